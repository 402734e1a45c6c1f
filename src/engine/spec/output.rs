//! A wait's `output` (docs/design.md §2.16): the named values a polled wait takes
//! from the response it ended on, each a JSON Pointer, a JSONPath or a CEL
//! expression over `body`, `status` and `headers`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{Errors, Limits, type_name};
use crate::engine::condition::{self, Condition};
use crate::engine::{Budget, ValuePath, bound};

/// The most names an `output` may have.
pub const MAX_NAMES: usize = 16;
/// The longest name.
pub const MAX_NAME_LEN: usize = 64;
/// The most bytes an output takes as JSON text; past it, the output is cut
/// (docs/design.md §2.16).
pub const MAX_BYTES: usize = 64 * 1024;

/// One named value: where in the response it is read.
#[derive(Clone, Debug, PartialEq)]
pub enum Pick {
    /// A JSON Pointer (`/data/id`) or a JSONPath
    /// (`$.items[*].id`) into the body.
    Path(ValuePath),
    /// A CEL expression over `body`, `status` and `headers`, whatever it yields.
    Cel(Condition),
}

impl Pick {
    fn parse(text: &str) -> Result<Pick, String> {
        if text.is_empty() {
            return Err("is empty: name a JSON Pointer such as \"/data/id\", a JSONPath such as \"$.items[*].id\", or a CEL expression (body is the whole body)".into());
        }
        if text.starts_with('/') || text.starts_with('$') {
            return ValuePath::parse(text).map(Pick::Path);
        }
        if text == crate::engine::path::HTTP_STATUS {
            return Err(
                "is \"@status\"; write the CEL expression status for the HTTP status code".into(),
            );
        }
        Condition::compile_value(text)
            .map(Pick::Cel)
            .map_err(|e| e.to_string())
    }

    fn text(&self) -> &str {
        match self {
            Pick::Path(p) => p.as_str(),
            Pick::Cel(c) => c.source(),
        }
    }
}

impl Serialize for Pick {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.text())
    }
}

impl<'de> Deserialize<'de> for Pick {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Pick::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The names of a wait's output and where each is read.
pub type Output = BTreeMap<String, Pick>;

pub(super) fn parse_output(v: &Value, limits: &Limits, errs: &mut Errors) -> Option<Output> {
    let Value::Object(obj) = v else {
        errs.push(
            "output",
            format!(
                "must be an object naming each value, such as {{\"id\": \"/data/id\", \"ready\": \"body.status == 'on'\"}}, not {}",
                type_name(v)
            ),
        );
        return None;
    };
    if obj.len() > MAX_NAMES {
        errs.push(
            "output",
            format!("has {} names; the limit is {MAX_NAMES}", obj.len()),
        );
        return None;
    }
    let mut out = Output::new();
    for (name, pick) in obj {
        let shown: String = name.chars().take(MAX_NAME_LEN).collect();
        let field = format!("output.{shown}");
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            errs.push(
                &field,
                format!(
                    "is not a name waitd takes: use 1 to {MAX_NAME_LEN} letters, digits, '_' or '-'"
                ),
            );
            continue;
        }
        let Value::String(text) = pick else {
            errs.push(
                &field,
                format!(
                    "must be a string (a JSON Pointer, a JSONPath or a CEL expression), not {}",
                    type_name(pick)
                ),
            );
            continue;
        };
        if text.len() > limits.max_path_len.max(condition::MAX_LEN) {
            errs.push(
                &field,
                format!(
                    "is {} bytes long; the limit is {}",
                    text.len(),
                    limits.max_path_len.max(condition::MAX_LEN)
                ),
            );
            continue;
        }
        match Pick::parse(text) {
            Ok(p) => {
                out.insert(name.clone(), p);
            }
            Err(e) => errs.push(&field, e),
        }
    }
    Some(out)
}

/// The output `picks` take from a response: an object with each name that has a
/// value (a pick that selects nothing or cannot be evaluated is left out), or
/// `None` when none has. Past [`MAX_BYTES`] it is cut as `error_detail` is.
pub fn take(
    picks: &Output,
    body: Option<&Value>,
    status: u16,
    headers: &BTreeMap<String, String>,
) -> Option<Value> {
    if picks.is_empty() {
        return None;
    }
    let mut path_budget = Budget::default();
    let mut cel_budget = condition::Budget::default();
    let needs_cel = picks.values().any(|p| matches!(p, Pick::Cel(_)));
    let vars = needs_cel.then(|| condition::Vars::new(body, status, headers, None));
    let mut out = Map::new();
    for (name, pick) in picks {
        let value = match pick {
            Pick::Path(p) => body.and_then(|b| p.detail(b, &mut path_budget).ok().flatten()),
            Pick::Cel(c) => vars
                .as_ref()
                .and_then(|v| c.evaluate_value(v, &mut cel_budget).ok()),
        };
        if let Some(v) = value {
            out.insert(name.clone(), v);
        }
    }
    if out.is_empty() {
        return None;
    }
    Some(bound::output(&Value::Object(out)))
}

/// Replaces every string of `out` (keys too) that holds one of `secrets` with
/// `<redacted>`: an output never carries a secret of the spec's, even one its
/// target echoed back.
pub fn redact<'s>(out: &mut Value, secrets: impl Iterator<Item = &'s str>) {
    let secrets: Vec<&str> = secrets.filter(|s| !s.is_empty()).collect();
    if secrets.is_empty() {
        return;
    }
    let holds = |s: &str| secrets.iter().any(|x| s.contains(x));
    fn walk(v: &mut Value, holds: &dyn Fn(&str) -> bool) {
        match v {
            Value::String(s) if holds(s) => *s = super::REDACTED.to_string(),
            Value::Array(a) => a.iter_mut().for_each(|x| walk(x, holds)),
            Value::Object(o) => {
                let old = std::mem::take(o);
                for (k, mut x) in old {
                    walk(&mut x, holds);
                    let k = if holds(&k) {
                        super::REDACTED.to_string()
                    } else {
                        k
                    };
                    o.insert(k, x);
                }
            }
            _ => {}
        }
    }
    walk(out, &holds);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn picks(v: Value) -> Output {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn each_kind_of_pick_takes_its_value_and_one_that_selects_nothing_is_left_out() {
        let body = json!({"a": {"b": 1}, "items": [{"id": "x"}, {"id": "y"}], "n": 5});
        let headers = BTreeMap::from([("x-r".to_string(), "eu".to_string())]);
        let p = picks(json!({
            "b": "/a/b", "ids": "$.items[*].id", "big": "body.n > 3",
            "r": "headers['x-r']", "s": "status", "none": "/missing", "bad": "body.nope.deeper"
        }));
        let out = take(&p, Some(&body), 201, &headers).unwrap();
        assert_eq!(
            out,
            json!({"b": 1, "ids": ["x", "y"], "big": true, "r": "eu", "s": 201})
        );
        assert_eq!(
            take(
                &picks(json!({"none": "/missing"})),
                Some(&body),
                200,
                &headers
            ),
            None
        );
        assert_eq!(take(&Output::new(), Some(&body), 200, &headers), None);
    }

    #[test]
    fn a_pick_reads_back_as_its_text_and_status_is_refused_as_a_path() {
        for text in ["/a/b", "$.x[0]", "body", "body.a + 1"] {
            let p: Pick = serde_json::from_value(json!(text)).unwrap();
            assert_eq!(serde_json::to_value(&p).unwrap(), json!(text));
        }
        assert!(serde_json::from_value::<Pick>(json!("@status")).is_err());
        assert!(serde_json::from_value::<Pick>(json!("")).is_err());
        assert!(serde_json::from_value::<Pick>(json!("body.(")).is_err());
    }

    #[test]
    fn a_secret_in_any_string_or_key_is_redacted() {
        let mut out =
            json!({"a": "Bearer s3cret", "b": ["ok", "xs3cretx"], "s3cret": 1, "c": "fine"});
        redact(&mut out, ["s3cret", ""].into_iter());
        assert_eq!(
            out,
            json!({"a": "<redacted>", "b": ["ok", "<redacted>"], "<redacted>": 1, "c": "fine"})
        );
    }
}
