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

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::engine::{EngineState, Spec};

pub use postgres::PgStore;

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
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Event {
    /// The global cursor (`GET /events`).
    pub id: i64,
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
    pub spec: Spec,
    pub engine: EngineState,
    pub next_poll_at: DateTime<Utc>,
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
