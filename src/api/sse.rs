//! The two event streams as streams: each is a state machine that the response
//! body pulls frames from, one at a time. Nothing is spawned; when the client goes
//! away the body is dropped, and with it the stream, its bus subscription and its
//! place among the open streams.
//!
//! A stream subscribes to the bus first, then replays from the table, then re-reads
//! the table whenever the bus says there is news (or that news may have been
//! missed): the table is the truth, the bus only a doorbell, so no event is lost or
//! repeated across listener reconnects.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use axum::http::{HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use uuid::Uuid;

use super::AppState;
use super::streams::Slot;
use crate::bus::{BusMsg, WaitSubscription};
use crate::events::feed::Batch;
use crate::metrics::Metrics;
use crate::model::Event;
use crate::store::StoreError;

/// Events read per query.
pub const PAGE: i64 = 500;
/// A wait's stream re-reads the table at least this often even without a notice.
const SAFETY_REREAD: Duration = Duration::from_secs(10);
/// SSE keep-alive comments (proxies drop idle connections at 15–60 s).
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// How long a stream waits after a failed read (the store is away) before the next.
const AFTER_ERROR: Duration = Duration::from_millis(500);

/// One SSE frame: `id` (the stream's cursor), `event` (the kind), `data` (the JSON).
fn frame(cursor: i64, kind: &str, json: &str) -> SseEvent {
    SseEvent::default()
        .id(cursor.to_string())
        .event(kind)
        .data(json)
}

/// The SSE response over a state machine: `step` takes the state and gives the next
/// frame with the state to continue from, or `None` when the stream is over.
fn respond<S, F, Fut>(state: S, step: F) -> Response
where
    S: Send + 'static,
    F: FnMut(S) -> Fut + Send + 'static,
    Fut: Future<Output = Option<(SseEvent, S)>> + Send + 'static,
{
    let frames = futures_util::stream::unfold((state, step), |(state, mut step)| async move {
        let (frame, state) = step(state).await?;
        Some((Ok::<_, Infallible>(frame), (state, step)))
    });
    let mut res = Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    let h = res.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    res
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
    read: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let _permit = s.replays.acquire().await;
    read.await
}

/// Waits out a failed read unless the server stops first; false when it did.
async fn pause_after_error(stopping: &mut watch::Receiver<bool>, e: &StoreError) -> bool {
    tracing::debug!(error = %e, "event stream cannot read; retrying");
    tokio::select! {
        _ = tokio::time::sleep(AFTER_ERROR) => true,
        _ = stopping.changed() => false,
    }
}

/// Where a wait's stream stands.
enum WaitPhase {
    /// Read the table from `last`.
    Read,
    /// Listen to the bus until `until`, then read anyway.
    Listen { until: Instant },
}

/// A wait's stream (`GET /waits/{id}/events`): history, then what its notices
/// carry (or a read when they carry nothing, or after a gap), ending after the
/// terminal event.
pub struct WaitStream {
    s: AppState,
    tenant: String,
    id: Uuid,
    /// The seq of the last event queued.
    last: i64,
    bus: WaitSubscription,
    stopping: watch::Receiver<bool>,
    phase: WaitPhase,
    queue: VecDeque<SseEvent>,
    done: bool,
    _open: Subscribed,
}

impl WaitStream {
    /// The response; subscribes before the first read, so nothing between the two
    /// is missed.
    pub fn respond(s: AppState, tenant: String, id: Uuid, after: i64, slot: Slot) -> Response {
        let stream = WaitStream {
            bus: s.bus.subscribe_wait(id),
            stopping: s.stopping.clone(),
            _open: Subscribed::new(s.metrics.clone(), slot),
            s,
            tenant,
            id,
            last: after,
            phase: WaitPhase::Read,
            queue: VecDeque::new(),
            done: false,
        };
        respond(stream, WaitStream::step)
    }

    async fn step(mut self) -> Option<(SseEvent, WaitStream)> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return Some((f, self));
            }
            if self.done {
                return None;
            }
            match self.phase {
                WaitPhase::Read => self.read().await,
                WaitPhase::Listen { until } => self.listen(until).await,
            }
        }
    }

    /// Queues `events` in order, up to and including a terminal one.
    fn push<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for e in events {
            let json = serde_json::to_string(e).unwrap_or_default();
            self.queue
                .push_back(frame(i64::from(e.seq), e.kind(), &json));
            self.last = i64::from(e.seq);
            if e.is_terminal() {
                self.done = true;
                return;
            }
        }
    }

    async fn read(&mut self) {
        let (s, tenant, id) = (&self.s, &self.tenant, self.id);
        let mut events = match replay_page(
            s,
            s.store.events().of_wait(tenant, id, self.last as i32, PAGE),
        )
        .await
        {
            Ok(events) => events,
            Err(e) => {
                if !pause_after_error(&mut self.stopping, &e).await {
                    self.done = true;
                }
                return;
            }
        };
        // Only what is sequenced: the rest follows with the sequencer's notice,
        // which carries it.
        let cut = events.iter().take_while(|e| e.id.is_some()).count();
        let full = events.len() as i64 == PAGE && cut == events.len();
        events.truncate(cut);
        self.push(&events);
        if self.done || full {
            return;
        }
        if self.last > 0 && self.at_end().await {
            self.done = true;
            return;
        }
        self.phase = WaitPhase::Listen {
            until: Instant::now() + SAFETY_REREAD,
        };
    }

    /// Resumed at the end of an ended wait (the event the client saw last is the
    /// terminal one), or past it (no such event, and the wait has ended): nothing
    /// more will come.
    async fn at_end(&self) -> bool {
        let (s, tenant, id) = (&self.s, &self.tenant, self.id);
        match s
            .store
            .events()
            .of_wait(tenant, id, self.last as i32 - 1, 1)
            .await
        {
            Ok(v) => match v.first() {
                Some(e) => i64::from(e.seq) == self.last && e.is_terminal(),
                None => {
                    matches!(s.store.waits().get(tenant, id).await, Ok(Some(w)) if !w.is_running())
                }
            },
            Err(_) => false,
        }
    }

    async fn listen(&mut self, until: Instant) {
        if *self.stopping.borrow() {
            self.done = true;
            return;
        }
        let msg = tokio::select! {
            _ = tokio::time::sleep_until(until) => {
                self.phase = WaitPhase::Read;
                return;
            }
            _ = self.stopping.changed() => {
                self.done = true;
                return;
            }
            m = self.bus.recv() => m,
        };
        if matches!(msg, Err(RecvError::Closed)) {
            self.done = true;
        } else if let Some(next) = carried(self.id, &msg, self.last) {
            // The notice brought the events that come next: no read.
            let next: Vec<Event> = next.cloned().collect();
            self.push(&next);
        } else if news(self.id, &msg, self.last) {
            self.phase = WaitPhase::Read;
        }
    }
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
        Ok(BusMsg::Work | BusMsg::Deliveries { .. } | BusMsg::Nudge(_)) => false,
        _ => true,
    }
}

/// The stream of all the tenant's events (`GET /events`): history from the table,
/// then the replica's [`crate::events::Feed`], which reads once for every
/// follower. After falling behind the feed, it reads the table again from where it
/// stands. It does not end by itself.
pub struct FeedStream {
    s: AppState,
    tenant: String,
    labels: BTreeMap<String, String>,
    /// The global id of the last event queued.
    last: i64,
    feed: broadcast::Receiver<Arc<Batch>>,
    stopping: watch::Receiver<bool>,
    /// Reading history (true) or following the feed.
    replaying: bool,
    queue: VecDeque<SseEvent>,
    done: bool,
    _open: Subscribed,
}

impl FeedStream {
    /// The response; subscribes to the feed before the first read, so nothing
    /// between the two is missed.
    pub fn respond(
        s: AppState,
        tenant: String,
        labels: BTreeMap<String, String>,
        after: i64,
        slot: Slot,
    ) -> Response {
        let stream = FeedStream {
            feed: s.feed.subscribe(),
            stopping: s.stopping.clone(),
            _open: Subscribed::new(s.metrics.clone(), slot),
            s,
            tenant,
            labels,
            last: after,
            replaying: true,
            queue: VecDeque::new(),
            done: false,
        };
        respond(stream, FeedStream::step)
    }

    async fn step(mut self) -> Option<(SseEvent, FeedStream)> {
        loop {
            if let Some(f) = self.queue.pop_front() {
                return Some((f, self));
            }
            if self.done {
                return None;
            }
            if self.replaying {
                self.replay().await;
            } else {
                self.follow().await;
            }
        }
    }

    /// One page of history; the feed takes over after the last.
    async fn replay(&mut self) {
        let s = &self.s;
        let read = s
            .store
            .events()
            .of_tenant(&self.tenant, self.last, &self.labels, PAGE);
        match replay_page(s, read).await {
            Ok(events) => {
                for e in &events {
                    let id = e.id.unwrap_or_default();
                    let json = serde_json::to_string(e).unwrap_or_default();
                    self.queue.push_back(frame(id, e.kind(), &json));
                    self.last = id;
                }
                if (events.len() as i64) < PAGE {
                    self.replaying = false;
                }
            }
            Err(e) => {
                if !pause_after_error(&mut self.stopping, &e).await {
                    self.done = true;
                }
            }
        }
    }

    /// One batch of the feed: what is this stream's and newer than what it sent.
    async fn follow(&mut self) {
        if *self.stopping.borrow() {
            self.done = true;
            return;
        }
        let batch = tokio::select! {
            _ = self.stopping.changed() => {
                self.done = true;
                return;
            }
            b = self.feed.recv() => b,
        };
        match batch {
            Ok(batch) => {
                for item in &batch.items {
                    let id = item.event.id.unwrap_or_default();
                    if id <= self.last || !item.is_for(&self.tenant, &self.labels) {
                        continue;
                    }
                    self.queue
                        .push_back(frame(id, item.event.kind(), &item.json));
                    self.last = id;
                }
            }
            // Batches were missed: read the table from where this stands.
            Err(RecvError::Lagged(_)) => self.replaying = true,
            Err(RecvError::Closed) => self.done = true,
        }
    }
}
