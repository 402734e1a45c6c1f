//! The Postgres backend: its three pools, migrations, diagnosis of a connection
//! that fails, and the channels its notices go out on. Each job's statements are
//! in its folder's `postgres.rs` (`store/waits/postgres.rs`, …).
//!
//! Postgres gives events their global cursor (`gid`) after commit, one sequencer
//! at a time (see [`PgDialect::sequence`], run by [`crate::events`]): a writer that
//! commits events wakes it, and listeners hear of events only once they are
//! sequenced.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::sync::Notify;

use super::StoreError;

/// The channel notices of new events go out on.
pub const EVENTS_CHANNEL: &str = "waitd_events";
/// [`WORK_CHANNEL`] as a literal, for statements that name it.
macro_rules! work_channel {
    () => {
        "waitd_work"
    };
}
/// The channel that tells replicas there is work to claim (waits created or
/// released).
pub const WORK_CHANNEL: &str = work_channel!();
/// [`DELIVERIES_CHANNEL`] as a literal, for statements that name it.
macro_rules! deliveries_channel {
    () => {
        "waitd_deliveries"
    };
}
/// The channel that tells every replica's deliverer that the outbox may hold a
/// delivery due now: sent by the statement that inserts deliveries (a trigger, see
/// `migrations/postgres/0015_deliveries_notice.sql`) or queues one again, so that
/// it goes out with their commit.
pub const DELIVERIES_CHANNEL: &str = deliveries_channel!();
/// The channel on which replicas tell each other of a host that asked for quiet.
pub const PAUSE_CHANNEL: &str = "waitd_pause";
/// The channel on which a nudge (its wait's id) reaches the replica holding the
/// wait.
pub const NUDGE_CHANNEL: &str = "waitd_nudges";

/// Held by the one sequencer at a time that gives committed events their global
/// cursor (`gid`).
pub(in crate::store) const SEQUENCER_LOCK: i64 = 0x7761_6974_6400_0001;

/// Checkpoints per statement: no one statement holds thousands of row locks.
pub(in crate::store) const CHECKPOINT_CHUNK: usize = 1000;

/// A handle on the database. Cloning is shallow (the pools are reference-counted).
#[derive(Clone, Debug)]
pub struct PgDialect {
    pub(in crate::store) pool: PgPool,
    /// Claims, renewals and releases get connections of their own, so that a burst
    /// of API traffic or progress writes can never starve the leases.
    pub(in crate::store) lease_pool: PgPool,
    /// The sequencer's own connection: a burst of reads that its notices set off
    /// must not delay its next run.
    pub(in crate::store) sequencer_pool: PgPool,
    /// How to connect, for diagnosing a connection that fails.
    pub(in crate::store) options: Arc<PgConnectOptions>,
    /// Wakes the sequencer after a commit that left events to sequence.
    pub(in crate::store) committed: Arc<Notify>,
}

pub(in crate::store) fn labels_json(labels: &BTreeMap<String, String>) -> Value {
    serde_json::to_value(labels).unwrap_or_else(|_| json!({}))
}
impl PgDialect {
    /// Tells the other replicas (their LISTEN adapters) that a host asked for
    /// quiet.
    pub async fn announce_pause(&self, pause: &crate::bus::HostPause) -> Result<(), StoreError> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(PAUSE_CHANNEL)
            .bind(pause.encode())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Connects (lazily: a database that is down now is retried on use).
    /// `max_connections` bounds this replica's share of the server.
    pub fn connect(url: &str, max_connections: u32) -> Result<PgDialect, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(|e| {
            StoreError::Config(format!("DATABASE_URL is not a valid postgres URL: {e}"))
        })?;
        let options = options.application_name("waitd");
        let pool_of = |n: u32| {
            PgPoolOptions::new()
                .max_connections(n)
                .min_connections(0)
                .acquire_timeout(Duration::from_secs(3))
                .connect_lazy_with(options.clone())
        };
        Ok(PgDialect {
            pool: pool_of(max_connections),
            lease_pool: pool_of(2),
            sequencer_pool: pool_of(1),
            options: Arc::new(options),
            committed: Default::default(),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Notified after every commit that left events to sequence.
    pub fn committed(&self) -> Arc<Notify> {
        self.committed.clone()
    }

    /// Where this store connects, as an operator would write it: host, port,
    /// database and user (never the password).
    pub fn describe(&self) -> String {
        let o = &self.options;
        format!(
            "Postgres at {}:{}, database \"{}\", user \"{}\"",
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or(o.get_username()),
            o.get_username()
        )
    }

    /// Connects once, outside the pool, and says why that fails (the pool reports
    /// only that it timed out): `None` when it works.
    pub async fn diagnose(&self) -> Option<String> {
        use sqlx::ConnectOptions;
        let attempt = tokio::time::timeout(Duration::from_secs(5), self.options.connect()).await;
        let cause = match attempt {
            Ok(Ok(conn)) => {
                let _ = sqlx::Connection::close(conn).await;
                return None;
            }
            Err(_) => "it did not answer within 5 s".to_string(),
            Ok(Err(sqlx::Error::Io(e))) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                "the connection was refused: is Postgres running, and listening on that host and port?".to_string()
            }
            Ok(Err(sqlx::Error::Io(e))) => format!("the connection failed: {e}"),
            Ok(Err(sqlx::Error::Tls(e))) => format!("TLS failed: {e}"),
            Ok(Err(sqlx::Error::Database(db))) => match db.code().as_deref() {
                Some("3D000") => format!(
                    "the database does not exist; create it (createdb -h {} -p {} -U {} {})",
                    self.options.get_host(),
                    self.options.get_port(),
                    self.options.get_username(),
                    self.options.get_database().unwrap_or("waitd")
                ),
                Some("28P01") | Some("28000") => format!(
                    "authentication failed ({}): check the user and password in DATABASE_URL, and pg_hba.conf",
                    db.message()
                ),
                Some("53300") => "the server has no connections left (too many clients)".to_string(),
                _ => format!("the server refused the connection: {}", db.message()),
            },
            Ok(Err(e)) => format!("the connection failed: {e}"),
        };
        Some(format!("cannot connect to {}: {cause}", self.describe()))
    }

    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        super::migrations::migrator(super::migrations::POSTGRES)
            .run(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::migrate::MigrateError::Execute(inner) => StoreError::from(inner),
                other => StoreError::Migrate(other),
            })
    }

    /// Connections checked out of the three pools right now.
    pub(super) fn connections_in_use(&self) -> u32 {
        [&self.pool, &self.lease_pool, &self.sequencer_pool]
            .iter()
            .map(|p| p.size().saturating_sub(p.num_idle() as u32))
            .sum()
    }

    pub(super) async fn close(&self) {
        self.pool.close().await;
        self.lease_pool.close().await;
        self.sequencer_pool.close().await;
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    #[cfg(test)]
    pub(super) async fn execute(&self, statement: &'static str) -> Result<(), StoreError> {
        sqlx::query(statement).execute(&self.pool).await?;
        Ok(())
    }
}
