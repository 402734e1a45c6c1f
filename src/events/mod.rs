//! The event pipeline of a replica, started by [`crate::serve`] and stopped with
//! it: who gives committed events their global cursor, who carries word of them
//! between replicas, and who hands them to the followers of `GET /events`.
//!
//! - [`sequencer`] (Postgres): gives every committed event its `gid`, in commit
//!   order, then announces it; woken by the store after each commit that left
//!   events to number, and once a second for any a dead writer left.
//! - [`listen`] (Postgres): the replica's one LISTEN connection, feeding the
//!   in-process [`crate::bus`] with the notices and work signals other replicas
//!   send. On SQLite the store publishes to the bus itself.
//! - [`feed`]: one read per batch of new events for every `/events` follower.
//!
//! Readers never sequence: what they read is what is sequenced, and the notice
//! that the sequencer sends after numbering events is what tells them to read.

pub mod feed;
pub mod listen;
pub mod sequencer;

use std::future::Future;

use tokio::task::JoinHandle;

use crate::bus::Bus;
use crate::store::Store;

pub use feed::Feed;

/// The running tasks; [`Events::stopped`] waits for them.
pub struct Events {
    pub feed: Feed,
    tasks: Vec<JoinHandle<()>>,
}

impl Events {
    /// Starts the tasks this store needs; each ends when `shutdown` resolves.
    pub fn start<F>(store: &Store, bus: &Bus, shutdown: impl Fn() -> F) -> Events
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let feed = Feed::new();
        let mut tasks = vec![tokio::spawn(feed.clone().run(
            store.events().clone(),
            bus.clone(),
            shutdown(),
        ))];
        if let Some(pg) = store.postgres() {
            tasks.push(tokio::spawn(sequencer::run(pg.clone(), shutdown())));
            tasks.push(tokio::spawn(listen::run(
                pg.pool().clone(),
                bus.clone(),
                shutdown(),
            )));
        }
        Events { feed, tasks }
    }

    /// Waits for the tasks to end (after shutdown).
    pub async fn stopped(self) {
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
