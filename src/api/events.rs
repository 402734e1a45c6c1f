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
use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::waits::{WaitId, parse_labels, query_pairs};
use super::{AppState, Tenant, json_response};
use crate::api::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::store::bus::{BusMsg, Subscription};
use crate::store::{Event, Store, StoreError};

const PAGE: i64 = 500;
/// A stream re-reads the table at least this often even without a notice.
const SAFETY_REREAD: Duration = Duration::from_secs(10);
/// SSE keep-alive comments (proxies drop idle connections at 15–60 s).
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// A page of events.
#[derive(Serialize, utoipa::ToSchema)]
pub struct EventPage {
    pub items: Vec<Event>,
    /// Pass as `after` for the next page; null when there is no more now.
    pub next_cursor: Option<String>,
}

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
/// else `?after=`, else the start.
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
        let items = s.store.events(&tenant, id, after, PAGE).await?;
        let next_cursor = (items.len() as i64 == PAGE)
            .then(|| items.last().map(|e| e.seq.to_string()))
            .flatten();
        return Ok(json_response(
            StatusCode::OK,
            EventPage { items, next_cursor },
        ));
    }
    let source = Source::Wait { id };
    Ok(sse(s, tenant, source, i64::from(after)))
}

/// All events
///
/// The same across all of the caller's waits, with a global cursor (`id`), filterable
/// by labels (`label=key:value`). As a stream it does not end by itself.
#[utoipa::path(
    get, path = "/events", tag = "events",
    params(
        ("after" = Option<i64>, Query, description = "Only events with a greater global id"),
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
    let after = resume_point(&headers, &pairs)?;
    let labels = parse_labels(&pairs)?;
    if !stream_it {
        let items = s.store.global_events(&tenant, after, &labels, PAGE).await?;
        let next_cursor = (items.len() as i64 == PAGE)
            .then(|| items.last().and_then(|e| e.id).map(|id| id.to_string()))
            .flatten();
        return Ok(json_response(
            StatusCode::OK,
            EventPage { items, next_cursor },
        ));
    }
    Ok(sse(s, tenant, Source::All { labels }, after))
}

enum Source {
    Wait { id: Uuid },
    All { labels: BTreeMap<String, String> },
}

impl Source {
    async fn read(&self, s: &AppState, tenant: &str, after: i64) -> Result<Vec<Event>, StoreError> {
        match self {
            Source::Wait { id } => s.store.events(tenant, *id, after as i32, PAGE).await,
            Source::All { labels } => s.store.global_events(tenant, after, labels, PAGE).await,
        }
    }

    fn cursor(&self, e: &Event) -> i64 {
        match self {
            Source::Wait { .. } => i64::from(e.seq),
            // Global reads select sequenced events only.
            Source::All { .. } => e.id.unwrap_or_default(),
        }
    }

    /// The events a notice carries for this stream, when they follow on from `after`
    /// without a gap (a wait's stream only; the global feed filters, so it reads).
    fn carried<'m>(
        &self,
        msg: &'m Result<BusMsg, RecvError>,
        after: i64,
    ) -> Option<impl Iterator<Item = &'m Event>> {
        let (Source::Wait { id }, Ok(BusMsg::Notice(n))) = (self, msg) else {
            return None;
        };
        let events = n.events.as_ref().filter(|_| n.wait_id == *id)?;
        let mut next = events
            .iter()
            .skip_while(move |e| i64::from(e.seq) <= after)
            .peekable();
        match next.peek() {
            Some(e) if i64::from(e.seq) == after + 1 => Some(next),
            _ => None,
        }
    }

    /// Whether a bus message may mean news for this stream.
    fn news(&self, msg: &Result<BusMsg, RecvError>, after: i64) -> bool {
        match (self, msg) {
            (Source::Wait { id }, Ok(BusMsg::Notice(n))) => {
                n.wait_id == *id && i64::from(n.seq) > after
            }
            (Source::All { .. }, Ok(BusMsg::Notice(n))) => n.gid > after,
            (_, Ok(BusMsg::Released)) => false,
            _ => true,
        }
    }
}

/// Sends one event down the stream; false when the stream is over (the client left,
/// or the wait's terminal event was just sent).
async fn send(tx: &mpsc::Sender<SseEvent>, source: &Source, e: &Event) -> bool {
    let data = serde_json::to_string(e).unwrap_or_default();
    let ev = SseEvent::default()
        .id(source.cursor(e).to_string())
        .event(e.kind.clone())
        .data(data);
    if tx.send(ev).await.is_err() {
        return false;
    }
    !(matches!(source, Source::Wait { .. }) && e.is_terminal())
}

/// Counts an open stream in the metrics for as long as it lives.
struct Subscribed(Arc<Metrics>);

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.0.sse_subscribers.fetch_sub(1, Relaxed);
    }
}

fn sse(s: AppState, tenant: String, source: Source, after: i64) -> Response {
    let (tx, rx) = mpsc::channel::<SseEvent>(64);
    s.metrics.sse_subscribers.fetch_add(1, Relaxed);
    let guard = Subscribed(s.metrics.clone());
    // Subscribe before the first read, so nothing between the two is missed.
    let mut bus = match &source {
        Source::Wait { id } => Subscription::Wait(s.bus.subscribe_wait(*id)),
        Source::All { .. } => Subscription::All(s.bus.subscribe()),
    };
    tokio::spawn(async move {
        let _guard = guard;
        let mut last = after;
        let mut stopping = s.stopping.clone();
        loop {
            match source.read(&s, &tenant, last).await {
                Ok(events) => {
                    let full = events.len() as i64 == PAGE;
                    for e in &events {
                        last = source.cursor(e);
                        if !send(&tx, &source, e).await {
                            return;
                        }
                    }
                    if full {
                        continue;
                    }
                    if let Source::Wait { id } = &source
                        && last > 0
                    {
                        // Resumed at the end of an ended wait (the event the client saw
                        // last is the terminal one), or past it (no such event, and the
                        // wait has ended): nothing more will come.
                        let at_end = match source.read(&s, &tenant, last - 1).await {
                            Ok(v) => match v.first() {
                                Some(e) => i64::from(e.seq) == last && e.is_terminal(),
                                None => {
                                    matches!(s.store.get(&tenant, *id).await, Ok(Some(w)) if !w.is_running())
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
                    // The store is away: keep the stream, try again shortly.
                    tracing::debug!(error = %e, "event stream cannot read; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                        _ = tx.closed() => return,
                        _ = stopping.changed() => return,
                    }
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
                        if let Some(next) = source.carried(&m, last) {
                            for e in next {
                                last = source.cursor(e);
                                if !send(&tx, &source, e).await {
                                    return;
                                }
                            }
                            continue;
                        }
                        if source.news(&m, last) {
                            break;
                        }
                    }
                }
            }
        }
    });
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
