//! The webhook outbox's statements on SQLite (§5.10 of the design): claiming due deliveries
//! a tenant's turn at a time, writing attempts' outcomes, redelivering, and the
//! bounds the outbox keeps.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{
    DELIVERY_COLUMNS, DUE_JOINS, DeliveryLimits, DeliveryRow, DueRow, Found, LIMITS_SQL, LimitsRow,
    Outcome, Requeue, Turns, due_columns, limits_of,
};
use crate::bus::BusMsg;
use crate::model::{DeliveryStatus, DropReason};
use crate::store::StoreError;
use crate::store::sqlite::{SqliteDialect, at, ms};

/// Webhook deliveries (see [`super`]).
impl SqliteDialect {
    pub(super) async fn claim_deliveries(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        ttl: Duration,
        limit: i64,
        turns: &Turns<'_>,
    ) -> Result<Vec<DueRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let pairs = |v: Vec<(Value, Value)>| {
            Value::from(
                v.into_iter()
                    .map(|(a, b)| Value::from(vec![a, b]))
                    .collect::<Vec<Value>>(),
            )
            .to_string()
        };
        let taken = pairs(
            turns
                .taken
                .iter()
                .map(|(t, n)| (Value::from(t.as_str()), Value::from(*n)))
                .collect(),
        );
        let stalled = pairs(
            turns
                .stalled
                .iter()
                .map(|(t, u)| (Value::from(t.as_str()), Value::from(u.as_str())))
                .collect(),
        );
        let ids: Vec<(i64,)> = sqlx::query_as(
            "UPDATE deliveries SET owner = ?1, lease_until = ?2, epoch = epoch + 1
             WHERE id IN (
                 SELECT id FROM (
                     SELECT x.id, x.next_attempt_at,
                            row_number() OVER (PARTITION BY x.tenant ORDER BY x.next_attempt_at, x.id)
                              + coalesce(f.taken, 0) AS turn
                     FROM deliveries x
                     JOIN wait_notify n ON n.wait_id = x.wait_id AND n.endpoint = x.endpoint
                     LEFT JOIN (SELECT json_extract(value, '$[0]') AS tenant,
                                       json_extract(value, '$[1]') AS taken
                                FROM json_each(?3)) f ON f.tenant = x.tenant
                     WHERE x.status = 'pending' AND x.next_attempt_at <= ?4
                       AND (x.owner IS NULL OR x.lease_until < ?4)
                       AND x.seq = (SELECT min(p.seq) FROM deliveries p
                                    WHERE p.wait_id = x.wait_id AND p.endpoint = x.endpoint
                                      AND p.status = 'pending')
                       AND NOT EXISTS (SELECT 1 FROM json_each(?5) s
                                       WHERE json_extract(s.value, '$[0]') = x.tenant
                                         AND json_extract(s.value, '$[1]') = n.url))
                 WHERE turn <= ?6 ORDER BY turn, next_attempt_at LIMIT ?7)
             RETURNING id",
        )
        .bind(owner)
        .bind(ms(now) + ttl.as_millis() as i64)
        .bind(taken)
        .bind(ms(now))
        .bind(&stalled)
        .bind(turns.per_tenant)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if !turns.stalled.is_empty() {
            // The due deliveries of stalled receivers wait until `stalled_until`.
            sqlx::query(
                "UPDATE deliveries SET next_attempt_at = ?1
                 WHERE status = 'pending' AND next_attempt_at <= ?2
                   AND (owner IS NULL OR lease_until < ?2)
                   AND EXISTS (SELECT 1 FROM wait_notify n, json_each(?3) s
                               WHERE n.wait_id = deliveries.wait_id
                                 AND n.endpoint = deliveries.endpoint
                                 AND json_extract(s.value, '$[0]') = deliveries.tenant
                                 AND json_extract(s.value, '$[1]') = n.url)",
            )
            .bind(ms(turns.stalled_until))
            .bind(ms(now))
            .bind(&stalled)
            .execute(&mut *tx)
            .await?;
        }
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let list = Value::from(ids.iter().map(|(id,)| *id).collect::<Vec<i64>>()).to_string();
        let sql = format!(
            "SELECT {} FROM deliveries d {DUE_JOINS} WHERE d.id IN (SELECT value FROM json_each(?))",
            due_columns()
        );
        let rows = sqlx::query_as(sqlx::AssertSqlSafe(sql))
            .bind(list)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows)
    }

    /// The batch in one transaction (one writer: a statement each is as cheap); the
    /// ids written, each with whether it ended with another delivery of its webhook
    /// pending behind it.
    pub(super) async fn finish_deliveries(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        batch: &[Outcome],
        attempts: &[String],
    ) -> Result<Vec<(i64, bool)>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut written = Vec::new();
        for (o, attempts) in batch.iter().zip(attempts) {
            let done = o.status != DeliveryStatus::Pending;
            let n = sqlx::query(
                "UPDATE deliveries SET status = ?, next_attempt_at = ?, finished_at = ?, tries = ?,
                        attempts_total = attempts_total + ?, attempts = ?,
                        owner = NULL, lease_until = NULL
                 WHERE id = ? AND owner = ? AND epoch = ?",
            )
            .bind(o.status.as_str())
            .bind(o.next_attempt_at.map(ms))
            .bind(done.then_some(ms(now)))
            .bind(o.tries)
            .bind(i32::from(o.attempted))
            .bind(attempts)
            .bind(o.id)
            .bind(owner)
            .bind(o.epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                continue;
            }
            let behind = if done && o.status != DeliveryStatus::Stopped {
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT 1 FROM deliveries
                                    WHERE wait_id = ? AND endpoint = ? AND status = 'pending')",
                )
                .bind(o.wait_id)
                .bind(o.endpoint)
                .fetch_one(&mut *tx)
                .await?
            } else {
                false
            };
            written.push((o.id, behind));
            if o.status == DeliveryStatus::Stopped {
                sqlx::query(
                    "UPDATE wait_notify SET stopped_at = ? WHERE wait_id = ? AND endpoint = ?",
                )
                .bind(ms(now))
                .bind(o.wait_id)
                .bind(o.endpoint)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "UPDATE deliveries SET status = 'stopped', next_attempt_at = NULL, finished_at = ?
                     WHERE wait_id = ? AND endpoint = ? AND status = 'pending'",
                )
                .bind(ms(now))
                .bind(o.wait_id)
                .bind(o.endpoint)
                .execute(&mut *tx)
                .await?;
            }
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
             WHERE d.wait_id = ? AND d.tenant = ? AND d.id > ? ORDER BY d.id LIMIT ?"
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
        let row: Option<(String, i32, bool, Option<i64>)> = sqlx::query_as(
            "SELECT status, endpoint, owner IS NOT NULL AND lease_until >= ?, redelivered_at
             FROM deliveries WHERE id = ? AND wait_id = ? AND tenant = ?",
        )
        .bind(ms(now))
        .bind(id)
        .bind(wait_id)
        .bind(tenant)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((status, endpoint, leased, redelivered_at)) = row else {
            return Ok(Requeue::NotFound);
        };
        let found = Found {
            status,
            leased,
            redelivered_at: redelivered_at.map(at),
            limits: limits_of(
                sqlx::query_as::<_, LimitsRow>(LIMITS_SQL)
                    .fetch_optional(&mut *tx)
                    .await?,
            ),
        };
        if let Some(no) = found.refusal(now) {
            return Ok(no);
        }
        let (webhook, wait, tenants): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM deliveries
                     WHERE wait_id = ?1 AND endpoint = ?2 AND status = 'pending'),
                    (SELECT count(*) FROM deliveries WHERE wait_id = ?1 AND status = 'pending'),
                    (SELECT count(*) FROM (SELECT 1 FROM deliveries
                                           WHERE tenant = ?3 AND status = 'pending' LIMIT ?4))",
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
            "UPDATE deliveries SET status = 'pending', next_attempt_at = ?1, finished_at = NULL,
                    tries = 0, owner = NULL, lease_until = NULL, drop_reason = NULL,
                    redelivered_at = ?1
             WHERE id = ?2",
        )
        .bind(ms(now))
        .bind(id)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE wait_notify SET stopped_at = NULL WHERE wait_id = ? AND endpoint = ?")
            .bind(wait_id)
            .bind(endpoint)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        // The outbox is in this process: its deliverer hears of it at once.
        self.bus.publish(BusMsg::Deliveries { requeued: true });
        Ok(Requeue::Queued)
    }

    pub(super) async fn set_delivery_limits(&self, l: DeliveryLimits) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO delivery_limits (id, per_webhook, per_wait, per_tenant, redelivery_interval_ms)
             VALUES (1, ?1, ?2, ?3, ?4)
             ON CONFLICT (id) DO UPDATE SET per_webhook = ?1, per_wait = ?2, per_tenant = ?3,
                                            redelivery_interval_ms = ?4",
        )
        .bind(i64::from(l.per_webhook))
        .bind(i64::from(l.per_wait))
        .bind(i64::from(l.per_tenant))
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

    pub(super) async fn dropped_deliveries(&self) -> Result<[i64; 3], StoreError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT reason, dropped FROM deliveries_dropped")
                .fetch_all(&self.pool)
                .await?;
        let mut out = [0; 3];
        for (reason, n) in rows {
            if let Some(i) = DropReason::ALL.iter().position(|r| r.as_str() == reason) {
                out[i] = n;
            }
        }
        Ok(out)
    }

    pub(super) async fn oldest_pending_delivery(
        &self,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let (t,): (Option<i64>,) =
            sqlx::query_as("SELECT min(created_at) FROM deliveries WHERE status = 'pending'")
                .fetch_one(&self.pool)
                .await?;
        Ok(t.map(at))
    }
}
