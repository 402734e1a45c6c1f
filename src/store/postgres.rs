//! The Postgres store.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{FromRow, Postgres, Transaction};
use uuid::Uuid;

use super::bus::{CHANNEL, Notice};
use super::{
    CANCEL_REASON, Canceled, Checkpoint, Claimed, Created, Event, FeedEvent, ListFilter, NewEvent,
    NewWait, Progress, Store, StoreError, Wait, canceled_event, decode_claim,
};
use crate::engine::Spec;

/// Held by the one sequencer at a time that gives committed events their global
/// cursor (`gid`).
const SEQUENCER_LOCK: i64 = 0x7761_6974_6400_0001;

/// Below `max_active_waits - LIMIT_MARGIN` running waits, creates skip the per-tenant
/// lock: more concurrent creates than this (connections across all replicas) would
/// be needed to overshoot the limit.
const LIMIT_MARGIN: i64 = 256;

/// A tenant's running count, once read, spares the next creates from counting for
/// this long while it is more than [`CACHED_MARGIN`] under the limit: overshooting
/// would take that many creates, across all replicas, within this window. Once it is
/// older, one create counts again while the others go on with it for up to as long
/// again, rather than all counting at once.
const COUNT_FRESH: std::time::Duration = std::time::Duration::from_millis(250);
const CACHED_MARGIN: i64 = 1024;

/// A tenant's running count as last read, when, and whether a create is reading it
/// again now.
#[derive(Debug)]
struct Counted {
    n: i64,
    at: Instant,
    recounting: bool,
}

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

/// Checkpoints per statement: no one statement holds thousands of row locks.
const CHECKPOINT_CHUNK: usize = 1000;

/// A handle on the database. Cloning is shallow (the pool is reference-counted).
#[derive(Clone, Debug)]
pub struct PgStore {
    pool: PgPool,
    /// Claims, renewals and releases get connections of their own, so that a burst
    /// of API traffic or progress writes can never starve the leases.
    lease_pool: PgPool,
    /// The sequencer's own connection: a burst of reads that its notices set off
    /// must not delay its next run.
    sequencer_pool: PgPool,
    pub(super) cipher: std::sync::Arc<super::secrets::Cipher>,
    /// How to connect, for diagnosing a connection that fails.
    options: std::sync::Arc<PgConnectOptions>,
    /// Wakes this replica's sequencer task (started on first use).
    sequencer: std::sync::Arc<Sequencer>,
    /// Per tenant: running waits when last counted, and when.
    running: std::sync::Arc<std::sync::Mutex<TenantCounts>>,
}

#[derive(Debug, Default)]
struct Sequencer {
    wake: tokio::sync::Notify,
    started: std::sync::atomic::AtomicBool,
}

#[derive(FromRow)]
struct WaitRow {
    id: Uuid,
    status: String,
    state: Option<String>,
    reason: Option<String>,
    error_detail: Option<Value>,
    last_error: Option<String>,
    polls: i32,
    retries: i32,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deadline: DateTime<Utc>,
    next_poll_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    labels: Value,
    spec: Value,
}

impl From<WaitRow> for Wait {
    fn from(r: WaitRow) -> Wait {
        Wait {
            id: r.id,
            status: r.status,
            state: r.state,
            reason: r.reason,
            error_detail: r.error_detail,
            last_error: r.last_error,
            polls: r.polls,
            retries: r.retries,
            created_at: r.created_at,
            updated_at: r.updated_at,
            deadline: r.deadline,
            next_poll_at: r.next_poll_at,
            finished_at: r.finished_at,
            labels: serde_json::from_value(r.labels).unwrap_or_default(),
            spec: r.spec,
        }
    }
}

#[derive(FromRow)]
struct EventRow {
    id: Option<i64>,
    seq: i32,
    wait_id: Uuid,
    kind: String,
    at: DateTime<Utc>,
    data: Value,
}

impl From<EventRow> for Event {
    fn from(r: EventRow) -> Event {
        Event {
            id: r.id,
            seq: r.seq,
            wait_id: r.wait_id,
            kind: r.kind,
            at: r.at,
            data: r.data,
        }
    }
}

#[derive(FromRow)]
struct FeedRow {
    #[sqlx(flatten)]
    event: EventRow,
    tenant: String,
    labels: Value,
}

impl FeedRow {
    fn into_feed(self) -> FeedEvent {
        FeedEvent {
            event: self.event.into(),
            tenant: self.tenant,
            labels: serde_json::from_value(self.labels).unwrap_or_default(),
        }
    }
}

const WAIT_COLUMNS: &str = "w.id, w.status, w.state, w.reason, w.error_detail, w.last_error, w.polls, w.retries, \
     w.created_at, w.updated_at, w.deadline, w.next_poll_at, w.finished_at, w.labels, s.spec";

impl PgStore {
    /// Wakes the sequencer after a commit, without waiting for it: the writer's
    /// answer does not queue behind the sequencer's own commit. The replica's one
    /// sequencer task runs [`PgStore::sequence`] again after each wake, so every
    /// event committed before a wake is sequenced by the run after it. A run that
    /// fails loses nothing: the events stay committed, and the next wake or the
    /// worker's periodic housekeeping picks them up.
    fn sequence_soon(&self) {
        use std::sync::atomic::Ordering;
        if !self.sequencer.started.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move { me.run_sequencer().await });
        }
        self.sequencer.wake.notify_one();
    }

    async fn run_sequencer(self) {
        while !self.pool.is_closed() {
            // The timeout only lets the task notice that the store was closed.
            if tokio::time::timeout(Duration::from_secs(1), self.sequencer.wake.notified())
                .await
                .is_err()
            {
                continue;
            }
            if let Err(e) = self.sequence().await {
                if self.pool.is_closed() {
                    break;
                }
                tracing::warn!(error = %e, "sequencing events failed; the next run picks them up");
                tokio::time::sleep(Duration::from_millis(100)).await;
                self.sequencer.wake.notify_one();
            }
        }
    }

    fn far_under_limit(&self, tenant: &str, max: i64) -> bool {
        let mut counts = self.running.lock().unwrap_or_else(|e| e.into_inner());
        counts.far_under(tenant, max, Instant::now())
    }

    fn counted(&self, tenant: &str, n: i64) {
        let mut counts = self.running.lock().unwrap_or_else(|e| e.into_inner());
        counts.counted(tenant, n, Instant::now());
    }

    /// Gives every committed event without one its global cursor (`gid`), in the
    /// order the events were written, and notifies listeners of the newest gid.
    ///
    /// One sequencer at a time (an advisory lock held to its commit), so a gid is
    /// visible only after every smaller one is: a reader of `GET /events` that has
    /// seen N never finds a smaller gid appear later. It runs in the replica's
    /// sequencer task (woken after commits), in a read that meets an unsequenced
    /// event, and in the worker's housekeeping; a progress batch that finds the lock
    /// free does the same inside its own transaction.
    pub async fn sequence(&self) -> Result<(), StoreError> {
        let mut tx = self.sequencer_pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SEQUENCER_LOCK)
            .execute(&mut *tx)
            .await?;
        sequence_in(&mut tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn find_idempotent(
        &self,
        tenant: &str,
        key: &str,
        hash: &str,
    ) -> Result<Option<Wait>, StoreError> {
        let row: Option<(String, Uuid)> = sqlx::query_as(
            "SELECT request_hash, wait_id FROM idempotency_keys WHERE tenant = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        match row {
            None => Ok(None),
            Some((h, _)) if h != hash => Err(StoreError::IdempotencyConflict),
            Some((_, id)) => self.get(tenant, id).await,
        }
    }

    /// Connects (lazily: a database that is down now is retried on use) and returns
    /// the store. `max_connections` bounds this replica's share of the server.
    pub fn connect(url: &str, max_connections: u32) -> Result<PgStore, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(|e| {
            StoreError::Other(format!("DATABASE_URL is not a valid postgres URL: {e}"))
        })?;
        let options = options.application_name("waitd");
        let options_kept = options.clone();
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options.clone());
        let lease_pool = PgPoolOptions::new()
            .max_connections(2)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options.clone());
        let sequencer_pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(Duration::from_secs(3))
            .connect_lazy_with(options);
        Ok(PgStore {
            pool,
            lease_pool,
            sequencer_pool,
            options: std::sync::Arc::new(options_kept),
            cipher: Default::default(),
            sequencer: Default::default(),
            running: Default::default(),
        })
    }

    /// One statement for a chunk of checkpoints, fenced by owner and epoch; with
    /// `release`, the waits are given up too. A checkpoint lands only when it is newer
    /// (more polls) than what the row holds: a progress write that committed while
    /// this statement was on its way wins. The fences travel in the batch, as in
    /// [`Store::record_many`], so the update is driven by the batch.
    async fn write_checkpoints(
        &self,
        owner: Uuid,
        chunk: &[&Checkpoint],
        release: bool,
    ) -> Result<u64, StoreError> {
        let (ids, epochs, engines, polls, retries, nexts) = unzip_checkpoints(chunk);
        let n = sqlx::query(
            "UPDATE waits w SET owner = CASE WHEN $8 THEN NULL ELSE w.owner END,
                    engine = CASE WHEN u.polls > w.polls THEN u.engine::jsonb ELSE w.engine END,
                    polls = GREATEST(w.polls, COALESCE(u.polls, w.polls)),
                    retries = CASE WHEN u.polls > w.polls THEN u.retries ELSE w.retries END,
                    next_poll_at = CASE WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    updated_at = CASE WHEN u.polls > w.polls THEN now() ELSE w.updated_at END,
                    claims = CASE WHEN u.polls > w.polls THEN 0 ELSE w.claims END
             FROM unnest($2::uuid[], $3::bigint[], $4::text[], $5::int[], $6::int[], $7::timestamptz[],
                         array_fill($1::uuid, ARRAY[cardinality($2::uuid[])]),
                         array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                  AS u(id, epoch, engine, polls, retries, next_poll_at, owner, running)
             WHERE w.id = u.id AND w.owner = u.owner AND w.epoch = u.epoch AND w.status = u.running",
        )
        .bind(owner)
        .bind(ids)
        .bind(epochs)
        .bind(engines)
        .bind(polls)
        .bind(retries)
        .bind(nexts)
        .bind(release)
        .execute(&self.lease_pool)
        .await?
        .rows_affected();
        Ok(n)
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
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
}

impl Store for PgStore {
    /// Applies the embedded migrations (sqlx takes an advisory lock, so replicas
    /// starting together are safe).
    async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("./migrations/postgres")
            .run(&self.pool)
            .await
            .map_err(|e| match e {
                sqlx::migrate::MigrateError::Execute(inner) => StoreError::from(inner),
                other => StoreError::Other(other.to_string()),
            })?;
        // Events a replica committed but did not live to sequence.
        self.sequence().await
    }

    async fn close(&self) {
        self.pool.close().await;
        self.lease_pool.close().await;
        self.sequencer_pool.close().await;
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Creates a wait with its `created` event. With an idempotency key, a second
    /// call with the same key and request hash returns the first wait.
    async fn create_within(
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
        let id = nw.id;
        let counted = match max_active {
            Some(max) => !self.far_under_limit(tenant, max),
            None => false,
        };
        if idempotency.is_none() && !counted {
            // The common case: one statement, one round trip, one commit.
            insert_wait(tenant, now, &nw).execute(&self.pool).await?;
            self.sequence_soon();
            return Ok(Created {
                wait: nw.wait(now),
                existing: false,
            });
        }
        let mut tx = self.pool.begin().await?;
        if let Some(max) = max_active.filter(|_| counted) {
            const COUNT: &str =
                "SELECT count(*) FROM waits WHERE status = 'running' AND tenant = $1";
            let (mut n,): (i64,) = sqlx::query_as(COUNT)
                .bind(tenant)
                .fetch_one(&mut *tx)
                .await?;
            if n + LIMIT_MARGIN >= max {
                // Near the limit, one tenant's creates queue on this lock so the count
                // and the insert cannot interleave. Far from it, concurrent creates
                // (at most one per pooled connection of every replica) cannot reach
                // it, and creates go in parallel.
                sqlx::query(
                    "SELECT pg_advisory_xact_lock(hashtextextended('waitd-tenant:' || $1, 0))",
                )
                .bind(tenant)
                .execute(&mut *tx)
                .await?;
                (n,) = sqlx::query_as(COUNT)
                    .bind(tenant)
                    .fetch_one(&mut *tx)
                    .await?;
            }
            self.counted(tenant, n);
            if n >= max {
                return Err(StoreError::TooManyActive(n));
            }
        }
        insert_wait(tenant, now, &nw).execute(&mut *tx).await?;
        if let Some((key, hash)) = idempotency {
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(tenant)
            .bind(key)
            .bind(hash)
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                // Another request with this key won the race: answer with its wait.
                tx.rollback().await?;
                return match self.find_idempotent(tenant, key, hash).await? {
                    Some(found) => Ok(Created {
                        wait: found,
                        existing: true,
                    }),
                    None => Err(StoreError::Other("idempotency key vanished".into())),
                };
            }
        }
        tx.commit().await?;
        self.sequence_soon();
        Ok(Created {
            wait: nw.wait(now),
            existing: false,
        })
    }

    async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id WHERE w.id = $1 AND w.tenant = $2"
        );
        let row: Option<WaitRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Wait::from))
    }

    /// A page of a tenant's waits, newest first.
    async fn list(&self, tenant: &str, filter: &ListFilter) -> Result<Vec<Wait>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id
             WHERE w.tenant = $1 AND ($2::text IS NULL OR w.status = $2) AND w.labels @> $3
               AND ($4::uuid IS NULL OR w.id < $4)
             ORDER BY w.id DESC LIMIT $5"
        );
        let labels = serde_json::to_value(&filter.labels).unwrap_or_else(|_| json!({}));
        let rows: Vec<WaitRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(&filter.status)
            .bind(labels)
            .bind(filter.before)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().map(Wait::from).collect())
    }

    /// Cancels a running wait (ending it exactly once); an ended wait is returned as
    /// it is. `None` when the tenant has no such wait.
    async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Canceled>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32, Option<String>)> = sqlx::query_as(
            "UPDATE waits SET status = 'canceled', reason = $4, finished_at = $3,
                    updated_at = $3, next_poll_at = NULL, owner = NULL, seq = seq + 1
             WHERE id = $1 AND tenant = $2 AND status = 'running'
             RETURNING seq, state",
        )
        .bind(id)
        .bind(tenant)
        .bind(now)
        .bind(CANCEL_REASON)
        .fetch_optional(&mut *tx)
        .await?;
        let ended = row.is_some();
        if let Some((seq, state)) = row {
            append_events(&mut tx, id, tenant, now, &[canceled_event(state)], seq - 1).await?;
            tx.commit().await?;
            self.sequence_soon();
        } else {
            tx.commit().await?;
        }
        Ok(self
            .get(tenant, id)
            .await?
            .map(|wait| Canceled { wait, ended }))
    }

    /// A wait's events with `seq > after`, oldest first.
    ///
    /// A wait's end commits with its terminal event, but the event gets its global
    /// cursor a moment later. So that a client who saw the wait end also sees all of
    /// its events, a read that meets an unsequenced one runs the sequencer itself and
    /// reads again.
    async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        for attempt in 0..2 {
            let rows: Vec<EventRow> = sqlx::query_as(
                "SELECT gid AS id, seq, wait_id, kind, at, data FROM wait_events
                 WHERE wait_id = $1 AND tenant = $2 AND seq > $3 ORDER BY seq LIMIT $4",
            )
            .bind(wait_id)
            .bind(tenant)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?;
            if attempt == 0 && rows.iter().any(|r| r.id.is_none()) {
                self.sequence().await?;
                continue;
            }
            // Still unsequenced after a run (another sequencer holds a batch): serve
            // the part that has its cursor; the rest follows with the next notice.
            return Ok(rows
                .into_iter()
                .take_while(|r| r.id.is_some())
                .map(Event::from)
                .collect());
        }
        Ok(Vec::new()) // not reached: the second pass returns
    }

    /// Events of all the tenant's waits with global `gid > after`, optionally only of waits
    /// carrying all the given labels.
    async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &std::collections::BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        // As in `events`: what has committed is served, sequencing it first if
        // its writer has not got there yet.
        let (pending,): (bool,) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM wait_events WHERE gid IS NULL AND tenant = $1)",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        if pending {
            self.sequence().await?;
        }
        let rows: Vec<EventRow> = if labels.is_empty() {
            sqlx::query_as(
                "SELECT gid AS id, seq, wait_id, kind, at, data FROM wait_events
                 WHERE tenant = $1 AND gid > $2 ORDER BY gid LIMIT $3",
            )
            .bind(tenant)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?
        } else {
            sqlx::query_as(
                "SELECT e.gid AS id, e.seq, e.wait_id, e.kind, e.at, e.data FROM wait_events e
                 JOIN waits w ON w.id = e.wait_id
                 WHERE e.tenant = $1 AND e.gid > $2 AND w.labels @> $3 ORDER BY e.gid LIMIT $4",
            )
            .bind(tenant)
            .bind(after)
            .bind(serde_json::to_value(labels).unwrap_or_else(|_| json!({})))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?
        };
        Ok(rows.into_iter().map(Event::from).collect())
    }

    async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedEvent>, StoreError> {
        let rows: Vec<FeedRow> = sqlx::query_as(
            "SELECT e.gid AS id, e.seq, e.wait_id, e.kind, e.at, e.data, e.tenant, w.labels
             FROM wait_events e JOIN waits w ON w.id = e.wait_id
             WHERE e.gid > $1 ORDER BY e.gid LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(FeedRow::into_feed).collect())
    }

    async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        let (n,): (Option<i64>,) = match tenant {
            None => {
                sqlx::query_as("SELECT max(gid) FROM wait_events")
                    .fetch_one(&self.pool)
                    .await?
            }
            Some(t) => {
                sqlx::query_as("SELECT max(gid) FROM wait_events WHERE tenant = $1")
                    .bind(t)
                    .fetch_one(&self.pool)
                    .await?
            }
        };
        Ok(n.unwrap_or(0))
    }

    /// Claims up to `limit` running waits that are due within `lookahead` and unowned
    /// or owned by a replica whose lease has run out. The same statement gives
    /// `owner` a lease row if it has none yet, so a wait is never owned by a replica
    /// without one; it does not extend an existing lease (only renewals do, so a
    /// dead replica's lease runs out at most one TTL after its last renewal).
    async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let rows: Vec<ClaimRow> = sqlx::query_as(
            "WITH me AS (
                 INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
                 ON CONFLICT (id) DO NOTHING),
             unowned AS MATERIALIZED (
                 SELECT id FROM waits
                 WHERE status = 'running' AND owner IS NULL AND next_poll_at <= now() + $3
                 ORDER BY next_poll_at
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED),
             orphaned AS MATERIALIZED (
                 SELECT id FROM waits
                 WHERE status = 'running' AND next_poll_at <= now() + $3
                   AND owner IN (SELECT id FROM replicas WHERE lease_until < now() AND id <> $1)
                 ORDER BY next_poll_at
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED),
             due AS (SELECT id FROM unowned UNION ALL SELECT id FROM orphaned LIMIT $4)
             UPDATE waits w SET owner = $1, epoch = w.epoch + 1
             FROM due, wait_specs s
             WHERE w.id = due.id AND s.wait_id = w.id
             RETURNING w.id, w.epoch, w.claims, w.engine, w.next_poll_at, s.spec, s.headers",
        )
        .bind(owner)
        .bind(ttl)
        .bind(lookahead)
        .bind(limit)
        .fetch_all(&self.lease_pool)
        .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for (id, epoch, claims, engine, next, spec, headers) in rows {
            match decode_claim(spec, headers, engine, &self.cipher) {
                Ok((spec, engine)) => claimed.push(Claimed {
                    id,
                    epoch,
                    claims,
                    next_poll_at: next.unwrap_or(engine.deadline),
                    spec,
                    engine,
                }),
                Err(e) => {
                    // A row this version cannot read: end it rather than spin on it.
                    tracing::error!(wait_id = %id, error = %e, "cannot decode a claimed wait; ending it in error");
                    let progress = Progress::undecodable(id, epoch, e);
                    let _ = self.record(owner, &progress).await;
                }
            }
        }
        Ok(claimed)
    }

    /// Many waits' progress in one transaction of two statements: one update of the
    /// rows (each fenced by owner and epoch), one insert of the events of the rows
    /// that were still this owner's.
    ///
    /// The fences (owner, epoch, `running`) are columns of the batch rather than
    /// conditions on `waits` alone. Without statistics on `waits` (a new database,
    /// before autovacuum's first analyze), the planner took `owner = $1 AND status =
    /// 'running'` for one row, scanned every wait the replica owns and matched each
    /// against the whole batch: 4.7 s for 100 rows among 100,000 waits. With nothing
    /// to filter `waits` by but the join, it looks each batch row up by primary key,
    /// whatever the statistics say (3 ms).
    async fn record_many(
        &self,
        owner: Uuid,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError> {
        if progress.is_empty() {
            return Ok(Vec::new());
        }
        let now = Utc::now();
        let n = progress.len();
        let mut c = RecordColumns::default();
        let mut events = Vec::with_capacity(n);
        for p in progress {
            let all = p.all_events();
            let (status, reason, detail) = p.columns();
            c.id.push(p.id);
            c.epoch.push(p.epoch);
            c.status.push(status.to_string());
            c.state.push(p.engine.state.clone());
            c.reason.push(reason.map(str::to_string));
            c.detail.push(detail.map(|d| d.to_string()));
            c.last_error.push(p.engine.last_error.clone());
            c.polls.push(p.engine.polls as i32);
            c.retries.push(p.engine.retries as i32);
            c.engine.push(
                serde_json::to_string(&p.engine).map_err(|e| StoreError::Other(e.to_string()))?,
            );
            c.next.push(if p.end.is_some() {
                None
            } else {
                p.next_poll_at
            });
            c.n_events.push(all.len() as i32);
            events.push(all);
        }
        let mut tx = self.pool.begin().await?;
        let rows: Vec<(Uuid, i32, String)> = sqlx::query_as(
            "UPDATE waits w SET status = u.status, state = u.state, reason = u.reason,
                    error_detail = u.detail::jsonb, last_error = u.last_error, polls = u.polls,
                    retries = u.retries, engine = u.engine::jsonb, next_poll_at = u.next_poll_at,
                    updated_at = $2,
                    finished_at = CASE WHEN u.status = 'running' THEN NULL ELSE $2 END,
                    owner = CASE WHEN u.status = 'running' THEN w.owner ELSE NULL END,
                    seq = w.seq + u.n_events, claims = 0
             FROM unnest($3::uuid[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
                         $9::text[], $10::int[], $11::int[], $12::text[], $13::timestamptz[], $14::int[],
                         array_fill($1::uuid, ARRAY[cardinality($3::uuid[])]),
                         array_fill('running'::text, ARRAY[cardinality($3::uuid[])]))
                  AS u(id, epoch, status, state, reason, detail, last_error, polls, retries, engine,
                       next_poll_at, n_events, owner, running)
             WHERE w.id = u.id AND w.owner = u.owner AND w.epoch = u.epoch AND w.status = u.running
             RETURNING w.id, w.seq, w.tenant",
        )
        .bind(owner)
        .bind(now)
        .bind(&c.id)
        .bind(&c.epoch)
        .bind(&c.status)
        .bind(&c.state)
        .bind(&c.reason)
        .bind(&c.detail)
        .bind(&c.last_error)
        .bind(&c.polls)
        .bind(&c.retries)
        .bind(&c.engine)
        .bind(&c.next)
        .bind(&c.n_events)
        .fetch_all(&mut *tx)
        .await?;
        let written: std::collections::HashMap<Uuid, (i32, String)> = rows
            .into_iter()
            .map(|(id, seq, tenant)| (id, (seq, tenant)))
            .collect();
        let mut e = EventColumns::default();
        for (i, all) in events.iter().enumerate() {
            let Some((seq, tenant)) = written.get(&c.id[i]) else {
                continue;
            };
            let first = seq - all.len() as i32 + 1;
            for (k, ev) in all.iter().enumerate() {
                e.wait_id.push(c.id[i]);
                e.seq.push(first + k as i32);
                e.tenant.push(tenant.clone());
                e.kind.push(ev.kind.clone());
                e.data.push(ev.data.to_string());
            }
        }
        if !e.wait_id.is_empty() {
            sqlx::query(
                "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
                 SELECT wait_id, seq, tenant, kind, $1, data::jsonb
                 FROM unnest($2::uuid[], $3::int[], $4::text[], $5::text[], $6::text[])
                      AS t(wait_id, seq, tenant, kind, data)",
            )
            .bind(now)
            .bind(&e.wait_id)
            .bind(&e.seq)
            .bind(&e.tenant)
            .bind(&e.kind)
            .bind(&e.data)
            .execute(&mut *tx)
            .await?;
        }
        // When no sequencer is running, these events get their cursor in this
        // transaction: one commit, not two, before followers hear of them. The lock
        // is held to the commit, so cursors still become visible in order; a writer
        // that finds it taken leaves its events to the sequencer task and goes on.
        let mut sequenced = e.wait_id.is_empty();
        if !sequenced {
            let (locked,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1)")
                .bind(SEQUENCER_LOCK)
                .fetch_one(&mut *tx)
                .await?;
            if locked {
                sequence_in(&mut tx).await?;
                sequenced = true;
            }
        }
        tx.commit().await?;
        if !sequenced {
            self.sequence_soon();
        }
        Ok(c.id.iter().map(|id| written.contains_key(id)).collect())
    }

    /// One statement for every first poll due at once; the fences travel in the
    /// batch, as in [`Store::record_many`].
    async fn mark_polling(
        &self,
        owner: Uuid,
        ids: &[(Uuid, i64)],
    ) -> Result<Vec<Uuid>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let (id, epoch): (Vec<Uuid>, Vec<i64>) = ids.iter().copied().unzip();
        let rows: Vec<(Uuid,)> = sqlx::query_as(
            "UPDATE waits w SET claims = w.claims + 1
             FROM unnest($2::uuid[], $3::bigint[],
                         array_fill($1::uuid, ARRAY[cardinality($2::uuid[])]),
                         array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                  AS u(id, epoch, owner, running)
             WHERE w.id = u.id AND w.owner = u.owner AND w.epoch = u.epoch AND w.status = u.running
             RETURNING w.id",
        )
        .bind(owner)
        .bind(id)
        .bind(epoch)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Renews `owner`'s lease (one row, however many waits it holds), writes the
    /// checkpoints that `held` carries, and returns the ids of `held` still this
    /// owner's under the same epoch; the others were taken over or ended elsewhere.
    async fn renew(
        &self,
        owner: Uuid,
        ttl: Duration,
        held: &[Checkpoint],
    ) -> Result<Vec<Uuid>, StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
             ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
        )
        .bind(owner)
        .bind(ttl)
        .execute(&self.lease_pool)
        .await?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let dirty: Vec<&Checkpoint> = held.iter().filter(|c| c.engine.is_some()).collect();
        for chunk in dirty.chunks(CHECKPOINT_CHUNK) {
            self.write_checkpoints(owner, chunk, false).await?;
        }
        let owned: std::collections::HashMap<Uuid, i64> =
            sqlx::query_as("SELECT id, epoch FROM waits WHERE owner = $1 AND status = 'running'")
                .bind(owner)
                .fetch_all(&self.lease_pool)
                .await?
                .into_iter()
                .collect();
        Ok(held
            .iter()
            .filter(|c| owned.get(&c.id) == Some(&c.epoch))
            .map(|c| c.id)
            .collect())
    }

    /// Writes the last checkpoints and gives the waits up, so another replica can
    /// take them over at once (graceful shutdown, or waits this replica let go).
    async fn release(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError> {
        if held.is_empty() {
            return Ok(0);
        }
        let all: Vec<&Checkpoint> = held.iter().collect();
        let mut n = 0;
        for chunk in all.chunks(CHECKPOINT_CHUNK) {
            n += self.write_checkpoints(owner, chunk, true).await?;
        }
        // Tell the other replicas there is work to claim.
        sqlx::query("SELECT pg_notify($1, 'released')")
            .bind(CHANNEL)
            .execute(&self.lease_pool)
            .await?;
        Ok(n)
    }

    /// Sequences events a dead writer left, and forgets replicas gone for a day that
    /// own nothing (the lease condition is checked again under the row lock, so a
    /// replica that claims at that moment keeps its row).
    async fn maintain(&self) -> Result<(), StoreError> {
        self.sequence().await?;
        sqlx::query(
            "DELETE FROM replicas r WHERE r.lease_until < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = r.id AND w.status = 'running')",
        )
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }

    /// Counts of running waits (for `/metrics`).
    async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM waits WHERE status = 'running' AND ($1::text IS NULL OR tenant = $1)",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}

/// The columns of [`PgStore::record_many`]'s update, one entry per wait.
#[derive(Default)]
struct RecordColumns {
    id: Vec<Uuid>,
    epoch: Vec<i64>,
    status: Vec<String>,
    state: Vec<Option<String>>,
    reason: Vec<Option<String>>,
    detail: Vec<Option<String>>,
    last_error: Vec<Option<String>>,
    polls: Vec<i32>,
    retries: Vec<i32>,
    engine: Vec<String>,
    next: Vec<Option<DateTime<Utc>>>,
    n_events: Vec<i32>,
}

/// The columns of [`PgStore::record_many`]'s event insert, one entry per event.
#[derive(Default)]
struct EventColumns {
    wait_id: Vec<Uuid>,
    seq: Vec<i32>,
    tenant: Vec<String>,
    kind: Vec<String>,
    data: Vec<String>,
}

/// id, epoch, claims, engine, next_poll_at, spec, headers.
type ClaimRow = (Uuid, i64, i32, Value, Option<DateTime<Utc>>, Value, Value);

type Columns = (
    Vec<Uuid>,
    Vec<i64>,
    Vec<Option<String>>,
    Vec<Option<i32>>,
    Vec<Option<i32>>,
    Vec<Option<DateTime<Utc>>>,
);

fn unzip_checkpoints(held: &[&Checkpoint]) -> Columns {
    let mut c: Columns = Default::default();
    for h in held {
        c.0.push(h.id);
        c.1.push(h.epoch);
        c.2.push(
            h.engine
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok()),
        );
        c.3.push(h.engine.as_ref().map(|e| e.polls as i32));
        c.4.push(h.engine.as_ref().map(|e| e.retries as i32));
        c.5.push(h.next_poll_at);
    }
    c
}

/// Gives every committed event without a global cursor one (and, inside `tx`, the
/// events `tx` itself wrote), and queues the notices, which go out at commit. The
/// caller holds [`SEQUENCER_LOCK`] until its commit.
async fn sequence_in(tx: &mut Transaction<'_, Postgres>) -> Result<(), StoreError> {
    let done: Vec<Sequenced> = sqlx::query_as(
        "WITH base AS (SELECT COALESCE(max(gid), 0) AS b FROM wait_events),
              pending AS (SELECT id, row_number() OVER (ORDER BY id) AS rn
                          FROM wait_events WHERE gid IS NULL ORDER BY id LIMIT 10000)
         UPDATE wait_events e SET gid = base.b + pending.rn
         FROM base, pending WHERE e.id = pending.id
         RETURNING e.wait_id, e.gid, e.seq, e.kind, e.at, e.data",
    )
    .fetch_all(&mut **tx)
    .await?;
    tracing::debug!(events = done.len(), "sequenced");
    // Listeners hear of events only once they are sequenced, so whatever they read
    // next (a wait's history, the global feed) already has them.
    let payloads = notices(done);
    if !payloads.is_empty() {
        sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
            .bind(CHANNEL)
            .bind(payloads)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Inserts a new wait, its spec and its `created` event in one statement.
fn insert_wait<'q>(
    tenant: &'q str,
    now: DateTime<Utc>,
    nw: &'q NewWait,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(
        "WITH w AS (
             INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
             VALUES ($1, $2, 'running', $3, $3, $4, $5, $6, $7, 1)),
         s AS (INSERT INTO wait_specs (wait_id, spec, headers) VALUES ($1, $8, $9))
         INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES ($1, 1, $2, $10, $3, $11)",
    )
    .bind(nw.id)
    .bind(tenant)
    .bind(now)
    .bind(nw.engine.deadline)
    .bind(nw.first_poll)
    .bind(&nw.labels)
    .bind(&nw.engine_json)
    .bind(&nw.spec)
    .bind(&nw.headers)
    .bind(&nw.created.kind)
    .bind(&nw.created.data)
}

/// Appends events numbered from `seq_before + 1`. They get their global cursor, and
/// listeners hear of them, from [`PgStore::sequence`] after commit.
async fn append_events(
    tx: &mut Transaction<'_, Postgres>,
    wait_id: Uuid,
    tenant: &str,
    at: DateTime<Utc>,
    events: &[NewEvent],
    seq_before: i32,
) -> Result<(), StoreError> {
    for (i, e) in events.iter().enumerate() {
        sqlx::query(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(wait_id)
        .bind(seq_before + 1 + i as i32)
        .bind(tenant)
        .bind(&e.kind)
        .bind(at)
        .bind(&e.data)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A notice longer than this goes without its events (the subscriber reads them).
const MAX_NOTICE_LINE: usize = 2000;

/// A sequenced event: wait, gid, seq, kind, time, fields.
type Sequenced = (Uuid, i64, i32, String, DateTime<Utc>, Value);

/// Notices for sequenced events, one per wait (its newest seq and gid; `t` when the
/// wait ended, `c` when it was created; its events when they fit), packed into
/// payloads under Postgres's 8000 byte limit.
fn notices(done: Vec<Sequenced>) -> Vec<String> {
    let mut per_wait: std::collections::BTreeMap<Uuid, Vec<Event>> = Default::default();
    for (wait_id, gid, seq, kind, at, data) in done {
        let event = super::bus::unpack(wait_id, (gid, seq, kind, at, data));
        per_wait.entry(wait_id).or_default().push(event);
    }
    let lines = per_wait.into_iter().map(|(wait_id, mut events)| {
        events.sort_by_key(|e| e.seq);
        let has = |kinds: &[&str]| events.iter().any(|e| kinds.contains(&e.kind.as_str()));
        let flag = if has(super::TERMINAL_KINDS) {
            't'
        } else if has(&["created"]) {
            'c'
        } else {
            '-'
        };
        let last = events.last().map(|e| (e.seq, e.id.unwrap_or_default()));
        let (seq, gid) = last.unwrap_or_default();
        let mut n = Notice {
            wait_id,
            seq,
            gid,
            flag,
            events: Some(events.into()),
        };
        let line = n.encode();
        if line.len() <= MAX_NOTICE_LINE {
            return line;
        }
        n.events = None;
        n.encode()
    });
    let mut payloads = Vec::new();
    let mut current = String::new();
    for line in lines {
        if current.len() + line.len() + 1 > 7000 {
            payloads.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push('\n');
        }
        current.push_str(&line);
    }
    if !current.is_empty() {
        payloads.push(current);
    }
    payloads
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
}
