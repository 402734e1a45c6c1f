//! A wait's target: the URL, its headers, whether its polls may be shared and
//! its own TLS settings, and how a request's `target` is read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::{Auth, parse_auth};
use super::method::{Method, parse_method};
use super::schema;
use super::tls::{Tls, parse_tls};
use super::{Errors, Limits, REDACTED, opt, type_name};

/// What to poll.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// An http or https URL (at most 2048 bytes; no credentials in it), or
    /// `tcp://host:port` or `tls://host:port`: a connection (and its handshake)
    /// is then the whole observation; or `grpc://host:port[/package.Service]`:
    /// a gRPC health check; or `dns://name?type=TYPE`: a question to a DNS
    /// resolver.
    #[schema(value_type = schema::PollUrl)]
    pub url: String,
    /// Request headers (at most 32). Values are secrets: every read shows them as
    /// `<redacted>` ([`Spec::redacted`]).
    #[serde(default)]
    #[schema(value_type = Option<schema::Headers>)]
    pub headers: BTreeMap<String, String>,
    /// The request method, default GET. Any other method sends a new
    /// `Idempotency-Key` with each poll, and its polls are never shared.
    #[serde(default, skip_serializing_if = "Method::is_get")]
    #[schema(value_type = Option<Method>)]
    pub method: Method,
    /// The request body (at most 16 KiB), only with a method other than GET: a
    /// string is sent as it is (`Content-Type: text/plain; charset=utf-8` unless
    /// `headers` name one), any other JSON value as JSON (`application/json`).
    /// It is shown back: keep secrets in `headers`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// Whether this wait's polls may be shared with the tenant's other waits that
    /// send the identical request (method, URL, every header, the same `tls`),
    /// or make the same probe of a tcp, tls, grpc or dns target, default true;
    /// `false` sends a request of its own at each poll.
    #[serde(default = "share_default", skip_serializing_if = "is_share_default")]
    #[schema(value_type = Option<bool>)]
    pub share: bool,
    /// A credential waitd obtains itself and sends as `Authorization` with every
    /// poll (then `headers` cannot hold an `Authorization` of their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    /// The target's own certificate authorities and client certificate; without
    /// it, the platform's verifier and no client certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<Tls>,
}

/// The name [`Target::secrets`] seals `tls.client_key` under.
const CLIENT_KEY: &str = ":tls.client_key";

impl Target {
    /// Every secret of the target as it is sealed at rest: the header values, and
    /// each write-only field under a name that starts with `:`, which no header
    /// name can.
    pub fn secrets(&self) -> BTreeMap<String, String> {
        let mut sealed = self.headers.clone();
        if let Some(auth) = &self.auth {
            auth.seal_into(&mut sealed);
        }
        if let Some(key) = self.tls.as_ref().and_then(|t| t.client_key.clone()) {
            sealed.insert(CLIENT_KEY.to_string(), key);
        }
        sealed
    }

    /// Puts back what [`Target::secrets`] gave to be sealed.
    pub fn restore_secrets(&mut self, mut sealed: BTreeMap<String, String>) {
        if let Some(auth) = &mut self.auth {
            auth.restore_from(&sealed);
        }
        // A key that is not there stays `<redacted>`, which no poll can use: a
        // wait never goes out without its client certificate.
        if let (Some(tls), Some(key)) = (&mut self.tls, sealed.remove(CLIENT_KEY)) {
            tls.client_key = Some(key);
        }
        sealed.retain(|name, _| !name.starts_with(':'));
        self.headers = sealed;
    }

    /// Every secret of the target reads [`REDACTED`].
    pub fn redact(&mut self) {
        for v in self.headers.values_mut() {
            *v = REDACTED.to_string();
        }
        if let Some(auth) = &mut self.auth {
            auth.redact();
        }
        if let Some(key) = self.tls.as_mut().and_then(|t| t.client_key.as_mut()) {
            *key = REDACTED.to_string();
        }
    }
}

fn share_default() -> bool {
    true
}

fn is_share_default(share: &bool) -> bool {
    *share
}

/// Headers waitd sets itself, or that would change the meaning of the request.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "expect",
];

pub(super) fn parse_target(
    v: Option<&Value>,
    limits: &Limits,
    errs: &mut Errors,
) -> Option<Target> {
    let obj = match v {
        None | Some(Value::Null) => {
            errs.push(
                "target",
                "is required: {\"url\": \"https://…\", \"headers\": {…}}",
            );
            return None;
        }
        Some(Value::Object(o)) => o,
        Some(other) => {
            errs.push(
                "target",
                format!("must be an object with a url, not {}", type_name(other)),
            );
            return None;
        }
    };
    errs.unknown(
        obj,
        "target",
        &["url", "headers", "method", "body", "share", "auth", "tls"],
    );
    let share = match opt(obj, "share") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            errs.push(
                "target.share",
                format!("must be true or false, not {}", type_name(other)),
            );
            true
        }
    };
    let url = match obj.get("url") {
        None | Some(Value::Null) => {
            errs.push("target.url", "is required: the http or https URL to poll");
            None
        }
        Some(Value::String(s)) if let Some(kind) = super::tcp::kind_of(v) => {
            super::tcp::refuse_http_fields(kind, obj, errs);
            super::tcp::check_tcp_url(kind, s, limits, errs)
        }
        Some(Value::String(s)) => check_url("target.url", s, limits, errs),
        Some(other) => {
            errs.push(
                "target.url",
                format!("must be a string, not {}", type_name(other)),
            );
            None
        }
    };
    let mut headers = BTreeMap::new();
    match opt(obj, "headers") {
        None => {}
        Some(Value::Object(h)) => {
            if h.len() > limits.max_headers {
                errs.push(
                    "target.headers",
                    format!(
                        "has {} headers; the limit is {}",
                        h.len(),
                        limits.max_headers
                    ),
                );
            } else {
                for (name, value) in h {
                    // Never echo a header value: it may be a secret.
                    // Nor an invalid name: someone may have written the whole header,
                    // secret and all, as the name.
                    if name.is_empty() || name.len() > 64 || !name.bytes().all(is_token_byte) {
                        errs.push(
                            "target.headers",
                            "has a name that is not a valid header name (1 to 64 of letters, digits and !#$%&'*+-.^_`|~); \
                             write {\"Name\": \"value\"}, e.g. {\"Authorization\": \"Bearer …\"}",
                        );
                        continue;
                    }
                    let field = format!("target.headers.{name}");
                    if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                        errs.push(&field, "is set by waitd itself and cannot be given");
                        continue;
                    }
                    let Value::String(value) = value else {
                        errs.push(
                            &field,
                            format!("must be a string, not {}", type_name(value)),
                        );
                        continue;
                    };
                    if name.len() + value.len() > limits.max_header_len {
                        errs.push(
                            &field,
                            format!(
                                "is longer than the limit of {} bytes",
                                limits.max_header_len
                            ),
                        );
                        continue;
                    }
                    if value.bytes().any(|b| (b < 0x20 && b != b'\t') || b == 0x7f) {
                        errs.push(&field, "has a control character (such as CR or LF) in its value, which HTTP does not allow");
                        continue;
                    }
                    if headers
                        .keys()
                        .any(|k: &String| k.eq_ignore_ascii_case(name))
                    {
                        errs.push(&field, "is given twice (header names are case-insensitive)");
                        continue;
                    }
                    headers.insert(name.clone(), value.clone());
                }
            }
        }
        Some(other) => errs.push(
            "target.headers",
            format!(
                "must be an object of name → value strings, not {}",
                type_name(other)
            ),
        ),
    }
    let auth = opt(obj, "auth").and_then(|v| parse_auth(v, limits, errs));
    if auth.is_some()
        && let Some(name) = headers
            .keys()
            .find(|k| k.eq_ignore_ascii_case("authorization"))
    {
        errs.push(
            &format!("target.headers.{name}"),
            "is set from target.auth at every poll; remove this header or target.auth",
        );
    }
    let tls = parse_tls(opt(obj, "tls"), url.as_deref(), errs);
    let (method, body) = parse_method(obj, headers.keys().cloned(), errs);
    url.map(|url| Target {
        url,
        headers,
        method,
        body,
        share,
        auth,
        tls,
    })
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub(super) fn check_url(
    field: &str,
    s: &str,
    limits: &Limits,
    errs: &mut Errors,
) -> Option<String> {
    if s.len() > limits.max_url_len {
        errs.push(
            field,
            format!(
                "is {} bytes long; the limit is {}",
                s.len(),
                limits.max_url_len
            ),
        );
        return None;
    }
    if let Err(why) = check_url_text(s) {
        errs.push(field, why);
        return None;
    }
    let url = match url::Url::parse(s) {
        Ok(u) => u,
        Err(e) => {
            errs.push(field, format!("is not a valid absolute URL ({e}); write e.g. \"https://api.example.com/servers/1\""));
            return None;
        }
    };
    if !matches!(url.scheme(), "http" | "https") {
        errs.push(
            field,
            format!(
                "uses the scheme \"{}\"; only http and https are supported",
                url.scheme()
            ),
        );
        return None;
    }
    if url.host().is_none() {
        errs.push(field, "has no host");
        return None;
    }
    if !url.username().is_empty() || url.password().is_some() {
        errs.push(field, "carries credentials; put them in target.headers (for example an Authorization header), which are never shown back; a webhook authenticates by its signature instead");
        return None;
    }
    let mut url = url;
    url.set_fragment(None);
    Some(url.to_string())
}

/// The URL as written, before the parser gets to normalise it: WHATWG parsing
/// would read `http:///x` as `http://x/`, `http:x` as `http://x/`, a backslash as a
/// slash and drop tabs and newlines, so a URL could quietly mean another host than
/// the one its author sees. Those forms are refused instead.
fn check_url_text(s: &str) -> Result<(), &'static str> {
    if let Some(b) = s.bytes().find(|b| *b <= 0x20 || *b == 0x7f) {
        return Err(if b == b' ' {
            "contains a space; percent-encode it (%20)"
        } else {
            "contains a control character (such as a tab, a newline or NUL); percent-encode it or remove it"
        });
    }
    if s.contains('\\') {
        return Err(
            "contains a backslash, which URL parsers read as \"/\"; write %5C if you mean a backslash",
        );
    }
    let lower = s.to_ascii_lowercase();
    let Some(rest) = ["http:", "https:"]
        .iter()
        .find_map(|scheme| lower.strip_prefix(scheme))
    else {
        // Another scheme, or none: the parser's own answer names it.
        return Ok(());
    };
    let Some(after) = rest.strip_prefix("//") else {
        return Err(
            "must start with http:// or https:// followed by the host, e.g. \"https://api.example.com/servers/1\"",
        );
    };
    let authority = after.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err(
            "has no host: after \"://\" comes the host, e.g. \"https://api.example.com/servers/1\"",
        );
    }
    Ok(())
}
