//! `/waits`: create, read, list, cancel, and the blocking forms of create and read.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use sha2::{Digest, Sha256};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use uuid::Uuid;

use super::{AppState, JsonBody, Tenant, blocked_status, json_response, parse_block};
use crate::api::error::{ApiError, ApiResult};
use crate::bus::BusMsg;
use crate::engine::Spec;
use crate::model::Status;
use crate::store::{ListFilter, Wait};

/// After a wait's deadline, how long a blocked request still waits for the worker to
/// record the end before answering 202.
const DEADLINE_GRACE: Duration = Duration::from_secs(10);

pub(crate) fn query_pairs(q: &Option<String>) -> Vec<(String, String)> {
    q.as_deref()
        .map(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

fn only(pairs: &[(String, String)], allowed: &[&str]) -> ApiResult<()> {
    for (k, _) in pairs {
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter \"{}\"; this route takes {}",
                k.chars().take(64).collect::<String>(),
                allowed.join(", ")
            )));
        }
    }
    Ok(())
}

pub(crate) fn param<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The `{id}` of a wait route. Anything that is not a UUID (including text that is
/// not even UTF-8) is a wait that does not exist: a 404 problem, like any other.
pub(crate) struct WaitId(pub Uuid);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for WaitId {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<WaitId, ApiError> {
        let raw = Path::<String>::from_request_parts(parts, state).await.ok();
        let text = raw.as_ref().map(|p| p.0.as_str()).unwrap_or("");
        Uuid::parse_str(text).map(WaitId).map_err(|_| {
            ApiError::not_found(format!(
                "there is no wait \"{}\"; wait ids are UUIDs such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21",
                text.chars().take(64).collect::<String>()
            ))
        })
    }
}

fn no_such_wait(id: Uuid) -> ApiError {
    ApiError::not_found(format!("there is no wait {id}"))
}

/// Why a blocked request stopped holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Held {
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

/// Holds until the wait ends, `limit` passes, or the server stops; returns the wait
/// as it then stands (read again, not as it was when the request began) and why
/// the hold ended. Costs no database polling: it re-reads only when the bus says
/// this wait ended (or that notices may have been missed).
async fn block(
    s: &AppState,
    tenant: &str,
    id: Uuid,
    limit: Option<Duration>,
) -> ApiResult<(Wait, Held)> {
    let _slot = s.streams.acquire(tenant)?;
    let mut rx = s.bus.subscribe_wait(id);
    // Read after subscribing, so an end between the two is not missed.
    let mut wait = s
        .store
        .get(tenant, id)
        .await?
        .ok_or_else(|| no_such_wait(id))?;
    let by_deadline = {
        let left = (wait.deadline - Utc::now()).to_std().unwrap_or_default();
        Instant::now() + left + DEADLINE_GRACE
    };
    let (until, at_until) = match limit {
        Some(d) if Instant::now() + d < by_deadline => (Instant::now() + d, Held::TimeLimit),
        _ => (by_deadline, Held::PastDeadline),
    };
    let mut stopping = s.stopping.clone();
    let mut why = Held::Ended;
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
                Ok(BusMsg::Work) => false,
                Err(RecvError::Closed) => {
                    why = Held::Stopping;
                    break;
                }
            },
        };
        if reread {
            wait = s
                .store
                .get(tenant, id)
                .await?
                .ok_or_else(|| no_such_wait(id))?;
        }
    }
    if wait.is_running() {
        // The answer shows the wait as it is now: its polls, retries, last error.
        wait = s
            .store
            .get(tenant, id)
            .await?
            .ok_or_else(|| no_such_wait(id))?;
        if !wait.is_running() {
            why = Held::Ended;
        }
    }
    Ok((wait, why))
}

/// The answer to a blocked request. An ended wait is answered with the status its
/// end maps to ([`blocked_status`]); a running one with 202 when the caller's own
/// duration ran out, and otherwise with a 503 problem and `Retry-After`: a blocked
/// request never answers 2xx for a wait that has not ended when the server is
/// stopping or the wait outlived its deadline, so `curl -f` fails and `curl
/// --retry` asks again (a POST with the same `Idempotency-Key` blocks on the same
/// wait).
fn blocked_response(wait: &Wait, why: Held, created: bool) -> Response {
    let mut res = match why {
        Held::Ended | Held::TimeLimit => {
            json_response(blocked_status(wait.status, created), wait)
        }
        Held::Stopping => ApiError {
            retry_after: Some(2),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Server stopping",
                format!(
                    "this waitd is shutting down, so it stopped holding the request; wait {} is still running: repeat the request (for a POST, with the same Idempotency-Key, which blocks on the same wait)",
                    wait.id
                ),
            )
        }
        .into_response(),
        Held::PastDeadline => ApiError {
            retry_after: Some(2),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "Wait not ended",
                format!(
                    "wait {} is still running although its deadline passed at {}: no replica has ended it yet; repeat the request shortly",
                    wait.id,
                    wait.deadline.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
                ),
            )
        }
        .into_response(),
    };
    res.headers_mut().insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/waits/{}", wait.id))
            .expect("a uuid path is a valid header"),
    );
    res
}

fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    match headers.get("idempotency-key") {
        None => Ok(None),
        Some(v) => {
            let k = v
                .to_str()
                .ok()
                .filter(|k| !k.is_empty() && k.len() <= 255)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "Idempotency-Key must be 1 to 255 visible ASCII characters",
                    )
                })?;
            Ok(Some(k.to_string()))
        }
    }
}

/// Create a wait
///
/// Persists the wait and answers 201 with it. With `?wait=<duration>` or
/// `?wait=true` the response is held until the wait ends (201 succeeded, 422 failed,
/// 412 timed_out, 409 canceled, 424 error) or the duration passes (202). A held
/// request cut by the server stopping, or `?wait=true` on a wait still running past
/// its deadline, is a 503 with `Retry-After`: repeat it with the same
/// `Idempotency-Key`.
#[utoipa::path(
    post, path = "/waits", tag = "waits",
    request_body(content = crate::api::openapi::CreateWait, content_type = "application/json"),
    params(
        ("wait" = Option<String>, Query, description = "Hold the response: a duration such as `30s`, or `true` until the wait ends."),
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retried POST return the first wait; the same key with another body is a 409."),
    ),
    responses(
        (status = 201, description = "Created (or, blocked, succeeded)", body = Wait),
        (status = 202, description = "Blocked and still running", body = Wait),
        (status = 400, description = "Invalid request", body = crate::api::error::Problem, content_type = "application/problem+json"),
        (status = 409, description = "Idempotency key reused, or blocked and canceled", body = crate::api::error::Problem),
        (status = 413, description = "Body over 64 KiB", body = crate::api::error::Problem),
        (status = 415, description = "Not JSON", body = crate::api::error::Problem),
        (status = 422, description = "Unknown preset or bad preset params, target refused by the SSRF guard, or blocked and failed", body = crate::api::error::Problem),
        (status = 412, description = "Blocked and timed out", body = Wait),
        (status = 424, description = "Blocked and ended in error", body = Wait),
        (status = 503, description = "Store unavailable, or blocked and cut by the server stopping (see Retry-After)", body = crate::api::error::Problem),
    )
)]
pub async fn create(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let pairs = query_pairs(&q);
    only(&pairs, &["wait"])?;
    let block_for = parse_block(param(&pairs, "wait"))?;
    let key = idempotency_key(&headers)?;
    let request = super::presets::expand(&s, &body)?;
    let spec = Spec::from_request(&request, &s.limits).map_err(ApiError::validation)?;
    let url =
        url::Url::parse(&spec.target.url).map_err(|e| ApiError::bad_request(e.to_string()))?;
    s.guard.check_url(&url).map_err(ApiError::unprocessable)?;
    let hash = key.as_ref().map(|_| {
        // serde_json's map keeps keys sorted, so equal requests hash equal.
        hex::encode(Sha256::digest(body.to_string().as_bytes()))
    });
    let idem = key.as_deref().zip(hash.as_deref());
    let created = s
        .store
        .create_within(&tenant, &spec, Utc::now(), idem, Some(s.max_active_waits))
        .await?;
    if !created.existing {
        s.metrics
            .created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(wait_id = %created.wait.id, "wait created");
    }
    let mut res = match block_for {
        Some(limit) => {
            let (wait, why) = if created.wait.is_running() {
                block(&s, &tenant, created.wait.id, limit).await?
            } else {
                (created.wait, Held::Ended)
            };
            blocked_response(&wait, why, true)
        }
        None => {
            let mut res = json_response(StatusCode::CREATED, &created.wait);
            res.headers_mut().insert(
                header::LOCATION,
                HeaderValue::from_str(&format!("/waits/{}", created.wait.id))
                    .expect("a uuid path is a valid header"),
            );
            res
        }
    };
    if created.existing {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

/// Read a wait
///
/// With `?wait=<duration>` or `?wait=true`, holds the response until the wait ends
/// (200 succeeded, 422 failed, 412 timed_out, 409 canceled, 424 error) or the
/// duration passes (202). Cut by the server stopping, or with `?wait=true` on a
/// wait still running past its deadline: 503 with `Retry-After`.
#[utoipa::path(
    get, path = "/waits/{id}", tag = "waits",
    params(
        ("id" = Uuid, Path, description = "The wait's id"),
        ("wait" = Option<String>, Query, description = "Hold the response: a duration such as `30s`, or `true` until the wait ends."),
    ),
    responses(
        (status = 200, description = "The wait (or, blocked, succeeded)", body = Wait),
        (status = 202, description = "Blocked and still running", body = Wait),
        (status = 404, description = "No such wait", body = crate::api::error::Problem),
        (status = 409, description = "Blocked and canceled", body = Wait),
        (status = 412, description = "Blocked and timed out", body = Wait),
        (status = 422, description = "Blocked and failed", body = Wait),
        (status = 424, description = "Blocked and ended in error", body = Wait),
        (status = 503, description = "Store unavailable, or blocked and cut by the server stopping (see Retry-After)", body = crate::api::error::Problem),
    )
)]
pub async fn get_one(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let pairs = query_pairs(&q);
    only(&pairs, &["wait"])?;
    let block_for = parse_block(param(&pairs, "wait"))?;
    match block_for {
        None => {
            let wait = s
                .store
                .get(&tenant, id)
                .await?
                .ok_or_else(|| no_such_wait(id))?;
            Ok(json_response(StatusCode::OK, &wait))
        }
        Some(limit) => {
            let (wait, why) = block(&s, &tenant, id, limit).await?;
            Ok(blocked_response(&wait, why, false))
        }
    }
}

pub use crate::model::WaitPage;

/// List waits
///
/// Newest first, filtered by `status` and by labels (`label=key:value`, repeatable;
/// all must match).
#[utoipa::path(
    get, path = "/waits", tag = "waits",
    params(
        ("status" = Option<String>, Query, description = "running | succeeded | failed | timed_out | canceled | error"),
        ("label" = Option<Vec<String>>, Query, description = "`key:value`; repeat for several"),
        ("limit" = Option<i64>, Query, description = "1 to 500, default 50"),
        ("cursor" = Option<String>, Query, description = "From `next_cursor` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of waits", body = WaitPage),
        (status = 400, description = "Bad filter", body = crate::api::error::Problem),
    )
)]
pub async fn list(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    let pairs = query_pairs(&q);
    only(&pairs, &["status", "label", "limit", "cursor"])?;
    let mut filter = ListFilter {
        limit: 50,
        ..Default::default()
    };
    if let Some(st) = param(&pairs, "status") {
        filter.status = Some(st.parse::<Status>().map_err(|_| {
            ApiError::bad_request(format!("status must be one of {}", Status::list()))
        })?);
    }
    filter.labels = parse_labels(&pairs, &s.limits)?;
    if let Some(l) = param(&pairs, "limit") {
        filter.limit = l
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=500).contains(n))
            .ok_or_else(|| ApiError::bad_request("limit must be a whole number from 1 to 500"))?;
    }
    if let Some(c) = param(&pairs, "cursor") {
        filter.before = Some(Uuid::parse_str(c).map_err(|_| {
            ApiError::bad_request(
                "cursor is not one this server gave out; pass next_cursor as it came",
            )
        })?);
    }
    // One more than asked for: a cursor is given only when another page exists.
    let limit = filter.limit;
    filter.limit += 1;
    let mut items = s.store.list(&tenant, &filter).await?;
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    let next_cursor = more
        .then(|| items.last().map(|w| w.id.to_string()))
        .flatten();
    Ok(json_response(
        StatusCode::OK,
        WaitPage { items, next_cursor },
    ))
}

/// The `label=key:value` filters of a list or a feed. A key that no wait can carry,
/// a value that none can hold, or more filters than a wait has labels, match
/// nothing: each is a 400 with a sentence, never a query.
pub(crate) fn parse_labels(
    pairs: &[(String, String)],
    limits: &crate::engine::Limits,
) -> ApiResult<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    for (k, v) in pairs {
        if k != "label" {
            continue;
        }
        let (lk, lv) = v.split_once(':').ok_or_else(|| {
            ApiError::bad_request("label must be written key:value, e.g. label=pipeline:1234")
        })?;
        let shown: String = lk.chars().take(64).collect();
        if !crate::engine::spec::is_label_name(lk) {
            return Err(ApiError::bad_request(format!(
                "label \"{}\" {}",
                shown.escape_debug(),
                crate::engine::spec::LABEL_NAME_RULE
            )));
        }
        if lv.len() > limits.max_label_len || lv.chars().any(char::is_control) {
            return Err(ApiError::bad_request(format!(
                "the value of label {shown} is longer than {} bytes or has a control character, so no wait can carry it",
                limits.max_label_len
            )));
        }
        labels.insert(lk.to_string(), lv.to_string());
        if labels.len() > limits.max_labels {
            return Err(ApiError::bad_request(format!(
                "more than {} label filters; a wait has at most {} labels",
                limits.max_labels, limits.max_labels
            )));
        }
    }
    Ok(labels)
}

/// Cancel a wait
///
/// Ends a running wait as `canceled`; an ended wait is returned unchanged.
#[utoipa::path(
    post, path = "/waits/{id}/cancel", tag = "waits",
    params(("id" = Uuid, Path, description = "The wait's id")),
    responses(
        (status = 200, description = "The wait, canceled (or as it ended)", body = Wait),
        (status = 404, description = "No such wait", body = crate::api::error::Problem),
    )
)]
pub async fn cancel(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    if let Some((k, _)) = query_pairs(&q).first() {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter \"{}\"; cancel takes none",
            k.chars().take(64).collect::<String>()
        )));
    }
    let canceled = s
        .store
        .cancel(&tenant, id, Utc::now())
        .await?
        .ok_or_else(|| no_such_wait(id))?;
    if canceled.ended {
        s.metrics.ended(Status::Canceled);
        tracing::info!(wait_id = %id, "wait canceled");
    }
    Ok(json_response(StatusCode::OK, &canceled.wait).into_response())
}
