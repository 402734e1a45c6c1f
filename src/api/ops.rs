//! The routes for operators and their tools, outside authentication: liveness,
//! readiness, Prometheus metrics, and the OpenAPI document itself.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::{ApiError, Problem};

/// Liveness
///
/// `ok` while the process serves HTTP; it does not ask the database.
#[utoipa::path(
    get, path = "/healthz", tag = "operations", operation_id = "healthz",
    security(()),
    responses(
        (status = 200, description = "The process is serving", body = String, content_type = "text/plain", example = "ok\n"),
    )
)]
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Readiness
///
/// `ready` when the store answers; otherwise a 503 problem saying what is wrong
/// where (the database is down, refuses the credentials, or is missing).
#[utoipa::path(
    get, path = "/readyz", tag = "operations", operation_id = "readyz",
    security(()),
    responses(
        (status = 200, description = "Ready to serve", body = String, content_type = "text/plain", example = "ready\n"),
        (status = 503, description = "The store does not answer; see the detail and Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before asking again"))),
    )
)]
pub async fn readyz(State(s): State<AppState>) -> Response {
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

/// Metrics
///
/// Prometheus text format: waits created and ended by status, polls by outcome,
/// probe latency, open event streams, running waits in the store.
#[utoipa::path(
    get, path = "/metrics", tag = "operations", operation_id = "metrics",
    security(()),
    responses(
        (status = 200, description = "The metrics", body = String, content_type = "text/plain; version=0.0.4; charset=utf-8"),
    )
)]
pub async fn metrics(State(s): State<AppState>) -> Response {
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

/// The OpenAPI document
///
/// This document (OpenAPI 3.1).
#[utoipa::path(
    get, path = "/openapi.json", tag = "operations", operation_id = "openapi",
    security(()),
    responses(
        (status = 200, description = "The document", body = Object, content_type = "application/json"),
    )
)]
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi::document(),
    )
        .into_response()
}
