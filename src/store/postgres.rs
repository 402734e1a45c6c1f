//! The Postgres dialect: SQL and conversions. What to do with the answers is
//! [`super::Store`]'s.
//!
//! Postgres gives events their global cursor (`gid`) after commit, one sequencer
//! at a time (see [`PgDialect::sequence`], run by [`crate::events`]): a writer that
//! commits events wakes it, and listeners hear of events only once they are
//! sequenced.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use tokio::sync::Notify;
use uuid::Uuid;

use super::{
    Admission, CheckpointRow, ClaimRow, EventRow, FeedRow, Inserted, LIMIT_MARGIN, ListFilter,
    NewWait, ProgressRow, StoreError, WAIT_COLUMNS, WaitEpoch, WaitRow,
};
use crate::bus::notice::{self, Notice};
use crate::model::{Event, EventBody};

mod outbox;
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

/// Held by the one sequencer at a time that gives committed events their global
/// cursor (`gid`).
const SEQUENCER_LOCK: i64 = 0x7761_6974_6400_0001;

/// Checkpoints per statement: no one statement holds thousands of row locks.
const CHECKPOINT_CHUNK: usize = 1000;

/// A handle on the database. Cloning is shallow (the pools are reference-counted).
#[derive(Clone, Debug)]
pub struct PgDialect {
    pool: PgPool,
    /// Claims, renewals and releases get connections of their own, so that a burst
    /// of API traffic or progress writes can never starve the leases.
    lease_pool: PgPool,
    /// The sequencer's own connection: a burst of reads that its notices set off
    /// must not delay its next run.
    sequencer_pool: PgPool,
    /// How to connect, for diagnosing a connection that fails.
    options: Arc<PgConnectOptions>,
    /// Wakes the sequencer after a commit that left events to sequence.
    committed: Arc<Notify>,
}

fn labels_json(labels: &BTreeMap<String, String>) -> Value {
    serde_json::to_value(labels).unwrap_or_else(|_| json!({}))
}

impl PgDialect {
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

    /// Gives every committed event without a global cursor one (`gid`), in the
    /// order the events were written, and notifies listeners of them.
    ///
    /// One sequencer at a time (an advisory lock held to its commit), so a gid is
    /// visible only after every smaller one is: a reader of `GET /events` that has
    /// seen N never finds a smaller gid appear later. [`crate::events`] runs it
    /// after every wake and once a second; a progress batch that finds the lock free
    /// does the same inside its own transaction.
    pub async fn sequence(&self) -> Result<usize, StoreError> {
        let mut tx = self.sequencer_pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(SEQUENCER_LOCK)
            .execute(&mut *tx)
            .await?;
        let n = sequence_in(&mut tx).await?;
        tx.commit().await?;
        Ok(n)
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

    pub(super) async fn find_idempotent(
        &self,
        tenant: &str,
        key: &str,
    ) -> Result<Option<(String, Uuid)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT request_hash, wait_id FROM idempotency_keys WHERE tenant = $1 AND key = $2",
        )
        .bind(tenant)
        .bind(key)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The insert of a new wait. Without a key or a count it is one statement and
    /// one commit; otherwise one transaction: the count (again under the tenant's
    /// lock near the limit, so the count and the insert cannot interleave), the
    /// insert, and the key.
    pub(super) async fn insert_wait(
        &self,
        tenant: &str,
        now: DateTime<Utc>,
        nw: &NewWait,
        idempotency: Option<(&str, &str)>,
        admission: Admission,
    ) -> Result<Inserted, StoreError> {
        if idempotency.is_none() && matches!(admission, Admission::Free) {
            insert_wait(tenant, now, nw).execute(&self.pool).await?;
            self.committed.notify_one();
            return Ok(Inserted::Yes { counted: None });
        }
        let mut tx = self.pool.begin().await?;
        let mut counted = None;
        if let Admission::Count { max } = admission {
            const COUNT: &str =
                "SELECT count(*) FROM waits WHERE status = 'running' AND tenant = $1";
            let (mut n,): (i64,) = sqlx::query_as(COUNT)
                .bind(tenant)
                .fetch_one(&mut *tx)
                .await?;
            if n + LIMIT_MARGIN >= max {
                // Far from the limit, concurrent creates (at most one per pooled
                // connection of every replica) cannot reach it and go in parallel.
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
            if n >= max {
                return Ok(Inserted::Full(n));
            }
            counted = Some(n);
        }
        insert_wait(tenant, now, nw).execute(&mut *tx).await?;
        if let Some((key, hash)) = idempotency {
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
            )
            .bind(tenant)
            .bind(key)
            .bind(hash)
            .bind(nw.id)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if inserted == 0 {
                tx.rollback().await?;
                return Ok(Inserted::KeyTaken);
            }
        }
        tx.commit().await?;
        self.committed.notify_one();
        Ok(Inserted::Yes { counted })
    }

    pub(super) async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<WaitRow>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id WHERE w.id = $1 AND w.tenant = $2"
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
        let sql = format!(
            "SELECT {WAIT_COLUMNS} FROM waits w JOIN wait_specs s ON s.wait_id = w.id
             WHERE w.tenant = $1 AND ($2::text IS NULL OR w.status = $2) AND w.labels @> $3
               AND ($4::uuid IS NULL OR w.id < $4)
             ORDER BY w.id DESC LIMIT $5"
        );
        let rows: Vec<WaitRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(filter.status.map(|s| s.as_str()))
            .bind(labels_json(&filter.labels))
            .bind(filter.before)
            .bind(filter.limit)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows)
    }

    /// Ends a running wait as canceled with the event `event` builds from its last
    /// state; true when this call ended it.
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
            "UPDATE waits SET status = 'canceled', reason = $4, finished_at = $3,
                    updated_at = $3, next_poll_at = NULL, owner = NULL, seq = seq + 1
             WHERE id = $1 AND tenant = $2 AND status = 'running'
             RETURNING seq, state",
        )
        .bind(id)
        .bind(tenant)
        .bind(now)
        .bind(reason)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((seq, state)) = row else {
            tx.commit().await?;
            return Ok(false);
        };
        let (kind, data) = event(state);
        sqlx::query(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(seq)
        .bind(tenant)
        .bind(kind)
        .bind(now)
        .bind(data)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.committed.notify_one();
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
            "SELECT gid AS id, seq, wait_id, kind, at, data FROM wait_events
             WHERE wait_id = $1 AND tenant = $2 AND seq > $3 ORDER BY seq LIMIT $4",
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
            .bind(labels_json(labels))
            .bind(limit)
            .fetch_all(&self.pool)
            .await?
        };
        Ok(rows)
    }

    pub(super) async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedRow>, StoreError> {
        let rows: Vec<FeedRow> = sqlx::query_as(
            "SELECT e.gid AS id, e.seq, e.wait_id, e.kind, e.at, e.data, e.tenant, w.labels
             FROM wait_events e JOIN waits w ON w.id = e.wait_id
             WHERE e.gid > $1 ORDER BY e.gid LIMIT $2",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    pub(super) async fn last_event_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
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
    pub(super) async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        Ok(sqlx::query_as(
            "WITH me AS (
                 INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
                 ON CONFLICT (id) DO NOTHING),
             unowned AS MATERIALIZED (
                 SELECT id FROM waits
                 WHERE status = 'running' AND owner IS NULL AND claim_at <= now() + $3
                 ORDER BY claim_at
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED),
             orphaned AS MATERIALIZED (
                 SELECT id FROM waits
                 WHERE status = 'running' AND claim_at <= now() + $3
                   AND owner IN (SELECT id FROM replicas WHERE lease_until < now() AND id <> $1)
                 ORDER BY claim_at
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED),
             due AS (SELECT id FROM unowned UNION ALL SELECT id FROM orphaned LIMIT $4)
             UPDATE waits w SET owner = $1, epoch = w.epoch + 1, claim_at = w.next_poll_at
             FROM due, wait_specs s
             WHERE w.id = due.id AND s.wait_id = w.id
             RETURNING w.id, w.epoch, w.claims, w.tenant, w.engine, w.next_poll_at, s.spec, s.headers",
        )
        .bind(owner)
        .bind(ttl)
        .bind(lookahead)
        .bind(limit)
        .fetch_all(&self.lease_pool)
        .await?)
    }

    /// One statement for every first poll due at once (`begun`: one more poll begun)
    /// or completed unchanged (its count back to 0); the fences travel in the
    /// batch, as in [`PgDialect::record`].
    pub(super) async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        let (id, epoch): (Vec<Uuid>, Vec<i64>) = ids.iter().map(|w| (w.id, w.epoch)).unzip();
        let rows: Vec<(Uuid,)> = sqlx::query_as(
            "UPDATE waits w SET claims = CASE WHEN $4 THEN w.claims + 1 ELSE 0 END
             FROM unnest($2::uuid[], $3::bigint[],
                         array_fill($1::uuid, ARRAY[cardinality($2::uuid[])]),
                         array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                  AS u(id, epoch, owner, running)
             WHERE w.id = u.id AND w.owner IS NOT DISTINCT FROM u.owner AND w.epoch = u.epoch AND w.status = u.running
             RETURNING w.id",
        )
        .bind(owner)
        .bind(id)
        .bind(epoch)
        .bind(begun)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
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
    ///
    /// The owner fence is written `IS NOT DISTINCT FROM` (the same answer here, since
    /// the batch's owner is never null) so that it cannot be an index condition:
    /// with statistics taken while the waits were unowned, the planner otherwise
    /// drove the join from `waits_owner` (`owner = u.owner`, thought to match one
    /// row) and scanned every wait the replica owns for each batch row: 30 s for a
    /// batch of a few hundred among a million waits, measured by the scale
    /// benchmark. Each batch row is looked up by primary key instead.
    pub(super) async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        batch: &[ProgressRow],
    ) -> Result<Vec<bool>, StoreError> {
        let c = RecordColumns::of(batch);
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
             WHERE w.id = u.id AND w.owner IS NOT DISTINCT FROM u.owner AND w.epoch = u.epoch AND w.status = u.running
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
        let written: HashMap<Uuid, (i32, String)> = rows
            .into_iter()
            .map(|(id, seq, tenant)| (id, (seq, tenant)))
            .collect();
        let e = EventColumns::of(batch, &written);
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
        // that finds it taken leaves its events to the sequencer and goes on.
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
            self.committed.notify_one();
        }
        Ok(c.id.iter().map(|id| written.contains_key(id)).collect())
    }

    /// Every running wait `owner` owns, with its epoch (a full renewal compares them
    /// with what it holds).
    pub(super) async fn owned(&self, owner: Uuid) -> Result<Vec<WaitEpoch>, StoreError> {
        let rows: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT id, epoch FROM waits WHERE owner = $1 AND status = 'running'")
                .bind(owner)
                .fetch_all(&self.lease_pool)
                .await?;
        Ok(rows.into_iter().map(WaitEpoch::from).collect())
    }

    /// The checkpoints that carry a state, in chunks (the others only name a wait).
    pub(super) async fn write_all_checkpoints(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<(), StoreError> {
        let dirty: Vec<&CheckpointRow> = held.iter().filter(|c| c.engine.is_some()).collect();
        for chunk in dirty.chunks(CHECKPOINT_CHUNK) {
            self.write_checkpoints(owner, chunk, false).await?;
        }
        Ok(())
    }

    /// The replica's one lease row, extended.
    pub(super) async fn renew_lease(&self, owner: Uuid, ttl: Duration) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
             ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
        )
        .bind(owner)
        .bind(ttl)
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }

    /// Writes the last checkpoints and gives the waits up, so another replica can
    /// take them over at once (graceful shutdown, or waits this replica let go).
    pub(super) async fn release(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<u64, StoreError> {
        if held.is_empty() {
            return Ok(0);
        }
        let all: Vec<&CheckpointRow> = held.iter().collect();
        let mut n = 0;
        for chunk in all.chunks(CHECKPOINT_CHUNK) {
            n += self.write_checkpoints(owner, chunk, true).await?;
        }
        // Tell the other replicas there is work to claim.
        sqlx::query("SELECT pg_notify($1, 'released')")
            .bind(WORK_CHANNEL)
            .execute(&self.lease_pool)
            .await?;
        Ok(n)
    }

    /// One statement for a chunk of checkpoints, fenced by owner and epoch; with
    /// `release`, the waits are given up too. The fences travel in the batch, as in
    /// [`PgDialect::record`], so the update is driven by the batch.
    async fn write_checkpoints(
        &self,
        owner: Uuid,
        chunk: &[&CheckpointRow],
        release: bool,
    ) -> Result<u64, StoreError> {
        let ids: Vec<Uuid> = chunk.iter().map(|c| c.id).collect();
        let epochs: Vec<i64> = chunk.iter().map(|c| c.epoch).collect();
        let engines: Vec<Option<&str>> = chunk.iter().map(|c| c.engine.as_deref()).collect();
        let polls: Vec<Option<i32>> = chunk.iter().map(|c| c.polls).collect();
        let retries: Vec<Option<i32>> = chunk.iter().map(|c| c.retries).collect();
        let nexts: Vec<Option<DateTime<Utc>>> = chunk.iter().map(|c| c.next_poll_at).collect();
        let n = sqlx::query(
            "UPDATE waits w SET owner = CASE WHEN $8 THEN NULL ELSE w.owner END,
                    engine = CASE WHEN u.polls > w.polls THEN u.engine::jsonb ELSE w.engine END,
                    polls = GREATEST(w.polls, COALESCE(u.polls, w.polls)),
                    retries = CASE WHEN u.polls > w.polls THEN u.retries ELSE w.retries END,
                    next_poll_at = CASE WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    claim_at = CASE WHEN NOT $8 THEN w.claim_at
                                    WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    updated_at = CASE WHEN u.polls > w.polls THEN now() ELSE w.updated_at END,
                    claims = CASE WHEN u.polls > w.polls THEN 0 ELSE w.claims END
             FROM unnest($2::uuid[], $3::bigint[], $4::text[], $5::int[], $6::int[], $7::timestamptz[],
                         array_fill($1::uuid, ARRAY[cardinality($2::uuid[])]),
                         array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                  AS u(id, epoch, engine, polls, retries, next_poll_at, owner, running)
             WHERE w.id = u.id AND w.owner IS NOT DISTINCT FROM u.owner AND w.epoch = u.epoch AND w.status = u.running",
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

    /// Forgets replicas gone for a day that own nothing (the lease condition is
    /// checked again under the row lock, so a replica that claims at that moment
    /// keeps its row).
    pub(super) async fn maintain(&self) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM replicas r WHERE r.lease_until < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = r.id AND w.status = 'running')",
        )
        .execute(&self.lease_pool)
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
            "SELECT count(*) FROM waits WHERE status = 'running' AND ($1::text IS NULL OR tenant = $1)",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
}

/// The columns of [`PgDialect::record`]'s update, one entry per wait.
#[derive(Default)]
struct RecordColumns {
    id: Vec<Uuid>,
    epoch: Vec<i64>,
    status: Vec<&'static str>,
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

impl RecordColumns {
    fn of(batch: &[ProgressRow]) -> RecordColumns {
        let mut c = RecordColumns::default();
        for p in batch {
            c.id.push(p.id);
            c.epoch.push(p.epoch);
            c.status.push(p.status);
            c.state.push(p.state.clone());
            c.reason.push(p.reason.clone());
            c.detail.push(p.detail.as_ref().map(Value::to_string));
            c.last_error.push(p.last_error.clone());
            c.polls.push(p.polls);
            c.retries.push(p.retries);
            c.engine.push(p.engine.clone());
            c.next.push(p.next_poll_at);
            c.n_events.push(p.events.len() as i32);
        }
        c
    }
}

/// The columns of [`PgDialect::record`]'s event insert, one entry per event of the
/// waits that were written (numbered up to each one's new seq).
#[derive(Default)]
struct EventColumns {
    wait_id: Vec<Uuid>,
    seq: Vec<i32>,
    tenant: Vec<String>,
    kind: Vec<&'static str>,
    data: Vec<String>,
}

impl EventColumns {
    fn of(batch: &[ProgressRow], written: &HashMap<Uuid, (i32, String)>) -> EventColumns {
        let mut e = EventColumns::default();
        for p in batch {
            let Some((seq, tenant)) = written.get(&p.id) else {
                continue;
            };
            let first = seq - p.events.len() as i32 + 1;
            for (k, (kind, data)) in p.events.iter().enumerate() {
                e.wait_id.push(p.id);
                e.seq.push(first + k as i32);
                e.tenant.push(tenant.clone());
                e.kind.push(kind);
                e.data.push(data.to_string());
            }
        }
        e
    }
}

/// A sequenced event: wait, gid, seq, kind, time, fields.
type Sequenced = (Uuid, i64, i32, String, DateTime<Utc>, Value);

/// Gives every committed event without a global cursor one (and, inside `tx`, the
/// events `tx` itself wrote), and queues the notices, which go out at commit: one
/// per wait on the events channel. The caller holds [`SEQUENCER_LOCK`] until its
/// commit.
async fn sequence_in(tx: &mut Transaction<'_, Postgres>) -> Result<usize, StoreError> {
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
    let n = done.len();
    if n == 0 {
        return Ok(0);
    }
    tracing::debug!(events = n, "sequenced");
    let mut per_wait: BTreeMap<Uuid, Vec<Event>> = BTreeMap::new();
    for (wait_id, gid, seq, kind, at, data) in done {
        let Ok(body) = EventBody::from_parts(&kind, data) else {
            continue;
        };
        per_wait.entry(wait_id).or_default().push(Event {
            id: Some(gid),
            seq,
            wait_id,
            at,
            body,
        });
    }
    let lines = per_wait.into_iter().map(|(wait_id, mut events)| {
        events.sort_by_key(|e| e.seq);
        Notice::announcing(wait_id, events).encode()
    });
    // Listeners hear of events only once they are sequenced, so whatever they read
    // next (a wait's history, the global feed) already has them.
    let payloads = notice::payloads(lines);
    sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
        .bind(EVENTS_CHANNEL)
        .bind(payloads)
        .execute(&mut **tx)
        .await?;
    Ok(n)
}

/// Inserts a new wait, its spec and its `created` event in one statement.
fn insert_wait<'q>(
    tenant: &'q str,
    now: DateTime<Utc>,
    nw: &'q NewWait,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    // With webhooks, their rows go in the same statement: the outbox trigger, which
    // fires at its end, finds them for the `created` event. The word on the work
    // channel ([`WORK_CHANNEL`]) goes out with the insert's commit: the claimers hear
    // of a wait as soon as it can be claimed, whatever the sequencer is doing.
    const PLAIN: &str = concat!("WITH w AS (
             INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq)
             VALUES ($1, $2, 'running', $3, $3, $4, $5, $5, $6, $7, 1)),
         s AS (INSERT INTO wait_specs (wait_id, spec, headers) VALUES ($1, $8, $9))
         INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
         SELECT $1, 1, $2, $10, $3, $11 FROM pg_notify('", work_channel!(), "', 'created')");
    const WITH_NOTIFY: &str = concat!("WITH w AS (
             INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq)
             VALUES ($1, $2, 'running', $3, $3, $4, $5, $5, $6, $7, 1)),
         s AS (INSERT INTO wait_specs (wait_id, spec, headers) VALUES ($1, $8, $9)),
         n AS (INSERT INTO wait_notify (wait_id, endpoint, url, kinds, secret)
               SELECT $1, e, u, k, x::jsonb FROM unnest($12::int[], $13::text[], $14::int[], $15::text[]) AS t(e, u, k, x))
         INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
         SELECT $1, 1, $2, $10, $3, $11 FROM pg_notify('", work_channel!(), "', 'created')");
    let q = sqlx::query(if nw.notify.is_empty() {
        PLAIN
    } else {
        WITH_NOTIFY
    })
    .bind(nw.id)
    .bind(tenant)
    .bind(now)
    .bind(nw.engine.deadline)
    .bind(nw.first_poll)
    .bind(&nw.labels)
    .bind(&nw.engine_json)
    .bind(&nw.spec)
    .bind(&nw.headers)
    .bind(nw.created.0)
    .bind(&nw.created.1);
    if nw.notify.is_empty() {
        return q;
    }
    q.bind(nw.notify.iter().map(|n| n.endpoint).collect::<Vec<i32>>())
        .bind(
            nw.notify
                .iter()
                .map(|n| n.url.clone())
                .collect::<Vec<String>>(),
        )
        .bind(nw.notify.iter().map(|n| n.kinds).collect::<Vec<i32>>())
        .bind(
            nw.notify
                .iter()
                .map(|n| n.secret.to_string())
                .collect::<Vec<String>>(),
        )
}
