//! Requests held until their wait ends (`?wait=`): the hold, and the answer it
//! makes, for a create (of a wait or a group) and a read alike.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use uuid::Uuid;

use super::error::{ApiError, ApiResult};
use super::extract::Hold;
use super::read::read;
use super::{AppState, json_response};
use crate::bus::BusMsg;
use crate::model::{Status, Wait};
use crate::signals::Signal;

/// After a wait's deadline, how long a blocked request still waits for the worker to
/// record the end before answering 503.
const DEADLINE_GRACE: Duration = Duration::from_secs(10);

/// The status code of a blocked request, by how the wait stands.
pub fn blocked_status(status: Status, created: bool) -> StatusCode {
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

/// Why a blocked request stopped holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Held {
    /// The wait ended.
    Ended,
    /// The `?wait=<duration>` given ran out.
    TimeLimit,
    /// The server is stopping.
    Stopping,
    /// The wait's deadline passed (and a grace after it) with the wait still running:
    /// no replica has ended it.
    PastDeadline,
}

/// Holds until the wait ends, `hold` runs out, or the server stops; returns the wait
/// as it then stands (read again, not as it was when the request began) and why
/// the hold ended. Costs no database polling: it re-reads only when the bus says
/// this wait ended (or that notices may have been missed). `slot` is the
/// tenant's place among open streams, taken first (a create takes it before it
/// stores anything, so that a `429` at the cap has made nothing).
pub(super) async fn block(
    s: &AppState,
    tenant: &str,
    id: Uuid,
    hold: Hold,
    _slot: super::streams::Slot,
) -> ApiResult<(Wait, Held)> {
    let mut rx = s.bus.subscribe_wait(id);
    // Read after subscribing, so an end between the two is not missed.
    let mut wait = read(s, tenant, id).await?;
    let by_deadline = {
        let left = (wait.deadline - Utc::now()).to_std().unwrap_or_default();
        Instant::now() + left + DEADLINE_GRACE
    };
    let (until, at_until) = match hold {
        Hold::For(d) => match Instant::now().checked_add(d) {
            Some(t) if t < by_deadline => (t, Held::TimeLimit),
            _ => (by_deadline, Held::PastDeadline),
        },
        Hold::UntilEnd => (by_deadline, Held::PastDeadline),
    };
    let mut stopping = s.stopping.clone();
    let mut why = Held::Ended;
    if wait.is_running() {
        s.signals.send(|| Signal::Holding(id));
    }
    while wait.is_running() {
        if *stopping.borrow() {
            why = Held::Stopping;
            break;
        }
        let reread = tokio::select! {
            _ = tokio::time::sleep_until(until) => {
                why = at_until;
                break;
            }
            r = stopping.changed() => {
                if r.is_err() {
                    why = Held::Stopping;
                    break;
                }
                continue;
            }
            m = rx.recv() => match m {
                Ok(BusMsg::Notice(n)) => n.wait_id == id && n.is_terminal(),
                Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => true,
                Ok(BusMsg::Work | BusMsg::Deliveries { .. } | BusMsg::Nudge(_)) => false,
                Err(RecvError::Closed) => {
                    why = Held::Stopping;
                    break;
                }
            },
        };
        if reread {
            wait = read(s, tenant, id).await?;
        }
    }
    if wait.is_running() {
        // The answer shows the wait as it is now: its polls, retries, last error.
        wait = read(s, tenant, id).await?;
        if !wait.is_running() {
            why = Held::Ended;
        }
    }
    Ok((wait, why))
}

pub(super) fn with_location(mut res: Response, id: Uuid) -> Response {
    res.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/waits/{id}")).expect("a uuid path is a valid header"),
    );
    res
}

/// The answer to a blocked request. An ended wait is answered with the status its
/// end maps to ([`blocked_status`]); a running one with 202 when the caller's own
/// duration ran out, and otherwise with a 503 problem and `Retry-After`: a blocked
/// request never answers 2xx for a wait that has not ended when the server is
/// stopping or the wait outlived its deadline, so `curl -f` fails and `curl
/// --retry` asks again (a POST with the same `Idempotency-Key` blocks on the same
/// wait).
pub(super) fn blocked_response(wait: &Wait, why: Held, created: bool) -> Response {
    let unavailable = |title, detail| {
        ApiError {
            retry_after: Some(2),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, title, detail)
        }
        .into_response()
    };
    let res = match why {
        Held::Ended | Held::TimeLimit => json_response(blocked_status(wait.status, created), wait),
        Held::Stopping => unavailable(
            "Server stopping",
            format!(
                "this waitd is shutting down, so it stopped holding the request; wait {} is still running: repeat the request (for a POST, with the same Idempotency-Key, which blocks on the same wait)",
                wait.id
            ),
        ),
        Held::PastDeadline => unavailable(
            "Wait not ended",
            format!(
                "wait {} is still running although its deadline passed at {}: no replica has ended it yet; repeat the request shortly",
                wait.id,
                wait.deadline
                    .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            ),
        ),
    };
    with_location(res, wait.id)
}
