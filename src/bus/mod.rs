//! The in-process event bus: how a blocked request, an event stream or the worker
//! pool learns at once that something it watches has news, whichever replica
//! wrote it.
//!
//! The bus knows nothing of where its messages come from: on Postgres the
//! replica's LISTEN adapter ([`crate::events`]) publishes what other replicas
//! announce; on SQLite the store publishes after each commit. The store's tables
//! stay the truth and the bus only a doorbell: after [`BusMsg::Resync`] (messages
//! may have been missed) subscribers read the table again.
//!
//! A subscriber that follows one wait hears only that wait's notices (and
//! resyncs): a thousand streams on a thousand waits cost a thousand deliveries per
//! thousand notices, not a million.

pub mod live;
pub mod notice;
mod pause;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use uuid::Uuid;

pub use notice::{Notice, NoticeKind};
pub use pause::{HostPause, PauseCause, PauseKey};

#[derive(Clone, Debug, PartialEq)]
pub enum BusMsg {
    /// A wait has new events.
    Notice(Notice),
    /// There is work to claim: waits were created, or released by a replica that
    /// is stopping.
    Work,
    /// Messages may have been missed: read the table again.
    Resync,
    /// The outbox may hold a delivery due now: deliveries were inserted (with the
    /// events they announce), or one was queued again (`requeued`: a client's
    /// redelivery, which is claimed at once rather than with a burst).
    Deliveries { requeued: bool },
    /// Poll this wait now, as its pacing allows: a POST to its nudge URL
    /// (docs/design.md §2.17). Only the worker of the replica holding it acts.
    Nudge(Uuid),
}

/// The bus. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Bus {
    tx: broadcast::Sender<BusMsg>,
    /// One channel per wait that somebody follows.
    waits: Arc<Mutex<HashMap<Uuid, broadcast::Sender<BusMsg>>>>,
    /// Hosts another replica paused.
    pauses: broadcast::Sender<HostPause>,
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
            pauses: broadcast::channel(256).0,
        }
    }

    /// A host another replica paused (its LISTEN adapter heard it).
    pub fn publish_pause(&self, pause: HostPause) {
        let _ = self.pauses.send(pause);
    }

    /// Hosts other replicas pause, as they are heard.
    pub fn subscribe_pauses(&self) -> broadcast::Receiver<HostPause> {
        self.pauses.subscribe()
    }

    /// Every message (the worker pool, the event feed).
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
            BusMsg::Work | BusMsg::Deliveries { .. } | BusMsg::Nudge(_) => {}
        }
        drop(waits);
        let _ = self.tx.send(msg);
    }

    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
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
            kind: NoticeKind::Other,
            events: None,
        })
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
        bus.publish(BusMsg::Work);
        bus.publish(BusMsg::Resync);
        assert_eq!(on_a.recv().await.unwrap(), notice(a, 2));
        assert_eq!(on_a.recv().await.unwrap(), BusMsg::Resync);
        assert_eq!(on_a_too.recv().await.unwrap(), notice(a, 2));
        assert_eq!(all.recv().await.unwrap(), notice(b, 1));
        assert_eq!(all.recv().await.unwrap(), notice(a, 2));
        assert_eq!(all.recv().await.unwrap(), BusMsg::Work);
        drop(on_a);
        assert_eq!(bus.waits.lock().unwrap().len(), 1, "one subscriber is left");
        drop(on_a_too);
        assert!(bus.waits.lock().unwrap().is_empty());
    }
}
