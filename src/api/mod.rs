//! The HTTP API: routes, extractors, problem+json errors, blocking reads and SSE.
//!
//! It talks to the store and listens on the event bus; it never calls the worker
//! pool, which is what lets any replica answer for any wait.

pub mod error;
mod events;
pub mod openapi;
mod presets;
pub mod streams;
mod ui;
mod waits;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use tokio::sync::watch;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;

use crate::bus::Bus;
use crate::engine::Limits;
use crate::metrics::Metrics;
use crate::model::Status;
use crate::probe::guard::Guard;
use crate::store::Store;
pub use error::{ApiError, ApiResult};

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// What every handler shares. Cloning is shallow.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub bus: Bus,
    pub limits: Arc<Limits>,
    /// The presets requests may name (built-in plus `--presets-dir`).
    pub presets: Arc<crate::presets::Registry>,
    pub metrics: Arc<Metrics>,
    pub guard: Arc<Guard>,
    /// token → tenant; empty means anonymous use (tenant "").
    pub tokens: Arc<HashMap<String, String>>,
    /// Most running waits one tenant may have.
    pub max_active_waits: i64,
    /// Requests per second per API token.
    pub rate: Arc<RateLimiter>,
    /// Flips to true when the server is stopping: streams and blocked reads end.
    pub stopping: watch::Receiver<bool>,
    /// The replica's feed of new events for the followers of `GET /events`.
    pub feed: crate::events::Feed,
    /// Caps on open event streams and blocked requests.
    pub streams: Arc<streams::StreamLimits>,
    /// How long a client has to send a request body.
    pub body_timeout: Duration,
    /// Origins whose pages may call the API (CORS); none when empty.
    pub cors_origins: Arc<Vec<HeaderValue>>,
    /// Permits to read history for a stream: at most this many such reads at once,
    /// so replays cannot take every pooled connection.
    pub replays: Arc<tokio::sync::Semaphore>,
}

/// The router with every route; tests and `serve` both use it.
pub fn router(state: AppState) -> Router {
    let cors = cors_layer(&state.cors_origins);
    let app = routes(state);
    match cors {
        Some(cors) => app.layer(cors),
        None => app,
    }
}

/// CORS for dashboards on other origins: exactly the origins the operator named,
/// and no CORS headers at all when none are.
fn cors_layer(origins: &[HeaderValue]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::Method;
    use tower_http::cors::{AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins.iter().cloned()))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                header::ACCEPT,
                header::HeaderName::from_static("idempotency-key"),
                header::HeaderName::from_static("last-event-id"),
            ])
            .expose_headers([
                header::LOCATION,
                header::RETRY_AFTER,
                header::HeaderName::from_static("idempotent-replayed"),
            ])
            .max_age(Duration::from_secs(600)),
    )
}

fn routes(state: AppState) -> Router {
    Router::new()
        .route("/waits", post(waits::create).get(waits::list))
        .route("/waits/{id}", get(waits::get_one))
        .route("/waits/{id}/cancel", post(waits::cancel))
        .route("/waits/{id}/events", get(events::wait_events))
        .route("/events", get(events::all_events))
        .route("/presets", get(presets::list))
        .route("/presets/{name}", get(presets::get_one))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_doc))
        .route("/", get(ui::to_dashboard))
        .route("/ui", get(ui::to_dashboard))
        .route("/ui/", get(ui::index))
        .route("/ui/{file}", get(ui::asset))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn(uri_limit))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::internal().into_response()
        }))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let route = req
                        .extensions()
                        .get::<axum::extract::MatchedPath>()
                        .map(|m| m.as_str().to_owned())
                        .unwrap_or_default();
                    // The path only: queries and headers may carry secrets.
                    tracing::info_span!("request", method = %req.method(), route)
                })
                // A 503 while stopping or while the store is away is not a fault of
                // this request; real internal errors are logged where they happen.
                .on_failure(
                    tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG),
                ),
        )
        .with_state(state)
}

/// The longest request URI answered: every query of this API fits (32 label
/// filters at their longest are about 10 KiB). Longer ones get a problem here;
/// only those past the HTTP layer's own limit (64 KiB) get its bare 414.
pub const MAX_URI: usize = 16 * 1024;

async fn uri_limit(req: Request, next: axum::middleware::Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "URI too long",
            format!(
                "the request URI is {len} bytes, more than the {} KiB this API answers",
                MAX_URI / 1024
            ),
        )
        .into_response();
    }
    next.run(req).await
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!(
        "there is no route {}; see /openapi.json for the API",
        uri.path()
    ))
}

async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method not allowed",
        format!(
            "{} does not accept {method}; see /openapi.json for the API",
            uri.path()
        ),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AppState>) -> Response {
    let Err(e) = s.store.ping().await else {
        return "ready\n".into_response();
    };
    // Say what is wrong, where: the pool itself only says that it timed out.
    let detail = match s.store.postgres() {
        Some(pg) => pg.diagnose().await,
        None => None,
    }
    .unwrap_or_else(|| format!("the store does not answer: {e}"));
    tracing::warn!(%detail, "not ready");
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "Not ready", detail)
    }
    .into_response()
}

async fn metrics(State(s): State<AppState>) -> Response {
    let active = s.store.count_running(None).await.ok();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(active),
    )
        .into_response()
}

async fn openapi_doc() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        openapi::document(),
    )
        .into_response()
}

/// The caller's tenant, from `Authorization: Bearer <token>`. With no tokens
/// configured, everyone is the anonymous tenant "".
pub struct Tenant(pub String);

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Tenant, ApiError> {
        if s.tokens.is_empty() {
            return Ok(Tenant(String::new()));
        }
        let given = parts
            .headers
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
        for (token, tenant) in s.tokens.iter() {
            if constant_time_eq(token.as_bytes(), given.as_bytes()) {
                found = Some(tenant.clone());
            }
        }
        let tenant = found.ok_or_else(|| ApiError::unauthorized("the API token is not valid"))?;
        // The bucket is the token's: two tokens of one tenant do not share it.
        s.rate.check(given)?;
        Ok(Tenant(tenant))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.ct_eq(b).into()
}

/// A JSON request body, with every failure rendered as problem+json: a wrong
/// content type (415), a body over [`MAX_BODY`] (413, at once when its
/// `Content-Length` says so), a body not sent within `--body-timeout` (408), a body
/// that breaks off or whose chunked framing is malformed (400), or JSON that does
/// not parse (400).
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &AppState) -> Result<JsonBody, ApiError> {
        check_content_type(req.headers())?;
        let too_large = || {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request too large",
                format!("the request body is over the {} KiB limit", MAX_BODY / 1024),
            )
        };
        let announced = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_large());
        }
        let mut stream = req.into_body().into_data_stream();
        let mut bytes: Vec<u8> = Vec::new();
        let read = async {
            use futures_util::StreamExt;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|_| {
                    ApiError::bad_request(
                        "the request body could not be read: it broke off, or its chunked encoding is malformed",
                    )
                })?;
                if bytes.len() + chunk.len() > MAX_BODY {
                    return Err(too_large());
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(())
        };
        match tokio::time::timeout(s.body_timeout, read).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "Request timeout",
                    format!(
                        "the request body did not arrive within {}",
                        crate::engine::duration::format(s.body_timeout)
                    ),
                ));
            }
        }
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "the request body is empty; send the wait as a JSON object",
            ));
        }
        serde_json::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    }
}

/// JSON, or no type, or curl's `-d` default (form-urlencoded) whose body is JSON:
/// so that `curl -d @spec.json` works as written.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime == "application/json"
        || mime.ends_with("+json")
        || mime == "application/x-www-form-urlencoded"
    {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type",
            format!("the request body must be JSON (Content-Type: application/json), not {mime}"),
        ))
    }
}

/// How long a request may hold its response (`?wait=`).
pub(crate) fn parse_block(v: Option<&str>) -> Result<Option<Option<Duration>>, ApiError> {
    match v {
        None | Some("false") => Ok(None),
        Some("true") | Some("") => Ok(Some(None)),
        Some(d) => crate::engine::duration::parse(d)
            .map(|d| Some(Some(d)))
            .map_err(|e| {
                ApiError::bad_request(format!(
                    "wait {e}; or use wait=true to hold until the wait ends"
                ))
            }),
    }
}

/// The status code of a blocked request, by how the wait stands.
pub(crate) fn blocked_status(status: Status, created: bool) -> StatusCode {
    match status {
        Status::Succeeded if created => StatusCode::CREATED,
        Status::Succeeded => StatusCode::OK,
        Status::Failed => StatusCode::UNPROCESSABLE_ENTITY,
        // Not 504 and 502: curl --retry, retrying clients and proxies repeat 408,
        // 429 and 5xx, and would ask an ended wait again and again. No common client
        // retries these.
        Status::TimedOut => StatusCode::PRECONDITION_FAILED,
        Status::Canceled => StatusCode::CONFLICT,
        Status::Error => StatusCode::FAILED_DEPENDENCY,
        Status::Running => StatusCode::ACCEPTED,
    }
}

pub(crate) fn json_response(status: StatusCode, value: impl serde::Serialize) -> Response {
    (status, Json(value)).into_response()
}

/// A token bucket per API token: `rate` requests a second on average, bursts of up to
/// twice that. In memory, per replica.
pub struct RateLimiter {
    rate: f64,
    buckets: std::sync::Mutex<HashMap<String, (f64, std::time::Instant)>>,
}

impl RateLimiter {
    pub fn new(rate: f64) -> RateLimiter {
        RateLimiter {
            rate: if rate.is_finite() && rate > 0.0 {
                rate
            } else {
                0.0
            },
            buckets: Default::default(),
        }
    }

    fn check(&self, token: &str) -> Result<(), ApiError> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let burst = (self.rate * 2.0).max(1.0);
        let now = std::time::Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last) = buckets.entry(token.to_string()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64;
        Err(ApiError {
            retry_after: Some(wait),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many requests",
                format!(
                    "this API token is limited to {} requests a second; try again in {wait} s",
                    self.rate
                ),
            )
        })
    }
}
