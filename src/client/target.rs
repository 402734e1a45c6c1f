//! The flags that name a wait's target (`--url`, `--tcp`, `--tls`, `--grpc`,
//! `--dns` with `--type`) and the ones laid over it (`--ca`, `--server-name`,
//! `--method`, `--data`), into the request's `target`.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::Problem;
use super::request::{SpecArgs, read_bounded, take_object};

/// `target.url` from the flag that names it, if one does.
pub(super) fn url_of(a: &SpecArgs) -> Result<Option<String>, Problem> {
    Ok(match (&a.url, &a.tcp, &a.tls) {
        (Some(url), _, _) => Some(url.clone()),
        (_, Some(address), _) => Some(format!("tcp://{}", host_port("--tcp", address)?)),
        (_, _, Some(address)) => Some(format!("tls://{}", host_port("--tls", address)?)),
        _ if a.dns.is_some() => a.dns.as_ref().map(|name| match &a.record_type {
            Some(t) => format!("dns://{name}?type={t}"),
            None => format!("dns://{name}"),
        }),
        _ => match &a.grpc {
            Some(address) => {
                let (at, service) = address.split_once('/').unwrap_or((address, ""));
                let at = host_port("--grpc", at)?;
                Some(if service.is_empty() {
                    format!("grpc://{at}")
                } else {
                    format!("grpc://{at}/{service}")
                })
            }
            None => None,
        },
    })
}

/// `--tcp` or `--tls` HOST:PORT, checked enough to name the flag; the validator
/// judges the rest (as target.url).
fn host_port<'a>(flag: &str, address: &'a str) -> Result<&'a str, Problem> {
    let shown: String = address.chars().take(100).collect();
    let has_port = address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if address.contains("://") || address.contains('/') || !has_port {
        return Err(format!(
            "{flag} takes HOST:PORT, e.g. {flag} db.internal:5432 or {flag} [::1]:443, not \"{shown}\""
        )
        .into());
    }
    Ok(address)
}

/// `--ca`, `--server-name`, `--method` and `--data` into the request's target.
pub(super) fn add_target_flags(req: &mut Map<String, Value>, a: &SpecArgs) -> Result<(), Problem> {
    use crate::engine::spec::{MAX_BODY, tls::MAX_PEM_LEN};
    if a.ca.is_none() && a.server_name.is_none() && a.method.is_none() && a.data.is_none() {
        return Ok(());
    }
    let mut target = take_object(req, "target");
    if a.ca.is_some() || a.server_name.is_some() {
        let mut tls = take_object(&mut target, "tls");
        if let Some(path) = &a.ca {
            let pem = read_bounded(path, MAX_PEM_LEN, "a PEM file of certificate authorities")
                .map_err(|Problem(e)| format!("--ca: {e}"))?;
            tls.insert("ca".into(), json!(pem));
        }
        if let Some(name) = &a.server_name {
            tls.insert("server_name".into(), json!(name));
        }
        target.insert("tls".into(), Value::Object(tls));
    }
    if let Some(m) = &a.method {
        let upper = m.to_ascii_uppercase();
        if !["GET", "POST", "PUT", "PATCH", "DELETE"].contains(&upper.as_str()) {
            let shown: String = m.chars().take(16).collect();
            return Err(
                format!("--method takes GET, POST, PUT, PATCH or DELETE, not \"{shown}\"").into(),
            );
        }
        target.insert("method".into(), json!(upper));
    }
    if let Some(data) = &a.data {
        let text = match data.strip_prefix('@') {
            Some(path) => read_bounded(Path::new(path), MAX_BODY, "a request body")
                .map_err(|Problem(e)| format!("--data: {e}"))?,
            None => data.clone(),
        };
        if text.len() > MAX_BODY {
            return Err(format!(
                "--data is {} bytes long; a body is at most {MAX_BODY}",
                text.len()
            )
            .into());
        }
        if target.get("method").and_then(Value::as_str) == Some("GET") {
            return Err(
                "--data is sent only with another method than GET: give --method POST, PUT, PATCH or DELETE"
                    .into(),
            );
        }
        target.entry("method").or_insert_with(|| json!("POST"));
        let body = match serde_json::from_str::<Value>(&text) {
            Ok(v @ (Value::Object(_) | Value::Array(_))) => v,
            _ => json!(text),
        };
        target.insert("body".into(), body);
    }
    req.insert("target".into(), Value::Object(target));
    Ok(())
}
