//! The HTTP API: routes, extractors, problem+json errors, blocking reads and SSE.
//!
//! It talks to the store and listens on the event bus; it never calls the worker
//! pool, which is what lets any replica answer for any wait. Inside, dependencies
//! point one way: this module assembles the router from the handler modules
//! ([`waits`] and the group create it hands on to, [`events`], [`presets`],
//! [`ops`], [`ui`]), which use the shared pieces ([`extract`], [`auth`],
//! [`error`], [`streams`], [`sse`], and for waits [`read`], [`hold`] and
//! [`guard`]) and the schemas of [`openapi`]; [`openapi`] reads the routes from
//! here to build the document and imports no handler.

mod approvals;
pub mod auth;
pub mod callbacks;
mod deliveries;
pub mod error;
mod events;
pub mod extract;
mod groups;
mod guard;
mod hold;
pub mod hooks;
pub mod nudges;
pub mod openapi;
mod ops;
mod presets;
mod read;
mod sources;
mod sse;
pub mod streams;
mod strict;
mod traced;
mod ui;
mod unread;
mod waits;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::bus::Bus;
use crate::engine::Limits;
use crate::metrics::Metrics;
use crate::outbound::Guard;
use crate::store::Store;
pub use auth::{RateLimiter, Tenant};
pub use error::{ApiError, ApiResult};
pub use extract::MAX_BODY;
pub use hold::blocked_status;
pub use traced::RequestTrace;

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
    /// The credentials the operator holds, which a wait may name.
    pub credentials: Arc<crate::outbound::credentials::Credentials>,
    /// The API tokens in force; none means anonymous use (tenant "").
    pub tokens: crate::tokens::Tokens,
    /// Most running waits one tenant may have.
    pub max_active_waits: i64,
    /// Requests per second per API token.
    pub rate: Arc<RateLimiter>,
    /// Requests per second per client address to callback URLs.
    pub callback_rate: Arc<callbacks::AddressLimiter>,
    /// Requests per second per client address to nudge URLs.
    pub nudge_rate: Arc<callbacks::AddressLimiter>,
    /// Requests per second per client address to event sources' hook URLs.
    pub hook_rate: Arc<callbacks::AddressLimiter>,
    /// The most events (and bytes of them) one tenant's sources keep.
    pub event_caps: crate::store::sources::EventCaps,
    /// Flips to true when the server is stopping: streams and blocked reads end.
    pub stopping: watch::Receiver<bool>,
    /// The replica's feed of new events for the followers of `GET /events`.
    pub feed: crate::events::Feed,
    /// Caps on open event streams and blocked requests.
    pub streams: Arc<streams::StreamLimits>,
    /// How long a client has to send a request body.
    pub body_timeout: Duration,
    /// Spans of requests, when traces are exported.
    pub traces: crate::traces::Traces,
    /// Origins whose pages may call the API (CORS); none when empty.
    pub cors_origins: Arc<Vec<HeaderValue>>,
    /// Permits to read history for a stream: at most this many such reads at once,
    /// so replays cannot take every pooled connection.
    pub replays: Arc<tokio::sync::Semaphore>,
    /// Asks this replica's worker for the current progress of the waits it holds.
    pub live: crate::bus::live::Live,
    /// What the retention sweep has deleted, for `/metrics`.
    pub retention: Arc<crate::retention::Stats>,
    /// The last count of running waits for `/metrics`, and when it was taken.
    pub active_count: Arc<tokio::sync::Mutex<Option<(std::time::Instant, i64)>>>,
    /// Where a blocked request reports that it holds (the `test-signals` feature).
    pub signals: crate::signals::Signals,
}

/// The API's routes, each registered once with its OpenAPI operation (one
/// `routes!` per path: utoipa-axum mounts a call's handlers on every path they
/// name). Authentication is added by [`router`]; the document is built from this.
pub fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(waits::create_wait, waits::list_waits))
        .routes(routes!(waits::get_wait))
        .routes(routes!(waits::cancel_wait))
        .routes(routes!(approvals::complete_wait))
        .routes(routes!(approvals::fail_wait))
        .routes(routes!(events::list_wait_events))
        .routes(routes!(events::list_events))
        .routes(routes!(deliveries::list_deliveries))
        .routes(routes!(deliveries::retry_delivery))
        .routes(routes!(presets::list_presets))
        .routes(routes!(presets::get_preset))
        .routes(routes!(sources::create_source, sources::list_sources))
        .routes(routes!(sources::get_source, sources::delete_source))
}

/// The operational routes: documented, outside authentication.
pub(crate) fn ops_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::readyz))
        .routes(routes!(ops::metrics))
        .routes(routes!(ops::openapi))
}

/// The callback URLs of callback waits, the nudge URLs of nudged waits and the
/// hook URLs of event sources: documented, outside authentication (the URL's secret is the credential).
pub(crate) fn callback_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(callbacks::complete_callback))
        .routes(routes!(callbacks::fail_callback))
        .routes(routes!(callbacks::beat_callback))
        .routes(routes!(nudges::nudge_wait))
        .routes(routes!(hooks::receive_event))
}

/// The router with every route; tests and `serve` both use it.
pub fn router(state: AppState) -> Router {
    let (api, _) = api_routes()
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::authenticate,
        ))
        .split_for_parts();
    let (ops, _) = ops_routes().split_for_parts();
    let (callbacks, _) = callback_routes().split_for_parts();
    let app = api
        .merge(ops)
        .merge(callbacks)
        .route("/", get(ui::to_dashboard))
        .route("/ui", get(ui::to_dashboard))
        .route("/ui/", get(ui::index))
        .route("/ui/{file}", get(ui::asset))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    let app = match cors_layer(&state.cors_origins) {
        Some(cors) => app.layer(cors),
        None => app,
    };
    let app = app
        .layer(axum::middleware::from_fn(uri_limit))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::internal().into_response()
        }))
        .layer(axum::middleware::from_fn(unread::close_unread));
    let app = if state.traces.is_on() {
        app.layer(axum::middleware::from_fn_with_state(
            state.traces.clone(),
            traced::trace_request,
        ))
    } else {
        app
    };
    app.layer(
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
            .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::DEBUG)),
    )
    .with_state(state)
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

pub(crate) fn json_response(status: StatusCode, value: impl serde::Serialize) -> Response {
    (status, Json(value)).into_response()
}
