//! Retention: deleting ended waits, with everything that hangs off them, once they
//! have been ended longer than the operator keeps them (`--retention`). The
//! sweeping loop is [`crate::retention`], which holds the [`Retention`] handle;
//! here is what one batch does, written once over the two backends.
//!
//! On SQLite: one process owns the file, so a batch takes no lock (Postgres takes a
//! transaction-level advisory lock, so that one replica sweeps at a time); every
//! event has its global id as it is written, so none waits to be sequenced; and
//! the pages a batch frees are reused by later writes, so [`Retention::vacuum_swept`]
//! does nothing there.
//!
//! A batch never touches a running wait, nor a wait with a delivery still pending
//! (its webhook is still owed), nor one whose events are not all sequenced. It
//! records, per tenant, the newest global event id it deleted: a `/events` cursor
//! before that would skip deleted events silently, so it is refused instead.

mod postgres;
mod sqlite;

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::{Core, Dialect, StoreError};

/// Rows one batch deleted, by table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub waits: u64,
    pub wait_specs: u64,
    pub wait_events: u64,
    pub deliveries: u64,
    pub wait_notify: u64,
    pub idempotency_keys: u64,
}

impl Swept {
    /// (table, rows) pairs, for metrics and logs.
    pub fn by_table(&self) -> [(&'static str, u64); 6] {
        [
            ("waits", self.waits),
            ("wait_specs", self.wait_specs),
            ("wait_events", self.wait_events),
            ("deliveries", self.deliveries),
            ("wait_notify", self.wait_notify),
            ("idempotency_keys", self.idempotency_keys),
        ]
    }
}

/// What the retention sweep asks of the store. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Retention {
    pub(super) core: Arc<Core>,
}

impl Retention {
    /// Deletes up to `limit` waits that ended before `cutoff`, oldest end first,
    /// with their rows in every table. `None` when another replica holds the
    /// sweep (Postgres: a transaction-level advisory lock), so that one replica
    /// sweeps at a time.
    pub async fn sweep_ended(
        &self,
        cutoff: DateTime<Utc>,
        limit: i64,
    ) -> Result<Option<Swept>, StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.sweep_ended(cutoff, limit).await,
            Dialect::Sqlite(d) => d.sweep_ended(cutoff, limit).await,
        }
    }

    /// Makes the space of swept rows reusable now (Postgres: `VACUUM`; SQLite
    /// reuses it by itself).
    pub async fn vacuum_swept(&self) -> Result<(), StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.vacuum_swept().await,
            Dialect::Sqlite(d) => d.vacuum_swept().await,
        }
    }

    /// When the wait that ended longest ago ended, if any has.
    pub async fn oldest_ended(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.oldest_ended().await,
            Dialect::Sqlite(d) => d.oldest_ended().await,
        }
    }

    /// The newest global event id of `tenant`'s that retention has deleted (0 when
    /// none): a `/events` cursor before it has lost events.
    pub async fn event_horizon(&self, tenant: &str) -> Result<i64, StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.event_horizon(tenant).await,
            Dialect::Sqlite(d) => d.event_horizon(tenant).await,
        }
    }
}
