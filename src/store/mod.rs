//! The system of record: waits, their specs, their event history, idempotency keys,
//! and the leases the worker pool takes on them.
//!
//! [`Store`] is written once: how a create is admitted and answered, how a claimed
//! row becomes a wait to poll, what a poll's progress writes, how rows read back.
//! The two backends ([`postgres`], and the embedded [`sqlite`] file) hold only SQL
//! and conversions, behind [`Dialect`].
//!
//! The store knows no HTTP and no scheduling: the API and the worker pool meet here
//! and on the event [`crate::bus`], never in each other's code. Every worker write
//! is fenced by `owner` and `epoch`; the end of a wait is a conditional update
//! (`status = 'running'`) in the same transaction as its terminal event, so a wait
//! ends exactly once however replicas race.

mod columns;
mod migrations;
pub mod postgres;
pub mod secrets;
mod sqlite;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::bus::Bus;
use crate::engine::{EngineState, Spec};
pub use crate::model::{Ending, Event, EventBody, Status, Wait};
use columns::{Json, Time, from_row};

pub use postgres::PgDialect;
use sqlite::SqliteDialect;

/// A wait the worker pool has just claimed.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub id: Uuid,
    pub epoch: i64,
    /// Polls of this wait begun since one last completed (each by a replica that
    /// then stopped): see [`MAX_CLAIMS`].
    pub claims: i32,
    /// The tenant the wait belongs to: its work takes that tenant's turns on the
    /// CPU pool.
    pub tenant: String,
    pub spec: Spec,
    pub engine: EngineState,
    pub next_poll_at: DateTime<Utc>,
}

/// A wait whose poll began this many times in a row without completing (each
/// replica that polled it died meanwhile) is ended by its next claimer instead of
/// polled, so that it cannot take down one replica after another. The count is kept
/// in the store: [`Store::mark_polling`] adds to it as the first poll after a claim
/// begins, and the write of a completed poll ([`Store::confirm_polled`] when it
/// changed nothing) clears it.
pub const MAX_CLAIMS: i32 = 3;

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

/// The counters and schedule of a held wait, written in periodic batches.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub id: Uuid,
    pub epoch: i64,
    /// `None` when nothing changed since the last checkpoint: only the lease is renewed.
    pub engine: Option<EngineState>,
    pub next_poll_at: Option<DateTime<Utc>>,
}

/// How a wait ended, as its progress records it.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    pub status: Status,
    pub reason: String,
    pub error_detail: Option<Value>,
}

/// What one poll changed, written at once (a new state, a retry, or the end).
#[derive(Clone, Debug)]
pub struct Progress {
    pub id: Uuid,
    pub epoch: i64,
    pub engine: EngineState,
    pub next_poll_at: Option<DateTime<Utc>>,
    /// The events the poll observed (`state`, `retry`); the terminal one follows
    /// from `end`.
    pub events: Vec<EventBody>,
    pub end: Option<Ended>,
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

/// An event of any tenant, as the replica's feed reads them for every follower of
/// `GET /events` at once: with the tenant and the labels of its wait, by which each
/// follower filters.
#[derive(Clone, Debug)]
pub struct FeedEvent {
    pub event: Event,
    pub tenant: String,
    pub labels: BTreeMap<String, String>,
}

/// What a renewal found: the named waits no longer the owner's under the epoch
/// they were named with (taken over, or ended elsewhere), and the waits the owner
/// owns without naming them (a claim whose answer never came back: the connection
/// broke after its commit), each with its epoch.
#[derive(Debug, Default, PartialEq)]
pub struct Renewal {
    pub lost: Vec<WaitEpoch>,
    pub strays: Vec<WaitEpoch>,
}

/// The reason recorded when a client cancels a wait.
pub const CANCEL_REASON: &str = "canceled by a client";

// ---------------------------------------------------------------------------------
// Rows: what the dialects read and write, in one shape for both.
// ---------------------------------------------------------------------------------

from_row! {
/// A wait as both dialects read it back.
pub(crate) struct WaitRow {
    id: Uuid,
    status: String,
    state: Option<String>,
    reason: Option<String>,
    error_detail: Option<Json>,
    last_error: Option<String>,
    polls: i32,
    retries: i32,
    created_at: Time,
    updated_at: Time,
    deadline: Time,
    next_poll_at: Option<Time>,
    finished_at: Option<Time>,
    labels: Json,
    spec: Json,
}
}

/// The columns a [`WaitRow`] reads, from `waits w JOIN wait_specs s`.
pub(crate) const WAIT_COLUMNS: &str = "w.id, w.status, w.state, w.reason, w.error_detail, w.last_error, w.polls, w.retries, \
     w.created_at, w.updated_at, w.deadline, w.next_poll_at, w.finished_at, w.labels, s.spec";

impl WaitRow {
    fn into_wait(self) -> Result<Wait, StoreError> {
        Ok(Wait {
            id: self.id,
            status: self.status.parse().map_err(|e| StoreError::Decode {
                what: "status",
                why: format!("{e}"),
            })?,
            state: self.state,
            reason: self.reason,
            error_detail: self.error_detail.map(|j| j.0),
            last_error: self.last_error,
            polls: self.polls,
            retries: self.retries,
            created_at: self.created_at.0,
            updated_at: self.updated_at.0,
            deadline: self.deadline.0,
            next_poll_at: self.next_poll_at.map(|t| t.0),
            finished_at: self.finished_at.map(|t| t.0),
            labels: serde_json::from_value(self.labels.0).unwrap_or_default(),
            spec: self.spec.0,
        })
    }
}

from_row! {
/// An event as both dialects read it back (`id` is the global cursor: Postgres's
/// `gid`, SQLite's row id).
pub(crate) struct EventRow {
    id: Option<i64>,
    seq: i32,
    wait_id: Uuid,
    kind: String,
    at: Time,
    data: Json,
}
}

impl EventRow {
    fn into_event(self) -> Result<Event, StoreError> {
        Ok(Event {
            id: self.id,
            seq: self.seq,
            wait_id: self.wait_id,
            at: self.at.0,
            body: EventBody::from_parts(&self.kind, self.data.0).map_err(|e| {
                StoreError::Decode {
                    what: "event",
                    why: e.to_string(),
                }
            })?,
        })
    }
}

from_row! {
/// A feed entry as both dialects read it back.
pub(crate) struct FeedRow {
    tenant: String,
    labels: Json,
    ..event: EventRow,
}
}

from_row! {
/// A claimed row's stored parts.
pub(crate) struct ClaimRow {
    id: Uuid,
    epoch: i64,
    claims: i32,
    tenant: String,
    engine: Json,
    next_poll_at: Option<Time>,
    spec: Json,
    headers: Json,
}
}

/// Everything a new wait's rows need, computed once for every backend.
pub(crate) struct NewWait {
    pub id: Uuid,
    pub engine: EngineState,
    pub first_poll: DateTime<Utc>,
    /// The spec as stored and shown: header values redacted.
    pub spec: Value,
    /// The header values, kept apart.
    pub headers: Value,
    pub labels: Value,
    pub engine_json: Value,
    /// The `created` event: kind and fields.
    pub created: (&'static str, Value),
    /// Its webhooks, secrets sealed.
    pub notify: Vec<deliveries::NotifyRow>,
}

/// What one progress entry writes, computed once for every backend.
pub(crate) struct ProgressRow {
    pub id: Uuid,
    pub epoch: i64,
    pub status: &'static str,
    pub state: Option<String>,
    pub reason: Option<String>,
    pub detail: Option<Value>,
    pub last_error: Option<String>,
    pub polls: i32,
    pub retries: i32,
    pub engine: String,
    /// `None` once it ends.
    pub next_poll_at: Option<DateTime<Utc>>,
    pub ended: bool,
    /// The events to append, in order: kind and fields.
    pub events: Vec<(&'static str, Value)>,
}

/// What one checkpoint writes. A checkpoint lands only when it is newer (more
/// polls) than what the row holds, so a progress write that committed while it was
/// on its way wins; a checkpoint without an engine state renews only.
pub(crate) struct CheckpointRow {
    pub id: Uuid,
    pub epoch: i64,
    pub engine: Option<String>,
    pub polls: Option<i32>,
    pub retries: Option<i32>,
    pub next_poll_at: Option<DateTime<Utc>>,
}

impl From<&Checkpoint> for CheckpointRow {
    fn from(c: &Checkpoint) -> CheckpointRow {
        CheckpointRow {
            id: c.id,
            epoch: c.epoch,
            engine: c
                .engine
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok()),
            polls: c.engine.as_ref().map(|e| e.polls as i32),
            retries: c.engine.as_ref().map(|e| e.retries as i32),
            next_poll_at: c.next_poll_at,
        }
    }
}

/// How a create counts the tenant's running waits, decided from the cached count.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Admission {
    /// Far under the limit (or no limit): insert without counting.
    Free,
    /// Count in the insert's transaction; within `LIMIT_MARGIN` of `max`, count
    /// again under the tenant's lock.
    Count { max: i64 },
}

/// The answer of a dialect's insert.
pub(crate) enum Inserted {
    /// The wait is in; `counted` is the tenant's running count when one was taken.
    Yes { counted: Option<i64> },
    /// Another request with this idempotency key won the race.
    KeyTaken,
    /// The tenant has this many running waits, the most allowed.
    Full(i64),
}

/// Below `max_active_waits - LIMIT_MARGIN` running waits, creates skip the per-tenant
/// lock: more concurrent creates than this (connections across all replicas) would
/// be needed to overshoot the limit.
pub(crate) const LIMIT_MARGIN: i64 = 256;

fn to_json<T: Serialize>(v: &T, what: &'static str) -> Result<Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Decode {
        what,
        why: e.to_string(),
    })
}

impl NewWait {
    fn prepare(
        spec: &Spec,
        now: DateTime<Utc>,
        cipher: &secrets::Cipher,
    ) -> Result<NewWait, StoreError> {
        let (engine, first_poll) = EngineState::start(spec, now);
        let created = EventBody::Created {
            deadline: engine.deadline,
        };
        Ok(NewWait {
            id: Uuid::now_v7(),
            first_poll,
            spec: to_json(&spec.redacted(), "spec")?,
            headers: cipher
                .seal(&spec.target.headers)
                .map_err(|why| StoreError::Decode {
                    what: "target headers",
                    why,
                })?,
            labels: to_json(&spec.labels, "labels")?,
            engine_json: to_json(&engine, "engine state")?,
            created: created.to_parts(),
            notify: deliveries::NotifyRow::of(&spec.notify, cipher)?,
            engine,
        })
    }

    /// The wait as it reads back right after its insert, built without a read.
    fn wait(&self, now: DateTime<Utc>) -> Wait {
        Wait {
            id: self.id,
            status: Status::Running,
            state: None,
            reason: None,
            error_detail: None,
            last_error: None,
            polls: 0,
            retries: 0,
            created_at: now,
            updated_at: now,
            deadline: self.engine.deadline,
            next_poll_at: Some(self.first_poll),
            finished_at: None,
            labels: serde_json::from_value(self.labels.clone()).unwrap_or_default(),
            spec: self.spec.clone(),
        }
    }
}

impl Progress {
    /// What this progress writes: its columns, and its events (the observed ones,
    /// then the terminal one if it ended).
    fn row(&self) -> Result<ProgressRow, StoreError> {
        let mut events: Vec<(&'static str, Value)> =
            self.events.iter().map(EventBody::to_parts).collect();
        if let Some(end) = &self.end {
            let terminal = EventBody::end(
                end.status,
                Ending {
                    reason: end.reason.clone(),
                    state: self.engine.state.clone(),
                    error_detail: end.error_detail.clone(),
                    last_error: self.engine.last_error.clone(),
                },
            );
            events.push(terminal.to_parts());
        }
        Ok(ProgressRow {
            id: self.id,
            epoch: self.epoch,
            status: self
                .end
                .as_ref()
                .map_or(Status::Running, |e| e.status)
                .as_str(),
            state: self.engine.state.clone(),
            reason: self.end.as_ref().map(|e| e.reason.clone()),
            detail: self.end.as_ref().and_then(|e| e.error_detail.clone()),
            last_error: self.engine.last_error.clone(),
            polls: self.engine.polls as i32,
            retries: self.engine.retries as i32,
            engine: serde_json::to_string(&self.engine).map_err(|e| StoreError::Decode {
                what: "engine state",
                why: e.to_string(),
            })?,
            next_poll_at: if self.end.is_some() {
                None
            } else {
                self.next_poll_at
            },
            ended: self.end.is_some(),
            events,
        })
    }

    /// Progress that ends a held wait in `error` with `reason`, keeping its counters
    /// but nothing the target said: for a wait whose polls keep killing the replica
    /// polling it, or whose progress the store refuses to take.
    pub fn abandon(id: Uuid, epoch: i64, engine: &EngineState, reason: String) -> Progress {
        let mut engine = engine.clone();
        engine.state = None;
        engine.last_error = None;
        Progress {
            id,
            epoch,
            engine,
            next_poll_at: None,
            events: vec![],
            end: Some(Ended {
                status: Status::Error,
                reason: crate::engine::bound::text(&reason, crate::engine::bound::MAX_REASON)
                    .into_owned(),
                error_detail: None,
            }),
        }
    }

    /// Progress that ends a wait this version cannot read, rather than spin on it.
    fn undecodable(id: Uuid, epoch: i64, why: String) -> Progress {
        let now = Utc::now();
        let engine = EngineState {
            deadline: now,
            polls: 0,
            retries: 0,
            budget_used: 0,
            poll_interval_ms: 0,
            retry_delay_ms: 0,
            transition_seen: false,
            hits: 0,
            state: None,
            last_error: Some(why.clone()),
        };
        Progress {
            id,
            epoch,
            engine,
            next_poll_at: None,
            events: vec![],
            end: Some(Ended {
                status: Status::Error,
                reason: format!("waitd could not read this wait's stored spec: {why}"),
                error_detail: None,
            }),
        }
    }
}

/// A tenant's running count as last read, when, and whether a create is reading it
/// again now.
#[derive(Debug)]
struct Counted {
    n: i64,
    at: Instant,
    recounting: bool,
}

/// A tenant's running count, once read, spares the next creates from counting for
/// this long while it is more than [`CACHED_MARGIN`] under the limit: overshooting
/// would take that many creates, across all replicas, within this window. Once it is
/// older, one create counts again while the others go on with it for up to as long
/// again, rather than all counting at once.
const COUNT_FRESH: Duration = Duration::from_millis(250);
const CACHED_MARGIN: i64 = 1024;

/// Per tenant, the running count as last read ([`COUNT_FRESH`], [`CACHED_MARGIN`]).
#[derive(Debug, Default)]
struct TenantCounts(std::collections::HashMap<String, Counted>);

impl TenantCounts {
    /// True when the tenant was counted lately and far enough under `max` that no
    /// count is needed now. A stale count is read again by one create (the caller
    /// answered false first), while the others go on with it a little longer.
    fn far_under(&mut self, tenant: &str, max: i64, now: Instant) -> bool {
        let Some(c) = self.0.get_mut(tenant).filter(|c| c.n + CACHED_MARGIN < max) else {
            return false;
        };
        let age = now.saturating_duration_since(c.at);
        if age < COUNT_FRESH || (c.recounting && age < 2 * COUNT_FRESH) {
            return true;
        }
        c.recounting = true;
        false
    }

    fn counted(&mut self, tenant: &str, n: i64, now: Instant) {
        if self.0.len() > 10_000 {
            self.0
                .retain(|_, c| now.saturating_duration_since(c.at) < 2 * COUNT_FRESH);
        }
        self.0.insert(
            tenant.to_string(),
            Counted {
                n,
                at: now,
                recounting: false,
            },
        );
    }
}

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
        match &$self.db {
            Dialect::Postgres(d) => d.$method($($arg),*).await,
            Dialect::Sqlite(d) => d.$method($($arg),*).await,
        }
    };
}

mod deliveries;
pub use deliveries::{DeliveryLimits, Due, KEPT_ATTEMPTS, Outcome, Redeliver, Turns};

/// The store. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Store {
    db: Dialect,
    cipher: Arc<secrets::Cipher>,
    /// Per tenant: running waits when last counted, and when.
    counts: Arc<Mutex<TenantCounts>>,
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
        Ok(Store {
            db,
            cipher: Default::default(),
            counts: Default::default(),
        })
    }

    /// Seals target header values at rest under `cipher`'s key.
    pub fn with_cipher(mut self, cipher: secrets::Cipher) -> Store {
        self.cipher = Arc::new(cipher);
        self
    }

    /// The Postgres backend, for what only Postgres has (LISTEN, the sequencer,
    /// connection diagnosis).
    pub fn postgres(&self) -> Option<&PgDialect> {
        match &self.db {
            Dialect::Postgres(d) => Some(d),
            Dialect::Sqlite(_) => None,
        }
    }

    /// The kind of store and where it is, never a password.
    pub fn describe(&self) -> String {
        match &self.db {
            Dialect::Postgres(d) => d.describe(),
            Dialect::Sqlite(d) => d.describe(),
        }
    }

    /// Database connections checked out right now (of `--db-connections` plus the
    /// few Postgres keeps apart for leases and the sequencer).
    pub fn connections_in_use(&self) -> u32 {
        match &self.db {
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
        self.create_within(tenant, spec, now, idempotency, None)
            .await
    }

    /// [`Store::create`], refusing with [`StoreError::TooManyActive`] when the tenant
    /// already has `max_active` running waits. The count and the insert are atomic
    /// (concurrent creates cannot overshoot), and an idempotent replay is answered
    /// before the limit is looked at.
    pub async fn create_within(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
    ) -> Result<Created, StoreError> {
        if let Some((key, hash)) = idempotency
            && let Some(found) = self.find_idempotent(tenant, key, hash).await?
        {
            return Ok(Created {
                wait: found,
                existing: true,
            });
        }
        let nw = NewWait::prepare(spec, now, &self.cipher)?;
        let admission = match max_active {
            Some(max) if !self.far_under_limit(tenant, max) => Admission::Count { max },
            _ => Admission::Free,
        };
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
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.far_under(tenant, max, Instant::now())
    }

    fn counted(&self, tenant: &str, n: i64) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.counted(tenant, n, Instant::now());
    }

    pub async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError> {
        sql!(self.get(tenant, id))?
            .map(WaitRow::into_wait)
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
        let ended = sql!(self.cancel(tenant, id, now, CANCEL_REASON, &canceled))?;
        Ok(self
            .get(tenant, id)
            .await?
            .map(|wait| Canceled { wait, ended }))
    }

    /// A wait's events with `seq > after`, oldest first. Every committed event is
    /// there; on Postgres one committed a moment ago may not have its global cursor
    /// yet (`id` is `None` until the sequencer gives it one).
    pub async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        sql!(self.events(tenant, wait_id, after, limit))?
            .into_iter()
            .map(EventRow::into_event)
            .collect()
    }

    /// The tenant's sequenced events with global `id > after`, of waits carrying all
    /// `labels`.
    pub async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        sql!(self.global_events(tenant, after, labels, limit))?
            .into_iter()
            .map(EventRow::into_event)
            .collect()
    }

    /// Events of every tenant with global id `> after`, oldest first (the replica's
    /// feed; see [`FeedEvent`]).
    pub async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedEvent>, StoreError> {
        sql!(self.feed(after, limit))?
            .into_iter()
            .map(|r| {
                Ok(FeedEvent {
                    event: r.event.into_event()?,
                    tenant: r.tenant,
                    labels: serde_json::from_value(r.labels.0).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The newest global event id given out so far (0 before the first event); with
    /// a tenant, the newest of that tenant's events.
    pub async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        sql!(self.last_event_id(tenant))
    }

    /// Claims up to `limit` running waits due within `lookahead` that are unowned or
    /// whose owner's lease has run out (epoch + 1). A row this version cannot read is
    /// ended in `error` rather than spun on.
    pub async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let rows = sql!(self.claim(owner, ttl, lookahead, limit))?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            match self.decode_claim(&row) {
                Ok((spec, engine)) => claimed.push(Claimed {
                    id: row.id,
                    epoch: row.epoch,
                    claims: row.claims,
                    tenant: row.tenant.clone(),
                    next_poll_at: row.next_poll_at.map_or(engine.deadline, |t| t.0),
                    spec,
                    engine,
                }),
                Err(why) => {
                    tracing::error!(wait_id = %row.id, error = %why, "cannot decode a claimed wait; ending it in error");
                    let _ = self
                        .record(
                            owner,
                            Utc::now(),
                            &Progress::undecodable(row.id, row.epoch, why),
                        )
                        .await;
                }
            }
        }
        Ok(claimed)
    }

    /// A claimed row's stored parts back into a spec (headers restored) and engine state.
    fn decode_claim(&self, row: &ClaimRow) -> Result<(Spec, EngineState), String> {
        let mut spec: Spec =
            serde_json::from_value(row.spec.0.clone()).map_err(|e| format!("spec: {e}"))?;
        spec.target.headers = self.cipher.open(&row.headers.0)?;
        let engine: EngineState = serde_json::from_value(row.engine.0.clone())
            .map_err(|e| format!("engine state: {e}"))?;
        Ok((spec, engine))
    }

    /// Records that a poll of each of these waits (id, epoch) begins, the first
    /// since its claim: it adds one to the wait's `claims`, which a completed poll's
    /// write sets back to 0 ([`MAX_CLAIMS`]). Fenced by owner and epoch; returns
    /// the ids still the owner's.
    pub async fn mark_polling(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.count_polls(owner, ids, true).await
    }

    /// Records that the first poll since the claim of each of these waits (id,
    /// epoch) completed and changed nothing worth an event: their `claims` goes back
    /// to 0, and nothing else is written (the poll count and schedule follow in a
    /// checkpoint). One statement for all of them; a claim of a million waits
    /// writes each row a third time otherwise, with every progress column.
    /// Fenced by owner and epoch; returns the ids still the owner's.
    pub async fn confirm_polled(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.count_polls(owner, ids, false).await
    }

    async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        sql!(self.count_polls(owner, ids, begun))
    }

    /// Writes what one poll changed, fenced by owner and epoch; false when the wait is
    /// no longer this owner's. `now` (the writer's clock) is when it is written: the
    /// wait's `updated_at`, and `finished_at` when it ends.
    pub async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        progress: &Progress,
    ) -> Result<bool, StoreError> {
        Ok(self
            .record_many(owner, now, std::slice::from_ref(progress))
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// [`Store::record`] for many waits in one transaction: one answer per entry, in
    /// order. A wait may appear once. The written rows' polls-begun counts go back
    /// to 0.
    pub async fn record_many(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError> {
        if progress.is_empty() {
            return Ok(Vec::new());
        }
        let rows = progress
            .iter()
            .map(Progress::row)
            .collect::<Result<Vec<_>, _>>()?;
        sql!(self.record(owner, now, &rows))
    }

    /// Renews the owner's lease (one row a replica, however many waits it holds)
    /// and writes `checkpoints`; says which of `named` (every wait the owner holds,
    /// with its epoch) are no longer the owner's under that epoch, and which waits
    /// the owner owns that `named` leaves out.
    ///
    /// The comparison is made here, not by the caller: for a replica holding a
    /// million waits it is a million lookups, which the worker's loop cannot spend.
    pub async fn renew(
        &self,
        owner: Uuid,
        ttl: Duration,
        named: &[WaitEpoch],
        checkpoints: &[Checkpoint],
    ) -> Result<Renewal, StoreError> {
        self.checkpoint(owner, ttl, checkpoints).await?;
        let mut owned: std::collections::HashMap<Uuid, i64> = sql!(self.owned(owner))?
            .into_iter()
            .map(|w| (w.id, w.epoch))
            .collect();
        let mut lost = Vec::new();
        for w in named {
            // Under another epoch it was claimed again since it was named: lost
            // under that one (the caller compares epochs), and no stray.
            if owned.remove(&w.id) != Some(w.epoch) {
                lost.push(*w);
            }
        }
        Ok(Renewal {
            lost,
            strays: owned.into_iter().map(WaitEpoch::from).collect(),
        })
    }

    /// Renews the owner's lease and writes `checkpoints` (those that carry a
    /// state), without comparing what it holds with what it owns.
    pub async fn checkpoint(
        &self,
        owner: Uuid,
        ttl: Duration,
        checkpoints: &[Checkpoint],
    ) -> Result<(), StoreError> {
        self.renew_lease(owner, ttl).await?;
        let rows: Vec<CheckpointRow> = checkpoints.iter().map(CheckpointRow::from).collect();
        sql!(self.write_all_checkpoints(owner, &rows))
    }

    /// Renews the owner's lease only: one row, however many waits it holds.
    pub async fn renew_lease(&self, owner: Uuid, ttl: Duration) -> Result<(), StoreError> {
        sql!(self.renew_lease(owner, ttl))
    }

    /// Writes the last checkpoints and gives the leases up, so another replica can
    /// take them over at once; tells the other replicas there is work.
    pub async fn release(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError> {
        let rows: Vec<CheckpointRow> = held.iter().map(CheckpointRow::from).collect();
        sql!(self.release(owner, &rows))
    }

    /// Periodic housekeeping, called on every lease renewal: forgets replicas gone
    /// for a day that own nothing.
    pub async fn maintain(&self) -> Result<(), StoreError> {
        sql!(self.maintain())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_tenant_count_is_read_again_by_one_create_while_the_others_go_on() {
        let t0 = Instant::now();
        let mut c = TenantCounts::default();
        assert!(!c.far_under("t", 10_000, t0), "never counted: count");
        c.counted("t", 100, t0);
        assert!(c.far_under("t", 10_000, t0 + COUNT_FRESH / 2));
        // Near the limit, every create counts, fresh or not.
        assert!(!c.far_under("t", 100 + CACHED_MARGIN, t0));
        let stale = t0 + COUNT_FRESH;
        assert!(
            !c.far_under("t", 10_000, stale),
            "the first to see it stale counts"
        );
        assert!(
            c.far_under("t", 10_000, stale),
            "the others go on meanwhile"
        );
        assert!(c.far_under("t", 10_000, t0 + COUNT_FRESH * 3 / 2));
        // The recount never came back (it failed): after twice the window, another
        // create counts.
        assert!(!c.far_under("t", 10_000, t0 + 2 * COUNT_FRESH));
        c.counted("t", 200, t0 + 2 * COUNT_FRESH);
        assert!(c.far_under("t", 10_000, t0 + 2 * COUNT_FRESH));
        assert!(!c.far_under("other", 10_000, t0), "tenants apart");
    }

    #[test]
    fn a_progress_that_ends_writes_its_terminal_event_last_and_no_next_poll() {
        let engine = EngineState {
            deadline: Utc::now(),
            polls: 4,
            retries: 1,
            budget_used: 0,
            poll_interval_ms: 1000,
            retry_delay_ms: 1000,
            transition_seen: true,
            hits: 1,
            state: Some("on".into()),
            last_error: Some("e".into()),
        };
        let p = Progress {
            id: Uuid::now_v7(),
            epoch: 2,
            engine,
            next_poll_at: Some(Utc::now()),
            events: vec![EventBody::State {
                from: Some("off".into()),
                to: "on".into(),
            }],
            end: Some(Ended {
                status: Status::Succeeded,
                reason: "the target reached \"on\"".into(),
                error_detail: None,
            }),
        };
        let row = p.row().unwrap();
        assert_eq!(row.status, "succeeded");
        assert!(row.ended && row.next_poll_at.is_none());
        let kinds: Vec<&str> = row.events.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ["state", "succeeded"]);
        assert_eq!(row.events[1].1["state"], "on");
        assert_eq!(row.events[1].1["last_error"], "e");
    }
}
