//! What an event source does with a request to its hook URL before anything is
//! kept (docs/design.md §2.18): checks its signature by the source's kind, names
//! its delivery (replays of one delivery are one effect), reads its key, and
//! picks the headers a wait's `match` may read. Everything here is pure and
//! bounded by what it is given: a stranger's headers are parsed in one pass, at
//! most [`MAX_SIGNATURES`] signatures are tried, and a CEL key runs within its
//! budget.

use std::collections::BTreeMap;

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{KeyInit, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::engine::condition::{Budget, Condition, Vars};
use crate::engine::spec::MAX_KEY;
pub use crate::store::sources::Kind;

/// The largest event body a hook URL reads (1 MiB): larger is a `413`.
pub const MAX_EVENT_BODY: usize = 1024 * 1024;
/// The most signatures of one `webhook-signature` header tried.
pub const MAX_SIGNATURES: usize = 8;
/// How far a Standard Webhooks `webhook-timestamp` may be from now (5 minutes),
/// so that a captured event cannot be replayed once its delivery is forgotten.
pub const TOLERANCE_SECS: i64 = 300;
/// The longest delivery id taken.
pub const MAX_DELIVERY: usize = 255;
/// The most headers of an event kept for `match`, and the longest value kept.
pub const MAX_KEPT_HEADERS: usize = 64;
pub const MAX_HEADER_VALUE: usize = 1024;

/// Headers never kept with an event: credentials and signatures.
const UNKEPT: &[&str] = &[
    "authorization",
    "cookie",
    "proxy-authorization",
    "x-hub-signature",
    "x-hub-signature-256",
    "webhook-signature",
];

/// A source's lookback window when none is named, and the longest one.
pub const DEFAULT_LOOKBACK: std::time::Duration = std::time::Duration::from_secs(300);
pub const MAX_LOOKBACK: std::time::Duration = std::time::Duration::from_secs(3600);

/// A source's `lookback` (`1s` to `1h`), or the end of a sentence saying why not.
pub fn lookback(text: &str) -> Result<std::time::Duration, String> {
    match crate::engine::duration::parse(text) {
        Ok(d) if d >= std::time::Duration::from_secs(1) && d <= MAX_LOOKBACK => Ok(d),
        Ok(_) => Err("must be from 1s to 1h".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The shortest and longest hook id an operator may choose: at least 22
/// characters of `A-Z a-z 0-9 _ -` are 128 bits and more.
pub const MIN_HOOK_ID: usize = 22;
pub const MAX_HOOK_ID: usize = 64;

/// Whether `id` is a hook id an operator may choose for a source of theirs.
pub fn is_hook_id(id: &str) -> bool {
    (MIN_HOOK_ID..=MAX_HOOK_ID).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Why an event is refused: the sentence of its `401`.
pub type Refusal = String;

/// The 32 bytes of `sha256=<64 hex digits>`, GitHub's `X-Hub-Signature-256`.
pub fn parse_github_signature(value: &str) -> Option<[u8; 32]> {
    let hex_part = value.trim().strip_prefix("sha256=")?;
    if hex_part.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut out).ok()?;
    Some(out)
}

/// The `v1` signatures of a `webhook-signature` header (space-separated
/// `v1,<base64>`), at most [`MAX_SIGNATURES`]; other versions are skipped.
pub fn parse_webhook_signatures(value: &str) -> Vec<[u8; 32]> {
    value
        .split(' ')
        .filter(|s| !s.is_empty())
        .take(MAX_SIGNATURES)
        .filter_map(|s| {
            let b64 = s.strip_prefix("v1,")?;
            if b64.len() > 64 {
                return None;
            }
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            <[u8; 32]>::try_from(bytes).ok()
        })
        .collect()
}

/// Whether `secret` is one `kind` can sign with, or the sentence saying why not.
pub fn check_secret(kind: Kind, secret: &str) -> Result<(), String> {
    if secret.len() < 16 || secret.len() > 512 {
        return Err(
            "must be 16 to 512 characters: a signing secret shorter than 16 is guessable".into(),
        );
    }
    match kind {
        Kind::StandardWebhooks => match crate::engine::spec::secret_key(secret) {
            Some(k) if k.len() >= 16 => Ok(()),
            _ => Err("must be a Standard Webhooks secret: \"whsec_\" and the base64 of 16 to 64 random bytes (e.g. whsec_ and `openssl rand -base64 32`)".into()),
        },
        Kind::Github | Kind::Bearer => {
            if secret.chars().all(|c| c.is_ascii_graphic()) {
                Ok(())
            } else {
                Err("must be printable ASCII without spaces, as it is sent in a header or typed into GitHub's form".into())
            }
        }
    }
}

fn header<'h>(headers: &'h BTreeMap<String, String>, name: &str) -> Option<&'h str> {
    headers.get(name).map(String::as_str)
}

fn hmac(key: &[u8]) -> hmac::Hmac<Sha256> {
    hmac::Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length")
}

/// Checks an event's signature as its source's kind says; `headers` are the
/// request's, names lowercase.
pub fn verify(
    kind: Kind,
    secret: &str,
    headers: &BTreeMap<String, String>,
    body: &[u8],
    now: DateTime<Utc>,
) -> Result<(), Refusal> {
    match kind {
        Kind::Github => {
            let given = header(headers, "x-hub-signature-256")
                .ok_or("the event has no X-Hub-Signature-256 header; set the webhook's secret on GitHub to this source's")?;
            let given = parse_github_signature(given)
                .ok_or("X-Hub-Signature-256 is not \"sha256=\" and 64 hex digits")?;
            let mut mac = hmac(secret.as_bytes());
            mac.update(body);
            let want: [u8; 32] = mac.finalize().into_bytes().into();
            if bool::from(want.ct_eq(&given)) {
                Ok(())
            } else {
                Err("X-Hub-Signature-256 does not match the body under this source's secret".into())
            }
        }
        Kind::StandardWebhooks => {
            let id = header(headers, "webhook-id").ok_or("the event has no webhook-id header")?;
            let ts = header(headers, "webhook-timestamp")
                .ok_or("the event has no webhook-timestamp header")?;
            let sigs = header(headers, "webhook-signature")
                .ok_or("the event has no webhook-signature header")?;
            let at: i64 = ts
                .trim()
                .parse()
                .map_err(|_| "webhook-timestamp is not whole seconds since 1970".to_string())?;
            if (now.timestamp() - at).abs() > TOLERANCE_SECS {
                return Err(format!(
                    "webhook-timestamp is more than {TOLERANCE_SECS} s from this server's clock; a signed event is taken only when fresh"
                ));
            }
            let key = crate::engine::spec::secret_key(secret).unwrap_or_default();
            let mut mac = hmac(&key);
            mac.update(id.as_bytes());
            mac.update(b".");
            mac.update(ts.trim().as_bytes());
            mac.update(b".");
            mac.update(body);
            let want: [u8; 32] = mac.finalize().into_bytes().into();
            let given = parse_webhook_signatures(sigs);
            if given.iter().any(|g| bool::from(want.ct_eq(g))) {
                Ok(())
            } else {
                Err("no v1 signature in webhook-signature matches the event under this source's secret".into())
            }
        }
        Kind::Bearer => {
            let given = header(headers, "authorization")
                .and_then(|v| {
                    let (scheme, token) = v.trim().split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
                })
                .ok_or("send this source's secret as \"Authorization: Bearer <secret>\"")?;
            // Compare the hashes: equal length, constant time.
            let (a, b) = (
                Sha256::digest(given.as_bytes()),
                Sha256::digest(secret.as_bytes()),
            );
            if bool::from(a.ct_eq(&b)) {
                Ok(())
            } else {
                Err("the bearer token is not this source's secret".into())
            }
        }
    }
}

/// The delivery id of an accepted event: what makes a replay one effect.
pub fn delivery_id(
    kind: Kind,
    headers: &BTreeMap<String, String>,
    body: &[u8],
) -> Result<String, String> {
    let named = match kind {
        Kind::Github => header(headers, "x-github-delivery").map(|v| ("X-GitHub-Delivery", v)),
        Kind::StandardWebhooks => header(headers, "webhook-id").map(|v| ("webhook-id", v)),
        Kind::Bearer => header(headers, "idempotency-key").map(|v| ("Idempotency-Key", v)),
    };
    match named {
        Some((name, v)) => {
            let v = v.trim();
            if v.is_empty() || v.len() > MAX_DELIVERY || !v.chars().all(|c| c.is_ascii_graphic()) {
                return Err(format!(
                    "{name} must be 1 to {MAX_DELIVERY} printable ASCII characters without spaces"
                ));
            }
            Ok(v.to_string())
        }
        None => Ok(format!("sha256:{}", hex::encode(Sha256::digest(body)))),
    }
}

/// How a source reads an event's key: a JSON Pointer into the body, or a CEL
/// expression over `body` and `headers`.
#[derive(Clone, Debug)]
pub enum KeyFrom {
    Pointer(String),
    Cel(Condition),
}

/// The longest key extraction taken.
pub const MAX_KEY_FROM: usize = 1024;

impl KeyFrom {
    /// Reads a source's `key`; the error is the end of a sentence.
    pub fn parse(text: &str) -> Result<KeyFrom, String> {
        if text.is_empty() || text.len() > MAX_KEY_FROM {
            return Err(format!(
                "must be 1 to {MAX_KEY_FROM} bytes: a JSON Pointer such as \"/workflow_run/id\" or a CEL expression such as \"body.workflow_run.head_sha\""
            ));
        }
        if text.starts_with('/') {
            return Ok(KeyFrom::Pointer(text.to_string()));
        }
        Condition::compile_value(text)
            .map(KeyFrom::Cel)
            .map_err(|e| {
                format!(
                    "is neither a JSON Pointer (which starts with \"/\") nor a CEL expression: {e}"
                )
            })
    }

    /// The key of an event, or `None` when it has none: the pointer or the
    /// expression yields no string or number, or one longer than [`MAX_KEY`], or
    /// the expression fails or runs past its budget.
    pub fn extract(&self, body: &Value, headers: &BTreeMap<String, String>) -> Option<String> {
        let v = match self {
            KeyFrom::Pointer(p) => body.pointer(p)?.clone(),
            KeyFrom::Cel(c) => {
                let vars = Vars::for_conditions(&[c], Some(body), 200, headers, None);
                c.evaluate_value(&vars, &mut Budget::default()).ok()?
            }
        };
        let key = match v {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            _ => return None,
        };
        (!key.is_empty() && key.len() <= MAX_KEY && !key.contains('\0')).then_some(key)
    }
}

/// The headers of an event a `match` may read: names lowercase, credentials and
/// signatures left out, at most [`MAX_KEPT_HEADERS`], values cut at
/// [`MAX_HEADER_VALUE`] bytes.
pub fn kept_headers(headers: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter(|(k, _)| !UNKEPT.contains(&k.as_str()))
        .take(MAX_KEPT_HEADERS)
        .map(|(k, v)| {
            let mut end = v.len().min(MAX_HEADER_VALUE);
            while !v.is_char_boundary(end) {
                end -= 1;
            }
            (k.clone(), v[..end].to_string())
        })
        .collect()
}
