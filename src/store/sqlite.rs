//! The embedded SQLite backend, the zero-setup default for one node: opening and
//! locking its file, migrations, and the notices it publishes after a commit.
//! Each job's statements are in its folder's `sqlite.rs`.
//!
//! One connection does all the work (SQLite has one writer anyway), in WAL mode with a
//! busy timeout. The file is locked for the life of the process, so a second waitd on
//! the same file refuses to start instead of double-polling. One writer numbers the
//! events as it writes them, and their notices (with the events) go on the
//! in-process bus after each commit.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection};
use uuid::Uuid;

use super::StoreError;
use crate::bus::{Bus, BusMsg, Notice};

/// A handle on the embedded database. Cloning is shallow.
#[derive(Clone, Debug)]
pub(crate) struct SqliteDialect {
    pub(in crate::store) pool: SqlitePool,
    pub(in crate::store) bus: Bus,
    /// What the start-up line calls it.
    name: String,
    /// Held open for the life of the store: the lock that keeps a second process out.
    _lock: Option<std::sync::Arc<std::fs::File>>,
    /// In memory: what keeps the database alive.
    memory: Option<std::sync::Arc<Keeper>>,
}

/// An in-memory database lives as long as some connection to it is open. The pool's
/// one connection is not enough: sqlx closes a connection whose query was cut off
/// (a request that went away, a timeout) and opens another, which would find an
/// empty database. So the database is named and shared, and this connection, outside
/// the pool and idle, keeps it for the life of the store.
#[derive(Debug)]
struct Keeper {
    options: SqliteConnectOptions,
    conn: tokio::sync::Mutex<Option<SqliteConnection>>,
}

pub(in crate::store) fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub(in crate::store) fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}
impl SqliteDialect {
    /// Opens (creating if missing) `sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`.
    pub(crate) fn open(url: &str, bus: Bus) -> Result<SqliteDialect, StoreError> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| StoreError::Config(format!("\"{url}\" is not a sqlite: URL")))?;
        let memory = rest == ":memory:" || rest.is_empty();
        let mut options = SqliteConnectOptions::new()
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let mut lock = None;
        let name;
        let mut keeper = None;
        if memory {
            options = options
                .in_memory(true)
                .shared_cache(true)
                .filename(format!("file:waitd-memory-{}", Uuid::now_v7()));
            keeper = Some(std::sync::Arc::new(Keeper {
                options: options.clone(),
                conn: tokio::sync::Mutex::new(None),
            }));
            name = "SQLite in memory".to_string();
        } else {
            let path = PathBuf::from(rest.split('?').next().unwrap_or(rest));
            if path.as_os_str().is_empty() {
                return Err(StoreError::Config(
                    "the sqlite URL names no file; write sqlite://waitd.db".into(),
                ));
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                && !dir.is_dir()
            {
                return Err(StoreError::Config(format!(
                    "the directory {} of the SQLite file does not exist",
                    dir.display()
                )));
            }
            let lock_path = PathBuf::from(format!("{}.lock", path.display()));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|e| {
                    StoreError::Config(format!(
                        "cannot open the lock file {}: {e}",
                        lock_path.display()
                    ))
                })?;
            file.try_lock().map_err(|_| {
                StoreError::Config(format!(
                    "another waitd is already using {} (it holds {}); one process per SQLite file — use Postgres for several replicas",
                    path.display(),
                    lock_path.display()
                ))
            })?;
            lock = Some(std::sync::Arc::new(file));
            name = format!("SQLite file {}", path.display());
            options = options
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal);
        }
        // One connection: SQLite has a single writer, and an in-memory database lives
        // and dies with its connection.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(options);
        Ok(SqliteDialect {
            pool,
            bus,
            name,
            _lock: lock,
            memory: keeper,
        })
    }

    pub(crate) fn describe(&self) -> String {
        self.name.clone()
    }

    /// After a commit that wrote events: their notices, and the deliverer's wake
    /// (the outbox trigger may have inserted deliveries with them).
    pub(in crate::store) fn publish(&self, notices: Vec<Notice>) {
        let wrote = !notices.is_empty();
        for n in notices {
            self.bus.publish(BusMsg::Notice(n));
        }
        if wrote {
            self.bus.publish(BusMsg::Deliveries { requeued: false });
        }
    }

    pub(super) async fn migrate(&self) -> Result<(), StoreError> {
        if let Some(k) = &self.memory {
            let mut conn = k.conn.lock().await;
            if conn.is_none() {
                *conn = Some(k.options.connect().await?);
            }
        }
        super::migrations::migrator(super::migrations::SQLITE)
            .run(&self.pool)
            .await
            .map_err(StoreError::Migrate)
    }

    pub(super) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Connections checked out of the pool right now.
    pub(super) fn connections_in_use(&self) -> u32 {
        self.pool.size().saturating_sub(self.pool.num_idle() as u32)
    }

    pub(super) async fn close(&self) {
        self.pool.close().await;
        if let Some(k) = &self.memory
            && let Some(conn) = k.conn.lock().await.take()
        {
            let _ = conn.close().await;
        }
    }

    #[cfg(test)]
    pub(super) async fn execute(&self, statement: &'static str) -> Result<(), StoreError> {
        sqlx::query(statement).execute(&self.pool).await?;
        Ok(())
    }
}
