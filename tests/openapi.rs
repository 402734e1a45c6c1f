//! The committed OpenAPI document must be the one the code generates, and say what
//! a client needs. Regenerate with `WAITD_UPDATE_OPENAPI=1 cargo test --test integration openapi::`.
//! (That the live API answers as it says is `.ci/contract`'s: schemathesis, and a
//! client generated from this document.)

use std::collections::HashSet;

use serde_json::{Value, json};

fn doc() -> Value {
    serde_json::from_str(waitd::api::openapi::document()).unwrap()
}

fn limits() -> waitd::engine::Limits {
    waitd::engine::Limits::default()
}

fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            ops.push((method.to_uppercase(), path.clone(), op));
        }
    }
    ops
}

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let generated = waitd::api::openapi::document();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    if std::env::var_os("WAITD_UPDATE_OPENAPI").is_some() {
        std::fs::write(path, generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is out of date; run `WAITD_UPDATE_OPENAPI=1 cargo test --test integration openapi::` and commit it"
    );
}

#[test]
fn every_route_is_there_once_with_its_own_operation_id() {
    let doc = doc();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    let mut seen = HashSet::new();
    let mut got = Vec::new();
    for (method, path, op) in operations(&doc) {
        let id = op["operationId"].as_str().unwrap().to_string();
        assert!(seen.insert(id.clone()), "operationId {id} is used twice");
        got.push(format!("{method} {path} {id}"));
    }
    got.sort();
    assert_eq!(
        got,
        [
            "DELETE /sources/{name} delete_source",
            "GET /events list_events",
            "GET /healthz healthz",
            "GET /metrics metrics",
            "GET /openapi.json openapi",
            "GET /presets list_presets",
            "GET /presets/{name} get_preset",
            "GET /readyz readyz",
            "GET /sources list_sources",
            "GET /sources/{name} get_source",
            "GET /waits list_waits",
            "GET /waits/{id} get_wait",
            "GET /waits/{id}/deliveries list_deliveries",
            "GET /waits/{id}/events list_wait_events",
            "POST /callbacks/{secret} complete_callback",
            "POST /callbacks/{secret}/fail fail_callback",
            "POST /callbacks/{secret}/heartbeat beat_callback",
            "POST /hooks/{id} receive_event",
            "POST /nudges/{secret} nudge_wait",
            "POST /sources create_source",
            "POST /waits create_wait",
            "POST /waits/{id}/cancel cancel_wait",
            "POST /waits/{id}/complete complete_wait",
            "POST /waits/{id}/deliveries/{delivery}/retry retry_delivery",
            "POST /waits/{id}/fail fail_wait",
        ]
    );
}

#[test]
fn problems_are_problem_json_and_every_refusal_that_asks_to_wait_says_for_how_long() {
    let doc = doc();
    for (method, path, op) in operations(&doc) {
        for (status, resp) in op["responses"].as_object().unwrap() {
            let content = resp["content"].as_object();
            let problem = content.and_then(|c| c.get("application/problem+json"));
            if status.starts_with('4') && !["409", "412", "422", "424"].contains(&status.as_str())
                || status == "503"
            {
                assert_eq!(
                    problem.map(|p| &p["schema"]["$ref"]),
                    Some(&json!("#/components/schemas/Problem")),
                    "{method} {path} {status} is a problem+json Problem"
                );
                assert!(
                    content.unwrap().get("application/json").is_none(),
                    "{method} {path} {status} is not plain JSON"
                );
            }
            if status == "429" || status == "503" {
                assert!(
                    resp["headers"].get("Retry-After").is_some(),
                    "{method} {path} {status} documents Retry-After"
                );
            }
        }
        let open = op["security"] == json!([{}]);
        assert_eq!(
            open,
            path == "/healthz"
                || path == "/readyz"
                || path == "/metrics"
                || path == "/openapi.json"
                || path.starts_with("/callbacks/")
                || path.starts_with("/nudges/")
                || path.starts_with("/hooks/"),
            "{method} {path}: only the operational routes, callback, nudge and hook URLs need no token"
        );
        if !open {
            assert!(op["responses"].get("401").is_some(), "{method} {path} 401");
        }
    }
    // A held request reports the end with a Wait; a refusal with the same code is
    // a problem.
    let created = &doc["paths"]["/waits"]["post"]["responses"];
    for status in ["409", "422"] {
        let c = &created[status]["content"];
        assert_eq!(
            c["application/json"]["schema"]["$ref"],
            "#/components/schemas/Wait"
        );
        assert_eq!(
            c["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem"
        );
    }
}

#[test]
fn the_request_says_what_is_required_bounded_and_refused() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    let create = &schemas["CreateWait"];
    let fields = create;
    assert_eq!(fields["additionalProperties"], json!(false));
    assert_eq!(create["if"]["required"], json!(["preset"]));
    assert_eq!(create["if"]["properties"]["preset"]["type"], "string");
    // Without a preset: a target, and `want` with its `state` or a
    // `success_condition`.
    let by_itself = &create["else"]["allOf"];
    assert_eq!(by_itself[0]["properties"]["params"]["type"], "null");
    let polled = &by_itself[1]["anyOf"][0]["allOf"];
    assert_eq!(polled[0]["required"], json!(["target"]));
    // Or a callback in the target's place.
    assert_eq!(by_itself[1]["anyOf"][1]["required"], json!(["callback"]));
    // A preset's request may leave the target's URL to the preset; a request
    // without one may not.
    assert_eq!(
        fields["properties"]["target"]["$ref"],
        "#/components/schemas/TargetOverlay"
    );
    assert_eq!(schemas["TargetOverlay"].get("required"), None);
    assert_eq!(
        polled[0]["properties"]["target"]["required"],
        json!(["url"])
    );
    assert_eq!(polled[1]["anyOf"][0]["required"], json!(["state", "want"]));
    assert_eq!(
        polled[1]["anyOf"][1]["required"],
        json!(["success_condition"])
    );
    assert_eq!(
        schemas["Condition"]["maxLength"],
        waitd::engine::condition::MAX_LEN
    );
    let p = &fields["properties"];
    assert_eq!(p["consecutive"]["minimum"], 1);
    // The bounds are the validator's own (schemathesis cannot see a body bound
    // drift: a generated body breaks some other rule of the server first).
    use waitd::engine::spec::{MAX_CONSECUTIVE, MAX_FACTOR, MAX_RETRIES};
    assert_eq!(p["consecutive"]["maximum"], MAX_CONSECUTIVE);
    assert_eq!(p["want"]["minItems"], 1);
    assert_eq!(p["want"]["maxItems"], limits().max_set_size);
    assert_eq!(p["fail"]["maxItems"], limits().max_set_size);
    let limits = limits();
    assert_eq!(schemas["Labels"]["maxProperties"], limits.max_labels);
    assert_eq!(
        schemas["Labels"]["additionalProperties"]["maxLength"],
        limits.max_label_len
    );
    assert_eq!(schemas["Headers"]["maxProperties"], limits.max_headers);
    assert_eq!(schemas["TargetUrl"]["maxLength"], limits.max_url_len);
    assert_eq!(schemas["ValuePath"]["maxLength"], limits.max_path_len);
    assert_eq!(schemas["StateValue"]["maxLength"], limits.max_value_len);
    assert_eq!(
        schemas["Duration"]["pattern"],
        waitd::engine::schema::DURATION_PATTERN
    );
    for nested in ["Target", "Poll", "Retry", "Spec"] {
        assert_eq!(
            schemas[nested]["additionalProperties"],
            json!(false),
            "{nested} refuses unknown fields"
        );
    }
    assert_eq!(
        schemas["Poll"]["properties"]["factor"]["maximum"],
        MAX_FACTOR
    );
    assert_eq!(
        schemas["Retry"]["properties"]["max_retries"]["maximum"],
        MAX_RETRIES
    );
    // Statuses and event kinds are the vocabulary's.
    let statuses: Vec<&str> = waitd::model::Status::ALL.map(|s| s.as_str()).to_vec();
    assert_eq!(schemas["Status"]["enum"], json!(statuses));
    let list = &doc["paths"]["/waits"]["get"]["parameters"];
    let limit = list
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "limit")
        .unwrap();
    assert_eq!(
        (&limit["schema"]["minimum"], &limit["schema"]["maximum"]),
        (&json!(1), &json!(500))
    );
}

#[test]
fn the_streams_say_what_their_frames_carry() {
    let doc = doc();
    let schemas = &doc["components"]["schemas"];
    for (path, frame) in [
        ("/waits/{id}/events", "WaitFrame"),
        ("/events", "FeedFrame"),
    ] {
        let c = &doc["paths"][path]["get"]["responses"]["200"]["content"];
        assert_eq!(
            c["text/event-stream"]["schema"]["$ref"],
            format!("#/components/schemas/{frame}")
        );
        assert_eq!(
            c["application/json"]["schema"]["$ref"],
            "#/components/schemas/EventPage"
        );
        let f = &schemas[frame]["properties"];
        assert_eq!(f["event"]["enum"], json!(waitd::model::EventBody::KINDS));
        assert_eq!(f["data"]["contentMediaType"], "application/json");
        assert_eq!(
            f["data"]["contentSchema"]["$ref"],
            "#/components/schemas/Event"
        );
    }
    // An event is one object per kind, told apart by `kind`.
    let event = &schemas["Event"];
    assert_eq!(event["discriminator"]["propertyName"], "kind");
    assert_eq!(
        event["oneOf"].as_array().unwrap().len(),
        waitd::model::EventBody::KINDS.len()
    );
    let failed = &schemas["EventFailed"];
    for field in ["id", "seq", "wait_id", "at", "kind", "reason", "state"] {
        assert!(
            failed["properties"].get(field).is_some(),
            "EventFailed.{field}"
        );
    }
    // Links from a created wait to what a client does next.
    let links = &doc["paths"]["/waits"]["post"]["responses"]["201"]["links"];
    assert_eq!(links["GetWait"]["operationId"], "get_wait");
    assert_eq!(links["GetWait"]["parameters"]["id"], "$response.body#/id");
}
