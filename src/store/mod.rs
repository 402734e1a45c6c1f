//! The system of record: waits, their specs, their event history, idempotency keys,
//! webhook deliveries, groups, and the leases the worker pool takes on waits.
//!
//! One folder per job, each holding its logic (written once) beside both
//! databases' SQL (its `postgres.rs` and `sqlite.rs`), and each with a handle that
//! does that job and no other:
//!
//! - [`waits`] ([`Store::waits`]): creates, with idempotency keys and the tenant's
//!   running-wait limit; reads, lists, cancels.
//! - [`events`] ([`Store::events`]): a wait's history, a tenant's events, the feed.
//! - [`leases`] ([`Store::leases`]): the worker pool's claims, renewals,
//!   checkpoints and releases; what its polls write is [`progress`], on the same
//!   handle.
//! - [`outbox`] ([`Store::outbox`]): webhook deliveries.
//! - [`groups`] ([`Store::groups`]): groups' creates, reads, ends and progress.
//! - [`retention`] ([`Store::retention`]): deleting ended waits.
//! - [`callbacks`] ([`Store::callbacks`]): callback waits' secrets, heartbeats and
//!   ends.
//! - [`nudges`] ([`Store::nudges`]): nudge URLs' secrets, and the word to poll now.
//! - [`sources`] ([`Store::sources`]): event sources, their kept events, and the
//!   waits listening to them.
//!
//! The worker holds the leases handle, the deliverer the outbox's, the group
//! watcher the groups', the retention sweep its own and the event feed the
//! events'; only the API holds the whole [`Store`]. Beside the jobs: each
//! database's connections and migrations ([`postgres`], [`sqlite`]), the rows
//! both read and write ([`rows`], [`columns`]), and values at rest ([`secrets`]).
//! Each folder's `mod.rs` opens with what differs on SQLite.
//!
//! The store knows no HTTP and no scheduling: the API and the worker pool meet here
//! and on the event [`crate::bus`], never in each other's code. Every worker write
//! is fenced by `owner` and `epoch`; the end of a wait is a conditional update
//! (`status = 'running'`) in the same transaction as its terminal event, so a wait
//! ends exactly once however replicas race.

mod columns;
mod migrations;
#[macro_use]
pub mod postgres;
mod rows;
pub mod secrets;
mod sqlite;

use std::sync::{Arc, Mutex};

use uuid::Uuid;

use crate::bus::Bus;
use crate::engine::EngineState;
pub use crate::model::{Ending, Event, EventBody, Status, Wait};
pub(crate) use rows::{
    Admission, CheckpointRow, ClaimRow, EventRow, FeedRow, GROUPED_COLUMN, GotRow, Inserted,
    LIMIT_MARGIN, NewWait, NotifyRow, ProgressRow, WAIT_COLUMNS, WaitRow,
};
use waits::TenantCounts;

pub use postgres::PgDialect;
use sqlite::SqliteDialect;

/// A wait as every fenced write names it: its id and the epoch of the claim it
/// is held under. A write under an older epoch finds the wait no longer its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitEpoch {
    pub id: Uuid,
    pub epoch: i64,
}

impl From<(Uuid, i64)> for WaitEpoch {
    fn from((id, epoch): (Uuid, i64)) -> WaitEpoch {
        WaitEpoch { id, epoch }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached: the API answers 503.
    #[error("the database is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    /// The database refused a statement (or answered one in a way this version
    /// cannot use).
    #[error("database error: {0}")]
    Database(#[source] sqlx::Error),
    /// Migrations could not be applied.
    #[error("cannot apply the migrations: {0}")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A stored value this version cannot read.
    #[error("cannot read the stored {what}: {why}")]
    Decode { what: &'static str, why: String },
    /// The store cannot be opened as configured.
    #[error("{0}")]
    Config(String),
    /// The same idempotency key was used with another request body.
    #[error("idempotency key reused with a different request")]
    IdempotencyConflict,
    /// The tenant already has this many running waits, the most allowed.
    #[error("the tenant has {0} running waits, the most allowed")]
    TooManyActive(i64),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        let away = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")),
            _ => false,
        };
        if away {
            StoreError::Unavailable(e)
        } else {
            StoreError::Database(e)
        }
    }
}

// ---------------------------------------------------------------------------------
// The dialects, and the store over them
// ---------------------------------------------------------------------------------

/// A backend: SQL and conversions. Each method is one statement or one
/// transaction; what to do with the answers is the handle's of the job it
/// serves.
#[derive(Clone, Debug)]
enum Dialect {
    Postgres(PgDialect),
    Sqlite(SqliteDialect),
}

macro_rules! sql {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match &$self.core.db {
            $crate::store::Dialect::Postgres(d) => d.$method($($arg),*).await,
            $crate::store::Dialect::Sqlite(d) => d.$method($($arg),*).await,
        }
    };
}

pub mod waits;
pub use waits::{CANCEL_REASON, Canceled, Created, ListFilter, Waits};
pub mod outbox;
pub use outbox::{DeliveryLimits, Due, Finished, KEPT_ATTEMPTS, Outbox, Outcome, Redeliver, Turns};
pub mod groups;
pub mod leases;
pub use leases::{Checkpoint, Claimed, Leases, Renewal, SLOT_CLAIMS, SlotToken};
pub mod progress;
pub use groups::{Group, GroupEnd, GroupRefused, GroupRequest, Groups, MemberRequest, MemberState};
pub use progress::{Ended, MAX_CLAIMS, Progress};
pub mod events;
pub use events::{Events, FeedEvent};
pub mod retention;
pub use retention::Retention;
pub mod callbacks;
pub use callbacks::{Callback, CallbackEnd, Callbacks};
pub mod nudges;
pub use nudges::{Nudged, Nudges};
pub mod sources;
pub use sources::Sources;

/// Batches of ended ids [`Groups::local_ends`] keeps for a slow receiver.
const LOCAL_ENDS: usize = 1024;

/// What every job's handle shares: the database, and what is kept beside it.
/// Cloning is shallow.
#[derive(Clone, Debug)]
struct Core {
    db: Dialect,
    cipher: Arc<secrets::Cipher>,
    /// Per tenant: running waits when last counted, and when.
    counts: Arc<Mutex<TenantCounts>>,
    /// On Postgres, the creates waiting to share a statement.
    creates: Arc<waits::batches::Creates>,
    /// On Postgres, the waits this process's progress writes ended, as each
    /// write commits (before the sequencer announces them): see
    /// [`Groups::local_ends`].
    ends: tokio::sync::broadcast::Sender<Arc<[Uuid]>>,
}

/// The store: the whole of it, for the API, and each job's handle for the part
/// that does only that job. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Store {
    core: Arc<Core>,
    callbacks: Callbacks,
    events: Events,
    groups: Groups,
    leases: Leases,
    nudges: Nudges,
    outbox: Outbox,
    retention: Retention,
    sources: Sources,
    waits: Waits,
}

impl Store {
    /// Opens the store a URL names: `postgres://…`, `sqlite://PATH`, `sqlite::memory:`.
    /// A SQLite store publishes its notices on `bus` after each commit; on Postgres
    /// the events component sequences events and the LISTEN adapter publishes them.
    pub fn open(url: &str, max_connections: u32, bus: Bus) -> Result<Store, StoreError> {
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Dialect::Postgres(PgDialect::connect(url, max_connections)?)
        } else if url.starts_with("sqlite:") {
            Dialect::Sqlite(SqliteDialect::open(url, bus)?)
        } else {
            let scheme: String = url
                .split(':')
                .next()
                .unwrap_or("")
                .chars()
                .take(20)
                .collect();
            return Err(StoreError::Config(format!(
                "the database URL has the scheme \"{scheme}\"; use postgres://…, sqlite://PATH or sqlite::memory:"
            )));
        };
        Ok(Store::of(Core {
            db,
            cipher: Default::default(),
            counts: Default::default(),
            creates: Default::default(),
            ends: tokio::sync::broadcast::channel(LOCAL_ENDS).0,
        }))
    }

    /// The store over `core`, with its handles.
    fn of(core: Core) -> Store {
        let core = Arc::new(core);
        Store {
            callbacks: Callbacks { core: core.clone() },
            events: Events { core: core.clone() },
            groups: Groups {
                core: core.clone(),
                waits: Waits { core: core.clone() },
            },
            leases: Leases { core: core.clone() },
            nudges: Nudges { core: core.clone() },
            outbox: Outbox { core: core.clone() },
            retention: Retention { core: core.clone() },
            sources: Sources { core: core.clone() },
            waits: Waits { core: core.clone() },
            core,
        }
    }

    /// Callback waits: their secrets' hashes, heartbeats and ends.
    pub fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    /// The reads of events: a wait's, a tenant's, the feed.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// Groups: creates, reads, ends, progress, and how a wait stands in them.
    pub fn groups(&self) -> &Groups {
        &self.groups
    }

    /// The worker pool's leases on waits, and what its polls write.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// Nudge URLs: their secrets' hashes, and the word to poll now.
    pub fn nudges(&self) -> &Nudges {
        &self.nudges
    }

    /// The webhook outbox: claims, outcomes, redeliveries, bounds.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// What the retention sweep deletes and reads.
    pub fn retention(&self) -> &Retention {
        &self.retention
    }

    /// Event sources, their kept events, and the waits listening to them.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// Waits: creates, reads, lists, cancels.
    pub fn waits(&self) -> &Waits {
        &self.waits
    }

    /// Seals target header values at rest under `cipher`'s key.
    pub fn with_cipher(self, cipher: secrets::Cipher) -> Store {
        let mut core = (*self.core).clone();
        core.cipher = Arc::new(cipher);
        Store::of(core)
    }

    /// The Postgres backend, for what only Postgres has (LISTEN, the sequencer,
    /// connection diagnosis).
    pub fn postgres(&self) -> Option<&PgDialect> {
        match &self.core.db {
            Dialect::Postgres(d) => Some(d),
            Dialect::Sqlite(_) => None,
        }
    }

    /// Tells the other replicas that a host asked for quiet (Postgres; a SQLite
    /// store has no other replica).
    pub async fn announce_pause(&self, pause: &crate::bus::HostPause) -> Result<(), StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.announce_pause(pause).await,
            Dialect::Sqlite(_) => Ok(()),
        }
    }

    /// The kind of store and where it is, never a password.
    pub fn describe(&self) -> String {
        match &self.core.db {
            Dialect::Postgres(d) => d.describe(),
            Dialect::Sqlite(d) => d.describe(),
        }
    }

    /// Database connections checked out right now (of `--db-connections` plus the
    /// few Postgres keeps apart for leases and the sequencer).
    pub fn connections_in_use(&self) -> u32 {
        match &self.core.db {
            Dialect::Postgres(d) => d.connections_in_use(),
            Dialect::Sqlite(d) => d.connections_in_use(),
        }
    }

    pub async fn migrate(&self) -> Result<(), StoreError> {
        sql!(self.migrate())
    }

    pub async fn ping(&self) -> Result<(), StoreError> {
        sql!(self.ping())
    }

    pub async fn close(&self) {
        sql!(self.close())
    }

    /// Runs one statement as written: for tests that bend the schema (a trigger
    /// that refuses a value, say).
    #[cfg(test)]
    pub(crate) async fn execute(&self, statement: &'static str) -> Result<(), StoreError> {
        sql!(self.execute(statement))
    }
}
