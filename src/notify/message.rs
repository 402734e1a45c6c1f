//! A delivery's message in the Standard Webhooks format: its body and its
//! signature.

use base64::Engine;
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

use crate::store::Due;

/// The `webhook-signature` of a message: `v1,` and the base64 HMAC-SHA256 of
/// `{id}.{timestamp}.{body}` under the secret's key.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// The body of a delivery: `type` (`wait.` and the event's kind), `timestamp` (the
/// event's time), `data` (the wait as it stands when sent) and `event` (the event it
/// announces: its `seq`, `kind`, `at` and fields).
pub fn payload(due: &Due) -> Vec<u8> {
    let mut event = serde_json::to_value(&due.event).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut event {
        o.remove("id");
    }
    let body = json!({
        "type": format!("wait.{}", due.event.kind()),
        "timestamp": due.event.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": due.wait,
        "event": event,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}
