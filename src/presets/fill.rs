//! A preset's values and its template: which values a parameter's kind takes,
//! the `{param}` placeholders of a request template, and the filling in of a
//! template with values, each written as the place it lands in needs (a URL's path
//! segment, a JSONPath string literal, a CEL string).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::{Param, ParamKind, PresetError};

pub(super) fn is_param_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z'))
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && s.len() <= 64
}

sentence_error! {
    /// Why a value does not fit a parameter; it completes the sentence "params.x …".
    pub struct ParamError;
}

/// Whether `value` is acceptable for a parameter of `kind`; the error completes the
/// sentence "params.x …".
pub(super) fn check_value(kind: ParamKind, value: &str) -> Result<(), ParamError> {
    if value.chars().any(char::is_control) {
        return Err("has a control character, which no parameter may contain".into());
    }
    if value.len() > 2048 {
        return Err(format!("is {} bytes long; the limit is 2048", value.len()).into());
    }
    match kind {
        ParamKind::Segment => {
            if value.is_empty() {
                return Err("is empty".into());
            }
        }
        ParamKind::Path => {
            if !value.starts_with('/') || value.contains(['?', '#', ' ']) {
                return Err(format!(
                    "must be an absolute path such as \"/apis/apps/v1/namespaces/default/deployments/web\" (starting with '/', without '?', '#' or spaces), not \"{value}\""
                ).into());
            }
        }
        ParamKind::Status => {
            if !value.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c))
                || !value.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(format!(
                    "must be an HTTP status code from 100 to 599, such as \"200\", not \"{value}\""
                )
                .into());
            }
        }
        ParamKind::Duration => {
            if !is_cel_duration(value) {
                return Err(format!(
                    "must be a duration such as \"5m\", \"90s\" or \"1h30m\" (numbers with units h, m, s, ms, us or ns, at most 2,562,047h, about 292 years), not \"{value}\""
                ).into());
            }
        }
        ParamKind::Address => {
            let well_formed = !value.contains(['/', '?', '#', '@', '\\', ' '])
                && url::Url::parse(&format!("tcp://{value}")).is_ok_and(|u| {
                    u.host_str().is_some_and(|h| !h.is_empty())
                        && u.port().is_some()
                        && u.path().is_empty()
                });
            if !well_formed {
                return Err(format!(
                    "must be a host and a port such as \"db.internal:5432\" or \"[::1]:443\", not \"{value}\""
                )
                .into());
            }
        }
        ParamKind::Source => {
            if !value.is_empty() && !crate::engine::spec::is_source_name(value) {
                return Err(format!(
                    "must be the name of an event source ({}), or empty for none, not \"{value}\"",
                    crate::engine::spec::SOURCE_NAME_RULE
                )
                .into());
            }
        }
        ParamKind::Count => {
            if value.is_empty()
                || value.len() > 7
                || !value.bytes().all(|b| b.is_ascii_digit())
                || value.parse::<u32>().is_ok_and(|n| n > 1_000_000)
            {
                return Err(format!(
                    "must be a whole number from 0 to 1000000, such as \"14\", not \"{value}\""
                )
                .into());
            }
        }
        ParamKind::BaseUrl | ParamKind::Url => {
            let url = url::Url::parse(value).map_err(|e| {
                format!("is not an absolute URL ({e}); write e.g. \"https://api.example.com\"")
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                return Err(
                    format!("must be an http or https URL with a host, not \"{value}\"").into(),
                );
            }
            if !url.username().is_empty() || url.password().is_some() {
                return Err("carries credentials; put them in target.headers instead".into());
            }
            if kind == ParamKind::BaseUrl && (url.query().is_some() || url.fragment().is_some()) {
                return Err(
                    "must be a base URL without a query or fragment (the preset appends its own path)"
                        .into(),
                );
            }
        }
    }
    Ok(())
}

/// Whether `value` is a duration CEL's `duration()` accepts and can hold: `0`, or
/// one or more of digits (with an optional fraction) and a unit, adding up to what
/// the `cel` crate's `duration()` holds: an `i64` count of nanoseconds, so at most
/// 9,223,372,036 whole seconds (2,562,047 hours, about 292 years). Written here
/// because the `cel` crate keeps its parser private; this is its grammar without
/// the sign.
fn is_cel_duration(value: &str) -> bool {
    // i64::MAX nanoseconds is 9,223,372,036.85 s; the whole seconds below it leave
    // room for the sum's rounding.
    const MAX_SECONDS: f64 = 9_223_372_036.0;
    if value == "0" {
        return true;
    }
    if value.is_empty() {
        return false;
    }
    let mut rest = value;
    let mut seconds = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(digits);
        let well_formed = match number.split_once('.') {
            Some((whole, frac)) => {
                !whole.is_empty()
                    && !frac.is_empty()
                    && whole.bytes().all(|b| b.is_ascii_digit())
                    && frac.bytes().all(|b| b.is_ascii_digit())
            }
            None => !number.is_empty(),
        };
        let Some(n) = number.parse::<f64>().ok().filter(|_| well_formed) else {
            return false;
        };
        let (unit, tail) = if let Some(t) = after.strip_prefix("ms") {
            (1e-3, t)
        } else if let Some(t) = after.strip_prefix("us") {
            (1e-6, t)
        } else if let Some(t) = after.strip_prefix("ns") {
            (1e-9, t)
        } else if let Some(t) = after.strip_prefix('h') {
            (3600.0, t)
        } else if let Some(t) = after.strip_prefix('m') {
            (60.0, t)
        } else if let Some(t) = after.strip_prefix('s') {
            (1.0, t)
        } else {
            return false;
        };
        seconds += n * unit;
        rest = tail;
    }
    seconds <= MAX_SECONDS
}

/// The JSON Schema of the values [`check_value`] takes for `kind`, as the served
/// OpenAPI document states them: never stricter than `check_value` (a value it
/// takes is always valid here), and as strict as a pattern can say, so that a
/// value valid here is mostly one it takes. Numbers and booleans are taken as
/// their text. (Lengths are bytes there and characters here.)
pub(super) fn value_schema(kind: ParamKind) -> Value {
    use serde_json::json;
    // `char::is_control`: C0, DEL and C1.
    const TEXT: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]+$";
    let text =
        |types: Value| json!({"type": types, "minLength": 1, "maxLength": 2048, "pattern": TEXT});
    match kind {
        ParamKind::Segment => text(json!(["string", "number", "boolean"])),
        ParamKind::BaseUrl | ParamKind::Url => text(json!("string")),
        ParamKind::Path => json!({
            "type": "string",
            "maxLength": 2048,
            "pattern": "^/[^?# \\u0000-\\u001F\\u007F-\\u009F]*$"
        }),
        ParamKind::Status => json!({
            "type": ["string", "integer"],
            "pattern": "^[1-5][0-9][0-9]$",
            "minimum": 100,
            "maximum": 599
        }),
        ParamKind::Address => json!({
            "type": "string",
            "maxLength": 2048,
            "pattern": "^[^/?#@\\\\ \\u0000-\\u001F\\u007F-\\u009F]+:[0-9]+$"
        }),
        ParamKind::Source => json!({
            "type": "string",
            "pattern": "^([a-z0-9][a-z0-9._-]{0,63})?$"
        }),
        ParamKind::Count => json!({
            "type": ["string", "integer"],
            "pattern": "^[0-9]{1,7}$",
            "minimum": 0,
            "maximum": 1_000_000
        }),
        ParamKind::Duration => json!({"anyOf": [
            {"type": "string", "pattern": "^(0|([0-9]+(\\.[0-9]+)?(h|m|s|ms|us|ns))+)$"},
            {"type": "integer", "minimum": 0, "maximum": 0}
        ]}),
    }
}

impl super::Preset {
    /// The JSON Schema of a request that names this preset, as far as the preset
    /// decides it: `preset` is its name, and `params` holds each parameter it
    /// requires and none it does not know, each as [`value_schema`] says.
    pub fn request_schema(&self) -> Value {
        use serde_json::{Map, json};
        let properties: Map<String, Value> = self
            .params
            .iter()
            .map(|(name, p)| (name.clone(), value_schema(p.kind)))
            .collect();
        let required: Vec<&String> = self
            .params
            .iter()
            .filter(|(_, p)| p.required)
            .map(|(name, _)| name)
            .collect();
        let mut params = json!({
            "type": if required.is_empty() { json!(["object", "null"]) } else { json!("object") },
            "additionalProperties": false,
            "properties": properties,
        });
        let mut request = json!({"properties": {"preset": {"const": self.name}}});
        if !required.is_empty() {
            params["required"] = json!(required);
            request["required"] = json!(["params"]);
        }
        request["properties"]["params"] = params;
        request
    }
}

/// The parts of a template string: literal text and placeholders.
enum Part<'a> {
    Text(Cow<'a, str>),
    Param(&'a str),
}

fn parse_template(s: &str) -> Result<Vec<Part<'_>>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = s;
    while let Some(i) = rest.find(['{', '}']) {
        text.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            text.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            text.push('}');
            rest = after;
        } else if tail.starts_with('}') {
            return Err(format!(
                "has a lone '}}' in \"{s}\"; write \"}}}}\" for a literal brace"
            ));
        } else {
            let end = tail.find('}').ok_or_else(|| {
                format!("has an unclosed '{{' in \"{s}\"; write \"{{{{\" for a literal brace")
            })?;
            let name = &tail[1..end];
            if !is_param_name(name) {
                return Err(format!(
                    "has \"{{{name}}}\" in \"{s}\", which is no parameter placeholder; write \"{{{{\" for a literal brace"
                ));
            }
            if !text.is_empty() {
                parts.push(Part::Text(Cow::Owned(std::mem::take(&mut text))));
            }
            parts.push(Part::Param(name));
            rest = &tail[end + 1..];
        }
    }
    text.push_str(rest);
    if !text.is_empty() {
        parts.push(Part::Text(Cow::Owned(text)));
    }
    Ok(parts)
}

pub(super) fn collect_placeholders(v: &Value, out: &mut Vec<String>) -> Result<(), PresetError> {
    match v {
        Value::String(s) => {
            for part in parse_template(s)? {
                if let Part::Param(p) = part
                    && !out.iter().any(|x| x == p)
                {
                    out.push(p.to_string());
                }
            }
        }
        Value::Array(items) => {
            for i in items {
                collect_placeholders(i, out)?;
            }
        }
        Value::Object(m) => {
            for i in m.values() {
                collect_placeholders(i, out)?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Where a template string sits, which decides how values are written into it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Url,
    JsonPath,
    /// A CEL expression: values go into single-quoted string literals.
    Cel,
    Plain,
}

pub(super) fn fill(
    v: &Value,
    at: &str,
    params: &BTreeMap<String, Param>,
    values: &HashMap<String, String>,
) -> Value {
    match v {
        Value::String(s) => {
            let context = if at == "target.url" {
                Context::Url
            } else if (at == "state" || at == "error") && s.starts_with('$') {
                Context::JsonPath
            } else if at == "success_condition" || at == "failure_condition" {
                Context::Cel
            } else {
                Context::Plain
            };
            // Templates were checked at load, so they parse.
            let parts = parse_template(s).unwrap_or_default();
            let mut out = String::with_capacity(s.len());
            for part in parts {
                match part {
                    Part::Text(t) => out.push_str(&t),
                    Part::Param(name) => {
                        let value = values.get(name).map(String::as_str).unwrap_or_default();
                        let kind = params.get(name).map(|p| p.kind).unwrap_or_default();
                        match (context, kind) {
                            (Context::Url, ParamKind::Segment) => {
                                out.push_str(&encode_segment(value))
                            }
                            (_, ParamKind::BaseUrl) => out.push_str(value.trim_end_matches('/')),
                            (Context::JsonPath, _) => out.push_str(&escape_jsonpath(value)),
                            // A status or a count is digits (checked); anything else is text
                            // inside a '…' literal, and cannot end it.
                            (Context::Cel, ParamKind::Status | ParamKind::Count) => {
                                out.push_str(value)
                            }
                            (Context::Cel, _) => out.push_str(&escape_jsonpath(value)),
                            _ => out.push_str(value),
                        }
                    }
                }
            }
            Value::String(out)
        }
        Value::Array(items) => {
            Value::Array(items.iter().map(|i| fill(i, at, params, values)).collect())
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, i)| !unasked(i, params, values))
                .map(|(k, i)| {
                    let here = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    (k.clone(), fill(i, &here, params, values))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Whether `v` is an object a `source` parameter left empty takes out: one of its
/// members is that parameter's placeholder, whole.
fn unasked(v: &Value, params: &BTreeMap<String, Param>, values: &HashMap<String, String>) -> bool {
    let Value::Object(m) = v else {
        return false;
    };
    m.values().any(|member| {
        let Some(name) = member
            .as_str()
            .and_then(|s| s.strip_prefix('{')?.strip_suffix('}'))
        else {
            return false;
        };
        params
            .get(name)
            .is_some_and(|p| p.kind == ParamKind::Source)
            && values.get(name).is_none_or(String::is_empty)
    })
}

/// Percent-encodes everything but RFC 3986's unreserved characters, so the value is
/// one path segment (or one query value) whatever it contains.
fn encode_segment(s: &str) -> String {
    use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
    const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    utf8_percent_encode(s, RESERVED).to_string()
}

/// Escapes a value for a single-quoted JSONPath string literal (RFC 9535).
fn escape_jsonpath(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\'', "\\'")
}
