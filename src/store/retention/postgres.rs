//! Retention's batch on Postgres (see [`super`]).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Swept;
use crate::store::StoreError;
use crate::store::postgres::PgDialect;

/// The advisory lock key of the sweep ("waitd-retention" folded into 64 bits).
const SWEEP_LOCK: i64 = 0x7761_6974_6472_6574;

impl PgDialect {
    pub(super) async fn sweep_ended(
        &self,
        cutoff: DateTime<Utc>,
        limit: i64,
    ) -> Result<Option<Swept>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let (locked,): (bool,) = sqlx::query_as("SELECT pg_try_advisory_xact_lock($1)")
            .bind(SWEEP_LOCK)
            .fetch_one(&mut *tx)
            .await?;
        if !locked {
            return Ok(None);
        }
        let ids: Vec<(Uuid,)> = sqlx::query_as(
            "SELECT w.id FROM waits w
             WHERE w.status <> 'running' AND w.finished_at < $1
               AND NOT EXISTS (SELECT 1 FROM deliveries d
                               WHERE d.wait_id = w.id AND d.status = 'pending')
               AND NOT EXISTS (SELECT 1 FROM wait_events e
                               WHERE e.wait_id = w.id AND e.gid IS NULL)
               AND NOT EXISTS (SELECT 1 FROM group_members m WHERE m.member_id = w.id)
             ORDER BY w.finished_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED",
        )
        .bind(cutoff)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let ids: Vec<Uuid> = ids.into_iter().map(|(id,)| id).collect();
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Some(Swept::default()));
        }
        sqlx::query(
            "INSERT INTO retention_horizons (tenant, last_deleted)
             SELECT tenant, max(gid) FROM wait_events
             WHERE wait_id = ANY($1) AND gid IS NOT NULL GROUP BY tenant
             ON CONFLICT (tenant) DO UPDATE
             SET last_deleted = greatest(retention_horizons.last_deleted, excluded.last_deleted)",
        )
        .bind(&ids)
        .execute(&mut *tx)
        .await?;
        let mut swept = Swept::default();
        for (table, column, rows) in [
            ("wait_events", "wait_id", &mut swept.wait_events),
            ("deliveries", "wait_id", &mut swept.deliveries),
            ("wait_notify", "wait_id", &mut swept.wait_notify),
            ("idempotency_keys", "wait_id", &mut swept.idempotency_keys),
            ("wait_specs", "wait_id", &mut swept.wait_specs),
            ("waits", "id", &mut swept.waits),
        ] {
            *rows = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE {column} = ANY($1)"
            )))
            .bind(&ids)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        }
        tx.commit().await?;
        Ok(Some(swept))
    }

    /// A plain `VACUUM` of the tables a sweep deletes from, which makes the space
    /// of the deleted rows reusable at once rather than at autovacuum's next visit
    /// (a minute apart at the least). It takes no lock that blocks reads or writes,
    /// and skips a table another session holds locked.
    pub(super) async fn vacuum_swept(&self) -> Result<(), StoreError> {
        sqlx::query(
            "VACUUM (SKIP_LOCKED) waits, wait_specs, wait_events, deliveries, wait_notify, idempotency_keys",
        )
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn oldest_ended(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let (t,): (Option<DateTime<Utc>>,) =
            sqlx::query_as("SELECT min(finished_at) FROM waits WHERE status <> 'running'")
                .fetch_one(&self.pool)
                .await?;
        Ok(t)
    }

    pub(super) async fn event_horizon(&self, tenant: &str) -> Result<i64, StoreError> {
        let n: Option<(i64,)> =
            sqlx::query_as("SELECT last_deleted FROM retention_horizons WHERE tenant = $1")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
        Ok(n.map_or(0, |(n,)| n))
    }
}
