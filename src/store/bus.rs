//! The event bus: one Postgres LISTEN connection per replica feeding an in-process
//! broadcast, so a blocked request or an SSE stream learns at once that a wait it
//! watches has news, whichever replica wrote it.
//!
//! Notices carry ids only, never content: a subscriber re-reads the table. After the
//! listener reconnects it broadcasts [`BusMsg::Resync`], because whatever was sent
//! while it was away is lost; subscribers then re-read from the table too.

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
}

impl Default for Bus {
    fn default() -> Self {
        Self::new()
    }
}

impl Bus {
    pub fn new() -> Bus {
        let (tx, _) = broadcast::channel(4096);
        Bus { tx }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<BusMsg> {
        self.tx.subscribe()
    }

    pub fn publish(&self, msg: BusMsg) {
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
