//! Retention's batch on SQLite (see [`super`]). One process uses a
//! SQLite file, so no lock is needed; the pages a batch frees are reused by
//! later writes, so the file stops growing once the sweep keeps pace.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::Swept;
use crate::store::StoreError;
use crate::store::sqlite::{SqliteDialect, at, ms};

impl SqliteDialect {
    pub(super) async fn sweep_ended(
        &self,
        cutoff: DateTime<Utc>,
        limit: i64,
    ) -> Result<Option<Swept>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ids: Vec<(Uuid,)> = sqlx::query_as(
            "SELECT w.id FROM waits w
             WHERE w.status <> 'running' AND w.finished_at < ?
               AND NOT EXISTS (SELECT 1 FROM deliveries d
                               WHERE d.wait_id = w.id AND d.status = 'pending')
               AND NOT EXISTS (SELECT 1 FROM group_members m WHERE m.member_id = w.id)
             ORDER BY w.finished_at
             LIMIT ?",
        )
        .bind(ms(cutoff))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        if ids.is_empty() {
            tx.commit().await?;
            return Ok(Some(Swept::default()));
        }
        let marks = vec!["?"; ids.len()].join(",");
        let mut horizon = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO retention_horizons (tenant, last_deleted)
             SELECT tenant, max(id) FROM wait_events WHERE wait_id IN ({marks}) GROUP BY tenant
             ON CONFLICT (tenant) DO UPDATE
             SET last_deleted = max(last_deleted, excluded.last_deleted)"
        )));
        for (id,) in &ids {
            horizon = horizon.bind(*id);
        }
        horizon.execute(&mut *tx).await?;
        let mut swept = Swept::default();
        for (table, column, rows) in [
            ("wait_events", "wait_id", &mut swept.wait_events),
            ("deliveries", "wait_id", &mut swept.deliveries),
            ("wait_notify", "wait_id", &mut swept.wait_notify),
            ("idempotency_keys", "wait_id", &mut swept.idempotency_keys),
            ("wait_specs", "wait_id", &mut swept.wait_specs),
            ("waits", "id", &mut swept.waits),
        ] {
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE {column} IN ({marks})"
            )));
            for (id,) in &ids {
                q = q.bind(*id);
            }
            *rows = q.execute(&mut *tx).await?.rows_affected();
        }
        tx.commit().await?;
        Ok(Some(swept))
    }

    /// Nothing: SQLite reuses freed pages without being asked.
    pub(super) async fn vacuum_swept(&self) -> Result<(), StoreError> {
        Ok(())
    }

    pub(super) async fn oldest_ended(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        let (t,): (Option<i64>,) =
            sqlx::query_as("SELECT min(finished_at) FROM waits WHERE status <> 'running'")
                .fetch_one(&self.pool)
                .await?;
        Ok(t.map(at))
    }

    pub(super) async fn event_horizon(&self, tenant: &str) -> Result<i64, StoreError> {
        let n: Option<(i64,)> =
            sqlx::query_as("SELECT last_deleted FROM retention_horizons WHERE tenant = ?")
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
        Ok(n.map_or(0, |(n,)| n))
    }
}
