//! The system of record: waits, their specs, their event history, idempotency keys,
//! and the leases the worker pool takes on them.
//!
//! [`Store`] is written once: how a create is admitted and answered, how a claimed
//! row becomes a wait to poll, what a poll's progress writes, how rows read back.
//! The two backends ([`postgres`], and the embedded [`sqlite`] file) hold only SQL
//! and conversions, behind [`Dialect`]. The rows both read and write are in
//! [`rows`]; what the worker pool asks of the store (claims, progress, the lease)
//! is in [`leases`]; the cached per-tenant counts of running waits in [`counts`].
//!
//! The store knows no HTTP and no scheduling: the API and the worker pool meet here
//! and on the event [`crate::bus`], never in each other's code. Every worker write
//! is fenced by `owner` and `epoch`; the end of a wait is a conditional update
//! (`status = 'running'`) in the same transaction as its terminal event, so a wait
//! ends exactly once however replicas race.

mod columns;
mod counts;
mod migrations;
#[macro_use]
pub mod postgres;
mod rows;
pub mod secrets;
mod sqlite;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::bus::Bus;
use crate::engine::{EngineState, Spec};
pub use crate::model::{Ending, Event, EventBody, Status, Wait};
use counts::TenantCounts;
pub(crate) use rows::{
    Admission, CheckpointRow, ClaimRow, EventRow, FeedRow, GROUPED_COLUMN, GotRow, Inserted,
    LIMIT_MARGIN, NewWait, NotifyRow, ProgressRow, WAIT_COLUMNS, WaitRow,
};

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

/// Filters of `GET /waits`.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub status: Option<Status>,
    pub labels: BTreeMap<String, String>,
    pub limit: i64,
    /// Return waits older than this id (UUIDv7 order).
    pub before: Option<Uuid>,
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

/// The result of a create: the wait, and whether an idempotency key found an earlier one.
#[derive(Debug)]
pub struct Created {
    pub wait: Wait,
    pub existing: bool,
}

/// The answer to a cancel: the wait as it now stands, and whether this cancel is
/// what ended it (false when it had ended already).
#[derive(Debug)]
pub struct Canceled {
    pub wait: Wait,
    pub ended: bool,
}

/// The reason recorded when a client cancels a wait.
pub const CANCEL_REASON: &str = "canceled by a client";

// ---------------------------------------------------------------------------------
// The dialects, and the store over them
// ---------------------------------------------------------------------------------

/// A backend: SQL and conversions. Each method is one statement or one
/// transaction; what to do with the answers is [`Store`]'s.
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

pub mod outbox;
pub use outbox::{DeliveryLimits, Due, Finished, KEPT_ATTEMPTS, Outbox, Outcome, Redeliver, Turns};
pub mod groups;
pub mod leases;
pub use leases::{Checkpoint, Claimed, Leases, Renewal, SLOT_CLAIMS, SlotToken};
pub mod progress;
pub use groups::{Group, GroupRefused, GroupRequest, MemberRequest, MemberState};
pub use progress::{Ended, MAX_CLAIMS, Progress};
pub mod events;
pub use events::{Events, FeedEvent};
pub mod retention;
pub use retention::Retention;

/// Batches of ended ids [`Store::local_ends`] keeps for a slow receiver.
const LOCAL_ENDS: usize = 1024;

/// What every job's handle shares: the database, and what is kept beside it.
/// Cloning is shallow.
#[derive(Clone, Debug)]
struct Core {
    db: Dialect,
    cipher: Arc<secrets::Cipher>,
    /// Per tenant: running waits when last counted, and when.
    counts: Arc<Mutex<TenantCounts>>,
    /// On Postgres, the waits this process's progress writes ended, as each
    /// write commits (before the sequencer announces them): see
    /// [`Store::local_ends`].
    ends: tokio::sync::broadcast::Sender<Arc<[Uuid]>>,
}

/// The store: the whole of it, for the API, and each job's handle for the part
/// that does only that job. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Store {
    core: Arc<Core>,
    events: Events,
    leases: Leases,
    outbox: Outbox,
    retention: Retention,
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
            ends: tokio::sync::broadcast::channel(LOCAL_ENDS).0,
        }))
    }

    /// The store over `core`, with its handles.
    fn of(core: Core) -> Store {
        let core = Arc::new(core);
        Store {
            events: Events { core: core.clone() },
            leases: Leases { core: core.clone() },
            outbox: Outbox { core: core.clone() },
            retention: Retention { core: core.clone() },
            core,
        }
    }

    /// The reads of events: a wait's, a tenant's, the feed.
    pub fn events(&self) -> &Events {
        &self.events
    }

    /// The worker pool's leases on waits, and what its polls write.
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// The webhook outbox: claims, outcomes, redeliveries, bounds.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// What the retention sweep deletes and reads.
    pub fn retention(&self) -> &Retention {
        &self.retention
    }

    /// The ids of the waits each of this process's progress writes ended, as the
    /// write commits, on Postgres (SQLite publishes every notice on the bus at
    /// commit already). Early word for this replica's group watcher: the same
    /// ends reach every replica as notices once the sequencer numbers them, which
    /// in a burst of ends takes a sequencer run or two. A receiver that falls
    /// behind misses some; the notices still come.
    pub fn local_ends(&self) -> tokio::sync::broadcast::Receiver<Arc<[Uuid]>> {
        self.core.ends.subscribe()
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

    /// Creates a wait with its `created` event. With an idempotency key (and the
    /// request's hash), a second call with the same key and hash returns the first
    /// wait; the same key with another hash is [`StoreError::IdempotencyConflict`].
    pub async fn create(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
    ) -> Result<Created, StoreError> {
        self.create_within(tenant, spec, now, idempotency, None, None)
            .await
    }

    /// [`Store::create`], refusing with [`StoreError::TooManyActive`] when the tenant
    /// already has `max_active` running waits. The count and the insert are atomic
    /// (concurrent creates cannot overshoot), and an idempotent replay is answered
    /// before the limit is looked at. `trace` is the `traceparent` the wait's
    /// polls and webhook attempts join.
    pub async fn create_within(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
        trace: Option<&str>,
    ) -> Result<Created, StoreError> {
        if let Some((key, hash)) = idempotency
            && let Some(found) = self.find_idempotent(tenant, key, hash).await?
        {
            return Ok(Created {
                wait: found,
                existing: true,
            });
        }
        let mut nw = NewWait::prepare(spec, now, &self.core.cipher, trace)?;
        nw.placement = Some(rows::placement(tenant, &spec.target.url));
        let admission = self.admission(tenant, max_active);
        match sql!(self.insert_wait(tenant, now, &nw, idempotency, admission))? {
            Inserted::Yes { counted } => {
                if let Some(n) = counted {
                    self.counted(tenant, n);
                }
                Ok(Created {
                    wait: nw.wait(now),
                    existing: false,
                })
            }
            Inserted::Full(n) => {
                self.counted(tenant, n);
                // A request with the same key may have made the wait meanwhile (its
                // place is what the limit counted): then the answer is that wait.
                if let Some((key, hash)) = idempotency
                    && let Some(found) = self.find_idempotent(tenant, key, hash).await?
                {
                    return Ok(Created {
                        wait: found,
                        existing: true,
                    });
                }
                Err(StoreError::TooManyActive(n))
            }
            Inserted::KeyTaken => {
                let (key, hash) = idempotency.expect("a key was taken, so one was given");
                match self.find_idempotent(tenant, key, hash).await? {
                    Some(found) => Ok(Created {
                        wait: found,
                        existing: true,
                    }),
                    None => Err(StoreError::Decode {
                        what: "idempotency key",
                        why: "the key was taken, then vanished".into(),
                    }),
                }
            }
        }
    }

    /// How a create of `tenant`'s is admitted under `max_active`: counted in its
    /// transaction, unless no limit applies or the tenant is far under it.
    fn admission(&self, tenant: &str, max_active: Option<i64>) -> Admission {
        match max_active {
            Some(max) if !self.far_under_limit(tenant, max) => Admission::Count { max },
            _ => Admission::Free,
        }
    }

    async fn find_idempotent(
        &self,
        tenant: &str,
        key: &str,
        hash: &str,
    ) -> Result<Option<Wait>, StoreError> {
        match sql!(self.find_idempotent(tenant, key))? {
            None => Ok(None),
            Some((h, _)) if h != hash => Err(StoreError::IdempotencyConflict),
            Some((_, id)) => self.get(tenant, id).await,
        }
    }

    fn far_under_limit(&self, tenant: &str, max: i64) -> bool {
        let mut counts = self.core.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.far_under(tenant, max, Instant::now())
    }

    fn counted(&self, tenant: &str, n: i64) {
        let mut counts = self.core.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.counted(tenant, n, Instant::now());
    }

    pub async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError> {
        Ok(self.read(tenant, id).await?.map(|(wait, _)| wait))
    }

    /// [`Store::get`], and whether the wait is a group or a member of one (whose
    /// groups [`Store::annotate_groups`] then fills in), in one statement.
    pub async fn read(&self, tenant: &str, id: Uuid) -> Result<Option<(Wait, bool)>, StoreError> {
        sql!(self.get(tenant, id))?
            .map(|row| Ok((row.wait.into_wait()?, row.grouped)))
            .transpose()
    }

    /// A page of a tenant's waits, newest first.
    pub async fn list(&self, tenant: &str, filter: &ListFilter) -> Result<Vec<Wait>, StoreError> {
        sql!(self.list(tenant, filter))?
            .into_iter()
            .map(WaitRow::into_wait)
            .collect()
    }

    /// Cancels a running wait, ending it exactly once; an ended wait is returned as it
    /// is. `None` when the tenant has no such wait.
    pub async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Canceled>, StoreError> {
        let canceled = |state: Option<String>| {
            EventBody::end(
                Status::Canceled,
                Ending {
                    reason: CANCEL_REASON.into(),
                    state,
                    error_detail: None,
                    last_error: None,
                },
            )
            .to_parts()
        };
        let ended = sql!(self.cancel(
            tenant,
            id,
            now,
            CANCEL_REASON,
            Status::Canceled.as_str(),
            &canceled
        ))?;
        Ok(self
            .get(tenant, id)
            .await?
            .map(|wait| Canceled { wait, ended }))
    }

    /// Runs one statement as written: for tests that bend the schema (a trigger
    /// that refuses a value, say).
    #[cfg(test)]
    pub(crate) async fn execute(&self, statement: &'static str) -> Result<(), StoreError> {
        sql!(self.execute(statement))
    }

    /// Running waits in the store; with a tenant, only that tenant's.
    pub async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        sql!(self.count_running(tenant))
    }
}
