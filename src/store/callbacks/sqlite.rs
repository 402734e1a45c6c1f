//! Callbacks on SQLite.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::CallbackRow;
use crate::store::StoreError;
use crate::store::sqlite::{SqliteDialect, at, ms};

type Row = (Uuid, String, Vec<u8>, Option<i64>, i64, bool);

fn row((wait_id, tenant, secret_hash, heartbeat, beat_at, judged): Row) -> CallbackRow {
    CallbackRow {
        wait_id,
        tenant,
        secret_hash,
        heartbeat,
        judged,
        beat_at: at(beat_at),
    }
}

impl SqliteDialect {
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
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(wait_id)
        .bind(tenant)
        .bind(hash)
        .bind(heartbeat)
        .bind(ms(now))
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
             WHERE secret_hash = ?",
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
            "UPDATE wait_callbacks SET beat_at = max(beat_at, ?)
             WHERE wait_id = ?
               AND EXISTS (SELECT 1 FROM waits w WHERE w.id = wait_id AND w.status = 'running')",
        )
        .bind(ms(now))
        .bind(wait_id)
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
               AND c.beat_at + c.heartbeat < ?
             LIMIT ?",
        )
        .bind(ms(now))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(row).collect())
    }
}

impl SqliteDialect {
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
        let from: Option<(Option<String>,)> = sqlx::query_as(
            "SELECT state FROM waits WHERE id = ? AND tenant = ? AND status = 'running'
               AND state IS NOT ?",
        )
        .bind(id)
        .bind(tenant)
        .bind(state)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((from,)) = from else {
            tx.commit().await?;
            return Ok(false);
        };
        let (seq,): (i32,) = sqlx::query_as(
            "UPDATE waits SET state = ?, updated_at = ?, seq = seq + 1 WHERE id = ? RETURNING seq",
        )
        .bind(state)
        .bind(ms(now))
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
        let notice = crate::store::events::sqlite::append_events(
            &mut tx,
            id,
            tenant,
            now,
            &[event(from)],
            seq - 1,
        )
        .await?;
        tx.commit().await?;
        self.publish(notice.into_iter().collect());
        Ok(true)
    }
}
