//! The OpenAPI 3.1 document. Its operations come from the handlers' annotations as
//! the router registers them ([`super::api_routes`]), its schemas from the types the
//! code serves and reads (the request's from [`Spec`], the events' from
//! [`EventBody`]); this module adds what no handler says: the request body's
//! "preset, or target, state and want", the shape of the SSE frames, bearer auth,
//! the answers every authenticated route can give, and the links between
//! operations. The committed copy at `openapi/openapi.json` is checked against it
//! by a test.

mod groups;

use std::sync::OnceLock;

use serde_json::json;
use utoipa::openapi::RefOr;
use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder, Schema, Type};
use utoipa::{Modify, OpenApi, PartialSchema, ToSchema};

use crate::engine::Spec;
use crate::model::{EventBody, Status};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "waitd",
        description = "An HTTP service that waits for you: it polls a URL until a JSON state is reached and reports it by GET, by a blocking GET, and by server-sent events.",
        license(name = "Apache-2.0"),
    ),
    components(schemas(Status)),
    tags(
        (name = "waits", description = "Create, read, list, block on and cancel waits"),
        (name = "events", description = "A wait's history, and live streams"),
        (name = "presets", description = "Named waiter definitions a create request can start from"),
        (name = "webhooks", description = "A wait's webhook deliveries (its `notify` entries), and redelivery"),
        (name = "callbacks", description = "The URL a callback wait's create answers with: POST to it to end the wait; no token needed"),
        (name = "sources", description = "Event sources: receivers of signed webhooks whose events poll or end the waits listening for their key; their hook URLs need no token"),
        (name = "nudges", description = "The URL a wait made with \"nudge\": true carries: POST to it to poll the wait now; no token needed"),
        (name = "operations", description = "Liveness, readiness, metrics and this document; no token needed"),
    )
)]
pub struct ApiDoc;

/// The request body of `POST /waits`: the fields of a [`Spec`] (unknown ones are
/// refused), plus `preset` and `params`. It names a preset, or gives `target` and
/// either `state` and `want` or a `success_condition` itself.
pub struct CreateWait;

impl PartialSchema for CreateWait {
    fn schema() -> RefOr<Schema> {
        let RefOr::T(Schema::Object(mut fields)) = Spec::schema() else {
            unreachable!("a struct's schema is an object")
        };
        // In a request every field may be left to its default or to the preset;
        // which must be there is said below.
        let needed: Vec<String> = std::mem::take(&mut fields.required);
        fields.properties.insert(
            "preset".into(),
            ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                    Type::String,
                    Type::Null,
                ]))
                .description(Some(
                    "A named waiter definition (`GET /presets` lists them) whose fields this request starts from; the request's own fields override them (objects merge key by key, arrays are replaced). An unknown preset is a 422: the document a server serves at `/openapi.json` lists the presets it has as this field's `enum`.",
                ))
                .into(),
        );
        fields.properties.insert(
            "params".into(),
            ObjectBuilder::new()
                .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                    Type::Object,
                    Type::Null,
                ]))
                .additional_properties(Some(ObjectBuilder::new().schema_type(
                    utoipa::openapi::schema::SchemaType::from_iter([
                        Type::String,
                        Type::Number,
                        Type::Boolean,
                    ]),
                )))
                .description(Some(
                    "Values for the preset's `{param}` placeholders, by name; `base_url` points a preset at another host. Only with `preset`; a missing or unknown parameter is a 422 naming `params.<name>`.",
                ))
                .into(),
        );
        fields.description = Some(
            "A wait to create: name a `preset`; or give `target` and either `state` and `want` or a `success_condition`; or give `callback` in the target's place (and whatever else differs from the defaults). Unknown fields are refused.".into(),
        );
        fields.examples = vec![
            json!({
                "target": {"url": "https://api.example.com/servers/1"},
                "state": "/data/attributes/status",
                "want": ["on"],
                "fail": ["failed_deployment"],
                "labels": {"pipeline": "1234"}
            }),
            json!({"preset": "http.ok", "params": {"url": "https://api.example.com/healthz"}}),
        ];
        // Without a preset: the fields a wait needs (`want` with its `state`, or a
        // `success_condition`), and no params.
        // A callback wait gives `callback` in the target's place, and needs nothing
        // to decide by.
        let mut polled = ObjectBuilder::new().required("target");
        for name in needed {
            polled = polled.required(name);
        }
        let decided = AnyOfBuilder::new()
            .item(ObjectBuilder::new().required("state").required("want"))
            .item(ObjectBuilder::new().required("success_condition"));
        let polled = AllOfBuilder::new().item(polled).item(decided);
        let called = ObjectBuilder::new()
            .required("callback")
            .property("target", ObjectBuilder::new().schema_type(Type::Null));
        let by_itself = AllOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .property("params", ObjectBuilder::new().schema_type(Type::Null)),
            )
            .item(AnyOfBuilder::new().item(polled).item(called));
        let either = AnyOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .required("preset")
                    .property("preset", ObjectBuilder::new().schema_type(Type::String)),
            )
            .item(by_itself);
        AllOfBuilder::new().item(fields).item(either).into()
    }
}

impl ToSchema for CreateWait {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((Spec::name().into(), Spec::schema()));
        <Spec as ToSchema>::schemas(schemas);
    }
}

/// The frame of an SSE stream: `event` is the event's kind, `id` the stream's
/// cursor, `data` the event as JSON.
fn frame_schema(id: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .property(
            "event",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(EventBody::KINDS)),
        )
        .required("event")
        .property(
            "id",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[0-9]+$"))
                .description(Some(id)),
        )
        .required("id")
        .property(
            "data",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .content_media_type("application/json")
                .description(Some("The event, as `GET …/events` pages give it"))
                .extensions(Some(Extensions::from_iter([(
                    "contentSchema",
                    json!({"$ref": "#/components/schemas/Event"}),
                )]))),
        )
        .required("data")
        .into()
}

/// A frame of a wait's stream (`GET /waits/{id}/events`).
pub struct WaitFrame;

impl PartialSchema for WaitFrame {
    fn schema() -> RefOr<Schema> {
        frame_schema("The event's `seq`: send it as Last-Event-ID to resume after it")
    }
}

impl ToSchema for WaitFrame {}

/// A frame of the stream of all events (`GET /events`).
pub struct FeedFrame;

impl PartialSchema for FeedFrame {
    fn schema() -> RefOr<Schema> {
        frame_schema("The event's global `id`: send it as Last-Event-ID to resume after it")
    }
}

impl ToSchema for FeedFrame {}

/// Bearer tokens on every route but the operational ones (which say so with an
/// empty `security`), and the answers every authenticated route can give.
struct Security;

impl Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        doc.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post, &mut item.delete]
                .into_iter()
                .flatten()
            {
                let open = op.security.as_ref().is_some_and(|s| {
                    s.iter()
                        .all(|r| serde_json::to_value(r).is_ok_and(|v| v == json!({})))
                });
                let responses = &mut op.responses.responses;
                responses
                    .entry("414".into())
                    .or_insert_with(|| problem("The request URI is over 16 KiB", false));
                if open {
                    continue;
                }
                responses.entry("401".into()).or_insert_with(|| {
                    problem(
                        "Missing or invalid API token (when tokens are configured)",
                        false,
                    )
                });
                // Every route that reads the store (the presets are in memory).
                if !op
                    .tags
                    .as_ref()
                    .is_some_and(|t| t.iter().any(|t| t == "presets"))
                {
                    responses.entry("503".into()).or_insert_with(|| {
                        problem("The store is unreachable: repeat after Retry-After", true)
                    });
                }
                responses.entry("429".into()).or_insert_with(|| {
                    problem(
                        "Over this token's request rate, or too many open streams and held requests: repeat after Retry-After",
                        true,
                    )
                });
            }
        }
        // A read-only token reads only: every other route refuses it.
        for op in doc.paths.paths.values_mut().filter_map(|i| i.post.as_mut()) {
            op.responses
                .responses
                .entry("403".into())
                .or_insert_with(|| {
                    problem(
                        "A read-only API token (tenant:token:read), which may only read",
                        false,
                    )
                });
        }
    }
}

/// A problem+json response, with `Retry-After` when `retry` is true.
fn problem(description: &str, retry: bool) -> RefOr<utoipa::openapi::Response> {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::{ContentBuilder, ResponseBuilder};
    let mut r = ResponseBuilder::new().description(description).content(
        "application/problem+json",
        ContentBuilder::new()
            .schema(Some(utoipa::openapi::Ref::from_schema_name("Problem")))
            .build(),
    );
    if retry {
        r = r.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1.0)),
                )
                .description(Some("Seconds to wait before repeating"))
                .build(),
        );
    }
    RefOr::T(r.build())
}

/// The links a client (or schemathesis' stateful phase) follows from a created
/// wait. Written as extensions: utoipa 5 spells the Link object's fields in
/// snake_case, and OpenAPI's are camelCase.
struct Links;

impl Modify for Links {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let link = |op: &str| {
            RefOr::T(
                utoipa::openapi::link::LinkBuilder::new()
                    .parameter("id", "$response.body#/id")
                    .extensions(Some(Extensions::from_iter([("operationId", op)])))
                    .build(),
            )
        };
        let Some(op) = doc
            .paths
            .paths
            .get_mut("/waits")
            .and_then(|i| i.post.as_mut())
        else {
            return;
        };
        for status in ["201", "202"] {
            if let Some(RefOr::T(resp)) = op.responses.responses.get_mut(status) {
                resp.links.insert("GetWait".into(), link("get_wait"));
                resp.links.insert("CancelWait".into(), link("cancel_wait"));
                resp.links
                    .insert("ListWaitEvents".into(), link("list_wait_events"));
            }
        }
    }
}

/// The whole document, from the routes as the router registers them.
fn build() -> serde_json::Value {
    let (_, mut doc) = super::api_routes()
        .merge(super::ops_routes())
        .merge(super::callback_routes())
        .split_for_parts();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    Security.modify(&mut doc);
    Links.modify(&mut doc);
    let mut doc = serde_json::to_value(&doc).expect("the OpenAPI document serialises");
    events_as_union(&mut doc);
    create_wait_as_one_object(&mut doc);
    groups::add(&mut doc);
    doc
}

/// `CreateWait` as one object with its fields, whose `if`/`else` says which must be
/// there (a `preset`; or else `target`, `state` and `want`, and no `params`), rather
/// than the `allOf` over an `anyOf` that utoipa's types can hold. The same schema, in
/// the form test generators read most thoroughly and client generators read as one
/// model (an `anyOf` would become a union of two).
///
/// Its `target` is a `TargetOverlay`: `Target` with no field required, because with
/// a preset it is laid over the preset's target (a request may give only
/// `headers`); without one, `else` requires its `url`. Its `notify` may be null.
fn create_wait_as_one_object(doc: &mut serde_json::Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(serde_json::Value::as_object_mut)
    else {
        return;
    };
    if let Some(target) = schemas.get("Target") {
        let mut overlay = target.clone();
        if let Some(o) = overlay.as_object_mut() {
            o.remove("required");
        }
        overlay["description"] = json!(
            "What to poll: a `Target`, whose `url` a preset may give (with a preset, these fields are laid over the preset's target)."
        );
        schemas.insert("TargetOverlay".into(), overlay);
    }
    let Some(create) = schemas.get_mut("CreateWait") else {
        return;
    };
    let mut fields = create["allOf"][0].take();
    fields["properties"]["target"] = json!({"$ref": "#/components/schemas/TargetOverlay"});
    // A null is "not given", for `callback` and `notify` as for every other field
    // of a request (a read never shows `notify` null, so `Spec`'s says an array).
    fields["properties"]["callback"] =
        json!({"oneOf": [{"type": "null"}, {"$ref": "#/components/schemas/Callback"}]});
    fields["properties"]["notify"]["type"] = json!(["array", "null"]);
    let either = &mut create["allOf"][1]["anyOf"];
    fields["if"] = either[0].take();
    fields["else"] = either[1].take();
    fields["else"]["allOf"][1]["anyOf"][0]["allOf"][0]["properties"]["target"] =
        json!({"required": ["url"]});
    *create = fields;
}

/// The document as this server serves it: [`document`], with `preset` in the
/// create schemas stating the presets it has as an `enum`, so that a client (or a
/// test generator) knows that any other name is a 422, and, for each, the
/// parameters it requires and takes (a `then` with one branch a preset), so that
/// a request missing one is schema-invalid as the server's 422 says. Built once
/// per registry.
pub fn served(presets: &std::sync::Arc<crate::presets::Registry>) -> std::sync::Arc<String> {
    use std::sync::{Arc, Mutex};
    static SERVED: Mutex<Option<(usize, Arc<String>)>> = Mutex::new(None);
    let key = Arc::as_ptr(presets) as usize;
    let mut cached = SERVED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((k, doc)) = cached.as_ref()
        && *k == key
    {
        return doc.clone();
    }
    let mut doc: serde_json::Value =
        serde_json::from_str(document()).expect("the document is JSON");
    let mut names: Vec<serde_json::Value> = presets
        .iter()
        .map(|p| serde_json::Value::String(p.name.clone()))
        .collect();
    names.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
    names.push(serde_json::Value::Null);
    // A request that names a preset gives the parameters it requires and no
    // others: one branch a preset. (They exclude each other by `preset`, so
    // `anyOf` says what `oneOf` would, in the form generators satisfy fastest.)
    let by_preset = serde_json::json!({
        "anyOf": presets.iter().map(|p| p.request_schema()).collect::<Vec<_>>()
    });
    for at in [
        "/components/schemas/CreateWait",
        "/components/schemas/CreateGroupMemberWait",
    ] {
        if let Some(s) = doc.pointer_mut(at) {
            s["properties"]["preset"]["enum"] = serde_json::Value::Array(names.clone());
            s["then"] = by_preset.clone();
        }
    }
    let mut s = serde_json::to_string_pretty(&doc).expect("JSON serialises");
    s.push('\n');
    let doc = Arc::new(s);
    *cached = Some((key, doc.clone()));
    doc
}

/// The document as pretty JSON, with a trailing newline; built once.
pub fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        let mut s = serde_json::to_string_pretty(&build()).expect("JSON serialises");
        s.push('\n');
        s
    })
}

/// Spells the event out as the union it is on the wire: one object per kind
/// (`EventCreated`, `EventState`, …), each with the fields every event has, its
/// `kind`, and the kind's own fields, told apart by `kind`. The derive gives the
/// same thing as `allOf` over a tagged `oneOf` (and the terminal kinds as `allOf`
/// over `Ending`), which says the same but which client generators cannot read.
fn events_as_union(doc: &mut serde_json::Value) {
    use serde_json::{Map, Value};
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let (Some(body), Some(event), Some(ending)) = (
        schemas.remove("EventBody"),
        schemas.remove("Event"),
        schemas.remove("Ending"),
    ) else {
        unreachable!("Event, EventBody and Ending are in the document");
    };
    let common = event["allOf"]
        .as_array()
        .and_then(|parts| parts.iter().find(|p| p.get("properties").is_some()))
        .cloned()
        .unwrap_or_default();
    // Adds `part`'s properties and required names to `into`.
    fn merge(into: &mut Value, part: &Value) {
        if let (Some(to), Some(from)) = (
            into["properties"].as_object_mut(),
            part["properties"].as_object(),
        ) {
            to.extend(from.clone());
        }
        if let (Some(to), Some(from)) =
            (into["required"].as_array_mut(), part["required"].as_array())
        {
            to.extend(
                from.iter()
                    .filter(|r| !to.contains(r))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
    }
    let mut refs = Vec::new();
    let mut mapping = Map::new();
    for variant in body["oneOf"].as_array().into_iter().flatten() {
        let mut merged = json!({"type": "object", "properties": {}, "required": []});
        merge(&mut merged, &common);
        let parts = variant["allOf"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![variant.clone()]);
        for part in &parts {
            let part = if part.get("$ref").is_some() {
                &ending
            } else {
                part
            };
            merge(&mut merged, part);
        }
        let description = variant
            .get("description")
            .or_else(|| ending.get("description"))
            .cloned();
        if let Some(d) = description {
            merged["description"] = d;
        }
        let kind = merged["properties"]["kind"]["enum"][0]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = format!(
            "Event{}",
            kind.split('_')
                .map(|w| w[..1].to_uppercase() + &w[1..])
                .collect::<String>()
        );
        let reference = format!("#/components/schemas/{name}");
        refs.push(json!({"$ref": reference}));
        mapping.insert(kind, Value::String(reference));
        schemas.insert(name, merged);
    }
    schemas.insert(
        "Event".into(),
        json!({
            "description": event.get("description").cloned().unwrap_or_default(),
            "oneOf": refs,
            "discriminator": {"propertyName": "kind", "mapping": mapping},
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_schema_has_the_fields_the_validator_reads_and_no_others() {
        let body = serde_json::to_value(CreateWait::schema()).unwrap();
        let mut names: Vec<&str> = body["allOf"][0]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        names.sort();
        let mut expected: Vec<&str> = crate::engine::spec::FIELDS.to_vec();
        expected.extend(["preset", "params"]);
        expected.sort();
        assert_eq!(names, expected);
        assert_eq!(body["allOf"][0]["additionalProperties"], json!(false));
        let by_itself = &body["allOf"][1]["anyOf"][1]["allOf"];
        let polled = &by_itself[1]["anyOf"][0]["allOf"];
        assert_eq!(polled[0]["required"], json!(["target"]));
        assert_eq!(polled[1]["anyOf"][0]["required"], json!(["state", "want"]));
        assert_eq!(
            polled[1]["anyOf"][1]["required"],
            json!(["success_condition"])
        );
        let called = &by_itself[1]["anyOf"][1];
        assert_eq!(called["required"], json!(["callback"]));
    }
}
