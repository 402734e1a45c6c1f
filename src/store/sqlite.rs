//! The embedded SQLite dialect: the zero-setup default for one node. SQL and
//! conversions; what to do with the answers is [`super::Store`]'s.
//!
//! One connection does all the work (SQLite has one writer anyway), in WAL mode with a
//! busy timeout. The file is locked for the life of the process, so a second waitd on
//! the same file refuses to start instead of double-polling. One writer numbers the
//! events as it writes them, and their notices (with the events) go on the
//! in-process bus after each commit.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection, Sqlite, Transaction};
use uuid::Uuid;

use super::{
    Admission, CheckpointRow, ClaimRow, EventRow, FeedRow, Inserted, ListFilter, NewWait,
    ProgressRow, StoreError, WAIT_COLUMNS, WaitEpoch, WaitRow,
};
use crate::bus::{Bus, BusMsg, Notice};
use crate::model::{Event, EventBody};

mod outbox;
/// A handle on the embedded database. Cloning is shallow.
#[derive(Clone, Debug)]
pub(crate) struct SqliteDialect {
    pool: SqlitePool,
    bus: Bus,
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

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn at(ms: i64) -> DateTime<Utc> {
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

    fn publish(&self, notices: Vec<Notice>) {
        for n in notices {
            self.bus.publish(BusMsg::Notice(n));
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

    pub(super) async fn find_idempotent(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<(String, Uuid)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT request_hash, wait_id FROM idempotency_keys WHERE tenant = ? AND key = ?",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// One transaction: the count (one connection is the only writer, so it holds),
    /// the insert, the key.
    pub(super) async fn insert_wait(
        &self,
        tenant: &str,
        now: DateTime<Utc>,
        nw: &NewWait,
        idempotency: Option<(&str, &str)>,
        admission: Admission,
    ) -> Result<Inserted, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut counted = None;
        if let Admission::Count { max } = admission {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM waits WHERE status = 'running' AND tenant = ?",
            )
            .bind(tenant)
            .fetch_one(&mut *tx)
            .await?;
            if n >= max {
                return Ok(Inserted::Full(n));
            }
            counted = Some(n);
        }
        sqlx::query(
            "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
             VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, 1)",
        )
        .bind(nw.id)
        .bind(tenant)
        .bind(ms(now))
        .bind(ms(now))
        .bind(ms(nw.engine.deadline))
        .bind(ms(nw.first_poll))
        .bind(nw.labels.to_string())
        .bind(nw.engine_json.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query("INSERT INTO wait_specs (wait_id, spec, headers) VALUES (?, ?, ?)")
            .bind(nw.id)
            .bind(nw.spec.to_string())
            .bind(nw.headers.to_string())
            .execute(&mut *tx)
            .await?;
        if let Some((key, hash)) = idempotency {
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at)
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(tenant)
            .bind(key)
            .bind(hash)
            .bind(nw.id)
            .bind(ms(now))
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                tx.rollback().await?;
                return Ok(Inserted::KeyTaken);
            }
        }
        // Before the `created` event, so that the outbox trigger finds them.
        for n in &nw.notify {
            sqlx::query(
                "INSERT INTO wait_notify (wait_id, endpoint, url, kinds, secret) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(nw.id)
            .bind(n.endpoint)
            .bind(&n.url)
            .bind(n.kinds)
            .bind(n.secret.to_string())
            .execute(&mut *tx)
            .await?;
        }
        let notice = append_events(
            &mut tx,
            nw.id,
            tenant,
            now,
            std::slice::from_ref(&nw.created),
            0,
        )
        .await?;
        tx.commit().await?;
        self.publish(notice.into_iter().collect());
        self.bus.publish(BusMsg::Work);
        Ok(Inserted::Yes { counted })
    }

    pub(super) async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<WaitRow>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id WHERE w.id = ? AND w.tenant = ?"
        );
        let row: Option<WaitRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row)
    }

    pub(super) async fn list(
        &self,
        tenant: &str,
        filter: &ListFilter,
    ) -> Result<Vec<WaitRow>, StoreError> {
        // Label keys, of waits and of filters alike, are validated to [A-Za-z0-9-_./]
        // (the API refuses any other filter), so a key quoted in a JSON path means
        // itself; it is bound as a parameter all the same.
        let mut sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id
             WHERE w.tenant = ? AND (? IS NULL OR w.status = ?) AND (? IS NULL OR w.id < ?)"
        );
        for _ in &filter.labels {
            sql.push_str(" AND json_extract(w.labels, ?) = ?");
        }
        sql.push_str(" ORDER BY w.id DESC LIMIT ?");
        let status = filter.status.map(|s| s.as_str());
        let mut q = sqlx::query_as::<_, WaitRow>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(status)
            .bind(status)
            .bind(filter.before)
            .bind(filter.before);
        for (k, v) in &filter.labels {
            q = q.bind(format!("$.\"{k}\"")).bind(v);
        }
        let rows = q.bind(filter.limit).fetch_all(&self.pool).await?;
        Ok(rows)
    }

    pub(super) async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
        reason: &str,
        event: &(dyn Fn(Option<String>) -> (&'static str, Value) + Sync),
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32, Option<String>)> = sqlx::query_as(
            "UPDATE waits SET status = 'canceled', reason = ?, finished_at = ?, updated_at = ?, next_poll_at = NULL,
                    owner = NULL, seq = seq + 1
             WHERE id = ? AND tenant = ? AND status = 'running'
             RETURNING seq, state",
        )
        .bind(reason)
        .bind(ms(now))
        .bind(ms(now))
        .bind(id)
        .bind(tenant)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((seq, state)) = row else {
            tx.commit().await?;
            return Ok(false);
        };
        let notice = append_events(&mut tx, id, tenant, now, &[event(state)], seq - 1).await?;
        tx.commit().await?;
        self.publish(notice.into_iter().collect());
        Ok(true)
    }

    pub(super) async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT id, seq, wait_id, kind, at, data FROM wait_events
             WHERE wait_id = ? AND tenant = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(wait_id)
        .bind(tenant)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    pub(super) async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        let mut sql = String::from(
            "SELECT e.id, e.seq, e.wait_id, e.kind, e.at, e.data FROM wait_events e
             JOIN waits w ON w.id = e.wait_id WHERE e.tenant = ? AND e.id > ?",
        );
        for _ in labels {
            sql.push_str(" AND json_extract(w.labels, ?) = ?");
        }
        sql.push_str(" ORDER BY e.id LIMIT ?");
        let mut q = sqlx::query_as::<_, EventRow>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(after);
        for (k, v) in labels {
            q = q.bind(format!("$.\"{k}\"")).bind(v);
        }
        let rows = q.bind(limit).fetch_all(&self.pool).await?;
        Ok(rows)
    }

    pub(super) async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedRow>, StoreError> {
        let rows: Vec<FeedRow> = sqlx::query_as(
            "SELECT e.id, e.seq, e.wait_id, e.kind, e.at, e.data, e.tenant, w.labels
             FROM wait_events e JOIN waits w ON w.id = e.wait_id
             WHERE e.id > ? ORDER BY e.id LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    pub(super) async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        let (n,): (Option<i64>,) =
            sqlx::query_as("SELECT max(id) FROM wait_events WHERE (? IS NULL OR tenant = ?)")
                .bind(tenant)
                .bind(tenant)
                .fetch_one(&self.pool)
                .await?;
        Ok(n.unwrap_or(0))
    }

    /// Claims due waits that are unowned or owned by a replica whose lease has run
    /// out, giving `owner` a lease row first if it has none (never extending one:
    /// only renewals do), as on Postgres.
    pub(super) async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let now = Utc::now();
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES (?, ?) ON CONFLICT (id) DO NOTHING",
        )
        .bind(owner)
        .bind(ms(now) + ttl.as_millis() as i64)
        .execute(&mut *tx)
        .await?;
        let rows = sqlx::query_as(
            "UPDATE waits SET owner = ?1, epoch = epoch + 1
             WHERE id IN (SELECT id FROM waits
                          WHERE status = 'running' AND next_poll_at <= ?2
                            AND (owner IS NULL
                                 OR owner IN (SELECT id FROM replicas WHERE lease_until < ?3 AND id <> ?1))
                          ORDER BY next_poll_at LIMIT ?4)
             RETURNING id, epoch, claims, tenant, engine, next_poll_at,
                       (SELECT spec FROM wait_specs WHERE wait_id = waits.id) AS spec,
                       (SELECT headers FROM wait_specs WHERE wait_id = waits.id) AS headers",
        )
        .bind(owner)
        .bind(ms(now) + lookahead.as_millis() as i64)
        .bind(ms(now))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(rows)
    }

    pub(super) async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut marked = Vec::with_capacity(ids.len());
        for &WaitEpoch { id, epoch } in ids {
            let n = sqlx::query(
                "UPDATE waits SET claims = CASE WHEN ? THEN claims + 1 ELSE 0 END
                 WHERE id = ? AND owner = ? AND epoch = ? AND status = 'running'",
            )
            .bind(begun)
            .bind(id)
            .bind(owner)
            .bind(epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                marked.push(id);
            }
        }
        tx.commit().await?;
        Ok(marked)
    }

    /// One transaction (one disk sync) for all of them.
    pub(super) async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        batch: &[ProgressRow],
    ) -> Result<Vec<bool>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut notices = Vec::new();
        let mut written = Vec::with_capacity(batch.len());
        for p in batch {
            let notice = record_one(&mut tx, owner, p, now).await?;
            written.push(notice.is_some());
            notices.extend(notice.flatten());
        }
        tx.commit().await?;
        self.publish(notices);
        Ok(written)
    }

    /// The replica's one lease row, extended (inserted if it has none).
    pub(super) async fn renew_lease(&self, owner: Uuid, ttl: Duration) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES (?, ?)
             ON CONFLICT (id) DO UPDATE SET lease_until = excluded.lease_until",
        )
        .bind(owner)
        .bind(ms(Utc::now()) + ttl.as_millis() as i64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The checkpoints that carry a state (the others only name a wait).
    pub(super) async fn write_all_checkpoints(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<(), StoreError> {
        let dirty: Vec<&CheckpointRow> = held.iter().filter(|c| c.engine.is_some()).collect();
        self.write_checkpoints(owner, &dirty, false).await?;
        Ok(())
    }

    /// Every running wait `owner` owns, with its epoch.
    pub(super) async fn owned(&self, owner: Uuid) -> Result<Vec<WaitEpoch>, StoreError> {
        let rows: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT id, epoch FROM waits WHERE owner = ? AND status = 'running'")
                .bind(owner)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(WaitEpoch::from).collect())
    }

    pub(super) async fn release(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<u64, StoreError> {
        let all: Vec<&CheckpointRow> = held.iter().collect();
        let n = self.write_checkpoints(owner, &all, true).await?;
        self.bus.publish(BusMsg::Work);
        Ok(n)
    }

    /// One wait at a time inside one transaction (SQLite has no array parameters;
    /// one transaction is one disk sync all the same), fenced by owner and epoch;
    /// with `release`, the waits are given up too.
    async fn write_checkpoints(
        &self,
        owner: Uuid,
        held: &[&CheckpointRow],
        release: bool,
    ) -> Result<u64, StoreError> {
        if held.is_empty() {
            return Ok(0);
        }
        let now = Utc::now();
        let mut kept = 0;
        let mut tx = self.pool.begin().await?;
        for c in held {
            // A checkpoint lands only when it is newer (more polls) than the row.
            kept += sqlx::query(
                "UPDATE waits SET owner = CASE WHEN ?1 THEN NULL ELSE owner END,
                        engine = CASE WHEN ?3 > polls THEN ?2 ELSE engine END,
                        retries = CASE WHEN ?3 > polls THEN ?4 ELSE retries END,
                        next_poll_at = CASE WHEN ?3 > polls THEN ?5 ELSE next_poll_at END,
                        updated_at = CASE WHEN ?3 > polls THEN ?6 ELSE updated_at END,
                        claims = CASE WHEN ?3 > polls THEN 0 ELSE claims END,
                        polls = MAX(polls, COALESCE(?3, polls))
                 WHERE id = ?7 AND owner = ?8 AND epoch = ?9 AND status = 'running'",
            )
            .bind(release)
            .bind(&c.engine)
            .bind(c.polls)
            .bind(c.retries)
            .bind(c.next_poll_at.map(ms))
            .bind(ms(now))
            .bind(c.id)
            .bind(owner)
            .bind(c.epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        tx.commit().await?;
        Ok(kept)
    }

    /// Forgets replicas gone for a day that own nothing.
    pub(super) async fn maintain(&self) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM replicas WHERE lease_until < ?
               AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = replicas.id AND w.status = 'running')",
        )
        .bind(ms(Utc::now()) - 24 * 3600 * 1000)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    #[cfg(test)]
    pub(super) async fn execute(&self, statement: &'static str) -> Result<(), StoreError> {
        sqlx::query(statement).execute(&self.pool).await?;
        Ok(())
    }

    pub(super) async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM waits WHERE status = 'running' AND (? IS NULL OR tenant = ?)",
        )
        .bind(tenant)
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}

/// One wait's progress inside `tx`, fenced by owner and epoch: `None` when the wait
/// is no longer this owner's, else the notice to publish after commit.
async fn record_one(
    tx: &mut Transaction<'_, Sqlite>,
    owner: Uuid,
    p: &ProgressRow,
    now: DateTime<Utc>,
) -> Result<Option<Option<Notice>>, StoreError> {
    let n_events = p.events.len() as i32;
    let row: Option<(i32, String)> = sqlx::query_as(
        "UPDATE waits SET status = ?, state = ?, reason = ?, error_detail = ?, last_error = ?,
                polls = ?, retries = ?, engine = ?, next_poll_at = ?, updated_at = ?,
                finished_at = ?, owner = CASE WHEN ? THEN NULL ELSE owner END,
                seq = seq + ?, claims = 0
         WHERE id = ? AND owner = ? AND epoch = ? AND status = 'running'
         RETURNING seq, tenant",
    )
    .bind(p.status)
    .bind(&p.state)
    .bind(&p.reason)
    .bind(p.detail.as_ref().map(Value::to_string))
    .bind(&p.last_error)
    .bind(p.polls)
    .bind(p.retries)
    .bind(&p.engine)
    .bind(p.next_poll_at.map(ms))
    .bind(ms(now))
    .bind(p.ended.then_some(ms(now)))
    .bind(p.ended)
    .bind(n_events)
    .bind(p.id)
    .bind(owner)
    .bind(p.epoch)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((seq, tenant)) = row else {
        return Ok(None);
    };
    let notice = append_events(tx, p.id, &tenant, now, &p.events, seq - n_events).await?;
    Ok(Some(notice))
}

/// Appends events numbered from `seq_before + 1`; the notice announcing them, with
/// them.
async fn append_events(
    tx: &mut Transaction<'_, Sqlite>,
    wait_id: Uuid,
    tenant: &str,
    now: DateTime<Utc>,
    events: &[(&'static str, Value)],
    seq_before: i32,
) -> Result<Option<Notice>, StoreError> {
    let mut appended = Vec::with_capacity(events.len());
    for (i, (kind, data)) in events.iter().enumerate() {
        let seq = seq_before + 1 + i as i32;
        let (gid,): (i64,) = sqlx::query_as(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(wait_id)
        .bind(seq)
        .bind(tenant)
        .bind(kind)
        .bind(ms(now))
        .bind(data.to_string())
        .fetch_one(&mut **tx)
        .await?;
        if let Ok(body) = EventBody::from_parts(kind, data.clone()) {
            appended.push(Event {
                id: Some(gid),
                seq,
                wait_id,
                at: at(ms(now)),
                body,
            });
        }
    }
    Ok((!appended.is_empty()).then(|| Notice::announcing(wait_id, appended)))
}
