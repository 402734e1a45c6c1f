//! Creating a group through `POST /waits`: the body's `all` or `any` list makes it
//! one (design §2.14). Every other route serves a group as the wait it is.

use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use chrono::Utc;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::{ApiError, ApiResult};
use super::extract::Hold;
use super::waits::{Held, block, blocked_response, with_location};
use super::{AppState, json_response};
use crate::engine::Spec;
use crate::groups::{MemberRequest, Refusal, request};
use crate::store::GroupRefused;

/// The SSRF guard on a spec's target, token endpoint and webhook URLs, and the
/// operator's word on the credential it names, with `at` naming where the spec
/// is.
pub(super) fn guard(
    s: &AppState,
    tenant: &str,
    spec: &Spec,
    at: &str,
    target: bool,
) -> ApiResult<()> {
    if target {
        if let Some(crate::engine::spec::Auth::Credential(name)) = &spec.target.auth {
            let url = url::Url::parse(&spec.target.url)
                .map_err(|e| ApiError::bad_request(format!("{at}target.url: {e}")))?;
            let granted = s
                .credentials
                .for_target(tenant, name, &url)
                .map_err(|why| {
                    ApiError::new(
                        StatusCode::FORBIDDEN,
                        "Credential not allowed",
                        format!("{at}target.auth.credential: {why}"),
                    )
                })?;
            if granted.tls.is_some() && spec.target.tls.is_some() {
                return Err(ApiError::bad_request(format!(
                    "{at}target.tls: the credential \"{name}\" brings its own TLS settings; remove target.tls"
                )));
            }
        }
        let url = url::Url::parse(&spec.target.url)
            .map_err(|e| ApiError::bad_request(format!("{at}target.url: {e}")))?;
        s.guard
            .check_url(&url)
            .map_err(|refused| ApiError::unprocessable(format!("{at}target.url: {refused}")))?;
        if let Some(crate::engine::spec::Auth::Oauth2(o)) = &spec.target.auth {
            let url = url::Url::parse(&o.token_url).map_err(|e| {
                ApiError::bad_request(format!("{at}target.auth.oauth2.token_url: {e}"))
            })?;
            s.guard.check_url(&url).map_err(|refused| {
                ApiError::unprocessable(format!(
                    "{at}target.auth.oauth2.token_url: {}",
                    refused
                        .to_string()
                        .replacen("the target host", "the token endpoint's host", 1)
                ))
            })?;
        }
    }
    for (i, n) in spec.notify.iter().enumerate() {
        let url = url::Url::parse(&n.url)
            .map_err(|e| ApiError::bad_request(format!("{at}notify[{i}].url: {e}")))?;
        s.guard.check_url(&url).map_err(|refused| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Webhook refused",
                format!(
                    "{at}notify[{i}].url: {}",
                    refused
                        .to_string()
                        .replacen("the target host", "the webhook host", 1)
                ),
            )
        })?;
    }
    Ok(())
}

/// Creates a group and answers as a create of a wait does (held with `?wait=`).
pub(super) async fn create(
    s: AppState,
    tenant: String,
    hold: Option<Hold>,
    key: Option<String>,
    body: Value,
    trace: Option<String>,
) -> ApiResult<Response> {
    let (presets, limits) = (s.presets.clone(), s.limits.clone());
    let (body, parsed) = crate::cpu::pool()
        .run(crate::cpu::Lane::Quick, &tenant, move || {
            let expand = |v: &Value| super::presets::expand(&presets, v).map(|c| c.into_owned());
            let parsed = request::parse(&body, &limits, &expand);
            (body, parsed)
        })
        .await
        .map_err(|lost| {
            tracing::error!(error = %lost, "a group create request's validation was lost");
            ApiError::internal()
        })?;
    let req = parsed.map_err(|r| match r {
        Refusal::Invalid(errors) => ApiError::validation(errors),
        Refusal::Expand { at, refused } => refused.within(&at),
    })?;
    let name = req.mode.as_str();
    for (i, m) in req.members.iter().enumerate() {
        if let MemberRequest::Spec { spec, .. } = m {
            guard(&s, &tenant, spec, &format!("{name}[{i}]."), true)?;
        }
    }
    guard(&s, &tenant, &req.shell, "", false)?;
    let hash = key
        .as_ref()
        .map(|_| hex::encode(Sha256::digest(body.to_string().as_bytes())));
    let idem = key.as_deref().zip(hash.as_deref());
    let slot = hold.map(|_| s.streams.acquire(&tenant)).transpose()?;
    let created = s
        .store
        .groups()
        .create(
            &tenant,
            &req,
            Utc::now(),
            idem,
            Some(s.max_active_waits),
            trace.as_deref(),
        )
        .await
        .map_err(|e| match e {
            GroupRefused::Store(e) => ApiError::from(e),
            GroupRefused::NoSuchMember { id, .. } => {
                ApiError::not_found(format!("there is no wait {id}"))
            }
            refused @ GroupRefused::MemberIsGroup { .. } => {
                ApiError::bad_request(refused.to_string())
            }
        })?;
    let id = created.wait.id;
    let mut wait = created.wait;
    if !created.existing {
        // The group and each member it made are waits created.
        let made = req
            .members
            .iter()
            .filter(|m| matches!(m, MemberRequest::Spec { .. }))
            .count();
        s.metrics
            .created
            .fetch_add(1 + made as u64, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(wait_id = %id, members = req.members.len(), "group created");
        // A member given by id may have ended already: decide before answering.
        if req
            .members
            .iter()
            .any(|m| matches!(m, MemberRequest::Id { .. }))
        {
            if let Err(e) = crate::groups::watch::settle(s.store.groups(), &s.metrics, id).await {
                tracing::warn!(group_id = %id, error = %e, "could not decide a new group; the sweep will");
            }
            if let Some(again) = s.store.waits().get(&tenant, id).await? {
                wait = again;
            }
        }
    }
    if wait.grouping.members.is_none() {
        s.store
            .groups()
            .annotate(std::slice::from_mut(&mut wait))
            .await?;
    }
    let mut res = match hold.zip(slot) {
        Some((hold, slot)) if wait.is_running() => {
            let (wait, why) = block(&s, &tenant, id, hold, slot).await?;
            blocked_response(&wait, why, true)
        }
        Some(_) => blocked_response(&wait, Held::Ended, true),
        None => with_location(json_response(StatusCode::CREATED, &wait), id),
    };
    if created.existing {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

/// Adds the third shape of `POST /waits` to the OpenAPI document: `CreateGroup`
/// (`all` or `any` of members, each a `CreateGroupMember`: a `CreateGroupMemberWait`,
/// a wait request with `required`, or `{"id", "required"}`), and makes the request body one of
/// `CreateWait` and `CreateGroup`.
pub(super) fn openapi_shape(doc: &mut Value) {
    use serde_json::json;
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let Some(wait) = schemas.get("CreateWait").cloned() else {
        return;
    };
    let mut member = wait.clone();
    member["properties"]["required"] = json!({
        "type": "boolean",
        "description": "In an `all` group: `false` lets this member end without success without failing the group. Only in `all` groups.",
        "default": true
    });
    member["description"] = json!(
        "A member of a group: a wait request (with `required`), or a wait of the same tenant by `id`."
    );
    let by_id = member_by_id(
        "A wait of the same tenant (not a group); another tenant's is a 404.",
        &member["properties"]["required"],
    );
    // The request shape is a component of its own rather than inline in the
    // union, so that client generators name it (they refuse some inline unions).
    schemas.insert("CreateGroupMemberWait".into(), member);
    let member = json!({
        "description": "A member of a group: a wait request (with `required`), or a wait of the same tenant by `id`.",
        "oneOf": [by_id, {"$ref": "#/components/schemas/CreateGroupMemberWait"}]
    });
    let list = |mode: &str| {
        json!({
            "type": "array",
            "minItems": 1,
            "maxItems": crate::groups::MAX_MEMBERS,
            "items": {"$ref": "#/components/schemas/CreateGroupMember"},
            "description": format!("The members: the group decides from {mode} of them. A group inside a group is a 400.")
        })
    };
    let mut group = group_object(
        "A group to create: a wait that succeeds when all of its members do (`all`) or the first does (`any`), under one deadline that caps theirs. Its running members are canceled when it is decided, unless `keep_running`.",
        [list("all"), list("any")],
        &wait["properties"],
    );
    group["examples"] = json!([
        {"all": [
            {"target": {"url": "https://api.example.com/servers/1"}, "state": "/data/attributes/status", "want": ["on"]},
            {"target": {"url": "https://api.example.com/servers/2"}, "state": "/data/attributes/status", "want": ["on"], "required": false}
        ], "labels": {"deploy": "1234"}},
        {"any": [
            {"preset": "http.ok", "params": {"url": "https://eu.example.com/healthz"}},
            {"preset": "http.ok", "params": {"url": "https://us.example.com/healthz"}}
        ]}
    ]);
    schemas.insert("CreateGroupMember".into(), member);
    schemas.insert("CreateGroup".into(), group);
    read_shape(schemas);
    if let Some(body) =
        doc.pointer_mut("/paths/~1waits/post/requestBody/content/application~1json/schema")
    {
        *body = json!({"oneOf": [
            {"$ref": "#/components/schemas/CreateWait"},
            {"$ref": "#/components/schemas/CreateGroup"}
        ]});
    }
}

/// A group: `all` or `any` of `members` (the two lists' schemas), and its own
/// fields, whose schemas are a wait's (`props`).
fn group_object(description: &str, [all, any]: [Value; 2], props: &Value) -> Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "description": description,
        "properties": {
            "all": all,
            "any": any,
            "timeout": props["timeout"],
            "labels": props["labels"],
            "notify": props["notify"],
            "keep_running": {"type": "boolean", "default": false, "description": "Leave the members running once the group is decided."}
        },
        "oneOf": [{"required": ["all"]}, {"required": ["any"]}]
    })
}

/// A member named by its `id` (described as `id`), with its `required` flag.
fn member_by_id(id: &str, required: &Value) -> Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["id"],
        "properties": {
            "id": {"type": "string", "format": "uuid", "description": id},
            "required": required
        }
    })
}

/// What a group's `spec` reads back as (design §2.14), and the wait's `spec` as
/// one of the two it is: `GroupSpec`, its members as each was made (a wait's
/// normalised spec, a `GroupMemberSpec`, with `required: false` where given) or
/// named (`{"id"}`), and the group's own fields.
fn read_shape(schemas: &mut serde_json::Map<String, Value>) {
    use serde_json::json;
    let Some(spec) = schemas.get("Spec").cloned() else {
        return;
    };
    let optional = json!({
        "type": "boolean",
        "description": "`false` when the member may end without success without failing its `all` group; absent otherwise."
    });
    let mut member = spec.clone();
    member["properties"]["required"] = optional.clone();
    member["description"] = json!(
        "A member of a group as it was created: its normalised spec, with `required` when it was given as `false`."
    );
    schemas.insert("GroupMemberSpec".into(), member);
    let by_id = member_by_id("A wait the group named by its id.", &optional);
    let list = json!({
        "type": "array",
        "items": {"oneOf": [by_id, {"$ref": "#/components/schemas/GroupMemberSpec"}]},
        "description": "The members, in the order given."
    });
    let mut group = group_object(
        "A group's normalised request: `all` or `any` of its members, and its own timeout, labels, webhooks (secrets redacted) and keep_running.",
        [list.clone(), list],
        &spec["properties"],
    );
    group["required"] = json!(["timeout", "labels", "keep_running"]);
    schemas.insert("GroupSpec".into(), group);
    let spec_field = schemas
        .get_mut("Wait")
        .and_then(|w| w["allOf"].as_array_mut())
        .and_then(|parts| {
            parts
                .iter_mut()
                .find_map(|p| p.pointer_mut("/properties/spec"))
        });
    if let Some(field) = spec_field {
        *field = json!({
            "description": "The normalised request, every header value and secret redacted: a wait's `Spec`, or a group's `GroupSpec`.",
            "oneOf": [
                {"$ref": "#/components/schemas/Spec"},
                {"$ref": "#/components/schemas/GroupSpec"}
            ]
        });
    }
}
