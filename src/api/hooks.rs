//! `/hooks/{id}`: where an event source's events arrive (docs/design.md §2.18),
//! and what an event does to the waits listening for its key, whether it
//! arrives before them (a wait's create looks back, [`listen`]) or after.
//!
//! No API token: the source's signature is the credential, checked on the raw
//! body before it is parsed, and nothing of a refused event is kept. The body is
//! read to at most 1 MiB. An event's effects reach at most [`MAX_LISTENERS`]
//! waits, each found through the listener index, never by a scan of all waits.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use axum::Extension;
use axum::body::Body;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use chrono::Utc;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::error::{ApiError, ApiResult, Problem};
use super::{AppState, json_response};
use crate::engine::condition::{Budget, Vars};
use crate::engine::spec::{OnEvent, Then};
use crate::engine::{End, Spec};
use crate::model::{Status, Wait};
use crate::sources::{KeyFrom, MAX_EVENT_BODY};
use crate::store::CallbackEnd;
use crate::store::sources::{Kept, NewEvent, OPERATOR, Source};

/// The most listening waits one event reaches.
pub const MAX_LISTENERS: i64 = 1000;
/// The most kept events a wait's create looks back at.
pub const MAX_LOOKBACK_EVENTS: i64 = 100;
/// Requests a second to hook URLs per client address, in bursts of up to
/// [`BURST`]: a provider delivering many events from one address.
pub const PER_SECOND: u32 = 100;
pub const BURST: u32 = 200;

/// The answer to an event.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventAccepted {
    /// The event's delivery id (its replays are one effect).
    pub delivery: String,
    /// The key the source read from it; `null` when it has none (it then
    /// reaches no wait).
    pub key: Option<String>,
    /// True when this delivery was received before: nothing more was done.
    pub replayed: bool,
    /// The listening waits the event matched (0 for a replay).
    pub matched: u64,
}

/// Receive an event
///
/// An event for an event source: its signature is checked by the source's kind,
/// it is kept for the source's lookback window, and the running waits whose
/// `on_event` names the source and the event's key (and whose `match` accepts
/// it) are polled now (`then: poll`) or have it judged by their conditions
/// (`then: end`). A delivery received before is one effect.
#[utoipa::path(
    post, path = "/hooks/{id}", tag = "sources", operation_id = "receive_event",
    params(("id" = String, Path, description = "The source's id, from its hook_url")),
    security(()),
    request_body(content = serde_json::Value, content_type = "application/json"),
    responses(
        (status = 202, description = "Kept, and applied to the waits it matched", body = EventAccepted),
        (status = 200, description = "A replay of a delivery already received: nothing more was done", body = EventAccepted),
        (status = 400, description = "The body is not JSON, or the delivery id is malformed", body = Problem, content_type = "application/problem+json"),
        (status = 401, description = "The signature is missing or wrong: nothing was kept", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No event source has this hook URL", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within the server's body timeout", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 1 MiB: nothing was kept", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many requests from this address, or the tenant keeps as many events as it may: nothing was kept", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn receive_event(
    State(s): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    s.hook_rate.check(peer.map(|c| c.0.0))?;
    let found = match id.len() {
        1..=64 => s.store.sources().by_id(&id).await?,
        _ => None,
    };
    let (source, secret) = found.ok_or_else(|| {
        ApiError::not_found("no event source has this hook URL; use the hook_url its create answered with (GET /sources shows it)")
    })?;
    let bytes = read_bounded(&s, &headers, body).await?;
    let headers = crate::probe::header_map(&headers);
    let refused = |why: String| {
        s.metrics.source_events_refused.fetch_add(1, Relaxed);
        ApiError::unauthorized(format!("the event is refused and not kept: {why}"))
    };
    crate::sources::verify(source.kind, &secret, &headers, &bytes, Utc::now()).map_err(refused)?;
    drop(secret);
    let delivery = crate::sources::delivery_id(source.kind, &headers, &bytes)
        .map_err(ApiError::bad_request)?;
    let parsed = crate::cpu::pool()
        .run(crate::cpu::Lane::Long, &source.tenant, {
            let key_from = source.key_from.clone();
            let headers = headers.clone();
            move || -> Result<(Value, Option<String>), String> {
                let body = super::strict::from_slice(&bytes).map_err(|e| e.to_string())?;
                let key = KeyFrom::parse(&key_from)
                    .ok()
                    .and_then(|k| k.extract(&body, &headers));
                Ok((body, key))
            }
        })
        .await
        .map_err(|lost| {
            tracing::error!(error = %lost, "an event's parse was lost");
            ApiError::internal()
        })?;
    let (body, key) = parsed.map_err(|e| {
        ApiError::bad_request(format!(
            "the event's body is not valid JSON: {e}; nothing was kept"
        ))
    })?;
    let kept_headers = crate::sources::kept_headers(&headers);
    let event = NewEvent {
        source: &source,
        delivery: &delivery,
        key: key.as_deref(),
        body: &body.to_string(),
        headers: &serde_json::to_string(&kept_headers).unwrap_or_else(|_| "{}".into()),
        received: Utc::now(),
    };
    match s.store.sources().keep(&event, s.event_caps).await? {
        Kept::Full => {
            return Err(ApiError {
                retry_after: Some(60),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too many kept events",
                    format!(
                        "{} {} events or {} MiB of events already, the most allowed; nothing was kept: send it again once older events expire (each source's lookback), or shorten the sources' lookback",
                        if source.tenant == OPERATOR {
                            "the operator's sources keep"
                        } else {
                            "this tenant keeps"
                        },
                        s.event_caps.events,
                        s.event_caps.bytes / (1024 * 1024)
                    ),
                )
            });
        }
        Kept::Replayed => {
            let answer = EventAccepted {
                delivery,
                key,
                replayed: true,
                matched: 0,
            };
            return Ok(json_response(StatusCode::OK, &answer));
        }
        Kept::New => {}
    }
    s.metrics.source_events.fetch_add(1, Relaxed);
    // The event is kept, and a redelivery of it would be a replay: its effects
    // run to their end even if the sender hangs up meanwhile.
    let effects = tokio::spawn(reach_listeners(
        s.clone(),
        source.clone(),
        key.clone(),
        Arc::new(body),
        Arc::new(kept_headers),
    ));
    let matched = effects.await.unwrap_or_else(|e| {
        tracing::error!(error = %e, "an event's effects were lost");
        0
    });
    let answer = EventAccepted {
        delivery,
        key,
        replayed: false,
        matched,
    };
    Ok(json_response(StatusCode::ACCEPTED, &answer))
}

/// Applies a kept event to the running waits listening for its key; how many
/// it matched. A wait it cannot be applied to (the store away) is logged and
/// left to its polls, which remain the backstop.
async fn reach_listeners(
    s: AppState,
    source: Source,
    key: Option<String>,
    body: Arc<Value>,
    headers: Arc<BTreeMap<String, String>>,
) -> u64 {
    let Some(key) = key else {
        return 0;
    };
    let listeners = match s
        .store
        .sources()
        .listeners(&source.id, &key, MAX_LISTENERS)
        .await
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "an event's listeners could not be read; their polls go on");
            return 0;
        }
    };
    let mut matched = 0;
    for l in listeners {
        // A tenant the operator no longer lists for its source (the file
        // changed since the wait began to listen) hears nothing of it.
        if source.tenant == OPERATOR && s.credentials.source_for(&l.tenant, &source.name).is_none()
        {
            continue;
        }
        let spec = SpecOf::Stored(l.spec);
        match apply(&s, &l.tenant, l.wait_id, spec, &body, &headers).await {
            Ok(true) => matched += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(wait = %l.wait_id, error = %e.detail, "an event could not be applied to a listening wait; its polls go on");
            }
        }
    }
    matched
}

/// The body's bytes, refused with a `413` as soon as they pass 1 MiB.
async fn read_bounded(s: &AppState, headers: &HeaderMap, body: Body) -> ApiResult<Vec<u8>> {
    use futures_util::StreamExt;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Event too large",
            format!(
                "the event's body is over {} MiB; nothing was kept",
                MAX_EVENT_BODY / (1024 * 1024)
            ),
        )
    };
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_EVENT_BODY as u64) {
        return Err(too_large());
    }
    let read = async {
        let mut stream = body.into_data_stream();
        let mut bytes: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| {
                ApiError::bad_request("the event's body could not be read: it broke off, or its chunked encoding is malformed")
            })?;
            if bytes.len() + chunk.len() > MAX_EVENT_BODY {
                return Err(too_large());
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    };
    match tokio::time::timeout(s.body_timeout, read).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "Request timeout",
            format!(
                "the event's body did not arrive within {}",
                crate::engine::duration::format(s.body_timeout)
            ),
        )),
    }
}

/// A listening wait's spec: as its create read it, or as stored (read on the
/// CPU pool, as reading it compiles its expressions).
pub(super) enum SpecOf {
    Parsed(Box<Spec>),
    Stored(String),
}

/// What an event does to one listening wait: nothing when its `match` refuses
/// it (or fails: logged and counted, the wait unharmed), else a poll now or a
/// judgement of its body. True when it matched.
pub(super) async fn apply(
    s: &AppState,
    tenant: &str,
    wait_id: uuid::Uuid,
    spec: SpecOf,
    body: &Arc<Value>,
    headers: &Arc<BTreeMap<String, String>>,
) -> ApiResult<bool> {
    let judged = {
        let (body, headers) = (Arc::clone(body), Arc::clone(headers));
        crate::cpu::pool()
            .run(crate::cpu::Lane::Long, tenant, move || {
                let spec = match spec {
                    SpecOf::Parsed(spec) => *spec,
                    SpecOf::Stored(text) => serde_json::from_str::<Spec>(&text)
                        .map_err(|e| format!("its stored spec does not read back: {e}"))?,
                };
                match &spec.on_event {
                    Some(on) => judge(on, &spec, &body, &headers),
                    None => Ok(None),
                }
            })
            .await
    };
    let judged = match judged {
        Ok(Ok(j)) => j,
        Ok(Err(why)) => {
            s.metrics.source_match_errors.fetch_add(1, Relaxed);
            tracing::warn!(wait = %wait_id, error = %why, "a listening wait's match could not be evaluated on an event; the event is kept and the wait goes on");
            return Ok(false);
        }
        Err(lost) => {
            s.metrics.source_match_errors.fetch_add(1, Relaxed);
            tracing::warn!(wait = %wait_id, error = %lost, "a listening wait's match was lost; the wait goes on");
            return Ok(false);
        }
    };
    let store = &s.store;
    match judged {
        None => return Ok(false),
        Some(Judged::Poll) => store.nudges().announce(wait_id).await?,
        Some(Judged::Verdict(super::callbacks::Verdict::End(o))) => {
            let end = if o.end == End::Succeeded {
                CallbackEnd {
                    status: Status::Succeeded,
                    reason: o.reason,
                    error_detail: None,
                    output: Some(crate::engine::bound::output(body)),
                }
            } else {
                CallbackEnd {
                    status: Status::Failed,
                    reason: o.reason,
                    error_detail: Some(
                        o.error_detail
                            .unwrap_or_else(|| crate::engine::bound::detail(body)),
                    ),
                    output: None,
                }
            };
            store
                .callbacks()
                .end(tenant, wait_id, &end, Utc::now())
                .await?;
        }
        Some(Judged::Verdict(super::callbacks::Verdict::Progress(Some(state)))) => {
            store
                .callbacks()
                .progress(tenant, wait_id, &state, Utc::now())
                .await?;
        }
        Some(Judged::Verdict(super::callbacks::Verdict::Progress(None))) => {}
        Some(Judged::Verdict(super::callbacks::Verdict::Unjudged(why))) => {
            tracing::info!(wait = %wait_id, reason = %why, "an event was not judged; the wait goes on");
        }
    }
    s.metrics.source_matches.fetch_add(1, Relaxed);
    Ok(true)
}

enum Judged {
    Poll,
    Verdict(super::callbacks::Verdict),
}

/// The `match` of `on`, then what `then` makes of the event: `None` when it does
/// not match; the error when `match` fails or runs past its budget.
fn judge(
    on: &OnEvent,
    spec: &Spec,
    body: &Value,
    headers: &BTreeMap<String, String>,
) -> Result<Option<Judged>, String> {
    if let Some(m) = &on.matches {
        let vars = Vars::for_conditions(&[m], Some(body), 200, headers, None).at(Utc::now());
        if !m
            .evaluate(&vars, &mut Budget::default())
            .map_err(|f| f.to_string())?
        {
            return Ok(None);
        }
    }
    Ok(Some(match on.then {
        Then::Poll => Judged::Poll,
        Then::End => Judged::Verdict(super::callbacks::verdict(spec, body, headers, Utc::now())),
    }))
}

/// A wait made with `on_event` starts listening to `source`: its listener is
/// indexed, then the events kept for its key within their window are applied
/// to it, oldest first, until one ends it. Indexing first means an event that
/// arrives meanwhile is seen by its receipt, or by this look back, or by both
/// (a second application is harmless: a poll paced, an end once). A wait whose
/// listener cannot be kept is canceled, and the answer is the error; a look
/// back that fails is logged, and the wait listens on.
pub(super) async fn listen(
    s: &AppState,
    tenant: &str,
    wait: &Wait,
    spec: &Spec,
    source: &Source,
) -> ApiResult<()> {
    let Some(on) = &spec.on_event else {
        return Ok(());
    };
    if let Err(e) = s.store.sources().listen(&source.id, &on.key, wait.id).await {
        let _ = s.store.waits().cancel(tenant, wait.id, Utc::now()).await;
        return Err(e.into());
    }
    if let Err(e) = look_back(s, tenant, wait, spec, on, source).await {
        tracing::warn!(wait = %wait.id, error = %e.detail, "a listening wait's look back at kept events failed; it listens on");
    }
    Ok(())
}

async fn look_back(
    s: &AppState,
    tenant: &str,
    wait: &Wait,
    spec: &Spec,
    on: &OnEvent,
    source: &Source,
) -> ApiResult<()> {
    let kept = s
        .store
        .sources()
        .kept(&source.id, &on.key, Utc::now(), MAX_LOOKBACK_EVENTS)
        .await?;
    for e in kept {
        let (Ok(body), Ok(headers)) = (
            serde_json::from_str::<Value>(&e.body),
            serde_json::from_str::<BTreeMap<String, String>>(&e.headers),
        ) else {
            continue;
        };
        let (body, headers) = (Arc::new(body), Arc::new(headers));
        let spec = SpecOf::Parsed(Box::new(spec.clone()));
        apply(s, tenant, wait.id, spec, &body, &headers).await?;
        if on.then == Then::End {
            let now = s.store.waits().get(tenant, wait.id).await?;
            if now.is_none_or(|w| w.status.is_end()) {
                break;
            }
        }
    }
    Ok(())
}
