//! The system of record: waits, their specs, their event history, idempotency keys,
//! and the leases the worker pool takes on them.
//!
//! The store knows no HTTP and no scheduling: the API and the worker pool meet here
//! and on the event [`bus`], never in each other's code. Every worker write is fenced
//! by `owner` and `epoch`; the end of a wait is a conditional update
//! (`status = 'running'`) in the same transaction as its terminal event, so a wait
//! ends exactly once however replicas race.

pub mod bus;
mod postgres;
pub mod secrets;
mod sqlite;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::engine::{EngineState, Spec};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// A wait as clients see it (`GET /waits/{id}`).
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Wait {
    pub id: Uuid,
    /// running | succeeded | failed | timed_out | canceled | error
    pub status: String,
    /// The last observed state (several values joined by ", "); null before the first good poll.
    pub state: Option<String>,
    /// One human sentence once the wait has ended.
    pub reason: Option<String>,
    /// From the spec's `error` path, when the wait failed.
    #[schema(value_type = Option<Object>)]
    pub error_detail: Option<Value>,
    /// The last transient or probe error.
    pub last_error: Option<String>,
    pub polls: i32,
    pub retries: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub next_poll_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub labels: BTreeMap<String, String>,
    /// The normalised request; every header value reads "<redacted>".
    #[schema(value_type = Object)]
    pub spec: Value,
}

impl Wait {
    pub fn is_running(&self) -> bool {
        self.status == "running"
    }
}

/// One entry of a wait's history.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Event {
    /// The global cursor (`GET /events`). Events are served only once they have
    /// one, so it is never null in a response.
    pub id: Option<i64>,
    /// Position in this wait's history, from 1.
    pub seq: i32,
    pub wait_id: Uuid,
    /// created | state | retry | succeeded | failed | timed_out | canceled | error
    pub kind: String,
    pub at: DateTime<Utc>,
    /// The kind's own fields (`from`/`to`, `error`/`attempt`/`delay`, `reason`…),
    /// flattened into the event object.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub data: Value,
}

impl Event {
    pub fn is_terminal(&self) -> bool {
        TERMINAL_KINDS.contains(&self.kind.as_str())
    }
}

pub const TERMINAL_KINDS: &[&str] = &["succeeded", "failed", "timed_out", "canceled", "error"];

/// An event of any tenant, as the replica's feed reads them for every follower of
/// `GET /events` at once: with the tenant and the labels of its wait, by which each
/// follower filters.
#[derive(Clone, Debug)]
pub struct FeedEvent {
    pub event: Event,
    pub tenant: String,
    pub labels: BTreeMap<String, String>,
}

/// An event the worker or the API is about to append.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub kind: String,
    pub data: Value,
}

/// A wait the worker pool has just claimed.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub id: Uuid,
    pub epoch: i64,
    /// Polls of this wait begun since one last completed (each by a replica that
    /// then stopped): see [`MAX_CLAIMS`].
    pub claims: i32,
    pub spec: Spec,
    pub engine: EngineState,
    pub next_poll_at: DateTime<Utc>,
}

/// A wait whose poll began this many times in a row without completing (each
/// replica that polled it died meanwhile) is ended by its next claimer instead of
/// polled, so that it cannot take down one replica after another. The count is kept
/// in the store: [`Store::mark_polling`] adds to it as the first poll after a claim
/// begins, and the write of a completed poll clears it.
pub const MAX_CLAIMS: i32 = 3;

/// The counters and schedule of a held wait, written in periodic batches.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub id: Uuid,
    pub epoch: i64,
    /// `None` when nothing changed since the last checkpoint: only the lease is renewed.
    pub engine: Option<EngineState>,
    pub next_poll_at: Option<DateTime<Utc>>,
}

/// What one poll changed, written at once (a new state, a retry, or the end).
#[derive(Clone, Debug)]
pub struct Progress {
    pub id: Uuid,
    pub epoch: i64,
    pub engine: EngineState,
    pub next_poll_at: Option<DateTime<Utc>>,
    pub events: Vec<NewEvent>,
    /// Set when the wait ends: status, reason, error detail.
    pub end: Option<(String, String, Option<Value>)>,
}

/// Filters of `GET /waits`.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub status: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub limit: i64,
    /// Return waits older than this id (UUIDv7 order).
    pub before: Option<Uuid>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached: the API answers 503.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The same idempotency key was used with another request body.
    #[error("idempotency key reused with a different request")]
    IdempotencyConflict,
    /// The tenant already has this many running waits, the most allowed.
    #[error("the tenant has {0} running waits, the most allowed")]
    TooManyActive(i64),
    #[error("database error: {0}")]
    Other(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(db)
                if db
                    .code()
                    .is_some_and(|c| c.starts_with("57P") || c.starts_with("08")) =>
            {
                StoreError::Unavailable(e.to_string())
            }
            _ => StoreError::Other(e.to_string()),
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
    pub created: NewEvent,
}

impl NewWait {
    pub fn prepare(
        spec: &Spec,
        now: DateTime<Utc>,
        cipher: &secrets::Cipher,
    ) -> Result<NewWait, StoreError> {
        let (engine, first_poll) = EngineState::start(spec, now);
        Ok(NewWait {
            id: Uuid::now_v7(),
            first_poll,
            spec: to_json(&spec.redacted())?,
            headers: cipher
                .seal(&spec.target.headers)
                .map_err(StoreError::Other)?,
            labels: to_json(&spec.labels)?,
            engine_json: to_json(&engine)?,
            created: NewEvent {
                kind: "created".into(),
                data: serde_json::json!({ "deadline": engine.deadline }),
            },
            engine,
        })
    }
}

impl NewWait {
    /// The wait as it reads back right after its insert, built without a read.
    pub fn wait(&self, now: DateTime<Utc>) -> Wait {
        use chrono::SubsecRound;
        // As the databases store them: microseconds.
        let (now, deadline, first_poll) = (
            now.trunc_subsecs(6),
            self.engine.deadline.trunc_subsecs(6),
            self.first_poll.trunc_subsecs(6),
        );
        Wait {
            id: self.id,
            status: "running".into(),
            state: None,
            reason: None,
            error_detail: None,
            last_error: None,
            polls: 0,
            retries: 0,
            created_at: now,
            updated_at: now,
            deadline,
            next_poll_at: Some(first_poll),
            finished_at: None,
            labels: serde_json::from_value(self.labels.clone()).unwrap_or_default(),
            spec: self.spec.clone(),
        }
    }
}

pub(crate) fn to_json<T: Serialize>(v: &T) -> Result<Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Other(e.to_string()))
}

pub(crate) fn canceled_event(state: Option<String>) -> NewEvent {
    NewEvent {
        kind: "canceled".into(),
        data: serde_json::json!({ "reason": CANCEL_REASON, "state": state }),
    }
}

impl Progress {
    /// The status, reason and error detail columns this progress writes.
    pub(crate) fn columns(&self) -> (&str, Option<&str>, Option<Value>) {
        match &self.end {
            Some((s, r, d)) => (s.as_str(), Some(r.as_str()), d.clone()),
            None => ("running", None, None),
        }
    }

    /// The events to append: the observed ones, then the terminal one if it ended.
    pub(crate) fn all_events(&self) -> Vec<NewEvent> {
        let mut events = self.events.clone();
        if let Some((status, reason, detail)) = &self.end {
            let mut data = serde_json::json!({ "reason": reason, "state": self.engine.state });
            if let Some(d) = detail {
                data["error_detail"] = d.clone();
            }
            if let Some(e) = &self.engine.last_error {
                data["last_error"] = serde_json::json!(e);
            }
            events.push(NewEvent {
                kind: status.clone(),
                data,
            });
        }
        events
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
            end: Some((
                "error".into(),
                crate::engine::bound::text(&reason, crate::engine::bound::MAX_REASON).into_owned(),
                None,
            )),
        }
    }

    /// Progress that ends a wait this version cannot read, rather than spin on it.
    pub(crate) fn undecodable(id: Uuid, epoch: i64, why: String) -> Progress {
        let now = Utc::now();
        Progress {
            id,
            epoch,
            engine: EngineState {
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
            },
            next_poll_at: None,
            events: vec![],
            end: Some((
                "error".into(),
                format!("waitd could not read this wait's stored spec: {why}"),
                None,
            )),
        }
    }
}

/// A claimed row's stored parts back into a spec (headers restored) and engine state.
pub(crate) fn decode_claim(
    spec: Value,
    headers: Value,
    engine: Value,
    cipher: &secrets::Cipher,
) -> Result<(Spec, EngineState), String> {
    let mut spec: Spec = serde_json::from_value(spec).map_err(|e| format!("spec: {e}"))?;
    spec.target.headers = cipher.open(&headers)?;
    let engine: EngineState =
        serde_json::from_value(engine).map_err(|e| format!("engine state: {e}"))?;
    Ok((spec, engine))
}

/// What the API and the worker pool need of a store. Postgres and the embedded SQLite
/// file implement it; [`AnyStore`] is whichever the operator configured.
#[allow(async_fn_in_trait)] // used with concrete types only
pub trait Store: Clone + Send + Sync + 'static {
    async fn migrate(&self) -> Result<(), StoreError>;
    async fn ping(&self) -> Result<(), StoreError>;
    async fn close(&self);
    /// Creates a wait with its `created` event. With an idempotency key (and the
    /// request's hash), a second call with the same key and hash returns the first
    /// wait; the same key with another hash is [`StoreError::IdempotencyConflict`].
    async fn create(
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
    async fn create_within(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
    ) -> Result<Created, StoreError>;
    async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError>;
    /// A page of a tenant's waits, newest first.
    async fn list(&self, tenant: &str, filter: &ListFilter) -> Result<Vec<Wait>, StoreError>;
    /// Cancels a running wait, ending it exactly once; an ended wait is returned as it
    /// is. `None` when the tenant has no such wait.
    async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Canceled>, StoreError>;
    /// A wait's events with `seq > after`, oldest first.
    async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError>;
    /// The tenant's events with global `id > after`, of waits carrying all `labels`.
    async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError>;
    /// Events of every tenant with global id `> after`, oldest first (the replica's
    /// feed; see [`FeedEvent`]).
    async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedEvent>, StoreError>;
    /// The newest global event id given out so far (0 before the first event); with
    /// a tenant, the newest of that tenant's events.
    async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError>;
    /// Claims up to `limit` running waits due within `lookahead` that are unowned or
    /// whose owner's lease has run out (epoch + 1). The claimed waits are leased for
    /// `ttl` at least; what the claimer already holds is renewed by `renew` only.
    async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError>;
    /// Records that a poll of each of these waits (id, epoch) begins, the first
    /// since its claim: it adds one to the wait's `claims`, which a completed poll's
    /// write sets back to 0 ([`MAX_CLAIMS`]). Fenced by owner and epoch; returns
    /// the ids still the owner's.
    async fn mark_polling(&self, owner: Uuid, ids: &[(Uuid, i64)])
    -> Result<Vec<Uuid>, StoreError>;
    /// Writes what one poll changed, fenced by owner and epoch; false when the wait is
    /// no longer this owner's.
    async fn record(&self, owner: Uuid, progress: &Progress) -> Result<bool, StoreError> {
        Ok(self
            .record_many(owner, std::slice::from_ref(progress))
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }
    /// [`Store::record`] for many waits in one transaction: one answer per entry, in
    /// order. A wait may appear once.
    async fn record_many(
        &self,
        owner: Uuid,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError>;
    /// Renews the owner's lease on everything it holds and writes the checkpoints
    /// `held` carries; returns the ids of `held` still the owner's, under the same
    /// epoch. (Postgres keeps one lease per replica; SQLite, with one process, one
    /// per row.)
    async fn renew(
        &self,
        owner: Uuid,
        ttl: Duration,
        held: &[Checkpoint],
    ) -> Result<Vec<Uuid>, StoreError>;
    /// Writes the last checkpoints and gives the leases up.
    async fn release(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError>;
    /// Periodic housekeeping, called by the worker pool on every lease renewal
    /// (Postgres: sequence any event whose writer died before sequencing it).
    async fn maintain(&self) -> Result<(), StoreError>;
    /// Running waits in the store; with a tenant, only that tenant's.
    async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError>;
}

/// The configured store. Cloning is shallow.
#[derive(Clone, Debug)]
pub enum AnyStore {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

impl AnyStore {
    /// Seals target header values at rest under `cipher`'s key.
    pub fn with_cipher(self, cipher: secrets::Cipher) -> AnyStore {
        let cipher = std::sync::Arc::new(cipher);
        match self {
            AnyStore::Postgres(mut s) => {
                s.cipher = cipher;
                AnyStore::Postgres(s)
            }
            AnyStore::Sqlite(mut s) => {
                s.cipher = cipher;
                AnyStore::Sqlite(s)
            }
        }
    }

    /// Opens the store a URL names: `postgres://…`, `sqlite://PATH`, `sqlite::memory:`.
    /// The bus is where a SQLite store publishes its events (Postgres uses NOTIFY, and
    /// [`bus::Bus::listen`] feeds the bus instead).
    pub fn open(url: &str, max_connections: u32, bus: bus::Bus) -> Result<AnyStore, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            PgStore::connect(url, max_connections).map(AnyStore::Postgres)
        } else if url.starts_with("sqlite:") {
            SqliteStore::open(url, bus).map(AnyStore::Sqlite)
        } else {
            let scheme: String = url
                .split(':')
                .next()
                .unwrap_or("")
                .chars()
                .take(20)
                .collect();
            Err(StoreError::Other(format!(
                "the database URL has the scheme \"{scheme}\"; use postgres://…, sqlite://PATH or sqlite::memory:"
            )))
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $method:ident ( $($arg:expr),* )) => {
        match $self {
            AnyStore::Postgres(s) => s.$method($($arg),*).await,
            AnyStore::Sqlite(s) => s.$method($($arg),*).await,
        }
    };
}

impl Store for AnyStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        dispatch!(self, migrate())
    }
    async fn ping(&self) -> Result<(), StoreError> {
        dispatch!(self, ping())
    }
    async fn close(&self) {
        dispatch!(self, close())
    }
    async fn create_within(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
    ) -> Result<Created, StoreError> {
        dispatch!(
            self,
            create_within(tenant, spec, now, idempotency, max_active)
        )
    }
    async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError> {
        dispatch!(self, get(tenant, id))
    }
    async fn list(&self, tenant: &str, filter: &ListFilter) -> Result<Vec<Wait>, StoreError> {
        dispatch!(self, list(tenant, filter))
    }
    async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Canceled>, StoreError> {
        dispatch!(self, cancel(tenant, id, now))
    }
    async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        dispatch!(self, events(tenant, wait_id, after, limit))
    }
    async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        dispatch!(self, global_events(tenant, after, labels, limit))
    }
    async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedEvent>, StoreError> {
        dispatch!(self, feed(after, limit))
    }
    async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        dispatch!(self, last_event_id(tenant))
    }
    async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        dispatch!(self, claim(owner, ttl, lookahead, limit))
    }
    async fn renew(
        &self,
        owner: Uuid,
        ttl: Duration,
        held: &[Checkpoint],
    ) -> Result<Vec<Uuid>, StoreError> {
        dispatch!(self, renew(owner, ttl, held))
    }
    async fn record_many(
        &self,
        owner: Uuid,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError> {
        dispatch!(self, record_many(owner, progress))
    }
    async fn mark_polling(
        &self,
        owner: Uuid,
        ids: &[(Uuid, i64)],
    ) -> Result<Vec<Uuid>, StoreError> {
        dispatch!(self, mark_polling(owner, ids))
    }
    async fn release(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError> {
        dispatch!(self, release(owner, held))
    }
    async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        dispatch!(self, count_running(tenant))
    }
    async fn maintain(&self) -> Result<(), StoreError> {
        dispatch!(self, maintain())
    }
}
