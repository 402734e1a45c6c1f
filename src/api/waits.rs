//! `/waits`: create, read, list, cancel, and the blocking forms of create and read.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use chrono::Utc;
use sha2::{Digest, Sha256};

use super::auth::Tenant;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{
    ApiQuery, HoldQuery, IdempotencyHeader, JsonBody, ListQuery, NoQuery, WaitId, idempotency_key,
};
use super::guard::guard;
use super::hold::{Held, block, blocked_response, with_location};
use super::openapi::CreateWait;
use super::read::{current, no_such_wait, read};
use super::{AppState, json_response};
use crate::engine::Spec;
use crate::model::{Status, Wait, WaitPage};

/// Create a wait
///
/// Persists the wait and answers 201 with it. With `?wait=<duration>` or
/// `?wait=true` the response is held until the wait ends (201 succeeded, 422 failed,
/// 412 timed_out, 409 canceled, 424 error) or the duration passes (202). A held
/// request cut by the server stopping, or `?wait=true` on a wait still running past
/// its deadline, is a 503 with `Retry-After`: repeat it with the same
/// `Idempotency-Key`.
#[utoipa::path(
    post, path = "/waits", tag = "waits", operation_id = "create_wait",
    request_body(content = CreateWait, content_type = "application/json"),
    params(
        HoldQuery,
        IdempotencyHeader,
    ),
    responses(
        (status = 201, description = "Created (or, held, succeeded)", body = CreatedWait,
         headers(("Location" = String, description = "The wait's URL"),
                 ("Idempotent-Replayed" = String, description = "`true` when an earlier request with this Idempotency-Key created the wait"))),
        (status = 202, description = "Held, and still running when the duration passed", body = Wait,
         headers(("Location" = String, description = "The wait's URL"))),
        (status = 400, description = "Invalid request: the body, a field (see `errors`), the query or the Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A `target.auth.credential` the operator does not give this tenant, or does not let go to this target's host (`--credentials-file`), or a read-only API token (tenant:token:read), which may only read", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "A group names a member by the id of no wait of the caller's (exactly as reading it would answer)", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within the server's body timeout", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Held and canceled (the wait), or the Idempotency-Key was used with another body (a problem)",
         content((Wait = "application/json"), (Problem = "application/problem+json"))),
        (status = 412, description = "Held and timed out", body = Wait),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Held and failed (the wait), or an unknown preset, bad preset params, or a target or webhook URL the SSRF guard refuses (a problem)",
         content((Wait = "application/json"), (Problem = "application/problem+json"))),
        (status = 424, description = "Held and ended in error", body = Wait),
        (status = 503, description = "The store is unreachable, or a held request was cut by the server stopping or outlived the wait's deadline: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn create_wait(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<HoldQuery>,
    headers: HeaderMap,
    trace: Option<axum::Extension<super::RequestTrace>>,
    JsonBody(mut body): JsonBody,
) -> ApiResult<Response> {
    let hold = q.hold()?;
    let key = idempotency_key(&headers)?;
    let trace = trace.and_then(|t| t.traceparent());
    if crate::groups::is_group(&body) {
        return super::groups::create(s, tenant, &headers, hold, key, body, trace).await;
    }
    // Parsing a request's presets, JSONPath queries and expressions costs what its
    // text decides: it is done on the CPU pool, in the tenant's turn. A request
    // with none of them costs what its JSON did to parse (linear, bounded by the
    // body's size, and done here already), so it is read here.
    let spec = if plain(&body) {
        Spec::from_request(&body, &s.limits).map_err(ApiError::validation)?
    } else {
        let (presets, limits) = (s.presets.clone(), s.limits.clone());
        let (request, spec) = crate::cpu::pool()
            .run(crate::cpu::Lane::Quick, &tenant, move || {
                let spec = super::presets::expand(&presets, &body).and_then(|request| {
                    Spec::from_request(&request, &limits).map_err(ApiError::validation)
                });
                (body, spec)
            })
            .await
            .map_err(|lost| {
                tracing::error!(error = %lost, "a create request's validation was lost");
                ApiError::internal()
            })?;
        body = request;
        spec?
    };
    if hold.is_some() && spec.callback.is_some() {
        return Err(ApiError::bad_request(
            "a callback wait cannot be created with ?wait=: the answer would be held until the wait ends, and no one would see its callback_url; create it without ?wait=, then block on GET /waits/{id}?wait=true",
        ));
    }
    if hold.is_some() && spec.nudge {
        return Err(ApiError::bad_request(
            "a wait with \"nudge\": true cannot be created with ?wait=: the answer would be held until the wait ends, and no one would see its nudge_url; create it without ?wait=, then block on GET /waits/{id}?wait=true",
        ));
    }
    guard(&s, &tenant, &spec, "", true)?;
    let source = match &spec.on_event {
        Some(on) => Some(super::sources::usable(&s, &tenant, &on.source).await?.ok_or_else(|| {
            ApiError::validation(vec![crate::engine::FieldError {
                field: "on_event.source".into(),
                message: format!(
                    "names \"{}\", which is neither one of this tenant's event sources nor one of the operator's it may use; create it with POST /sources, or see GET /sources",
                    on.source
                ),
            }])
        })?),
        None => None,
    };
    let hash = key.as_ref().map(|_| {
        // serde_json's map keeps keys sorted, so equal requests hash equal.
        hex::encode(Sha256::digest(body.to_string().as_bytes()))
    });
    let idem = key.as_deref().zip(hash.as_deref());
    let slot = hold.map(|_| s.streams.acquire(&tenant)).transpose()?;
    let mut created = s
        .store
        .waits()
        .create_within(
            &tenant,
            &spec,
            Utc::now(),
            idem,
            Some(s.max_active_waits),
            trace.as_deref(),
        )
        .await?;
    if !created.existing {
        s.metrics
            .created
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(wait_id = %created.wait.id, "wait created");
    }
    if let (Some(source), false) = (&source, created.existing) {
        super::hooks::listen(&s, &tenant, &created.wait, &spec, source).await?;
        // A kept event may have ended it: answer it as it now stands.
        if let Some(now) = s.store.waits().get(&tenant, created.wait.id).await? {
            created.wait = now;
        }
    }
    let (callback_url, nudge_url) = match (&spec.callback, created.existing) {
        (Some(cb), false) => (
            Some(register_callback(&s, &tenant, &created.wait, cb, &spec, &headers).await?),
            None,
        ),
        (None, false) if spec.nudge => (
            None,
            Some(register_nudge(&s, &tenant, &created.wait, &headers).await?),
        ),
        _ => (None, None),
    };
    if callback_url.is_some() || nudge_url.is_some() {
        // Only this answer carries the URL: the store keeps its secret's hash.
        let id = created.wait.id;
        let shown = CreatedWait {
            wait: created.wait,
            callback_url,
            nudge_url,
        };
        return Ok(with_location(
            json_response(StatusCode::CREATED, &shown),
            id,
        ));
    }
    let mut res = match hold.zip(slot) {
        Some((hold, slot)) if created.wait.is_running() => {
            let (wait, why) = block(&s, &tenant, created.wait.id, hold, slot).await?;
            blocked_response(&wait, why, true)
        }
        Some(_) => blocked_response(&created.wait, Held::Ended, true),
        None => with_location(
            json_response(StatusCode::CREATED, &created.wait),
            created.wait.id,
        ),
    };
    if created.existing {
        res.headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

/// A wait as its create answers it: with the URL a callback wait or a wait made
/// with `"nudge": true` is given, in this answer only.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CreatedWait {
    #[serde(flatten)]
    pub wait: Wait,
    /// A callback wait's URL (a capability: no token needed): POST to it to end
    /// the wait. Shown once, never again, not in an idempotent replay.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// The nudge URL of a wait made with `"nudge": true` (a capability): POST to
    /// it to poll the wait now. Shown once, as `callback_url` is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nudge_url: Option<String>,
}

/// Keeps the hash of a fresh secret for a callback wait just created, and answers
/// its callback URL on the address the request came to. A wait whose secret cannot
/// be kept could never be completed: it is canceled, and the answer is the error.
pub(super) async fn register_callback(
    s: &AppState,
    tenant: &str,
    wait: &Wait,
    cb: &crate::engine::spec::Callback,
    spec: &crate::engine::Spec,
    headers: &HeaderMap,
) -> ApiResult<String> {
    let secret = crate::store::callbacks::Secret::generate();
    let now = Utc::now();
    if let Err(e) = s
        .store
        .callbacks()
        .register(
            wait.id,
            tenant,
            &secret.hash(),
            cb.heartbeat,
            super::callbacks::judges(spec),
            now,
        )
        .await
    {
        let _ = s.store.waits().cancel(tenant, wait.id, now).await;
        return Err(e.into());
    }
    Ok(capability_url(
        headers,
        super::callbacks::PATH,
        secret.expose(),
    ))
}

/// A capability URL (a callback or nudge URL) on the address the request came
/// to: `path` then `secret`.
pub(super) fn capability_url(headers: &HeaderMap, path: &str, secret: &str) -> String {
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
    {
        Some("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}{path}{secret}")
}

/// Keeps the hash of a fresh nudge secret for a wait just created, and answers
/// its nudge URL. A wait whose secret cannot be kept is canceled, and the answer
/// is the error: its maker asked for a URL it would not get.
pub(super) async fn register_nudge(
    s: &AppState,
    tenant: &str,
    wait: &Wait,
    headers: &HeaderMap,
) -> ApiResult<String> {
    let secret = crate::store::callbacks::Secret::generate();
    if let Err(e) = s
        .store
        .nudges()
        .register(wait.id, tenant, &secret.hash())
        .await
    {
        let _ = s.store.waits().cancel(tenant, wait.id, Utc::now()).await;
        return Err(e.into());
    }
    Ok(capability_url(
        headers,
        super::nudges::PATH,
        secret.expose(),
    ))
}

/// A request that names no preset (nor its `params`), no condition and no JSONPath
/// query: its paths are JSON Pointers (or `@status`), read in time linear in their
/// length.
fn plain(body: &serde_json::Value) -> bool {
    let pointer = |key: &str| match body.get(key) {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::String(p)) => !p.starts_with('$'),
        Some(_) => true,
    };
    [
        "preset",
        "params",
        "success_condition",
        "failure_condition",
        "output",
        "on_event",
    ]
    .iter()
    .all(|k| body.get(*k).is_none())
        && pointer("state")
        && pointer("error")
}

/// Read a wait
///
/// With `?wait=<duration>` or `?wait=true`, holds the response until the wait ends
/// (200 succeeded, 422 failed, 412 timed_out, 409 canceled, 424 error) or the
/// duration passes (202). Cut by the server stopping, or with `?wait=true` on a
/// wait still running past its deadline: 503 with `Retry-After`.
#[utoipa::path(
    get, path = "/waits/{id}", tag = "waits", operation_id = "get_wait",
    params(
        ("id" = Uuid, Path, description = "The wait's id"),
        HoldQuery,
    ),
    responses(
        (status = 200, description = "The wait (or, held, succeeded)", body = Wait),
        (status = 202, description = "Held, and still running when the duration passed", body = Wait),
        (status = 400, description = "A bad `wait` or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Held and canceled", body = Wait),
        (status = 412, description = "Held and timed out", body = Wait),
        (status = 422, description = "Held and failed", body = Wait),
        (status = 424, description = "Held and ended in error", body = Wait),
        (status = 503, description = "The store is unreachable, or a held request was cut by the server stopping or outlived the wait's deadline: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn get_wait(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    ApiQuery(q): ApiQuery<HoldQuery>,
) -> ApiResult<Response> {
    match q.hold()? {
        None => Ok(json_response(StatusCode::OK, read(&s, &tenant, id).await?)),
        Some(hold) => {
            let slot = s.streams.acquire(&tenant)?;
            let (wait, why) = block(&s, &tenant, id, hold, slot).await?;
            Ok(blocked_response(&wait, why, false))
        }
    }
}

/// List waits
///
/// Newest first, filtered by `status` and by labels (`label=key:value`, repeatable;
/// all must match).
#[utoipa::path(
    get, path = "/waits", tag = "waits", operation_id = "list_waits",
    params(ListQuery),
    responses(
        (status = 200, description = "A page of waits", body = WaitPage),
        (status = 400, description = "A bad filter, limit or cursor, or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_waits(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Response> {
    let mut filter = q.filter(&s.limits)?;
    // One more than asked for: a cursor is given only when another page exists.
    let limit = filter.limit;
    filter.limit += 1;
    let mut items = s.store.waits().list(&tenant, &filter).await?;
    let more = items.len() as i64 > limit;
    items.truncate(limit as usize);
    s.store.groups().annotate(&mut items).await?;
    current(&s, &mut items).await;
    let next_cursor = more
        .then(|| items.last().map(|w| w.id.to_string()))
        .flatten();
    Ok(json_response(
        StatusCode::OK,
        WaitPage { items, next_cursor },
    ))
}

/// Cancel a wait
///
/// Ends a running wait as `canceled`; an ended wait is returned unchanged.
#[utoipa::path(
    post, path = "/waits/{id}/cancel", tag = "waits", operation_id = "cancel_wait",
    params(("id" = Uuid, Path, description = "The wait's id"), NoQuery),
    responses(
        (status = 200, description = "The wait, canceled (or as it had ended)", body = Wait),
        (status = 400, description = "A query parameter was given", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn cancel_wait(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
) -> ApiResult<Response> {
    let canceled = s
        .store
        .waits()
        .cancel(&tenant, id, Utc::now())
        .await?
        .ok_or_else(|| no_such_wait(id))?;
    let mut wait = canceled.wait;
    s.store
        .groups()
        .annotate(std::slice::from_mut(&mut wait))
        .await?;
    if canceled.ended {
        s.metrics.ended(Status::Canceled);
        if wait.grouping.mode.is_some() {
            s.metrics.group_ended(Status::Canceled);
        }
        tracing::info!(wait_id = %id, "wait canceled");
    }
    Ok(json_response(StatusCode::OK, &wait))
}
