//! A `tcp://host:port` target: a connection is the whole observation, so the
//! URL has a host and a port and nothing else, and nothing of an HTTP request
//! goes with it.

use serde_json::{Map, Value};

use super::{Errors, Limits, opt};

/// The kind of target the request's `target.url` names other than HTTP:
/// `tcp`, `tls`, `grpc` (`tcp://…`, `tls://…`, `grpc://…`, any case) or `dns`
/// (`dns:…`, so that a URL without the slashes hears of the one form); `None`
/// for an http target.
pub(super) fn kind_of(target: Option<&Value>) -> Option<&'static str> {
    let url = target.and_then(|t| t.get("url")).and_then(Value::as_str)?;
    if url.get(..4).is_some_and(|s| s.eq_ignore_ascii_case("dns:")) {
        return Some("dns");
    }
    ["tcp", "tls", "grpc"].into_iter().find(|kind| {
        url.get(..kind.len() + 3)
            .is_some_and(|s| s.eq_ignore_ascii_case(&format!("{kind}://")))
    })
}

/// `target.url` of a TCP target: `tcp://host:port`, written back in its
/// normal form.
pub(super) fn check_tcp_url(
    kind: &str,
    s: &str,
    limits: &Limits,
    errs: &mut Errors,
) -> Option<String> {
    const FIELD: &str = "target.url";
    if kind == "dns" {
        return super::dns::check_dns_url(s, limits, errs);
    }
    let example = if kind == "grpc" {
        "write grpc://HOST:PORT, or grpc://HOST:PORT/SERVICE for one service, e.g. \"grpc://api.internal:50051/shop.Orders\"".to_string()
    } else {
        format!("write {kind}://HOST:PORT, e.g. \"{kind}://db.internal:5432\"")
    };
    let example = example.as_str();
    if s.len() > limits.max_url_len {
        errs.push(
            FIELD,
            format!(
                "is {} bytes long; the limit is {}",
                s.len(),
                limits.max_url_len
            ),
        );
        return None;
    }
    if s.bytes().any(|b| b <= 0x20 || b == 0x7f || b == b'\\') {
        errs.push(
            FIELD,
            format!("contains a space, a control character or a backslash; {example}"),
        );
        return None;
    }
    let url = match url::Url::parse(s) {
        Ok(u) => u,
        Err(e) => {
            errs.push(
                FIELD,
                format!("is not a valid tcp:// address ({e}); {example}"),
            );
            return None;
        }
    };
    let problem = if url.host_str().is_none_or(str::is_empty) {
        Some("has no host")
    } else if url.port().is_none() {
        Some("has no port")
    } else if !url.username().is_empty() || url.password().is_some() {
        Some("carries credentials, which a connection cannot send")
    } else if url.query().is_some() || url.fragment().is_some() {
        Some("has a query or a fragment, which a connection cannot send")
    } else if kind != "grpc" && !matches!(url.path(), "" | "/") {
        Some("has a path, which a connection cannot send")
    } else if kind == "grpc" && !service_name(url.path().trim_start_matches('/')) {
        Some(
            "names a service that is not a gRPC service name (letters, digits, '_' and '.', at most 200)",
        )
    } else {
        None
    };
    if let Some(problem) = problem {
        errs.push(FIELD, format!("{problem}; {example}"));
        return None;
    }
    // The host as an http URL would read it, so that an address written
    // another way (`0x7f.1`, `2130706433`) is the address the guard judges.
    let port = url.port().unwrap_or_default();
    let host = url.host_str().unwrap_or_default();
    match url::Url::parse(&format!("http://{host}:{port}/")) {
        Ok(http) => Some(format!(
            "{kind}://{}:{port}{}",
            http.host_str().unwrap_or_default(),
            match url.path().trim_start_matches('/') {
                "" => String::new(),
                service => format!("/{service}"),
            }
        )),
        Err(e) => {
            errs.push(
                FIELD,
                format!("has a host that is not valid ({e}); {example}"),
            );
            None
        }
    }
}

/// A gRPC service's full name (`package.Service`), or "" for the server as a
/// whole.
fn service_name(s: &str) -> bool {
    s.len() <= 200
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// The fields of `target` that only an HTTP request has, refused on a TCP
/// target by name.
pub(super) fn refuse_http_fields(kind: &str, obj: &Map<String, Value>, errs: &mut Errors) {
    for name in ["headers", "method", "body", "auth", "tls"] {
        // A tls:// target may name the authorities its chain must verify to.
        if kind == "tls" && name == "tls" {
            continue;
        }
        // `{}` is how a target without headers reads back.
        let empty = matches!(opt(obj, name), Some(Value::Object(o)) if o.is_empty());
        if opt(obj, name).is_some() && !(name == "headers" && empty) {
            let does = if kind == "dns" {
                "only asks a resolver"
            } else {
                "only connects"
            };
            errs.push(
                &format!("target.{name}"),
                format!("is part of an HTTP request, and a {kind}:// target {does}; remove it"),
            );
        }
    }
}
