//! Reading a group's create body: `{"all": [member, …]}` or `{"any": [member, …]}`
//! with the wait's `timeout`, `labels` and `notify`, and `keep_running`.
//!
//! The group's own fields are checked by the wait's own parser (with a stand-in
//! target the group never polls), so they are refused in the same words as a
//! wait's. Each member is a whole wait spec, or `{"id": …}`; its fields are named
//! `all[2].want` and so on.

use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::MAX_MEMBERS;
use crate::engine::{FieldError, Limits, Spec};
use crate::model::GroupMode;
pub use crate::store::{GroupRequest, MemberRequest};

/// Why a group request is refused: its fields, or (from `expand`) a member's
/// preset, with where that member is in the request (`all[2]`).
#[derive(Debug)]
pub enum Refusal<E> {
    Invalid(Vec<FieldError>),
    Expand { at: String, refused: E },
}

/// Whether a create body asks for a group.
pub fn is_group(body: &Value) -> bool {
    body.get("all").is_some() || body.get("any").is_some()
}

const GROUP_FIELDS: &[&str] = &["all", "any", "timeout", "labels", "notify", "keep_running"];

fn err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

/// Reads a group request whose members may name presets of `presets`; a member's
/// preset refused is [`Refusal::Expand`] with the preset's field errors.
pub fn parse_with_presets(
    body: &Value,
    limits: &Limits,
    presets: &crate::presets::Registry,
) -> Result<GroupRequest, Refusal<Vec<FieldError>>> {
    parse(body, limits, &|v: &Value| {
        presets.apply(v).map(std::borrow::Cow::into_owned)
    })
}

/// Reads a group request. `expand` turns a member's preset request into a wait
/// request (a preset's expansion).
pub fn parse<E>(
    body: &Value,
    limits: &Limits,
    expand: &dyn Fn(&Value) -> Result<Value, E>,
) -> Result<GroupRequest, Refusal<E>> {
    let Some(obj) = body.as_object() else {
        return Err(Refusal::Invalid(vec![err(
            "",
            "the request body must be a JSON object",
        )]));
    };
    let mut errs = Vec::new();
    let (mode, list) = match (obj.get("all"), obj.get("any")) {
        (Some(_), Some(_)) => {
            return Err(Refusal::Invalid(vec![err(
                "any",
                "a group is either all or any of its members; give one of the two",
            )]));
        }
        (Some(l), None) => (GroupMode::All, l),
        (None, Some(l)) => (GroupMode::Any, l),
        (None, None) => unreachable!("is_group() chose this parser"),
    };
    let name = mode.as_str();
    for key in obj.keys() {
        if !GROUP_FIELDS.contains(&key.as_str()) {
            let shown: String = key.chars().take(64).collect();
            errs.push(err(
                shown,
                format!(
                    "is not a field of a group; a group takes {} (a member's own fields go inside its entry in {name})",
                    GROUP_FIELDS.join(", ")
                ),
            ));
        }
    }
    let keep_running = match obj.get("keep_running") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errs.push(err("keep_running", "must be true or false"));
            false
        }
    };
    // The group's own fields, read by the wait's parser around a stand-in target.
    let mut carrier = Map::new();
    for key in ["timeout", "labels", "notify"] {
        if let Some(v) = obj.get(key) {
            carrier.insert(key.into(), v.clone());
        }
    }
    carrier.insert("target".into(), json!({"url": "http://group.invalid/"}));
    carrier.insert("state".into(), json!("@status"));
    carrier.insert("want".into(), json!([200]));
    let shell = match Spec::from_request(&Value::Object(carrier), limits) {
        Ok(s) => Some(s),
        Err(e) => {
            errs.extend(e);
            None
        }
    };
    let items = match list {
        Value::Array(items) if items.is_empty() => {
            errs.push(err(name, "needs at least one member"));
            &[][..]
        }
        Value::Array(items) if items.len() > MAX_MEMBERS => {
            errs.push(err(
                name,
                format!(
                    "has {} members; a group has at most {MAX_MEMBERS}",
                    items.len()
                ),
            ));
            &[][..]
        }
        Value::Array(items) => &items[..],
        _ => {
            errs.push(err(
                name,
                "must be a list of members, each a wait spec or {\"id\": \"<wait id>\"}",
            ));
            &[][..]
        }
    };
    let mut members = Vec::with_capacity(items.len());
    let mut shown = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{name}[{i}]");
        let Some(m) = item.as_object() else {
            errs.push(err(at, "must be a wait spec or {\"id\": \"<wait id>\"}"));
            continue;
        };
        if m.contains_key("all") || m.contains_key("any") {
            errs.push(err(
                at,
                "is a group; a group cannot be a member of a group: list its members here instead",
            ));
            continue;
        }
        let required = match m.get("required") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                errs.push(err(format!("{at}.required"), "must be true or false"));
                true
            }
        };
        if !required && mode == GroupMode::Any {
            errs.push(err(
                format!("{at}.required"),
                "applies to members of an all group only; in an any group no member is required",
            ));
        }
        let mut m = m.clone();
        m.remove("required");
        if let Some(id) = m.get("id") {
            if m.len() > 1 {
                errs.push(err(
                    at,
                    "names a wait by id, so it takes only id (and required), not a spec",
                ));
                continue;
            }
            match id.as_str().and_then(|s| Uuid::parse_str(s).ok()) {
                Some(id) => {
                    shown.push(shown_member(json!({"id": id}), required));
                    members.push(MemberRequest::Id { id, required });
                }
                None => errs.push(err(format!("{at}.id"), "must be a wait id (a UUID)")),
            }
            continue;
        }
        let request = match expand(&Value::Object(m)) {
            Ok(request) => request,
            Err(refused) => return Err(Refusal::Expand { at, refused }),
        };
        match Spec::from_request(&request, limits) {
            Ok(mut spec) => {
                if let Some(shell) = &shell
                    && spec.timeout > shell.timeout
                {
                    // A member lives no longer than its group; what it asked of
                    // its own timeout must still hold under the group's.
                    spec.timeout = shell.timeout;
                    if spec.poll.delay > spec.timeout {
                        errs.push(err(
                            format!("{at}.poll.delay"),
                            "is longer than the group's timeout, which is the member's too, so the target would never be polled",
                        ));
                        continue;
                    }
                }
                shown.push(shown_member(
                    serde_json::to_value(spec.redacted()).unwrap_or_default(),
                    required,
                ));
                members.push(MemberRequest::Spec {
                    spec: Box::new(spec),
                    required,
                });
            }
            Err(e) => errs.extend(e.into_iter().map(|fe| FieldError {
                field: if fe.field.is_empty() {
                    at.clone()
                } else {
                    format!("{at}.{}", fe.field)
                },
                message: fe.message,
            })),
        }
    }
    match shell {
        Some(shell) if errs.is_empty() => {
            let whole = serde_json::to_value(shell.redacted()).unwrap_or_default();
            let mut spec = Map::new();
            spec.insert(name.into(), Value::Array(shown));
            for key in ["timeout", "labels", "notify"] {
                if let Some(v) = whole.get(key) {
                    spec.insert(key.into(), v.clone());
                }
            }
            spec.insert("keep_running".into(), Value::Bool(keep_running));
            Ok(GroupRequest {
                mode,
                keep_running,
                members,
                shell,
                spec: Value::Object(spec),
            })
        }
        _ => Err(Refusal::Invalid(errs)),
    }
}

fn shown_member(mut v: Value, required: bool) -> Value {
    if !required && let Some(o) = v.as_object_mut() {
        o.insert("required".into(), Value::Bool(false));
    }
    v
}
