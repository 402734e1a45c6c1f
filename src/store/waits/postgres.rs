//! Waits' own statements on Postgres: creating one (with its key, its count and its
//! webhooks), reading, listing and canceling.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::Postgres;
use uuid::Uuid;

use super::batches::Creates;
use crate::store::postgres::{PgDialect, labels_json};
use crate::store::{
    Admission, GROUPED_COLUMN, GotRow, Inserted, LIMIT_MARGIN, ListFilter, NewWait, StoreError,
    WAIT_COLUMNS, WaitRow,
};

impl PgDialect {
    pub(in crate::store) async fn find_idempotent(
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

    /// The insert of a new wait. Without a count it joins the next batch of
    /// creates ([`super::batches`]); with one it is a transaction of its own: the
    /// count (again under the tenant's lock near the limit, so the count and the
    /// insert cannot interleave), the insert, and the key.
    pub(super) async fn insert_wait(
        &self,
        tenant: &str,
        now: DateTime<Utc>,
        nw: &NewWait,
        idempotency: Option<(&str, &str)>,
        admission: Admission,
        creates: &Arc<Creates>,
    ) -> Result<Inserted, StoreError> {
        if matches!(admission, Admission::Free) {
            return self
                .insert_batched(creates, tenant, now, nw, idempotency)
                .await;
        }
        let mut tx = self.pool.begin().await?;
        let counted = match admit(&mut tx, tenant, admission).await? {
            Ok(counted) => counted,
            Err(n) => return Ok(Inserted::Full(n)),
        };
        insert_wait(tenant, now, nw).execute(&mut *tx).await?;
        if let Some((key, hash)) = idempotency
            && !take_key(&mut tx, tenant, key, hash, nw.id, now).await?
        {
            tx.rollback().await?;
            return Ok(Inserted::KeyTaken);
        }
        tx.commit().await?;
        self.committed.notify_one();
        Ok(Inserted::Yes { counted })
    }

    pub(in crate::store) async fn get(
        &self,
        tenant: &str,
        id: Uuid,
    ) -> Result<Option<GotRow>, StoreError> {
        let sql = format!(
            "SELECT {WAIT_COLUMNS}, {GROUPED_COLUMN} FROM waits w JOIN wait_specs s ON s.wait_id = w.id WHERE w.id = $1 AND w.tenant = $2"
        );
        let row: Option<GotRow> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(id)
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row)
    }

    pub(in crate::store) async fn list(
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

    /// Ends a running wait, whoever holds it (a cancel, a group's end, a
    /// callback), with the event `event` builds from its last state; true when
    /// this call ended it.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::store) async fn end_running(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
        reason: &str,
        status: &str,
        error_detail: Option<&Value>,
        output: Option<&Value>,
        event: &(dyn Fn(Option<String>) -> (&'static str, Value) + Sync),
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32, Option<String>)> = sqlx::query_as(
            "UPDATE waits SET status = $5, reason = $4, error_detail = $6, output = $7, finished_at = $3,
                    updated_at = $3, next_poll_at = NULL, owner = NULL, seq = seq + 1
             WHERE id = $1 AND tenant = $2 AND status = 'running'
             RETURNING seq, state",
        )
        .bind(id)
        .bind(tenant)
        .bind(now)
        .bind(reason)
        .bind(status)
        .bind(error_detail)
        .bind(output)
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

    pub(in crate::store) async fn count_running(
        &self,
        tenant: Option<&str>,
    ) -> Result<i64, StoreError> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM waits WHERE status = 'running' AND ($1::text IS NULL OR tenant = $1)",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(n)
    }
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
             INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq, placement)
             VALUES ($1, $2, 'running', $3, $3, $4, $5, $5, $6, $7, 1, $13)),
         s AS (INSERT INTO wait_specs (wait_id, spec, headers, trace) VALUES ($1, $8, $9, $12))
         INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
         SELECT $1, 1, $2, $10, $3, $11 FROM pg_notify('", work_channel!(), "', 'created')");
    const WITH_NOTIFY: &str = concat!("WITH w AS (
             INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq, placement)
             VALUES ($1, $2, 'running', $3, $3, $4, $5, $5, $6, $7, 1, $13)),
         s AS (INSERT INTO wait_specs (wait_id, spec, headers, trace) VALUES ($1, $8, $9, $12)),
         n AS (INSERT INTO wait_notify (wait_id, endpoint, url, kinds, secret)
               SELECT $1, e, u, k, x::jsonb FROM unnest($14::int[], $15::text[], $16::int[], $17::text[]) AS t(e, u, k, x))
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
    .bind(&nw.created.1)
    .bind(&nw.trace)
    .bind(nw.placement);
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

/// Takes the idempotency key for the wait being inserted in `tx`: false when
/// another request took it first (the caller rolls back).
pub(in crate::store) async fn take_key(
    tx: &mut sqlx::PgConnection,
    tenant: &str,
    key: &str,
    hash: &str,
    id: Uuid,
    now: DateTime<Utc>,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO idempotency_keys (tenant, key, request_hash, wait_id, created_at)
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(key)
    .bind(hash)
    .bind(id)
    .bind(now)
    .execute(tx)
    .await?
    .rows_affected();
    Ok(inserted > 0)
}

/// Admission within a create's transaction: the tenant's running count when one
/// is to be taken (again under the tenant's lock near the limit, so the count
/// and the insert cannot interleave), or `Err` with the count when the tenant
/// is at `max`.
pub(in crate::store) async fn admit(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &str,
    admission: Admission,
) -> Result<Result<Option<i64>, i64>, StoreError> {
    let Admission::Count { max } = admission else {
        return Ok(Ok(None));
    };
    const COUNT: &str = "SELECT count(*) FROM waits WHERE status = 'running' AND tenant = $1";
    let (mut n,): (i64,) = sqlx::query_as(COUNT)
        .bind(tenant)
        .fetch_one(&mut **tx)
        .await?;
    if n + LIMIT_MARGIN >= max {
        // Far from the limit, concurrent creates (at most one per pooled
        // connection of every replica) cannot reach it and go in parallel.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('waitd-tenant:' || $1, 0))")
            .bind(tenant)
            .execute(&mut **tx)
            .await?;
        (n,) = sqlx::query_as(COUNT)
            .bind(tenant)
            .fetch_one(&mut **tx)
            .await?;
    }
    Ok(if n >= max { Err(n) } else { Ok(Some(n)) })
}
