//! The event bus: one Postgres LISTEN connection per replica feeding an in-process
//! broadcast, so a blocked request or an SSE stream learns at once that a wait it
//! watches has news, whichever replica wrote it.
//!
//! A notice names a wait, its newest seq and global cursor. When they fit, it also
//! carries the events themselves, so a stream that has seen everything before them
//! sends them on without reading the table; otherwise, or after a gap, the
//! subscriber re-reads the table, which stays the truth. After the listener reconnects it broadcasts [`BusMsg::Resync`], because whatever was sent
//! while it was away is lost; subscribers then re-read from the table too.
//!
//! A subscriber that follows one wait hears only that wait's notices (and resyncs):
//! a thousand streams on a thousand waits cost a thousand deliveries per thousand
//! notices, not a million.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::{Event, PgStore};

pub const CHANNEL: &str = "waitd_events";

/// What a notice says: a wait, its newest seq, the newest global event id, and a
/// flag: `c` created, `t` terminal, `-` otherwise.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    pub wait_id: Uuid,
    pub seq: i32,
    pub gid: i64,
    pub flag: char,
    /// The events the notice announces, oldest first, when they fit in it.
    pub events: Option<Arc<[Event]>>,
}

/// An event inside a notice: global id, seq, kind, time, the kind's fields.
pub(crate) type Packed = (i64, i32, String, DateTime<Utc>, Value);

/// A sequenced event of `wait_id` from its packed fields.
pub(crate) fn unpack(wait_id: Uuid, (gid, seq, kind, at, data): Packed) -> Event {
    Event {
        id: Some(gid),
        seq,
        wait_id,
        kind,
        at,
        data,
    }
}

impl Notice {
    /// One line: `wait_id seq gid flag`, then the events as JSON when present.
    pub fn encode(&self) -> String {
        let head = format!("{} {} {} {}", self.wait_id, self.seq, self.gid, self.flag);
        let Some(events) = &self.events else {
            return head;
        };
        let packed: Vec<Packed> = events
            .iter()
            .map(|e| {
                (
                    e.id.unwrap_or_default(),
                    e.seq,
                    e.kind.clone(),
                    e.at,
                    e.data.clone(),
                )
            })
            .collect();
        match serde_json::to_string(&packed) {
            Ok(json) => format!("{head} {json}"),
            Err(_) => head,
        }
    }

    pub fn decode(line: &str) -> Option<Notice> {
        let mut parts = line.splitn(5, ' ');
        let wait_id = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let gid = parts.next()?.parse().ok()?;
        let flag = parts.next()?.chars().next()?;
        // Events that do not parse are left out: the subscriber reads them instead.
        let events = parts
            .next()
            .and_then(|json| serde_json::from_str::<Vec<Packed>>(json).ok())
            .map(|packed| packed.into_iter().map(|p| unpack(wait_id, p)).collect());
        Some(Notice {
            wait_id,
            seq,
            gid,
            flag,
            events,
        })
    }

    pub fn is_terminal(&self) -> bool {
        self.flag == 't'
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum BusMsg {
    Notice(Notice),
    /// Waits were released by a replica that is stopping: worth a claim.
    Released,

    /// Notices may have been missed: re-read the table.
    Resync,
}

/// The in-process side of the bus. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Bus {
    tx: broadcast::Sender<BusMsg>,
    /// One channel per wait that somebody follows.
    waits: Arc<Mutex<HashMap<Uuid, broadcast::Sender<BusMsg>>>>,
}

/// A subscription to one wait's notices; leaves the bus when dropped.
pub struct WaitSubscription {
    rx: broadcast::Receiver<BusMsg>,
    id: Uuid,
    waits: Arc<Mutex<HashMap<Uuid, broadcast::Sender<BusMsg>>>>,
}

impl WaitSubscription {
    pub async fn recv(&mut self) -> Result<BusMsg, broadcast::error::RecvError> {
        self.rx.recv().await
    }
}

/// Either kind of subscription.
pub enum Subscription {
    All(broadcast::Receiver<BusMsg>),
    Wait(WaitSubscription),
}

impl Subscription {
    pub async fn recv(&mut self) -> Result<BusMsg, broadcast::error::RecvError> {
        match self {
            Subscription::All(rx) => rx.recv().await,
            Subscription::Wait(w) => w.recv().await,
        }
    }
}

impl Drop for WaitSubscription {
    fn drop(&mut self) {
        let mut waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        // This receiver still counts: the last one out removes the channel.
        if waits
            .get(&self.id)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            waits.remove(&self.id);
        }
    }
}

impl Default for Bus {
    fn default() -> Self {
        Self::new()
    }
}

impl Bus {
    pub fn new() -> Bus {
        let (tx, _) = broadcast::channel(4096);
        Bus {
            tx,
            waits: Default::default(),
        }
    }

    /// Every message (the worker pool, the global event feed).
    pub fn subscribe(&self) -> broadcast::Receiver<BusMsg> {
        self.tx.subscribe()
    }

    /// Notices of one wait, and every resync.
    pub fn subscribe_wait(&self, id: Uuid) -> WaitSubscription {
        let mut waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        let rx = waits
            .entry(id)
            .or_insert_with(|| broadcast::channel(64).0)
            .subscribe();
        WaitSubscription {
            rx,
            id,
            waits: self.waits.clone(),
        }
    }

    pub fn publish(&self, msg: BusMsg) {
        let waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        match &msg {
            BusMsg::Notice(n) => {
                if let Some(tx) = waits.get(&n.wait_id) {
                    let _ = tx.send(msg.clone());
                }
            }
            BusMsg::Resync => {
                for tx in waits.values() {
                    let _ = tx.send(BusMsg::Resync);
                }
            }
            BusMsg::Released => {}
        }
        drop(waits);
        let _ = self.tx.send(msg);
    }

    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Runs the LISTEN connection until `shutdown` resolves, reconnecting with a short
    /// backoff while the database is away.
    pub async fn listen(self, store: PgStore, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut delay = Duration::from_millis(100);
        let mut first = true;
        loop {
            let connected = async {
                let mut l = PgListener::connect_with(store.pool()).await?;
                l.listen(CHANNEL).await?;
                Ok::<_, sqlx::Error>(l)
            };
            let mut listener = tokio::select! {
                _ = &mut shutdown => return,
                r = connected => match r {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(error = %e, "event listener cannot connect; retrying");
                        tokio::select! {
                            _ = &mut shutdown => return,
                            _ = tokio::time::sleep(delay) => {}
                        }
                        delay = (delay * 2).min(Duration::from_secs(5));
                        continue;
                    }
                },
            };
            delay = Duration::from_millis(100);
            if !first {
                tracing::info!("event listener reconnected");
                self.publish(BusMsg::Resync);
            }
            first = false;
            loop {
                let next = tokio::select! {
                    _ = &mut shutdown => return,
                    n = listener.try_recv() => n,
                };
                match next {
                    Ok(Some(n)) => match n.payload() {
                        "released" => self.publish(BusMsg::Released),
                        p => {
                            tracing::trace!(bytes = p.len(), "notice received");
                            // One notice a line: a sequencer run reports many waits.
                            for notice in p.lines().filter_map(Notice::decode) {
                                self.publish(BusMsg::Notice(notice));
                            }
                        }
                    },
                    Ok(None) => {
                        // The connection dropped; anything sent meanwhile is lost.
                        tracing::warn!("event listener lost its connection");
                        self.publish(BusMsg::Resync);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "event listener failed");
                        self.publish(BusMsg::Resync);
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(wait_id: Uuid, seq: i32) -> BusMsg {
        BusMsg::Notice(Notice {
            wait_id,
            seq,
            gid: seq as i64,
            flag: '-',
            events: None,
        })
    }

    #[test]
    fn a_notice_round_trips_with_and_without_its_events() {
        let wait_id = Uuid::now_v7();
        let at = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123456Z")
            .unwrap()
            .with_timezone(&Utc);
        let bare = Notice {
            wait_id,
            seq: 3,
            gid: 17,
            flag: 't',
            events: None,
        };
        assert_eq!(Notice::decode(&bare.encode()), Some(bare.clone()));
        let full = Notice {
            events: Some(Arc::from(vec![
                Event {
                    id: Some(16),
                    seq: 2,
                    wait_id,
                    kind: "state".into(),
                    at,
                    data: serde_json::json!({"from": "a b", "to": "on\nx"}),
                },
                Event {
                    id: Some(17),
                    seq: 3,
                    wait_id,
                    kind: "succeeded".into(),
                    at,
                    data: serde_json::json!({"reason": "reached on", "state": "on"}),
                },
            ])),
            ..bare.clone()
        };
        let line = full.encode();
        assert!(!line.contains('\n'), "one notice is one line: {line}");
        assert_eq!(Notice::decode(&line), Some(full));
        // Unreadable events are dropped, the notice itself kept.
        let broken = format!("{} [[1,", bare.encode());
        assert_eq!(Notice::decode(&broken), Some(bare));
    }

    #[tokio::test]
    async fn a_wait_subscriber_hears_its_wait_and_resyncs_only_and_leaves_no_trace() {
        let bus = Bus::new();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let mut all = bus.subscribe();
        let mut on_a = bus.subscribe_wait(a);
        let mut on_a_too = bus.subscribe_wait(a);
        bus.publish(notice(b, 1));
        bus.publish(notice(a, 2));
        bus.publish(BusMsg::Released);
        bus.publish(BusMsg::Resync);
        assert_eq!(on_a.recv().await.unwrap(), notice(a, 2));
        assert_eq!(on_a.recv().await.unwrap(), BusMsg::Resync);
        assert_eq!(on_a_too.recv().await.unwrap(), notice(a, 2));
        assert_eq!(all.recv().await.unwrap(), notice(b, 1));
        assert_eq!(all.recv().await.unwrap(), notice(a, 2));
        assert_eq!(all.recv().await.unwrap(), BusMsg::Released);
        drop(on_a);
        assert_eq!(bus.waits.lock().unwrap().len(), 1, "one subscriber is left");
        drop(on_a_too);
        assert!(bus.waits.lock().unwrap().is_empty());
    }
}
