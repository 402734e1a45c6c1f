//! The readers of the create request's fields that its parsers share: a field's
//! errors gathered with its dotted path, and the readers of booleans, durations,
//! conditions, paths, value sets and labels.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{FieldError, Limits, NUL_REFUSED};
use crate::engine::condition::Condition;
use crate::engine::duration;
use crate::engine::path::ValuePath;

#[derive(Default)]
pub(super) struct Errors(pub(super) Vec<FieldError>);

impl Errors {
    pub(super) fn push(&mut self, field: &str, message: impl std::fmt::Display) {
        self.0.push(FieldError {
            field: field.to_string(),
            message: message.to_string(),
        });
    }

    pub(super) fn unknown(&mut self, obj: &Map<String, Value>, prefix: &str, known: &[&str]) {
        for key in obj.keys() {
            if !known.contains(&key.as_str()) {
                let shown: String = key.chars().take(64).collect();
                let hint = known
                    .iter()
                    .find(|k| close(k, key))
                    .map(|k| format!(" (did you mean \"{k}\"?)"))
                    .unwrap_or_default();
                self.push(
                    &join(prefix, &shown),
                    format!(
                        "is not a field of this object{hint}; known fields are {}",
                        known.join(", ")
                    ),
                );
            }
        }
    }
}

/// True when `a` and `b` differ by one edit or one swap of neighbours: a likely typo.
pub fn close(a: &str, b: &str) -> bool {
    strsim::osa_distance(a, b) == 1
}

pub(super) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

pub(super) fn opt<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

/// A whole number, written as `3` or `3.0` (JSON does not tell them apart).
pub(super) fn whole_number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|x| x.fract() == 0.0 && *x >= 0.0 && *x <= u32::MAX as f64)
            .map(|x| x as u64)
    })
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn parse_bool(obj: &Map<String, Value>, key: &str, errs: &mut Errors) -> Option<bool> {
    match opt(obj, key)? {
        Value::Bool(b) => Some(*b),
        other => {
            errs.push(
                key,
                format!("must be true or false, not {}", type_name(other)),
            );
            None
        }
    }
}

pub(super) fn parse_condition(
    obj: &Map<String, Value>,
    key: &str,
    errs: &mut Errors,
) -> Option<Condition> {
    match opt(obj, key)? {
        Value::String(s) => match Condition::compile(s) {
            Ok(c) => Some(c),
            Err(e) => {
                errs.push(key, e);
                None
            }
        },
        other => {
            errs.push(
                key,
                format!(
                    "must be a CEL expression as a string, such as \"status == 404\", not {}",
                    type_name(other)
                ),
            );
            None
        }
    }
}

pub(super) fn parse_duration(field: &str, v: &Value, errs: &mut Errors) -> Option<Duration> {
    match v {
        Value::String(s) => match duration::parse(s) {
            Ok(d) => Some(d),
            Err(e) => {
                errs.push(field, e);
                None
            }
        },
        other => {
            errs.push(
                field,
                format!(
                    "must be a duration string such as \"30s\" or \"5m\", not {}",
                    type_name(other)
                ),
            );
            None
        }
    }
}

pub(super) fn parse_path(
    field: &str,
    v: &Value,
    limits: &Limits,
    errs: &mut Errors,
) -> Option<ValuePath> {
    let Value::String(s) = v else {
        errs.push(
            field,
            format!(
                "must be a string (a JSON Pointer or JSONPath), not {}",
                type_name(v)
            ),
        );
        return None;
    };
    if s.len() > limits.max_path_len {
        errs.push(
            field,
            format!(
                "is {} bytes long; the limit is {}",
                s.len(),
                limits.max_path_len
            ),
        );
        return None;
    }
    if s.contains('\0') {
        errs.push(field, NUL_REFUSED);
        return None;
    }
    match ValuePath::parse(s) {
        Ok(p) => Some(p),
        Err(e) => {
            errs.push(field, e);
            None
        }
    }
}

/// A set of states: strings, numbers and booleans (compared as their JSON text).
pub(super) fn parse_set(
    field: &str,
    v: &Value,
    limits: &Limits,
    errs: &mut Errors,
) -> Option<Vec<String>> {
    let Value::Array(items) = v else {
        errs.push(
            field,
            format!(
                "must be an array of states, e.g. [\"on\"], not {}",
                type_name(v)
            ),
        );
        return None;
    };
    if items.len() > limits.max_set_size {
        errs.push(
            field,
            format!(
                "has {} entries; the limit is {}",
                items.len(),
                limits.max_set_size
            ),
        );
        return None;
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let text = match item {
            Value::String(s) => s.clone(),
            Value::Number(_) | Value::Bool(_) => item.to_string(),
            other => {
                errs.push(
                    &format!("{field}[{i}]"),
                    format!(
                        "must be a string, number or boolean, not {}",
                        type_name(other)
                    ),
                );
                continue;
            }
        };
        if text.contains('\0') {
            errs.push(&format!("{field}[{i}]"), NUL_REFUSED);
            continue;
        }
        if text.len() > limits.max_value_len {
            errs.push(
                &format!("{field}[{i}]"),
                format!(
                    "is {} bytes long; the limit is {}",
                    text.len(),
                    limits.max_value_len
                ),
            );
            continue;
        }
        if !out.contains(&text) {
            out.push(text);
        }
    }
    Some(out)
}

/// What a label name may be; a filter on any other name can match nothing.
pub const LABEL_NAME_RULE: &str =
    "is not a valid label name: 1 to 63 characters of letters, digits, '-', '_', '.' and '/'";

/// Whether `k` is a label name a wait can carry.
pub fn is_label_name(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 63
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./".contains(&b))
}

pub(super) fn parse_labels(
    v: Option<&Value>,
    limits: &Limits,
    errs: &mut Errors,
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let obj = match v {
        None => return labels,
        Some(Value::Object(o)) => o,
        Some(other) => {
            errs.push(
                "labels",
                format!(
                    "must be an object of string → string, not {}",
                    type_name(other)
                ),
            );
            return labels;
        }
    };
    if obj.len() > limits.max_labels {
        errs.push(
            "labels",
            format!(
                "has {} labels; the limit is {}",
                obj.len(),
                limits.max_labels
            ),
        );
        return labels;
    }
    for (k, v) in obj {
        let shown: String = k.chars().take(64).collect();
        let field = format!("labels.{shown}");
        if !is_label_name(k) {
            errs.push(&field, LABEL_NAME_RULE);
            continue;
        }
        let Value::String(s) = v else {
            errs.push(&field, format!("must be a string, not {}", type_name(v)));
            continue;
        };
        if s.len() > limits.max_label_len {
            errs.push(
                &field,
                format!(
                    "is {} bytes long; the limit is {}",
                    s.len(),
                    limits.max_label_len
                ),
            );
            continue;
        }
        if s.chars().any(char::is_control) {
            errs.push(&field, "has a control character in its value");
            continue;
        }
        labels.insert(k.clone(), s.clone());
    }
    labels
}
