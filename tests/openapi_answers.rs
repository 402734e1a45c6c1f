//! What the API answers, held to the document it serves (`GET /openapi.json`): a
//! group as every route answers it, and requests that name a preset, which the
//! document calls valid exactly when they carry the parameters the server needs.
//! (The document's shape is tests/openapi.rs's; the whole API against it, with
//! generated requests, is `.ci/contract`'s.)

use serde_json::{Value, json};

use crate::support::in_process::InProcess;
use crate::support::{Reply, Upstream};

/// Whether `v` is of the JSON Schema type `t`.
fn is_type(v: &Value, t: &str) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64() || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => false,
    }
}

/// Why `v` breaks `schema`, as the document writes schemas (`$ref`s to its own
/// components, types, properties, `required`, `additionalProperties`, `items`,
/// `oneOf`/`anyOf`/`allOf`, `if`/`then`/`else`, `enum`, `const`, patterns and
/// bounds), or `None` when it conforms.
fn breaks(doc: &Value, schema: &Value, v: &Value, at: &str) -> Option<String> {
    let s = match schema {
        Value::Object(s) => s,
        Value::Bool(false) => return Some(format!("{at}: nothing is allowed here")),
        _ => return None,
    };
    let sub = |schema: &Value, v: &Value, at: &str| breaks(doc, schema, v, at);
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let target = doc
            .pointer(r.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("{r} resolves"));
        if let Some(why) = sub(target, v, at) {
            return Some(why);
        }
    }
    if let Some(t) = s.get("type") {
        let types: Vec<&str> = match t {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !types.iter().any(|t| is_type(v, t)) {
            return Some(format!("{at}: {v} is not of type {types:?}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array)
        && !e.contains(v)
    {
        return Some(format!("{at}: {v} is not one of {e:?}"));
    }
    if let Some(c) = s.get("const")
        && c != v
    {
        return Some(format!("{at}: {v} is not {c}"));
    }
    let bound = |key: &str| s.get(key).and_then(Value::as_f64);
    match v {
        Value::Object(o) => {
            for name in s
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = name.as_str().unwrap_or_default();
                if !o.contains_key(name) {
                    return Some(format!("{at}: {name} is required"));
                }
            }
            let props = s.get("properties").and_then(Value::as_object);
            for (k, x) in o {
                let here = format!("{at}.{k}");
                let why = match (props.and_then(|p| p.get(k)), s.get("additionalProperties")) {
                    (Some(p), _) => sub(p, x, &here),
                    (None, Some(Value::Bool(false))) => Some(format!("{here} is not a property")),
                    (None, Some(a)) => sub(a, x, &here),
                    (None, None) => None,
                };
                if why.is_some() {
                    return why;
                }
            }
        }
        Value::Array(items) => {
            if bound("minItems").is_some_and(|m| (items.len() as f64) < m)
                || bound("maxItems").is_some_and(|m| items.len() as f64 > m)
            {
                return Some(format!("{at}: {} items is out of bounds", items.len()));
            }
            if let Some(item) = s.get("items") {
                for (i, x) in items.iter().enumerate() {
                    if let Some(why) = sub(item, x, &format!("{at}[{i}]")) {
                        return Some(why);
                    }
                }
            }
        }
        Value::String(t) => {
            let n = t.chars().count() as f64;
            if bound("minLength").is_some_and(|m| n < m)
                || bound("maxLength").is_some_and(|m| n > m)
            {
                return Some(format!("{at}: {t:?} is out of its length bounds"));
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str) {
                let re = regex_automata::meta::Regex::new(p)
                    .unwrap_or_else(|e| panic!("the pattern {p} compiles: {e}"));
                if !re.is_match(t.as_str()) {
                    return Some(format!("{at}: {t:?} does not match {p}"));
                }
            }
        }
        Value::Number(n) => {
            let n = n.as_f64().unwrap_or_default();
            if bound("minimum").is_some_and(|m| n < m) || bound("maximum").is_some_and(|m| n > m) {
                return Some(format!("{at}: {n} is out of bounds"));
            }
        }
        _ => {}
    }
    for part in s
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(why) = sub(part, v, at) {
            return Some(why);
        }
    }
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        let whys: Vec<String> = any.iter().filter_map(|p| sub(p, v, at)).collect();
        if whys.len() == any.len() {
            return Some(format!("{at}: none of anyOf holds: {whys:?}"));
        }
    }
    if let Some(one) = s.get("oneOf").and_then(Value::as_array) {
        let whys: Vec<String> = one.iter().filter_map(|p| sub(p, v, at)).collect();
        if one.len() - whys.len() != 1 {
            return Some(format!(
                "{at}: {} branches of oneOf hold, not one: {whys:?}",
                one.len() - whys.len()
            ));
        }
    }
    if let Some(cond) = s.get("if") {
        let branch = match sub(cond, v, at) {
            None => s.get("then"),
            Some(_) => s.get("else"),
        };
        if let Some(why) = branch.and_then(|b| sub(b, v, at)) {
            return Some(why);
        }
    }
    None
}

/// The answer's body conforms to what the document lists for `status` on the
/// operation at `path` and `method`, as `content_type`.
fn conforms(doc: &Value, method: &str, path: &str, status: u16, content_type: &str, body: &Value) {
    let ptr = format!(
        "/paths/{}/{method}/responses/{status}/content/{}/schema",
        path.replace('~', "~0").replace('/', "~1"),
        content_type.replace('/', "~1")
    );
    let schema = doc
        .pointer(&ptr)
        .unwrap_or_else(|| panic!("{method} {path} lists {status} as {content_type}"));
    if let Some(why) = breaks(doc, schema, body, "body") {
        panic!(
            "{method} {path} answered {status} with what its document does not say: {why}\n{body:#}"
        );
    }
}

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test]
async fn a_group_is_answered_by_every_route_as_the_document_says() {
    let app = InProcess::start().await;
    let (_, doc) = app.get("/openapi.json").answer().await;
    let up = Upstream::start().await;
    let deploying = up.script(
        "/deploying",
        vec![Reply::json(200, json!({"status": "deploying"}))],
    );
    let failing = up.script(
        "/failing",
        vec![Reply::json(200, json!({"status": "broken"}))],
    );

    // A wait the group names by id, not required; a member it makes, which fails.
    let (status, named) = app
        .create(json!({"target": {"url": deploying}, "state": "/status", "want": ["on"], "timeout": "1m"}))
        .await;
    assert_eq!(status, 201, "{named}");
    let group = json!({
        "all": [
            {"target": {"url": failing, "headers": {"Authorization": "Bearer not-shown"}},
             "state": "/status", "want": ["on"], "fail": ["broken"]},
            {"id": named["id"], "required": false}
        ],
        "timeout": "1m",
        "labels": {"deploy": "1"},
        "notify": [{"url": "http://127.0.0.1:9/hook", "secret": SECRET}],
        "keep_running": false
    });
    let (status, created) = app.post("/waits?wait=true").json(&group).answer().await;
    assert_eq!(
        (status, &created["status"]),
        (422, &json!("failed")),
        "{created}"
    );
    conforms(&doc, "post", "/waits", 422, "application/json", &created);
    let id = created["id"].as_str().unwrap().to_string();
    assert!(
        !created.to_string().contains("not-shown") && !created.to_string().contains(SECRET),
        "a group's members' secrets are redacted: {created}"
    );

    let (status, read) = app.get(&format!("/waits/{id}")).answer().await;
    assert_eq!(status, 200);
    conforms(&doc, "get", "/waits/{id}", 200, "application/json", &read);
    let (status, held) = app.get(&format!("/waits/{id}?wait=true")).answer().await;
    assert_eq!(status, 422, "a failed group, held for: {held}");
    conforms(&doc, "get", "/waits/{id}", 422, "application/json", &held);
    let (status, listed) = app.get("/waits?label=deploy:1").answer().await;
    assert_eq!(
        (status, listed["items"].as_array().map(Vec::len)),
        (200, Some(1))
    );
    conforms(&doc, "get", "/waits", 200, "application/json", &listed);
    let (status, canceled) = app.post(&format!("/waits/{id}/cancel")).answer().await;
    assert_eq!(status, 200);
    conforms(
        &doc,
        "post",
        "/waits/{id}/cancel",
        200,
        "application/json",
        &canceled,
    );
    // Its named member, canceled when the group failed, shows its group.
    let (_, member) = app
        .get(&format!("/waits/{}", named["id"].as_str().unwrap()))
        .answer()
        .await;
    assert_eq!(member["group"], json!(id));
    conforms(&doc, "get", "/waits/{id}", 200, "application/json", &member);
    app.stop().await;
}

#[tokio::test]
async fn a_request_naming_a_preset_is_valid_by_the_served_document_when_its_parameters_are_there() {
    let app = InProcess::start().await;
    let (_, doc) = app.get("/openapi.json").answer().await;
    let (_, presets) = app.get("/presets").answer().await;
    let create = json!({"$ref": "#/components/schemas/CreateWait"});
    let member = json!({"$ref": "#/components/schemas/CreateGroupMemberWait"});
    let local = "http://127.0.0.1:9";
    let mut required_somewhere = 0;
    for p in presets["items"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        // Every parameter at its example (the URLs this machine's), with a timeout
        // under the server's maximum.
        let mut params = serde_json::Map::new();
        for (param, def) in p["params"].as_object().unwrap() {
            let value = match def["kind"].as_str().unwrap() {
                "base_url" => json!(local),
                "url" => json!(format!("{local}/x")),
                "address" => json!("127.0.0.1:9"),
                _ => [&def["example"], &def["default"]]
                    .into_iter()
                    .find(|v| v.is_string())
                    .cloned()
                    .unwrap_or(json!("x")),
            };
            params.insert(param.clone(), value);
        }
        let whole = json!({"preset": name, "params": params, "timeout": "1m"});
        assert_eq!(
            breaks(&doc, &create, &whole, "body"),
            None,
            "{name}: {whole}"
        );
        assert_eq!(
            breaks(&doc, &member, &whole, "body"),
            None,
            "{name} as a member"
        );
        let (status, answer) = app.create(whole.clone()).await;
        assert_eq!(status, 201, "{name}: {answer}");
        for (param, def) in p["params"].as_object().unwrap() {
            let mut without = whole.clone();
            without["params"].as_object_mut().unwrap().remove(param);
            let refused = breaks(&doc, &create, &without, "body");
            let (status, answer) = app.create(without.clone()).await;
            if def["required"] == json!(true) {
                required_somewhere += 1;
                assert!(
                    refused.is_some(),
                    "{name} without {param} is schema-invalid"
                );
                assert_eq!(status, 422, "{name} without {param}: {answer}");
                assert_eq!(answer["errors"][0]["field"], format!("params.{param}"));
            } else {
                assert_eq!(refused, None, "{name} without {param}");
                assert_eq!(status, 201, "{name} without {param}: {answer}");
            }
        }
        // A parameter the preset does not have: invalid by both.
        let mut extra = whole.clone();
        extra["params"]["no_such_param"] = json!("x");
        assert!(
            breaks(&doc, &create, &extra, "body").is_some(),
            "{name} + no_such_param"
        );
        assert_eq!(app.create(extra).await.0, 422);
        // A target without a URL is laid over the preset's: valid by both. (A
        // connection has no headers; a TLS one may name the server it asks for.)
        let mut headers = whole.clone();
        headers["target"] = if ["tcp.", "grpc.", "dns."]
            .iter()
            .any(|k| name.starts_with(k))
        {
            json!({})
        } else if name.starts_with("tls.") {
            json!({"tls": {"server_name": "svc.example"}})
        } else {
            json!({"headers": {"X-Trace": "1"}})
        };
        assert_eq!(
            breaks(&doc, &create, &headers, "body"),
            None,
            "{name} + headers"
        );
        let (status, answer) = app.create(headers).await;
        assert_eq!(status, 201, "{name} + headers: {answer}");
    }
    // Without a preset, a target needs its URL: invalid by both.
    let no_url = json!({"target": {"headers": {"X-Trace": "1"}}, "success_condition": "true"});
    assert!(breaks(&doc, &create, &no_url, "body").is_some());
    assert_eq!(app.create(no_url).await.0, 400);
    assert!(required_somewhere > 0, "some preset requires a parameter");
    app.stop().await;
}

#[tokio::test]
async fn an_auth_that_names_no_way_is_refused_as_the_document_says() {
    let app = InProcess::start().await;
    let (_, doc) = app.get("/openapi.json").answer().await;
    let create = json!({"$ref": "#/components/schemas/CreateWait"});
    for auth in [
        json!({}),
        json!({"credential": null}),
        json!({"oauth2": null}),
    ] {
        let request = json!({
            "target": {"url": "http://127.0.0.1:9/x", "auth": auth},
            "success_condition": "true"
        });
        assert!(breaks(&doc, &create, &request, "body").is_some(), "{auth}");
        let (status, answer) = app.create(request).await;
        assert_eq!(status, 400, "{auth}: {answer}");
        assert_eq!(answer["errors"][0]["field"], "target.auth", "{answer}");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_null_field_is_not_given_in_a_wait_and_a_group_as_the_document_says() {
    let app = InProcess::start().await;
    let (_, doc) = app.get("/openapi.json").answer().await;
    let body = json!({"$ref": "#/paths/~1waits/post/requestBody/content/application~1json/schema"});
    let wait = json!({"target": {"url": "http://127.0.0.1:9/x"}, "success_condition": "true"});
    for request in [
        json!({"target": wait["target"], "success_condition": "true", "notify": null, "timeout": null}),
        json!({"all": [wait], "notify": null, "timeout": null}),
    ] {
        assert_eq!(breaks(&doc, &body, &request, "body"), None, "{request}");
        let (status, answer) = app.create(request.clone()).await;
        assert_eq!(status, 201, "{request}: {answer}");
    }
    // A group's keep_running is true or false, and a group lists its members.
    for request in [
        json!({"all": [wait], "keep_running": null}),
        json!({"all": null}),
    ] {
        assert!(breaks(&doc, &body, &request, "body").is_some(), "{request}");
        assert_eq!(app.create(request).await.0, 400);
    }
    app.stop().await;
}
