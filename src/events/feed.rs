//! The replica's feed of new events for every follower of `GET /events`.
//!
//! A thousand dashboards following `/events` would otherwise each read the table
//! at every notice: a thousand reads, and a thousand times the CPU, per event. The
//! feed reads once per batch of notices, every tenant's events with their tenant
//! and labels, and hands the batch to every follower, which keeps what is its own
//! (tenant, labels) in memory and sends it with the JSON already written.
//!
//! The batches are contiguous: each covers every event from the one before it to
//! its newest (`after < id <= upto`), so a follower that subscribed before reading
//! its history, and reads it again after a lag, sees every event exactly once by
//! taking from each batch what is newer than what it last sent. While nobody
//! follows, the feed reads nothing and only moves its cursor with the notices.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use crate::bus::{Bus, BusMsg};
use crate::model::Event;
use crate::store::Events;

/// Events read per query.
const PAGE: i64 = 1000;
/// Batches a slow follower may fall behind before it reads the table itself.
const BACKLOG: usize = 1024;
/// How often the feed reads even without a notice, in case one was lost.
const SAFETY: Duration = Duration::from_secs(10);

/// One event as the followers receive it.
#[derive(Debug)]
pub struct FeedItem {
    pub event: Event,
    pub tenant: String,
    pub labels: BTreeMap<String, String>,
    /// The event as JSON, written once for every follower.
    pub json: String,
}

impl FeedItem {
    /// Whether a follower of `tenant`, filtering by `labels`, wants this event.
    pub fn is_for(&self, tenant: &str, labels: &BTreeMap<String, String>) -> bool {
        self.tenant == tenant && labels.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// Every event with `after < id <= upto`.
#[derive(Debug)]
pub struct Batch {
    pub after: i64,
    pub upto: i64,
    pub items: Vec<FeedItem>,
}

/// The subscriber side. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Feed {
    tx: broadcast::Sender<Arc<Batch>>,
}

impl Default for Feed {
    fn default() -> Self {
        Feed::new()
    }
}

impl Feed {
    pub fn new() -> Feed {
        Feed {
            tx: broadcast::channel(BACKLOG).0,
        }
    }

    /// Batches from now on; subscribe before reading history.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Batch>> {
        self.tx.subscribe()
    }

    /// Runs until `shutdown` resolves: reads what the bus announces while anyone
    /// follows, and publishes it.
    pub async fn run(
        self,
        store: Events,
        bus: Bus,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut rx = bus.subscribe();
        // Where the feed stands: the newest event already published or skipped.
        let mut last = loop {
            match store.last_id(None).await {
                Ok(n) => break n,
                Err(e) => {
                    tracing::warn!(error = %e, "the event feed cannot read where it starts; retrying");
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    }
                }
            }
        };
        let mut safety = tokio::time::interval(SAFETY);
        safety.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // `Some(gid)`: a notice up to gid; `None`: read whatever is new.
            let news: Option<i64> = tokio::select! {
                _ = &mut shutdown => return,
                _ = safety.tick() => None,
                m = rx.recv() => match m {
                    Ok(BusMsg::Notice(n)) => Some(n.gid),
                    Ok(BusMsg::Work | BusMsg::Deliveries { .. } | BusMsg::Nudge(_)) => continue,
                    Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => None,
                    Err(RecvError::Closed) => return,
                },
            };
            if self.tx.receiver_count() == 0 {
                // Nobody follows: whoever subscribes later reads history that
                // already holds these events, so they need not be read now.
                match news {
                    Some(gid) => {
                        last = last.max(gid);
                        continue;
                    }
                    None => {
                        // Where the events stand now; but the read may take long
                        // (the store is away), and a follower that subscribed
                        // meanwhile may have read its history before the newest of
                        // these were numbered: then they are its to get from here.
                        if let Ok(n) = store.last_id(None).await
                            && self.tx.receiver_count() == 0
                        {
                            last = last.max(n);
                            continue;
                        }
                        if self.tx.receiver_count() == 0 {
                            continue;
                        }
                    }
                }
            }
            if news.is_some_and(|gid| gid <= last) {
                continue;
            }
            // Read until nothing is left, a page at a time.
            loop {
                let page = match store.feed(last, PAGE).await {
                    Ok(p) => p,
                    Err(e) => {
                        // Try again shortly rather than wait for the next notice: the
                        // events announced so far may be the last for a while.
                        tracing::debug!(error = %e, "the event feed cannot read; trying again");
                        tokio::select! {
                            _ = &mut shutdown => return,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
                        }
                    }
                };
                let Some(upto) = page.last().and_then(|e| e.event.id) else {
                    break;
                };
                let full = page.len() as i64 == PAGE;
                let items = page
                    .into_iter()
                    .map(|f| FeedItem {
                        json: serde_json::to_string(&f.event).unwrap_or_default(),
                        event: f.event,
                        tenant: f.tenant,
                        labels: f.labels,
                    })
                    .collect();
                let _ = self.tx.send(Arc::new(Batch {
                    after: last,
                    upto,
                    items,
                }));
                last = upto;
                if !full {
                    break;
                }
            }
        }
    }
}
