//! Callbacks on Postgres.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::CallbackRow;
use crate::store::{PgDialect, StoreError};

type Row = (Uuid, String, Vec<u8>, Option<i64>, DateTime<Utc>, bool);

fn row((wait_id, tenant, secret_hash, heartbeat, beat_at, judged): Row) -> CallbackRow {
    CallbackRow {
        wait_id,
        tenant,
        secret_hash,
        heartbeat,
        judged,
        beat_at,
    }
}

impl PgDialect {
    pub(in crate::store) async fn register_callback(
        &self,
        wait_id: Uuid,
        tenant: &str,
        hash: &[u8],
        heartbeat: Option<i64>,
        judged: bool,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO wait_callbacks (wait_id, tenant, secret_hash, heartbeat, beat_at, judged)
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(wait_id)
        .bind(tenant)
        .bind(hash)
        .bind(heartbeat)
        .bind(now)
        .bind(judged)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(in crate::store) async fn find_callback(
        &self,
        hash: &[u8],
    ) -> Result<Option<CallbackRow>, StoreError> {
        let found: Option<Row> = sqlx::query_as(
            "SELECT wait_id, tenant, secret_hash, heartbeat, beat_at, judged FROM wait_callbacks
             WHERE secret_hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(found.map(row))
    }

    pub(in crate::store) async fn beat_callback(
        &self,
        wait_id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let n = sqlx::query(
            "UPDATE wait_callbacks c SET beat_at = greatest(c.beat_at, $2)
             FROM waits w WHERE c.wait_id = $1 AND w.id = c.wait_id AND w.status = 'running'",
        )
        .bind(wait_id)
        .bind(now)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(n > 0)
    }

    pub(in crate::store) async fn silent_callbacks(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<CallbackRow>, StoreError> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT c.wait_id, c.tenant, c.secret_hash, c.heartbeat, c.beat_at, c.judged
             FROM wait_callbacks c JOIN waits w ON w.id = c.wait_id
             WHERE w.status = 'running' AND c.heartbeat IS NOT NULL
               AND c.beat_at + c.heartbeat * interval '1 millisecond' < $1
             LIMIT $2",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(row).collect())
    }
}

impl PgDialect {
    /// Sets a running callback wait's `state` with its `state` event, unless it
    /// reads so already; true when it changed.
    pub(in crate::store) async fn callback_state(
        &self,
        tenant: &str,
        id: Uuid,
        state: &str,
        now: DateTime<Utc>,
        event: &(dyn Fn(Option<String>) -> (&'static str, serde_json::Value) + Sync),
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let row: Option<(i32, Option<String>)> = sqlx::query_as(
            "WITH old AS MATERIALIZED (
                 SELECT id, state FROM waits WHERE id = $1 AND tenant = $2 FOR UPDATE)
             UPDATE waits w SET state = $3, updated_at = $4, seq = w.seq + 1
             FROM old
             WHERE w.id = old.id AND w.status = 'running' AND w.state IS DISTINCT FROM $3
             RETURNING w.seq, old.state",
        )
        .bind(id)
        .bind(tenant)
        .bind(state)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((seq, from)) = row else {
            tx.commit().await?;
            return Ok(false);
        };
        let (kind, data) = event(from);
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
}
