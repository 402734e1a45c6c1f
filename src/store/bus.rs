//! The event bus: one Postgres LISTEN connection per replica feeding an in-process
//! broadcast, so a blocked request or an SSE stream learns at once that a wait it
//! watches has news, whichever replica wrote it.
//!
//! Notices carry ids only, never content: a subscriber re-reads the table. After the
//! listener reconnects it broadcasts [`BusMsg::Resync`], because whatever was sent
//! while it was away is lost; subscribers then re-read from the table too.
//!
//! A subscriber that follows one wait hears only that wait's notices (and resyncs):
//! a thousand streams on a thousand waits cost a thousand deliveries per thousand
//! notices, not a million.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::PgStore;

pub const CHANNEL: &str = "waitd_events";

/// What a notice says: a wait, its newest seq, the newest global event id, and a
/// flag: `c` created, `t` terminal, `-` otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    pub wait_id: Uuid,
    pub seq: i32,
    pub gid: i64,
    pub flag: char,
}

impl Notice {
    pub fn encode(&self) -> String {
        format!("{} {} {} {}", self.wait_id, self.seq, self.gid, self.flag)
    }

    pub fn decode(payload: &str) -> Option<Notice> {
        let mut parts = payload.split(' ');
        let wait_id = parts.next()?.parse().ok()?;
        let seq = parts.next()?.parse().ok()?;
        let gid = parts.next()?.parse().ok()?;
        let flag = parts.next()?.chars().next()?;
        Some(Notice {
            wait_id,
            seq,
            gid,
            flag,
        })
    }

    pub fn is_terminal(&self) -> bool {
        self.flag == 't'
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        if waits.get(&self.id).is_some_and(|tx| tx.receiver_count() <= 1) {
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
        let _ = self.tx.send(msg);
        let waits = self.waits.lock().unwrap_or_else(|e| e.into_inner());
        match msg {
            BusMsg::Notice(n) => {
                if let Some(tx) = waits.get(&n.wait_id) {
                    let _ = tx.send(msg);
                }
            }
            BusMsg::Resync => {
                for tx in waits.values() {
                    let _ = tx.send(msg);
                }
            }
            BusMsg::Released => {}
        }
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
