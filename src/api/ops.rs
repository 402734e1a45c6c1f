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
    let active = active_waits(&s).await;
    // Whether the store answers, for alerts on a database out of reach.
    let store_up = u8::from(s.store.ping().await.is_ok());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        {
            let mut out = s.metrics.render(active, s.store.connections_in_use());
            s.tokens.render_metrics(&mut out);
            s.retention.render(&mut out);
            out.push_str(&format!(
                "# HELP waitd_store_up Whether the store answered this scrape (1) or not (0).\n\
                 # TYPE waitd_store_up gauge\nwaitd_store_up {store_up}\n"
            ));
            out
        },
    )
        .into_response()
}

/// How long a count of the running waits serves `/metrics` (which anyone may ask
/// for, and which a count over a million rows would make expensive).
const ACTIVE_FRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// The running waits in the store, counted at most once per [`ACTIVE_FRESH`]: scrapes
/// meanwhile, and those that come while a count runs, get its answer.
async fn active_waits(s: &AppState) -> Option<i64> {
    let mut last = s.active_count.lock().await;
    if let Some((at, n)) = *last
        && at.elapsed() < ACTIVE_FRESH
    {
        return Some(n);
    }
    let n = s.store.waits().count_running(None).await.ok()?;
    *last = Some((std::time::Instant::now(), n));
    Some(n)
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
pub async fn openapi(State(s): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi::served(&s.presets).as_str().to_owned(),
    )
        .into_response()
}
