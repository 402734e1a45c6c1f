//! A target whose polls are not GETs: the method and body each request carries,
//! and the `Idempotency-Key` that is new at each poll, so that a target which
//! keeps keys knows a poll retried from one that is new.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request};

use crate::engine::Spec;
use crate::engine::spec::{self, body_bytes, body_content_type};
use crate::outbound::Body;

/// The header a poll of a method other than GET carries, new at each poll.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// What a poll sends besides a GET's: kept boxed in the target, as most targets
/// have none.
#[derive(Debug)]
pub(super) struct Sent {
    method: Method,
    /// Empty without a body.
    body: Bytes,
}

/// The method and body of the spec's target, when it is not a plain GET; a body
/// adds its `Content-Type` to `headers` unless they have one.
pub(super) fn sent(spec: &Spec, headers: &mut HeaderMap) -> Option<Box<Sent>> {
    let target = spec.target.as_ref()?;
    let method = match target.method {
        spec::Method::Get => return None,
        spec::Method::Post => Method::POST,
        spec::Method::Put => Method::PUT,
        spec::Method::Patch => Method::PATCH,
        spec::Method::Delete => Method::DELETE,
    };
    let body = match &target.body {
        Some(b) => {
            if !headers.contains_key(CONTENT_TYPE) {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static(body_content_type(b)));
            }
            Bytes::from(body_bytes(b))
        }
        None => Bytes::new(),
    };
    Some(Box::new(Sent { method, body }))
}

/// Makes `request` (a GET without a body) the target's: its method, its body and
/// a new `Idempotency-Key`.
pub(super) fn apply(sent: &Sent, request: &mut Request<Body>) {
    *request.method_mut() = sent.method.clone();
    *request.body_mut() = Body::new(sent.body.clone());
    let key = uuid::Uuid::now_v7().to_string();
    if let Ok(value) = HeaderValue::from_str(&key) {
        request.headers_mut().insert(IDEMPOTENCY_KEY, value);
    }
}
