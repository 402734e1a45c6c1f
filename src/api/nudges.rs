//! `/nudges/{secret}`: the URL a wait made with `"nudge": true` carries in its
//! create's answer (docs/design.md §2.17). A POST schedules a poll of the wait
//! now, paced by the worker holding it to one a minimum poll interval; a storm
//! of nudges is one poll. A nudge decides nothing (its body is not read): the
//! poll does. No API token: the secret is the credential, found by its SHA-256
//! and never logged or shown.

use std::net::SocketAddr;

use axum::Extension;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult, Problem};
use super::{AppState, json_response};
use crate::model::Wait;
use crate::store::callbacks::SecretHash;

/// The path a nudge URL has, after the server's own address.
pub const PATH: &str = "/nudges/";

/// Requests a second to nudge URLs per client address, in bursts of up to
/// [`BURST`]: enough for a provider fanning its events out to many waits from
/// one address, and far too few to guess a 256-bit secret.
pub const PER_SECOND: u32 = 100;
/// The burst [`PER_SECOND`] allows.
pub const BURST: u32 = 200;

/// The answer to a nudge of a running wait.
#[derive(Debug, Serialize, ToSchema)]
pub struct NudgeAccepted {
    /// The nudged wait.
    pub id: uuid::Uuid,
    /// Always `"poll scheduled"`: the replica holding the wait polls it now, or
    /// one minimum poll interval after its last nudged poll.
    pub nudge: &'static str,
}

/// Nudge a wait
///
/// Schedules a poll of the wait now: its conditions judge the answer as at any
/// poll. Nudges coalesce (many at once are one poll) and are paced (one nudged
/// poll a minimum poll interval). The body, if any, is not read.
#[utoipa::path(
    post, path = "/nudges/{secret}", tag = "nudges", operation_id = "nudge_wait",
    params(("secret" = String, Path, description = "The secret of the nudge URL the create's answer carried")),
    security(()),
    responses(
        (status = 202, description = "A poll is scheduled", body = NudgeAccepted),
        (status = 404, description = "No wait has this nudge URL", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The wait had already ended: the wait, as it ended", body = Wait),
        (status = 429, description = "Too many requests to nudge URLs from this address", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn nudge_wait(
    State(s): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(secret): Path<String>,
) -> ApiResult<Response> {
    s.nudge_rate.check(peer.map(|c| c.0.0))?;
    let found = s
        .store
        .nudges()
        .find(&SecretHash::of(&secret))
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                "no wait has this nudge URL; use the nudge_url the wait's create answered with, exactly as given",
            )
        })?;
    if !found.running {
        let wait = s
            .store
            .waits()
            .get(&found.tenant, found.wait_id)
            .await?
            .ok_or_else(|| ApiError::not_found("no wait has this nudge URL"))?;
        return Ok(json_response(StatusCode::CONFLICT, &wait));
    }
    s.store.nudges().announce(found.wait_id).await?;
    s.metrics
        .nudges
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(json_response(
        StatusCode::ACCEPTED,
        &NudgeAccepted {
            id: found.wait_id,
            nudge: "poll scheduled",
        },
    ))
}
