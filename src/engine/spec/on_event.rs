//! A wait's `on_event` (docs/design.md §2.18): the wait listens for the events an
//! event source receives whose key is the wait's `key`, filters them with an
//! optional `match`, and then either polls now or has the event's body judged by
//! its conditions. Here only the field's form is checked: whether the source
//! exists is the API's to say, as it needs the store.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Errors, opt, type_name};
use crate::engine::condition::Condition;
use crate::engine::schema;

/// The longest `on_event.key` (and the longest key a source extracts).
pub const MAX_KEY: usize = 256;

/// What a listening wait does with an event that matches it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Then {
    /// Poll the wait now, paced as a nudge is: the poll decides.
    #[default]
    Poll,
    /// Judge the event's body by the wait's conditions, as a callback's body is.
    End,
}

/// The events a wait listens for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OnEvent {
    /// The name of one of the tenant's event sources.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub source: String,
    /// The value the source's key extraction must yield for an event to be this
    /// wait's (at most 256 bytes; a number is taken as its text).
    #[schema(value_type = schema::EventKeyText)]
    pub key: String,
    /// A CEL expression over the event's `body` and `headers`: an event with
    /// this key is the wait's only when it is true.
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::ConditionText>)]
    pub matches: Option<Condition>,
    /// `poll` (default): poll the wait now. `end`: judge the event's body by the
    /// wait's conditions, as a callback's body is. `null` reads as the default.
    #[serde(default)]
    #[schema(nullable)]
    pub then: Then,
}

/// Whether `name` is a source name: 1 to 64 of `a-z 0-9 . _ -`, starting with a
/// letter or digit.
pub fn is_source_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

/// The rule [`is_source_name`] checks, as a sentence's end.
pub const SOURCE_NAME_RULE: &str =
    "1 to 64 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit";

pub(super) fn parse_on_event(v: &Value, is_callback: bool, errs: &mut Errors) -> Option<OnEvent> {
    let Value::Object(obj) = v else {
        errs.push(
            "on_event",
            format!(
                "must be an object such as {{\"source\": \"github\", \"key\": \"<run id>\"}}, not {}",
                type_name(v)
            ),
        );
        return None;
    };
    errs.unknown(obj, "on_event", &["source", "key", "match", "then"]);
    let source = match opt(obj, "source") {
        Some(Value::String(s)) if is_source_name(s) => Some(s.clone()),
        Some(Value::String(_)) => {
            errs.push(
                "on_event.source",
                format!("is not a source name: a source's name is {SOURCE_NAME_RULE}"),
            );
            None
        }
        Some(other) => {
            errs.push(
                "on_event.source",
                format!(
                    "must be the name of an event source (see GET /sources), not {}",
                    type_name(other)
                ),
            );
            None
        }
        None => {
            errs.push(
                "on_event.source",
                "is required: the name of the event source to listen to (see GET /sources)",
            );
            None
        }
    };
    let key = match opt(obj, "key") {
        Some(Value::String(s)) if s.is_empty() => {
            errs.push("on_event.key", "is empty; give the value the source's key extraction yields for this wait's events (e.g. a run id)");
            None
        }
        Some(Value::String(s)) if s.len() > MAX_KEY => {
            errs.push(
                "on_event.key",
                format!("is {} bytes, more than the {MAX_KEY} allowed", s.len()),
            );
            None
        }
        Some(Value::String(s)) if s.contains('\0') => {
            errs.push("on_event.key", super::NUL_REFUSED);
            None
        }
        Some(Value::String(s)) => Some(s.clone()),
        // A run id is a number in most payloads: its text is the key.
        Some(Value::Number(n)) => Some(n.to_string()),
        Some(other) => {
            errs.push(
                "on_event.key",
                format!(
                    "must be a string (or a number, read as its text), not {}",
                    type_name(other)
                ),
            );
            None
        }
        None => {
            errs.push("on_event.key", "is required: the value the source's key extraction yields for this wait's events (e.g. a run id)");
            None
        }
    };
    let matches = super::parse_condition(obj, "match", errs);
    if matches.is_none() && opt(obj, "match").is_some() {
        // parse_condition named the field "match": say where it is.
        if let Some(last) = errs.0.last_mut().filter(|e| e.field == "match") {
            last.field = "on_event.match".into();
        }
    }
    let then = match opt(obj, "then") {
        None => Then::Poll,
        Some(Value::String(s)) if s == "poll" => Then::Poll,
        Some(Value::String(s)) if s == "end" => Then::End,
        Some(other) => {
            let shown = match other {
                Value::String(s) => format!(
                    "\"{}\"",
                    s.chars().take(32).collect::<String>().escape_debug()
                ),
                v => type_name(v).to_string(),
            };
            errs.push("on_event.then", format!("is {shown}; it must be \"poll\" (poll the wait now; the poll decides) or \"end\" (judge the event's body by the wait's conditions)"));
            return None;
        }
    };
    if is_callback && then == Then::Poll {
        errs.push("on_event.then", "is \"poll\" (the default) on a callback wait, which has nothing to poll; use \"end\" to have an event's body judged as a callback's is");
        return None;
    }
    Some(OnEvent {
        source: source?,
        key: key?,
        matches,
        then,
    })
}
