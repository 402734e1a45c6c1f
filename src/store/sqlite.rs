//! The embedded SQLite store: the zero-setup default for one node.
//!
//! One connection does all the work (SQLite has one writer anyway), in WAL mode with a
//! busy timeout. The file is locked for the life of the process, so a second waitd on
//! the same file refuses to start instead of double-polling. Events reach subscribers
//! through the in-process bus, published after each commit.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{FromRow, Sqlite, Transaction};
use uuid::Uuid;

use super::bus::{Bus, BusMsg, Notice};
use super::{
    CANCEL_REASON, Canceled, Checkpoint, Claimed, Created, Event, FeedEvent, ListFilter, NewEvent,
    NewWait, Progress, Store, StoreError, Wait, canceled_event, decode_claim,
};
use crate::engine::Spec;

/// A handle on the embedded database. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    pool: SqlitePool,
    bus: Bus,
    pub(super) cipher: std::sync::Arc<super::secrets::Cipher>,
    /// Held open for the life of the store: the lock that keeps a second process out.
    _lock: Option<std::sync::Arc<std::fs::File>>,
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn at(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn parse_json(s: Option<String>) -> Option<Value> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}

#[derive(FromRow)]
struct WaitRow {
    id: Uuid,
    status: String,
    state: Option<String>,
    reason: Option<String>,
    error_detail: Option<String>,
    last_error: Option<String>,
    polls: i32,
    retries: i32,
    created_at: i64,
    updated_at: i64,
    deadline: i64,
    next_poll_at: Option<i64>,
    finished_at: Option<i64>,
    labels: String,
    spec: String,
}

impl From<WaitRow> for Wait {
    fn from(r: WaitRow) -> Wait {
        Wait {
            id: r.id,
            status: r.status,
            state: r.state,
            reason: r.reason,
            error_detail: parse_json(r.error_detail),
            last_error: r.last_error,
            polls: r.polls,
            retries: r.retries,
            created_at: at(r.created_at),
            updated_at: at(r.updated_at),
            deadline: at(r.deadline),
            next_poll_at: r.next_poll_at.map(at),
            finished_at: r.finished_at.map(at),
            labels: serde_json::from_str(&r.labels).unwrap_or_default(),
            spec: serde_json::from_str(&r.spec).unwrap_or(Value::Null),
        }
    }
}

#[derive(FromRow)]
struct EventRow {
    id: i64,
    seq: i32,
    wait_id: Uuid,
    kind: String,
    at: i64,
    data: String,
}

impl From<EventRow> for Event {
    fn from(r: EventRow) -> Event {
        Event {
            id: Some(r.id),
            seq: r.seq,
            wait_id: r.wait_id,
            kind: r.kind,
            at: at(r.at),
            data: serde_json::from_str(&r.data).unwrap_or(Value::Null),
        }
    }
}

/// id, epoch, claims, engine, next_poll_at, spec, headers.
type ClaimRow = (Uuid, i64, i32, String, Option<i64>, String, String);

#[derive(FromRow)]
struct FeedRow {
    #[sqlx(flatten)]
    event: EventRow,
    tenant: String,
    labels: String,
}

const WAIT_COLUMNS: &str = "w.id, w.status, w.state, w.reason, w.error_detail, w.last_error, w.polls, w.retries, \
     w.created_at, w.updated_at, w.deadline, w.next_poll_at, w.finished_at, w.labels, s.spec";

impl SqliteStore {
    fn publish(&self, notice: Option<Notice>) {
        if let Some(n) = notice {
            self.bus.publish(BusMsg::Notice(n));
        }
    }

    /// With a TTL: renew the leases. Without: give them up.
    async fn write_checkpoints(
        &self,
        owner: Uuid,
        held: &[Checkpoint],
        ttl: Option<Duration>,
    ) -> Result<Vec<Uuid>, StoreError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let now = Utc::now();
        let lease = ttl.map(|t| ms(now) + t.as_millis() as i64);
        let mut kept = Vec::with_capacity(held.len());
        let mut tx = self.pool.begin().await?;
        for c in held {
            let engine = c
                .engine
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok());
            // A checkpoint lands only when it is newer (more polls) than the row.
            let n = sqlx::query(
                "UPDATE waits SET owner = CASE WHEN ?1 IS NULL THEN NULL ELSE owner END, lease_until = ?1,
                        engine = CASE WHEN ?3 > polls THEN ?2 ELSE engine END,
                        retries = CASE WHEN ?3 > polls THEN ?4 ELSE retries END,
                        next_poll_at = CASE WHEN ?3 > polls THEN ?5 ELSE next_poll_at END,
                        updated_at = CASE WHEN ?3 > polls THEN ?6 ELSE updated_at END,
                        claims = CASE WHEN ?3 > polls THEN 0 ELSE claims END,
                        polls = MAX(polls, COALESCE(?3, polls))
                 WHERE id = ?7 AND owner = ?8 AND epoch = ?9 AND status = 'running'",
            )
            .bind(lease)
            .bind(&engine)
            .bind(c.engine.as_ref().map(|e| e.polls as i32))
            .bind(c.engine.as_ref().map(|e| e.retries as i32))
            .bind(c.next_poll_at.map(ms))
            .bind(ms(now))
            .bind(c.id)
            .bind(owner)
            .bind(c.epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                kept.push(c.id);
            }
        }
        tx.commit().await?;
        Ok(kept)
    }

    /// Opens (creating if missing) `sqlite://PATH`, `sqlite:PATH` or `sqlite::memory:`.
    pub fn open(url: &str, bus: Bus) -> Result<SqliteStore, StoreError> {
        let rest = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| StoreError::Other(format!("\"{url}\" is not a sqlite: URL")))?;
        let memory = rest == ":memory:" || rest.is_empty();
        let mut options = SqliteConnectOptions::new()
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let mut lock = None;
        if memory {
            options = options.in_memory(true);
        } else {
            let path = PathBuf::from(rest.split('?').next().unwrap_or(rest));
            if path.as_os_str().is_empty() {
                return Err(StoreError::Other(
                    "the sqlite URL names no file; write sqlite://waitd.db".into(),
                ));
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
                && !dir.is_dir()
            {
                return Err(StoreError::Other(format!(
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
                    StoreError::Other(format!(
                        "cannot open the lock file {}: {e}",
                        lock_path.display()
                    ))
                })?;
            file.try_lock().map_err(|_| {
                StoreError::Other(format!(
                    "another waitd is already using {} (it holds {}); one process per SQLite file — use Postgres for several replicas",
                    path.display(),
                    lock_path.display()
                ))
            })?;
            lock = Some(std::sync::Arc::new(file));
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
        Ok(SqliteStore {
            pool,
            bus,
            cipher: Default::default(),
            _lock: lock,
        })
    }
}

impl Store for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations/sqlite")
            .run(&self.pool)
            .await
            .map_err(|e| StoreError::Other(e.to_string()))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn create_within(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
    ) -> Result<Created, StoreError> {
        let nw = NewWait::prepare(spec, now, &self.cipher)?;
        let id = nw.id;
        let mut tx = self.pool.begin().await?;
        if let Some((key, hash)) = idempotency {
            let row: Option<(String, Uuid)> = sqlx::query_as(
                "SELECT request_hash, wait_id FROM idempotency_keys WHERE tenant = ? AND key = ?",
            )
            .bind(tenant)
            .bind(key)
            .fetch_optional(&mut *tx)
            .await?;
            match row {
                Some((h, _)) if h != hash => return Err(StoreError::IdempotencyConflict),
                Some((_, existing)) => {
                    tx.commit().await?;
                    let wait = self
                        .get(tenant, existing)
                        .await?
                        .ok_or_else(|| StoreError::Other("idempotent wait vanished".into()))?;
                    return Ok(Created {
                        wait,
                        existing: true,
                    });
                }
                None => {}
            }
        }
        // One connection: this transaction is the only writer, so the count holds.
        if let Some(max) = max_active {
            let (n,): (i64,) = sqlx::query_as(
                "SELECT count(*) FROM waits WHERE status = 'running' AND tenant = ?",
            )
            .bind(tenant)
            .fetch_one(&mut *tx)
            .await?;
            if n >= max {
                return Err(StoreError::TooManyActive(n));
            }
        }
        sqlx::query(
            "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
             VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, 1)",
        )
        .bind(id)
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
            .bind(id)
            .bind(nw.spec.to_string())
            .bind(nw.headers.to_string())
            .execute(&mut *tx)
            .await?;
        if let Some((key, hash)) = idempotency {
            sqlx::query("INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at) VALUES (?, ?, ?, ?, ?)")
                .bind(tenant)
                .bind(key)
                .bind(hash)
                .bind(id)
                .bind(ms(now))
                .execute(&mut *tx)
                .await?;
        }
        let notice = append_events(&mut tx, id, tenant, now, &[nw.created], 0, 'c').await?;
        tx.commit().await?;
        self.publish(notice);
        let wait = self
            .get(tenant, id)
            .await?
            .ok_or_else(|| StoreError::Other("created wait vanished".into()))?;
        Ok(Created {
            wait,
            existing: false,
        })
    }

    async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id WHERE w.id = ? AND w.tenant = ?"
        );
        let row: Option<WaitRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Wait::from))
    }

    async fn list(&self, tenant: &str, filter: &ListFilter) -> Result<Vec<Wait>, StoreError> {
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
        let mut q = sqlx::query_as::<_, WaitRow>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(&filter.status)
            .bind(&filter.status)
            .bind(filter.before)
            .bind(filter.before);
        for (k, v) in &filter.labels {
            q = q.bind(format!("$.\"{k}\"")).bind(v);
        }
        let rows = q.bind(filter.limit).fetch_all(&self.pool).await?;
        Ok(rows.into_iter().map(Wait::from).collect())
    }

    async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Canceled>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32, Option<String>)> = sqlx::query_as(
            "UPDATE waits SET status = 'canceled', reason = ?, finished_at = ?, updated_at = ?, next_poll_at = NULL,
                    owner = NULL, lease_until = NULL, seq = seq + 1
             WHERE id = ? AND tenant = ? AND status = 'running'
             RETURNING seq, state",
        )
        .bind(CANCEL_REASON)
        .bind(ms(now))
        .bind(ms(now))
        .bind(id)
        .bind(tenant)
        .fetch_optional(&mut *tx)
        .await?;
        let mut notice = None;
        let ended = row.is_some();
        if let Some((seq, state)) = row {
            notice = append_events(
                &mut tx,
                id,
                tenant,
                now,
                &[canceled_event(state)],
                seq - 1,
                't',
            )
            .await?;
        }
        tx.commit().await?;
        self.publish(notice);
        Ok(self
            .get(tenant, id)
            .await?
            .map(|wait| Canceled { wait, ended }))
    }

    async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
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
        Ok(rows.into_iter().map(Event::from).collect())
    }

    async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &std::collections::BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
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
        Ok(rows.into_iter().map(Event::from).collect())
    }

    async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedEvent>, StoreError> {
        let rows: Vec<FeedRow> = sqlx::query_as(
            "SELECT e.id, e.seq, e.wait_id, e.kind, e.at, e.data, e.tenant, w.labels
             FROM wait_events e JOIN waits w ON w.id = e.wait_id
             WHERE e.id > ? ORDER BY e.id LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| FeedEvent {
                event: r.event.into(),
                tenant: r.tenant,
                labels: serde_json::from_str(&r.labels).unwrap_or_default(),
            })
            .collect())
    }

    async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        let (n,): (Option<i64>,) =
            sqlx::query_as("SELECT max(id) FROM wait_events WHERE (? IS NULL OR tenant = ?)")
                .bind(tenant)
                .bind(tenant)
                .fetch_one(&self.pool)
                .await?;
        Ok(n.unwrap_or(0))
    }

    async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let now = Utc::now();
        let rows: Vec<ClaimRow> = sqlx::query_as(
            "UPDATE waits SET owner = ?, lease_until = ?, epoch = epoch + 1
             WHERE id IN (SELECT id FROM waits
                          WHERE status = 'running' AND next_poll_at <= ?
                            AND (owner IS NULL OR lease_until < ?)
                          ORDER BY next_poll_at LIMIT ?)
             RETURNING id, epoch, claims, engine, next_poll_at,
                       (SELECT spec FROM wait_specs WHERE wait_id = waits.id),
                       (SELECT headers FROM wait_specs WHERE wait_id = waits.id)",
        )
        .bind(owner)
        .bind(ms(now) + ttl.as_millis() as i64)
        .bind(ms(now) + lookahead.as_millis() as i64)
        .bind(ms(now))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for (id, epoch, claims, engine, next, spec, headers) in rows {
            let parsed = (|| {
                let spec: Value = serde_json::from_str(&spec).map_err(|e| e.to_string())?;
                let headers: Value = serde_json::from_str(&headers).map_err(|e| e.to_string())?;
                let engine: Value = serde_json::from_str(&engine).map_err(|e| e.to_string())?;
                decode_claim(spec, headers, engine, &self.cipher)
            })();
            match parsed {
                Ok((spec, engine)) => claimed.push(Claimed {
                    id,
                    epoch,
                    claims,
                    next_poll_at: next.map(at).unwrap_or(engine.deadline),
                    spec,
                    engine,
                }),
                Err(e) => {
                    tracing::error!(wait_id = %id, error = %e, "cannot decode a claimed wait; ending it in error");
                    let _ = self
                        .record(owner, &Progress::undecodable(id, epoch, e))
                        .await;
                }
            }
        }
        Ok(claimed)
    }

    /// One transaction (one disk sync) for all of them.
    async fn record_many(
        &self,
        owner: Uuid,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError> {
        let now = Utc::now();
        let mut tx = self.pool.begin().await?;
        let mut notices = Vec::new();
        let mut written = Vec::with_capacity(progress.len());
        for p in progress {
            let notice = record_one(&mut tx, owner, p, now).await?;
            written.push(notice.is_some());
            notices.extend(notice);
        }
        tx.commit().await?;
        for notice in notices {
            self.publish(notice);
        }
        Ok(written)
    }

    async fn mark_polling(
        &self,
        owner: Uuid,
        ids: &[(Uuid, i64)],
    ) -> Result<Vec<Uuid>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.pool.begin().await?;
        let mut marked = Vec::with_capacity(ids.len());
        for (id, epoch) in ids {
            let n = sqlx::query(
                "UPDATE waits SET claims = claims + 1
                 WHERE id = ? AND owner = ? AND epoch = ? AND status = 'running'",
            )
            .bind(id)
            .bind(owner)
            .bind(epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                marked.push(*id);
            }
        }
        tx.commit().await?;
        Ok(marked)
    }

    /// Renews leases and writes checkpoints, one wait at a time inside one transaction
    /// (SQLite has no array parameters; one transaction is one disk sync all the same).
    async fn renew(
        &self,
        owner: Uuid,
        ttl: Duration,
        held: &[Checkpoint],
    ) -> Result<Vec<Uuid>, StoreError> {
        // Everything the owner holds, named in `held` or not (a claim may be on its
        // way back to the worker).
        sqlx::query("UPDATE waits SET lease_until = ? WHERE owner = ? AND status = 'running'")
            .bind(ms(Utc::now()) + ttl.as_millis() as i64)
            .bind(owner)
            .execute(&self.pool)
            .await?;
        self.write_checkpoints(owner, held, Some(ttl)).await
    }

    async fn release(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError> {
        let n = self.write_checkpoints(owner, held, None).await?.len() as u64;
        self.bus.publish(BusMsg::Released);
        Ok(n)
    }

    /// Nothing to do: one writer sequences events as it writes them.
    async fn maintain(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
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
    p: &Progress,
    now: DateTime<Utc>,
) -> Result<Option<Option<Notice>>, StoreError> {
    let events = p.all_events();
    let n_events = events.len() as i32;
    let (status, reason, detail) = p.columns();
    let ended = p.end.is_some();
    let row: Option<(i32, String)> = sqlx::query_as(
        "UPDATE waits SET status = ?, state = ?, reason = ?, error_detail = ?, last_error = ?,
                polls = ?, retries = ?, engine = ?, next_poll_at = ?, updated_at = ?,
                finished_at = ?, owner = CASE WHEN ? THEN NULL ELSE owner END,
                lease_until = CASE WHEN ? THEN NULL ELSE lease_until END, seq = seq + ?, claims = 0
         WHERE id = ? AND owner = ? AND epoch = ? AND status = 'running'
         RETURNING seq, tenant",
    )
    .bind(status)
    .bind(&p.engine.state)
    .bind(reason)
    .bind(detail.map(|d| d.to_string()))
    .bind(&p.engine.last_error)
    .bind(p.engine.polls as i32)
    .bind(p.engine.retries as i32)
    .bind(serde_json::to_string(&p.engine).map_err(|e| StoreError::Other(e.to_string()))?)
    .bind(if ended { None } else { p.next_poll_at.map(ms) })
    .bind(ms(now))
    .bind(ended.then_some(ms(now)))
    .bind(ended)
    .bind(ended)
    .bind(n_events)
    .bind(p.id)
    .bind(owner)
    .bind(p.epoch)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((seq, tenant)) = row else {
        return Ok(None);
    };
    if events.is_empty() {
        return Ok(Some(None));
    }
    let flag = if ended { 't' } else { '-' };
    let notice = append_events(tx, p.id, &tenant, now, &events, seq - n_events, flag).await?;
    Ok(Some(notice))
}

async fn append_events(
    tx: &mut Transaction<'_, Sqlite>,
    wait_id: Uuid,
    tenant: &str,
    now: DateTime<Utc>,
    events: &[NewEvent],
    seq_before: i32,
    flag: char,
) -> Result<Option<Notice>, StoreError> {
    let mut last_gid = 0i64;
    for (i, e) in events.iter().enumerate() {
        let (gid,): (i64,) = sqlx::query_as(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(wait_id)
        .bind(seq_before + 1 + i as i32)
        .bind(tenant)
        .bind(&e.kind)
        .bind(ms(now))
        .bind(e.data.to_string())
        .fetch_one(&mut **tx)
        .await?;
        last_gid = gid;
    }
    Ok((!events.is_empty()).then_some(Notice {
        wait_id,
        seq: seq_before + events.len() as i32,
        gid: last_gid,
        flag,
        events: None,
    }))
}
