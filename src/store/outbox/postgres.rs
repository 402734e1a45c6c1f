//! The webhook outbox's statements on Postgres (§5.10 of the design): claiming due deliveries
//! a tenant's turn at a time, writing attempts' outcomes, redelivering, and the
//! bounds the outbox keeps.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    DELIVERY_COLUMNS, DUE_JOINS, DeliveryLimits, DeliveryRow, DueRow, Found, LIMITS_SQL, LimitsRow,
    Outcome, Requeue, Turns, due_columns, limits_of,
};
use crate::model::DeliveryStatus;
use crate::store::StoreError;
use crate::store::postgres::PgDialect;

/// Webhook deliveries (see [`super`]). On the main pool: the lease pool
/// is kept for the waits' claims and renewals, which deliveries must not delay.
impl PgDialect {
    pub(super) async fn claim_deliveries(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        ttl: Duration,
        limit: i64,
        turns: &Turns<'_>,
    ) -> Result<Vec<DueRow>, StoreError> {
        // Turns are numbered over every due delivery first in line for its webhook
        // (one probe of deliveries_pending_by_webhook each: the probe is ordered as
        // that index is, so that no plan reads it from another index and sorts; on
        // tables without statistics, `min(seq)` was planned as a scan of every
        // pending delivery through deliveries_pending_by_tenant, once for each due
        // one). A window function cannot
        // share a level with FOR UPDATE, so the ids picked are then locked, skipping
        // any another replica is claiming, and checked again once locked; as an
        // array, so that they are read by primary key whatever the planner's
        // statistics say. The due deliveries of stalled receivers are put off in
        // the same statement (rows disjoint from the claimed ones).
        let sql = format!(
            "WITH due AS (
                 SELECT x.id, x.next_attempt_at,
                        row_number() OVER (PARTITION BY x.tenant ORDER BY x.next_attempt_at, x.id)
                          + coalesce(f.taken, 0) AS turn
                 FROM deliveries x
                 JOIN wait_notify n ON n.wait_id = x.wait_id AND n.endpoint = x.endpoint
                 LEFT JOIN unnest($5::text[], $6::bigint[]) AS f(tenant, taken) ON f.tenant = x.tenant
                 WHERE x.status = 'pending' AND x.next_attempt_at <= $2
                   AND (x.owner IS NULL OR x.lease_until < $2)
                   AND x.seq = (SELECT p.seq FROM deliveries p
                                WHERE p.wait_id = x.wait_id AND p.endpoint = x.endpoint
                                  AND p.status = 'pending'
                                ORDER BY p.wait_id, p.endpoint, p.seq LIMIT 1)
                   AND NOT EXISTS (SELECT 1 FROM unnest($8::text[], $9::text[]) AS s(tenant, url)
                                   WHERE s.tenant = x.tenant AND s.url = n.url)),
             picked AS (
                 SELECT q.id FROM deliveries q
                 WHERE q.id = ANY(ARRAY(SELECT id FROM due WHERE turn <= $7
                                        ORDER BY turn, next_attempt_at LIMIT $4))
                   AND q.status = 'pending' AND (q.owner IS NULL OR q.lease_until < $2)
                 FOR UPDATE SKIP LOCKED),
             c AS (
                 UPDATE deliveries d SET owner = $1, lease_until = $2 + $3 * interval '1 millisecond',
                        epoch = d.epoch + 1
                 FROM picked t
                 WHERE d.id = t.id
                 RETURNING d.*),
             snoozed AS (
                 UPDATE deliveries d SET next_attempt_at = $10
                 FROM (SELECT q.id FROM deliveries q
                       WHERE q.id = ANY(ARRAY(
                                 SELECT x.id FROM deliveries x
                                 JOIN wait_notify n ON n.wait_id = x.wait_id AND n.endpoint = x.endpoint
                                 JOIN unnest($8::text[], $9::text[]) AS s(tenant, url)
                                   ON s.tenant = x.tenant AND s.url = n.url
                                 WHERE x.status = 'pending' AND x.tenant = ANY($8)
                                   AND x.next_attempt_at <= $2
                                   AND (x.owner IS NULL OR x.lease_until < $2)))
                         AND q.status = 'pending' AND (q.owner IS NULL OR q.lease_until < $2)
                       FOR UPDATE SKIP LOCKED) v
                 WHERE d.id = v.id)
             SELECT {} FROM c d {DUE_JOINS}",
            due_columns()
        );
        let (tenants, taken): (Vec<&str>, Vec<i64>) =
            turns.taken.iter().map(|(t, n)| (t.as_str(), *n)).unzip();
        let (stalled_tenants, stalled_urls): (Vec<&str>, Vec<&str>) = turns
            .stalled
            .iter()
            .map(|(t, u)| (t.as_str(), u.as_str()))
            .unzip();
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(owner)
            .bind(now)
            .bind(ttl.as_millis() as f64)
            .bind(limit)
            .bind(tenants)
            .bind(taken)
            .bind(turns.per_tenant)
            .bind(stalled_tenants)
            .bind(stalled_urls)
            .bind(turns.stalled_until)
            .fetch_all(&self.pool)
            .await?)
    }

    /// One statement for the batch, and for the `stopped` ones the webhook stops,
    /// in the same transaction; the ids written, each with whether it ended with
    /// another delivery of its webhook pending behind it.
    pub(super) async fn finish_deliveries(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        batch: &[Outcome],
        attempts: &[String],
    ) -> Result<Vec<(i64, bool)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let written: Vec<(i64, bool)> = sqlx::query_as(
            "UPDATE deliveries d SET status = u.status, next_attempt_at = u.next,
                    finished_at = CASE WHEN u.status = 'pending' THEN NULL ELSE $2 END,
                    tries = u.tries, attempts_total = d.attempts_total + u.attempted,
                    attempts = u.attempts::jsonb, owner = NULL, lease_until = NULL
             FROM unnest($3::bigint[], $4::bigint[], $5::text[], $6::timestamptz[], $7::int[],
                         $8::int[], $9::text[]) AS u(id, epoch, status, next, tries, attempted, attempts)
             WHERE d.id = u.id AND d.owner = $1 AND d.epoch = u.epoch
             RETURNING d.id, u.status NOT IN ('pending', 'stopped') AND EXISTS (
                 SELECT 1 FROM deliveries p
                 WHERE p.wait_id = d.wait_id AND p.endpoint = d.endpoint
                   AND p.status = 'pending' AND p.id <> d.id)",
        )
        .bind(owner)
        .bind(now)
        .bind(batch.iter().map(|o| o.id).collect::<Vec<i64>>())
        .bind(batch.iter().map(|o| o.epoch).collect::<Vec<i64>>())
        .bind(batch.iter().map(|o| o.status.as_str()).collect::<Vec<&str>>())
        .bind(batch.iter().map(|o| o.next_attempt_at).collect::<Vec<Option<DateTime<Utc>>>>())
        .bind(batch.iter().map(|o| o.tries).collect::<Vec<i32>>())
        .bind(batch.iter().map(|o| i32::from(o.attempted)).collect::<Vec<i32>>())
        .bind(attempts)
        .fetch_all(&mut *tx)
        .await?;
        for o in batch.iter().filter(|o| {
            o.status == DeliveryStatus::Stopped && written.iter().any(|(id, _)| *id == o.id)
        }) {
            sqlx::query(
                "UPDATE wait_notify SET stopped_at = $3 WHERE wait_id = $1 AND endpoint = $2",
            )
            .bind(o.wait_id)
            .bind(o.endpoint)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE deliveries SET status = 'stopped', next_attempt_at = NULL, finished_at = $3
                 WHERE wait_id = $1 AND endpoint = $2 AND status = 'pending'",
            )
            .bind(o.wait_id)
            .bind(o.endpoint)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(written)
    }

    pub(super) async fn deliveries(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        let sql = format!(
            "SELECT {DELIVERY_COLUMNS} FROM deliveries d
             JOIN wait_notify n ON n.wait_id = d.wait_id AND n.endpoint = d.endpoint
             WHERE d.wait_id = $1 AND d.tenant = $2 AND d.id > $3 ORDER BY d.id LIMIT $4"
        );
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(wait_id)
            .bind(tenant)
            .bind(after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?)
    }

    pub(super) async fn redeliver(
        &self,
        tenant: &str,
        wait_id: Uuid,
        id: i64,
        now: DateTime<Utc>,
    ) -> Result<Requeue, StoreError> {
        let mut tx = self.pool.begin().await?;
        let limits = limits_of(
            sqlx::query_as::<_, LimitsRow>(LIMITS_SQL)
                .fetch_optional(&mut *tx)
                .await?,
        );
        // Read first without a lock, which is enough to refuse: the claim skips
        // locked rows, so a client retrying in a loop that locked the row on every
        // refusal would keep the queued redelivery from being claimed until the
        // claim's next idle look. Then locked and judged again, so that two
        // redeliveries of one delivery at once are one, then a 409.
        let mut judged = None;
        for lock in ["", " FOR UPDATE"] {
            let row: Option<(String, i32, bool, Option<DateTime<Utc>>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "SELECT status, endpoint, owner IS NOT NULL AND lease_until >= $4, redelivered_at
                     FROM deliveries WHERE id = $1 AND wait_id = $2 AND tenant = $3{lock}"
                )))
                .bind(id)
                .bind(wait_id)
                .bind(tenant)
                .bind(now)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((status, e, leased, redelivered_at)) = row else {
                return Ok(Requeue::NotFound);
            };
            let found = Found {
                status,
                leased,
                redelivered_at,
                limits,
            };
            if let Some(no) = found.refusal(now) {
                return Ok(no);
            }
            judged = Some((e, found));
        }
        let Some((endpoint, found)) = judged else {
            return Ok(Requeue::NotFound);
        };
        // The tenant's count stops at its bound: no more need be read to judge it.
        let (webhook, wait, tenants): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM deliveries
                     WHERE wait_id = $1 AND endpoint = $2 AND status = 'pending'),
                    (SELECT count(*) FROM deliveries WHERE wait_id = $1 AND status = 'pending'),
                    (SELECT count(*) FROM (SELECT 1 FROM deliveries
                                           WHERE tenant = $3 AND status = 'pending' LIMIT $4) t)",
        )
        .bind(wait_id)
        .bind(endpoint)
        .bind(tenant)
        .bind(i64::from(found.limits.per_tenant))
        .fetch_one(&mut *tx)
        .await?;
        if let Some(no) = found.full(webhook, wait, tenants) {
            return Ok(no);
        }
        sqlx::query(
            "UPDATE deliveries SET status = 'pending', next_attempt_at = $2, finished_at = NULL,
                    tries = 0, owner = NULL, lease_until = NULL, drop_reason = NULL,
                    redelivered_at = $2
             WHERE id = $1",
        )
        .bind(id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE wait_notify SET stopped_at = NULL WHERE wait_id = $1 AND endpoint = $2",
        )
        .bind(wait_id)
        .bind(endpoint)
        .execute(&mut *tx)
        .await?;
        // Every replica's deliverer hears of it with the commit.
        sqlx::query(concat!(
            "SELECT pg_notify('",
            deliveries_channel!(),
            "', 'redelivered')"
        ))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Requeue::Queued)
    }

    pub(super) async fn set_delivery_limits(&self, l: DeliveryLimits) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO delivery_limits (id, per_webhook, per_wait, per_tenant, redelivery_interval_ms)
             VALUES (1, $1, $2, $3, $4)
             ON CONFLICT (id) DO UPDATE SET per_webhook = $1, per_wait = $2, per_tenant = $3,
                                            redelivery_interval_ms = $4",
        )
        .bind(l.per_webhook.min(i32::MAX as u32) as i32)
        .bind(l.per_wait.min(i32::MAX as u32) as i32)
        .bind(l.per_tenant.min(i32::MAX as u32) as i32)
        .bind(l.redelivery_interval.as_millis().min(i64::MAX as u128) as i64)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn delivery_limits(&self) -> Result<DeliveryLimits, StoreError> {
        Ok(limits_of(
            sqlx::query_as::<_, LimitsRow>(LIMITS_SQL)
                .fetch_optional(&self.pool)
                .await?,
        ))
    }

    /// A sequence's count: `last_value` once `nextval` was called, else none yet.
    pub(super) async fn dropped_deliveries(&self) -> Result<[i64; 3], StoreError> {
        let (a, b, c): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM deliveries_dropped_webhook_cap),
                    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM deliveries_dropped_wait_cap),
                    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM deliveries_dropped_tenant_cap)",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok([a, b, c])
    }

    pub(super) async fn oldest_pending_delivery(
        &self,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let (t,): (Option<DateTime<Utc>>,) =
            sqlx::query_as("SELECT min(created_at) FROM deliveries WHERE status = 'pending'")
                .fetch_one(&self.pool)
                .await?;
        Ok(t)
    }
}
