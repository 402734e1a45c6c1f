//! The group shapes of the OpenAPI document, which the derived schemas cannot say:
//! `POST /waits` takes a wait or a group, and a wait's `spec` reads back as either.

use serde_json::Value;

/// Adds the third shape of `POST /waits` to the OpenAPI document: `CreateGroup`
/// (`all` or `any` of members, each a `CreateGroupMember`: a `CreateGroupMemberWait`,
/// a wait request with `required`, or `{"id", "required"}`), and makes the request body one of
/// `CreateWait` and `CreateGroup`.
pub(super) fn add(doc: &mut Value) {
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
            "description": "The normalised request, every header value and secret redacted: a group's `GroupSpec` (it has `keep_running`), or a wait's `Spec`.",
            "oneOf": [
                {"$ref": "#/components/schemas/GroupSpec"},
                {"$ref": "#/components/schemas/Spec"}
            ]
        });
    }
}
