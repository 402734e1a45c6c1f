//! A target's request method and body: a GET by default; another method, and a
//! body, only when the wait says so.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Errors, opt, type_name};

/// The largest `target.body`, in bytes as it is sent.
pub const MAX_BODY: usize = 16 * 1024;

/// The request method of a poll.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum Method {
    /// The default: a read that may be repeated and shared.
    #[default]
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

impl Method {
    /// The method's name as HTTP writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }

    /// Whether it is the default GET (then it is not written back).
    pub fn is_get(&self) -> bool {
        *self == Method::Get
    }
}

/// The body a poll sends: a string as its bytes, any other JSON value as JSON.
pub fn body_bytes(body: &Value) -> Vec<u8> {
    match body {
        Value::String(s) => s.as_bytes().to_vec(),
        other => serde_json::to_vec(other).unwrap_or_default(),
    }
}

/// The `Content-Type` a body goes with when the target's headers name none.
pub fn body_content_type(body: &Value) -> &'static str {
    match body {
        Value::String(_) => "text/plain; charset=utf-8",
        _ => "application/json",
    }
}

/// `target.method` and `target.body`, checked together: a body goes only with a
/// method other than GET, and a wait that sends one must not set the
/// `Idempotency-Key` that waitd sets at every poll.
pub(super) fn parse_method(
    obj: &Map<String, Value>,
    headers: impl Iterator<Item = String>,
    errs: &mut Errors,
) -> (Method, Option<Value>) {
    let mut understood = true;
    let method = match opt(obj, "method") {
        None => Method::Get,
        Some(Value::String(s)) => match s.to_ascii_uppercase().as_str() {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            _ => {
                errs.push(
                    "target.method",
                    format!(
                        "is \"{}\"; write one of GET, POST, PUT, PATCH or DELETE",
                        s.chars().take(16).collect::<String>().escape_debug()
                    ),
                );
                understood = false;
                Method::Get
            }
        },
        Some(other) => {
            errs.push(
                "target.method",
                format!(
                    "must be a string (GET, POST, PUT, PATCH or DELETE), not {}",
                    type_name(other)
                ),
            );
            understood = false;
            Method::Get
        }
    };
    let body = opt(obj, "body").cloned();
    if let Some(b) = &body {
        if method.is_get() && understood {
            let why = if opt(obj, "method").is_some() {
                "is sent only with another method than GET; set target.method to POST, PUT, PATCH or DELETE, or remove the body"
            } else {
                "needs target.method: a poll is a GET unless the wait says otherwise, e.g. \"method\": \"POST\""
            };
            errs.push("target.body", why);
        }
        let len = body_bytes(b).len();
        if len > MAX_BODY {
            errs.push(
                "target.body",
                format!("is {len} bytes long; the limit is {MAX_BODY}"),
            );
        }
    }
    if !method.is_get() {
        for name in headers {
            if name.eq_ignore_ascii_case("idempotency-key") {
                errs.push(
                    &format!("target.headers.{name}"),
                    "is set by waitd, a new one at each poll of a method other than GET; remove this header",
                );
            }
        }
    }
    (method, body)
}
