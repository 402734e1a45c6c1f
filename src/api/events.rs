//! Event history as JSON pages, and followed live as server-sent events.
//!
//! A stream subscribes to the bus first, then replays from the table, then re-reads
//! the table whenever the bus says there is news (or that news may have been
//! missed): the table is the truth, the bus only a doorbell, so no event is lost or
//! repeated across listener reconnects.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::streams::Slot;
use super::waits::{WaitId, param, parse_labels, query_pairs};
use super::{AppState, Tenant, json_response};
use crate::api::error::{ApiError, ApiResult};
use crate::bus::{BusMsg, WaitSubscription};
use crate::metrics::Metrics;
use crate::store::{Event, StoreError};

const PAGE: i64 = 500;
/// A stream re-reads the table at least this often even without a notice.
const SAFETY_REREAD: Duration = Duration::from_secs(10);
/// SSE keep-alive comments (proxies drop idle connections at 15–60 s).
const KEEP_ALIVE: Duration = Duration::from_secs(10);

pub use crate::model::EventPage;

fn wants_stream(headers: &HeaderMap, pairs: &[(String, String)]) -> ApiResult<bool> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .contains("text/event-stream");
    let follow = match pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "follow")
        .map(|(_, v)| v.as_str())
    {
        None | Some("false") => false,
        Some("true") | Some("") => true,
        Some(_) => return Err(ApiError::bad_request("follow must be true or false")),
    };
    Ok(accept || follow)
}

/// The position to resume after: `Last-Event-ID` (as browsers send on reconnect),
/// else `?after=`, else the start. (`/events` also takes `after=latest`.)
fn resume_point(headers: &HeaderMap, pairs: &[(String, String)]) -> ApiResult<i64> {
    let from_header = headers.get("last-event-id").and_then(|v| v.to_str().ok());
    let from_query = pairs
        .iter()
        .rev()
        .find(|(k, _)| k == "after")
        .map(|(_, v)| v.as_str());
    match from_header.or(from_query) {
        None | Some("") => Ok(0),
        Some(v) => v
            .trim()
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .ok_or_else(|| {
                ApiError::bad_request(
                    "Last-Event-ID (or after) must be an event id this server sent",
                )
            }),
    }
}

fn only(pairs: &[(String, String)], allowed: &[&str]) -> ApiResult<()> {
    match pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        Some((k, _)) => Err(ApiError::bad_request(format!(
            "unknown query parameter \"{}\"; this route takes {}",
            k.chars().take(64).collect::<String>(),
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

/// A wait's events
///
/// JSON history by default; with `Accept: text/event-stream` or `?follow=true`, an
/// SSE stream (`id: <seq>`, `event: <kind>`, `data: <json>`): history first, then
/// live, ending after the terminal event. `Last-Event-ID` resumes after that seq.
#[utoipa::path(
    get, path = "/waits/{id}/events", tag = "events",
    params(
        ("id" = Uuid, Path, description = "The wait's id"),
        ("after" = Option<i64>, Query, description = "Only events with a greater seq"),
        ("follow" = Option<bool>, Query, description = "Stream as server-sent events"),
    ),
    responses(
        (status = 200, description = "The history (JSON) or the stream (text/event-stream)", 
         content((EventPage = "application/json"), (String = "text/event-stream"))),
        (status = 404, description = "No such wait", body = crate::api::error::Problem),
    )
)]
pub async fn wait_events(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let pairs = query_pairs(&q);
    only(&pairs, &["after", "follow"])?;
    let stream_it = wants_stream(&headers, &pairs)?;
    let after = i32::try_from(resume_point(&headers, &pairs)?)
        .map_err(|_| ApiError::bad_request("Last-Event-ID (or after) is not a seq of this wait"))?;
    if s.store.get(&tenant, id).await?.is_none() {
        return Err(ApiError::not_found(format!("there is no wait {id}")));
    }
    if !stream_it {
        let mut items = sequenced_history(&s, &tenant, id, after, PAGE + 1).await?;
        let more = items.len() as i64 > PAGE;
        items.truncate(PAGE as usize);
        let next_cursor = more
            .then(|| items.last().map(|e| e.seq.to_string()))
            .flatten();
        return Ok(json_response(
            StatusCode::OK,
            EventPage { items, next_cursor },
        ));
    }
    let slot = s.streams.acquire(&tenant)?;
    Ok(sse_wait(s, tenant, id, i64::from(after), slot))
}

/// All events
///
/// The same across all of the caller's waits, with a global cursor (`id`), filterable
/// by labels (`label=key:value`). As a stream it does not end by itself.
#[utoipa::path(
    get, path = "/events", tag = "events",
    params(
        ("after" = Option<String>, Query, description = "Only events with a greater global id; `latest` for events from now on (as JSON: an empty page whose next_cursor is the newest id)"),
        ("follow" = Option<bool>, Query, description = "Stream as server-sent events"),
        ("label" = Option<Vec<String>>, Query, description = "`key:value`; repeat for several"),
    ),
    responses(
        (status = 200, description = "Events (JSON) or the stream (text/event-stream)", 
         content((EventPage = "application/json"), (String = "text/event-stream"))),
    )
)]
pub async fn all_events(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let pairs = query_pairs(&q);
    only(&pairs, &["after", "follow", "label"])?;
    let stream_it = wants_stream(&headers, &pairs)?;
    let labels = parse_labels(&pairs, &s.limits)?;
    let latest = param(&pairs, "after") == Some("latest") && headers.get("last-event-id").is_none();
    let after = if latest {
        // Now: the tenant's newest event. A dashboard that has just read the list
        // follows from here without replaying history.
        s.store.last_event_id(Some(&tenant)).await?
    } else {
        let after = resume_point(&headers, &pairs)?;
        // A cursor no event has reached yet: from another server, or one whose
        // history was reset. Following it would wait for ids already given to
        // other events.
        let newest = s.store.last_event_id(None).await?;
        if after > newest {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Cursor ahead of the events",
                format!(
                    "the cursor {after} is past the newest event of this server ({newest}): its history was reset, or the cursor came from another server; start again from after=0, or after=latest for new events only"
                ),
            ));
        }
        after
    };
    if !stream_it {
        let mut items = s
            .store
            .global_events(&tenant, after, &labels, PAGE + 1)
            .await?;
        let more = items.len() as i64 > PAGE;
        items.truncate(PAGE as usize);
        // The cursor to follow from: after the last event of the page, or where
        // this page started when it is empty (after=latest gives the newest).
        let next_cursor = match items.last() {
            Some(e) if more => e.id.map(|id| id.to_string()),
            _ if latest => Some(after.to_string()),
            _ => None,
        };
        return Ok(json_response(
            StatusCode::OK,
            EventPage { items, next_cursor },
        ));
    }
    let slot = s.streams.acquire(&tenant)?;
    Ok(sse_all(s, tenant, labels, after, slot))
}

/// The events a notice carries for a wait's stream, when they follow on from
/// `after` without a gap.
fn carried(
    id: Uuid,
    msg: &Result<BusMsg, RecvError>,
    after: i64,
) -> Option<impl Iterator<Item = &Event>> {
    let Ok(BusMsg::Notice(n)) = msg else {
        return None;
    };
    let events = n.events.as_ref().filter(|_| n.wait_id == id)?;
    let mut next = events
        .iter()
        .skip_while(move |e| i64::from(e.seq) <= after)
        .peekable();
    match next.peek() {
        Some(e) if i64::from(e.seq) == after + 1 => Some(next),
        _ => None,
    }
}

/// Whether a bus message may mean news for a wait's stream.
fn news(id: Uuid, msg: &Result<BusMsg, RecvError>, after: i64) -> bool {
    match msg {
        Ok(BusMsg::Notice(n)) => n.wait_id == id && i64::from(n.seq) > after,
        Ok(BusMsg::Work) => false,
        _ => true,
    }
}

/// A wait's history from `after`, as far as it is sequenced. On Postgres an event
/// committed a moment ago may not have its global cursor yet; reads do not number
/// events themselves but wait (for at most a second) for the sequencer's notice that
/// it has, then read again, so a client that saw the wait end sees all its events.
async fn sequenced_history(
    s: &AppState,
    tenant: &str,
    id: Uuid,
    after: i32,
    limit: i64,
) -> Result<Vec<Event>, StoreError> {
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut notices: Option<WaitSubscription> = None;
    loop {
        let mut events = s.store.events(tenant, id, after, limit).await?;
        let cut = events.iter().take_while(|e| e.id.is_some()).count();
        if cut == events.len() || tokio::time::Instant::now() >= until {
            events.truncate(cut);
            return Ok(events);
        }
        match notices.as_mut() {
            // Subscribed only now: read again first, so a notice sent meanwhile is
            // not waited for in vain.
            None => notices = Some(s.bus.subscribe_wait(id)),
            Some(rx) => {
                let _ = tokio::time::timeout_at(until, rx.recv()).await;
            }
        }
    }
}

/// One SSE frame: `id` (the stream's cursor), `event` (the kind), `data` (the JSON).
fn frame(cursor: i64, kind: &str, json: &str) -> SseEvent {
    SseEvent::default()
        .id(cursor.to_string())
        .event(kind)
        .data(json)
}

/// Counts an open stream in the metrics for as long as it lives, and holds its
/// place among the streams the replica allows.
struct Subscribed {
    metrics: Arc<Metrics>,
    _slot: Slot,
}

impl Subscribed {
    fn new(metrics: Arc<Metrics>, slot: Slot) -> Subscribed {
        metrics.sse_subscribers.fetch_add(1, Relaxed);
        Subscribed {
            metrics,
            _slot: slot,
        }
    }
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.metrics.sse_subscribers.fetch_sub(1, Relaxed);
    }
}

/// A page of history, read under a replay permit: replays share the connection
/// pool with everything else, and a burst of them (a thousand dashboards
/// reconnecting at once) must leave connections to the rest.
async fn replay_page<T>(
    s: &AppState,
    read: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let _permit = s.replays.acquire().await;
    read.await
}

/// Waits out a failed read (the store is away) unless the stream ends first;
/// false when it did.
async fn pause_after_error(
    tx: &mpsc::Sender<SseEvent>,
    stopping: &mut tokio::sync::watch::Receiver<bool>,
    e: &StoreError,
) -> bool {
    tracing::debug!(error = %e, "event stream cannot read; retrying");
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(500)) => true,
        _ = tx.closed() => false,
        _ = stopping.changed() => false,
    }
}

/// The SSE response over the frames a task sends.
fn sse_response(rx: mpsc::Receiver<SseEvent>) -> Response {
    let body = stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    let mut res = Sse::new(body)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
}

/// A wait's stream: history, then what its notices carry (or a read when they
/// carry nothing, or after a gap), ending after the terminal event.
fn sse_wait(s: AppState, tenant: String, id: Uuid, after: i64, slot: Slot) -> Response {
    let (tx, rx) = mpsc::channel::<SseEvent>(64);
    let guard = Subscribed::new(s.metrics.clone(), slot);
    // Subscribe before the first read, so nothing between the two is missed.
    let mut bus: WaitSubscription = s.bus.subscribe_wait(id);
    tokio::spawn(async move {
        let _guard = guard;
        let mut last = after;
        let mut stopping = s.stopping.clone();
        // Sends one event; false when the stream is over (the client left, or the
        // terminal event was just sent).
        let send = |e: &Event| {
            let json = serde_json::to_string(e).unwrap_or_default();
            let f = frame(i64::from(e.seq), e.kind(), &json);
            let terminal = e.is_terminal();
            let tx = tx.clone();
            async move { tx.send(f).await.is_ok() && !terminal }
        };
        loop {
            match replay_page(&s, s.store.events(&tenant, id, last as i32, PAGE)).await {
                Ok(mut events) => {
                    let full = events.len() as i64 == PAGE;
                    // Only what is sequenced: the rest follows with the sequencer's
                    // notice, which carries it.
                    let cut = events.iter().take_while(|e| e.id.is_some()).count();
                    let full = full && cut == events.len();
                    events.truncate(cut);
                    for e in &events {
                        last = i64::from(e.seq);
                        if !send(e).await {
                            return;
                        }
                    }
                    if full {
                        continue;
                    }
                    if last > 0 {
                        // Resumed at the end of an ended wait (the event the client saw
                        // last is the terminal one), or past it (no such event, and the
                        // wait has ended): nothing more will come.
                        let at_end = match s.store.events(&tenant, id, last as i32 - 1, 1).await {
                            Ok(v) => match v.first() {
                                Some(e) => i64::from(e.seq) == last && e.is_terminal(),
                                None => {
                                    matches!(s.store.get(&tenant, id).await, Ok(Some(w)) if !w.is_running())
                                }
                            },
                            Err(_) => false,
                        };
                        if at_end {
                            return;
                        }
                    }
                }
                Err(e) => {
                    if pause_after_error(&tx, &mut stopping, &e).await {
                        continue;
                    }
                    return;
                }
            }
            let deadline = tokio::time::Instant::now() + SAFETY_REREAD;
            loop {
                if *stopping.borrow() {
                    return;
                }
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline) => break,
                    _ = tx.closed() => return,
                    _ = stopping.changed() => return,
                    m = bus.recv() => {
                        if matches!(m, Err(RecvError::Closed)) {
                            return;
                        }
                        // The notice brought the events that come next: no read.
                        if let Some(next) = carried(id, &m, last) {
                            for e in next {
                                last = i64::from(e.seq);
                                if !send(e).await {
                                    return;
                                }
                            }
                            continue;
                        }
                        if news(id, &m, last) {
                            break;
                        }
                    }
                }
            }
        }
    });
    sse_response(rx)
}

/// The stream of all the tenant's events (`GET /events`): history from the table,
/// then the replica's [`crate::feed`], which reads once for every follower. After
/// falling behind the feed, it reads the table again from where it stands.
fn sse_all(
    s: AppState,
    tenant: String,
    labels: BTreeMap<String, String>,
    after: i64,
    slot: Slot,
) -> Response {
    let (tx, rx) = mpsc::channel::<SseEvent>(64);
    let guard = Subscribed::new(s.metrics.clone(), slot);
    // Subscribe before the first read, so nothing between the two is missed.
    let mut feed = s.feed.subscribe();
    tokio::spawn(async move {
        let _guard = guard;
        let mut last = after;
        let mut stopping = s.stopping.clone();
        loop {
            // History, a page at a time, up to what is there now.
            loop {
                match replay_page(&s, s.store.global_events(&tenant, last, &labels, PAGE)).await {
                    Ok(events) => {
                        for e in &events {
                            let id = e.id.unwrap_or_default();
                            let json = serde_json::to_string(e).unwrap_or_default();
                            if tx.send(frame(id, e.kind(), &json)).await.is_err() {
                                return;
                            }
                            last = id;
                        }
                        if (events.len() as i64) < PAGE {
                            break;
                        }
                    }
                    Err(e) => {
                        if !pause_after_error(&tx, &mut stopping, &e).await {
                            return;
                        }
                    }
                }
            }
            // Live, from the feed, until this stream falls behind it.
            loop {
                if *stopping.borrow() {
                    return;
                }
                let batch = tokio::select! {
                    _ = tx.closed() => return,
                    _ = stopping.changed() => return,
                    b = feed.recv() => b,
                };
                match batch {
                    Ok(batch) => {
                        for item in batch.items.iter() {
                            let id = item.event.id.unwrap_or_default();
                            if id <= last || !item.is_for(&tenant, &labels) {
                                continue;
                            }
                            if tx
                                .send(frame(id, item.event.kind(), &item.json))
                                .await
                                .is_err()
                            {
                                return;
                            }
                            last = id;
                        }
                    }
                    // Batches were missed: read the table from where this stands.
                    Err(RecvError::Lagged(_)) => break,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    });
    sse_response(rx)
}
