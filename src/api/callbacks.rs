//! `/callbacks/{secret}`: the URL a callback wait's create answer carries, and its
//! `/fail` and `/heartbeat` (docs/design.md §2.15). No API token: the secret is the
//! credential. A secret that names no wait is a `404` whatever it is, found by its
//! SHA-256 and compared in constant time; the secret is never logged or shown.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;

use axum::Extension;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;

use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::Value;

use super::error::{ApiError, ApiResult, Problem};
use super::extract::JsonBody;
use super::{AppState, json_response};
use crate::engine::{self, Context, Decision, End, EngineState, Outcome, Spec};
use crate::model::{Status, Wait};
use crate::store::callbacks::SecretHash;
use crate::store::{Callback, CallbackEnd};

/// The path a callback URL has, after the server's own address.
pub const PATH: &str = "/callbacks/";

/// The reason a successful callback records.
pub const SUCCEEDED: &str = "the callback reported success";
/// The reason a `/fail` callback records.
pub const FAILED: &str = "the callback reported a failure";

/// Complete a callback wait
///
/// Ends the wait `succeeded`, with the JSON body as its `output`. A wait with a
/// `state`, `success_condition` or `failure_condition` judges the body first
/// (`body` and `headers` in the conditions): it ends the wait `succeeded` or
/// `failed` as a polled response would, or else is progress (`202`, the state
/// read from it recorded). The first completion wins: a later one is a `409`
/// carrying the wait as it ended.
#[utoipa::path(
    post, path = "/callbacks/{secret}", tag = "callbacks", operation_id = "complete_callback",
    params(("secret" = String, Path, description = "The secret of the callback URL the create's answer carried")),
    security(()),
    request_body(content = serde_json::Value, content_type = "application/json"),
    responses(
        (status = 200, description = "The wait, ended by this callback", body = Wait),
        (status = 202, description = "The body met neither condition: the wait, still running, with the state read from it", body = Wait),
        (status = 400, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No callback wait has this URL", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The body could not be judged (its state path is absent, a condition failed to evaluate); the wait goes on", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests to callback URLs from this address", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
        (status = 408, description = "The body did not arrive within the server's body timeout", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The wait had already ended: the wait, as it ended", body = Wait),
        (status = 413, description = "Body over 64 KiB; the wait goes on", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn complete_callback(
    State(s): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(secret): Path<String>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let cb = find(&s, peer, &secret).await?;
    if !cb.judged {
        return finish(&s, &cb, &succeeded(SUCCEEDED.into(), &body)).await;
    }
    let wait = wait_of(&s, &cb).await?;
    if wait.status.is_end() {
        return Ok(json_response(StatusCode::CONFLICT, &wait));
    }
    let spec: Spec = serde_json::from_value(wait.spec.clone()).map_err(|e| {
        tracing::error!(wait = %cb.wait_id, error = %e, "a callback wait's spec does not read back");
        ApiError::internal()
    })?;
    let headers = crate::probe::header_map(&headers);
    let body = Arc::new(body);
    let read = Arc::clone(&body);
    let verdict = crate::cpu::pool()
        .run(crate::cpu::Lane::Long, &cb.tenant, move || {
            verdict(&spec, &read, &headers, Utc::now())
        })
        .await
        .map_err(|lost| {
            ApiError::unprocessable(format!(
                "the callback's body could not be judged: {lost}; the wait goes on"
            ))
        })?;
    match verdict {
        Verdict::End(o) if o.end == End::Succeeded => {
            finish(&s, &cb, &succeeded(o.reason, &body)).await
        }
        Verdict::End(o) => {
            let end = CallbackEnd {
                status: Status::Failed,
                reason: o.reason,
                error_detail: Some(
                    o.error_detail
                        .unwrap_or_else(|| crate::engine::bound::detail(&body)),
                ),
                output: None,
            };
            finish(&s, &cb, &end).await
        }
        Verdict::Progress(state) => {
            if let Some(state) = state {
                s.store
                    .callbacks()
                    .progress(&cb.tenant, cb.wait_id, &state, Utc::now())
                    .await?;
            }
            let wait = wait_of(&s, &cb).await?;
            let status = if wait.status.is_end() {
                StatusCode::CONFLICT
            } else {
                StatusCode::ACCEPTED
            };
            Ok(json_response(status, &wait))
        }
        Verdict::Unjudged(why) => Err(ApiError::unprocessable(format!(
            "the callback's body was not judged: {why}; the wait goes on"
        ))),
    }
}

/// Whether a callback wait's spec judges a callback's body, rather than let any
/// body end it.
pub(super) fn judges(spec: &Spec) -> bool {
    spec.state.is_some() || spec.success_condition.is_some() || spec.failure_condition.is_some()
}

/// The end of a callback that succeeded, with its body as the wait's output.
fn succeeded(reason: String, body: &Value) -> CallbackEnd {
    CallbackEnd {
        status: Status::Succeeded,
        reason,
        error_detail: None,
        output: Some(crate::engine::bound::output(body)),
    }
}

/// What a callback wait's state path and conditions make of a callback's body.
pub(super) enum Verdict {
    /// It ends the wait `succeeded` or `failed`.
    End(Outcome),
    /// It meets neither: the wait goes on, with the state read from it, if any.
    Progress(Option<String>),
    /// It could not be judged (the state path is not in it, a condition failed
    /// to evaluate): the wait goes on unchanged.
    Unjudged(String),
}

/// The engine's verdict on a callback's body, judged alone: a callback wait takes
/// neither `consecutive` nor `require_transition`, so no earlier callback counts.
pub(super) fn verdict(
    spec: &Spec,
    body: &Value,
    headers: &std::collections::BTreeMap<String, String>,
    now: chrono::DateTime<Utc>,
) -> Verdict {
    let obs = crate::probe::callback_observation(spec, body, headers);
    let (mut st, _) = EngineState::start(spec, now);
    let cx = Context {
        now,
        floor: std::time::Duration::ZERO,
        jitter: 0.0,
    };
    let step = engine::step(spec, &mut st, obs, cx);
    match step.decision {
        Decision::End(o) if matches!(o.end, End::Succeeded | End::Failed) => Verdict::End(o),
        Decision::End(o) => Verdict::Unjudged(o.reason),
        Decision::PollAt(_) => match step.events.into_iter().find_map(|e| match e {
            engine::Event::Retry { error, .. } => Some(error),
            _ => None,
        }) {
            Some(error) => Verdict::Unjudged(error),
            None => Verdict::Progress(st.state),
        },
    }
}

/// Fail a callback wait
///
/// Ends the wait `failed`, with the JSON body as its `error_detail`. The first
/// completion wins: a later one is a `409` carrying the wait as it ended.
#[utoipa::path(
    post, path = "/callbacks/{secret}/fail", tag = "callbacks", operation_id = "fail_callback",
    params(("secret" = String, Path, description = "The secret of the callback URL the create's answer carried")),
    security(()),
    request_body(content = serde_json::Value, content_type = "application/json"),
    responses(
        (status = 200, description = "The wait, ended by this callback", body = Wait),
        (status = 400, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No callback wait has this URL", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests to callback URLs from this address", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
        (status = 408, description = "The body did not arrive within the server's body timeout", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The wait had already ended: the wait, as it ended", body = Wait),
        (status = 413, description = "Body over 64 KiB; the wait goes on", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn fail_callback(
    State(s): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(secret): Path<String>,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let cb = find(&s, peer, &secret).await?;
    let end = CallbackEnd {
        status: Status::Failed,
        reason: FAILED.into(),
        error_detail: Some(crate::engine::bound::detail(&body)),
        output: None,
    };
    finish(&s, &cb, &end).await
}

/// Beat a callback wait's heartbeat
///
/// Restarts the clock of the wait's `callback.heartbeat`. The deadline holds
/// whatever the heartbeats.
#[utoipa::path(
    post, path = "/callbacks/{secret}/heartbeat", tag = "callbacks", operation_id = "beat_callback",
    params(("secret" = String, Path, description = "The secret of the callback URL the create's answer carried")),
    security(()),
    responses(
        (status = 200, description = "The wait, still running", body = Wait),
        (status = 404, description = "No callback wait has this URL", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests to callback URLs from this address", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
        (status = 409, description = "The wait had already ended: the wait, as it ended", body = Wait),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn beat_callback(
    State(s): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(secret): Path<String>,
) -> ApiResult<Response> {
    let cb = find(&s, peer, &secret).await?;
    let beat = s.store.callbacks().beat(cb.wait_id, Utc::now()).await?;
    let wait = wait_of(&s, &cb).await?;
    let status = if beat {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    Ok(json_response(status, &wait))
}

/// Requests a second to callback URLs per client address (IPv6 by its /64), in
/// bursts of up to [`BURST`]: a caller guessing secrets gets a `429` well before
/// it could try many. In memory, per replica.
pub const PER_SECOND: u32 = 10;
/// The burst [`PER_SECOND`] allows.
pub const BURST: u32 = 20;

/// A per-address limit on requests to capability URLs (callback and nudge URLs):
/// in memory, per replica.
#[derive(Debug)]
pub struct AddressLimiter {
    limiter: governor::DefaultKeyedRateLimiter<IpAddr>,
    per_second: u32,
    /// What the `429` names: "callback URLs", "nudge URLs".
    what: &'static str,
}

impl Default for AddressLimiter {
    /// The callback URLs' limit.
    fn default() -> Self {
        AddressLimiter::new(PER_SECOND, BURST, "callback URLs")
    }
}

impl AddressLimiter {
    pub fn new(per_second: u32, burst: u32, what: &'static str) -> AddressLimiter {
        let quota =
            governor::Quota::per_second(NonZeroU32::new(per_second.max(1)).expect("non-zero"))
                .allow_burst(NonZeroU32::new(burst.max(1)).expect("non-zero"));
        AddressLimiter {
            limiter: governor::RateLimiter::keyed(quota),
            per_second,
            what,
        }
    }

    /// Counts one request from `peer` (IPv6 by its /64), or the `429` that
    /// refuses it.
    pub(super) fn check(&self, peer: Option<SocketAddr>) -> ApiResult<()> {
        let Some(peer) = peer else {
            return Ok(());
        };
        let key = match peer.ip().to_canonical() {
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) >> 64 << 64)),
            v4 => v4,
        };
        self.limiter.check_key(&key).map_err(|_| ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests",
                format!(
                    "{} take at most {} requests a second from one address; try again in 1 s",
                    self.what, self.per_second
                ),
            )
        })
    }
}

/// The callback wait `secret` names, or the `404` that says none does.
async fn find(
    s: &AppState,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    secret: &str,
) -> ApiResult<Callback> {
    s.callback_rate.check(peer.map(|c| c.0.0))?;
    s.store
        .callbacks()
        .find(&SecretHash::of(secret))
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                "no callback wait has this URL; use the callback_url the wait's create answered with, exactly as given",
            )
        })
}

async fn wait_of(s: &AppState, cb: &Callback) -> ApiResult<Wait> {
    s.store
        .waits()
        .get(&cb.tenant, cb.wait_id)
        .await?
        .ok_or_else(|| ApiError::not_found("no callback wait has this URL"))
}

/// Ends the wait as `end` says, once: `200` with the wait this ended, or `409`
/// with the wait as the end that came first left it.
pub(super) async fn finish(s: &AppState, cb: &Callback, end: &CallbackEnd) -> ApiResult<Response> {
    let ended = s
        .store
        .callbacks()
        .end(&cb.tenant, cb.wait_id, end, Utc::now())
        .await?;
    let wait = wait_of(s, cb).await?;
    let status = if ended {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    Ok(json_response(status, &wait))
}
