//! Who is calling, and how often: a layer in front of every API route reads the
//! bearer token, finds its tenant, counts the request against the token's rate, and
//! hands the handlers a [`Tenant`]; a read-only token only reads. Health,
//! readiness, metrics, the OpenAPI document and the dashboard's files are outside
//! it.

use std::future::Future;
use std::num::NonZeroU32;
use std::time::Duration;

use axum::body::Body;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota};

use super::AppState;
use super::error::ApiError;
use crate::tokens::{Access, Grant};

/// The caller's tenant, put in the request by [`authenticate`]. With no tokens
/// configured, everyone is the anonymous tenant "".
#[derive(Clone, Debug)]
pub struct Tenant(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Tenant, ApiError> {
        parts.extensions.get::<Tenant>().cloned().ok_or_else(|| {
            // A route registered outside the layer: a bug, never the caller's fault.
            tracing::error!("a handler asked for the tenant on a route without authentication");
            ApiError::internal()
        })
    }
}

/// The layer: 401 without a valid token (when tokens are configured), 429 past the
/// token's rate, 403 for a read-only token on a route that changes something, else
/// the request goes on with its [`Tenant`]. An event stream opened with a token
/// ends when a reload removes the token (or changes its tenant or access), and a
/// request held until a wait ends (`?wait=`) is answered `401` then.
pub async fn authenticate(State(s): State<AppState>, mut req: Request, next: Next) -> Response {
    let caller = match caller_of(&s, req.headers()) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let Some((token, grant)) = caller else {
        req.extensions_mut().insert(Tenant(String::new()));
        return next.run(req).await;
    };
    if grant.access == Access::Read && !reads_only(req.method()) {
        return read_only().into_response();
    }
    req.extensions_mut().insert(Tenant(grant.tenant.clone()));
    let held = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "wait" || p.starts_with("wait=")));
    let res = if held {
        tokio::select! {
            res = next.run(req) => res,
            () = s.tokens.revoked(token.clone(), grant.clone()) => ApiError::unauthorized(
                "the API token of this request was removed (or changed) while the request was held; send a token in force",
            )
            .into_response(),
        }
    } else {
        next.run(req).await
    };
    if is_event_stream(&res) {
        end_when(res, s.tokens.revoked(token, grant))
    } else {
        res
    }
}

/// GET and HEAD change nothing; every other method of this API does.
fn reads_only(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD)
}

fn read_only() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "Read-only token",
        "this API token is read-only: it may read, list and follow waits, but not create, \
         cancel, complete, fail, redeliver or change event sources; use a token configured without \":read\" for that",
    )
}

fn is_event_stream(res: &Response) -> bool {
    res.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// The response with its body ended (cleanly, as a stream that is over) when
/// `revoked` resolves.
fn end_when(res: Response, revoked: impl Future<Output = ()> + Send + 'static) -> Response {
    use futures_util::StreamExt;
    let (parts, body) = res.into_parts();
    let body = Body::from_stream(body.into_data_stream().take_until(Box::pin(revoked)));
    Response::from_parts(parts, body)
}

/// The caller's token and its grant; `None` when no tokens are configured
/// (anonymous use).
fn caller_of(s: &AppState, headers: &HeaderMap) -> Result<Option<(String, Grant)>, ApiError> {
    let tokens = s.tokens.current();
    if tokens.is_empty() {
        return Ok(None);
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .ok_or_else(|| {
            ApiError::unauthorized("send an API token as \"Authorization: Bearer <token>\"")
        })?;
    // Compare against every token in constant time, so timing tells nothing.
    let mut found = None;
    for (token, grant) in tokens.iter() {
        if constant_time_eq(token.as_bytes(), given.as_bytes()) {
            found = Some((token, grant));
        }
    }
    let (token, grant) =
        found.ok_or_else(|| ApiError::unauthorized("the API token is not valid"))?;
    // The bucket is the token's: two tokens of one tenant do not share it. Only
    // valid tokens get one, so the map is as large as the configured tokens.
    s.rate.check(token)?;
    Ok(Some((token.clone(), grant.clone())))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// `rate` requests a second per API token on average, in bursts of up to twice that
/// (GCRA, governor's). In memory, per replica.
pub struct RateLimiter {
    rate: f64,
    limiter: Option<DefaultKeyedRateLimiter<String>>,
}

impl RateLimiter {
    /// No limit when `rate` is 0 (or not a positive number).
    pub fn new(rate: f64) -> RateLimiter {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            0.0
        };
        let limiter = (rate > 0.0).then(|| {
            let burst = NonZeroU32::new((rate * 2.0).ceil().clamp(1.0, u32::MAX as f64) as u32)
                .unwrap_or(NonZeroU32::MIN);
            let period = Duration::from_secs_f64(1.0 / rate).max(Duration::from_nanos(1));
            let quota = Quota::with_period(period)
                .expect("a positive period")
                .allow_burst(burst);
            governor::RateLimiter::keyed(quota)
        });
        RateLimiter { rate, limiter }
    }

    /// Counts one request of `token`, or the 429 (with `Retry-After`, in whole
    /// seconds rounded up) that refuses it.
    fn check(&self, token: &str) -> Result<(), ApiError> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        // The lookup borrows; only a token's first request allocates its key.
        let Err(not_until) = limiter.check_key(&token.to_string()) else {
            return Ok(());
        };
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
        Err(ApiError {
            retry_after: Some(secs),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests",
                format!(
                    "this API token is limited to {} requests a second; try again in {secs} s",
                    self.rate
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_gets_twice_its_rate_as_a_burst_then_a_429_that_says_when() {
        let r = RateLimiter::new(5.0);
        for i in 0..10 {
            assert!(r.check("a").is_ok(), "request {i} of the burst");
        }
        let e = r.check("a").unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.retry_after, Some(1));
        assert!(e.detail.contains("5 requests a second"), "{}", e.detail);
        // Another token has its own bucket.
        assert!(r.check("b").is_ok());
        // No limit at 0.
        let none = RateLimiter::new(0.0);
        for _ in 0..1000 {
            assert!(none.check("a").is_ok());
        }
    }
}
