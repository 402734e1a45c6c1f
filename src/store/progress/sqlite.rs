//! Progress: first polls counted, and batches of waits' progress written with
//! their events.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use crate::bus::Notice;
use crate::store::events::sqlite::append_events;
use crate::store::sqlite::{SqliteDialect, ms};
use crate::store::{ProgressRow, StoreError, WaitEpoch};

impl SqliteDialect {
    pub(in crate::store) async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut marked = Vec::with_capacity(ids.len());
        for &WaitEpoch { id, epoch } in ids {
            let n = sqlx::query(
                "UPDATE waits SET claims = CASE WHEN ? THEN claims + 1 ELSE 0 END
                 WHERE id = ? AND owner = ? AND epoch = ? AND status = 'running'",
            )
            .bind(begun)
            .bind(id)
            .bind(owner)
            .bind(epoch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 1 {
                marked.push(id);
            }
        }
        tx.commit().await?;
        Ok(marked)
    }

    /// One transaction (one disk sync) for all of them.
    pub(in crate::store) async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        batch: &[ProgressRow],
    ) -> Result<Vec<bool>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut notices = Vec::new();
        let mut written = Vec::with_capacity(batch.len());
        for p in batch {
            let notice = record_one(&mut tx, owner, p, now).await?;
            written.push(notice.is_some());
            notices.extend(notice.flatten());
        }
        tx.commit().await?;
        self.publish(notices);
        Ok(written)
    }
}

/// One wait's progress inside `tx`, fenced by owner and epoch: `None` when the wait
/// is no longer this owner's, else the notice to publish after commit.
async fn record_one(
    tx: &mut Transaction<'_, Sqlite>,
    owner: Uuid,
    p: &ProgressRow,
    now: DateTime<Utc>,
) -> Result<Option<Option<Notice>>, StoreError> {
    let n_events = p.events.len() as i32;
    let row: Option<(i32, String)> = sqlx::query_as(
        "UPDATE waits SET status = ?, state = COALESCE(?, state), reason = ?, error_detail = ?, output = ?, last_error = ?,
                polls = ?, retries = ?, engine = ?, next_poll_at = ?, updated_at = ?,
                finished_at = ?, owner = CASE WHEN ? THEN NULL ELSE owner END,
                seq = seq + ?, claims = 0
         WHERE id = ? AND owner = ? AND epoch = ? AND status = 'running'
         RETURNING seq, tenant",
    )
    .bind(p.status)
    .bind(&p.state)
    .bind(&p.reason)
    .bind(p.detail.as_ref().map(Value::to_string))
    .bind(p.output.as_ref().map(Value::to_string))
    .bind(&p.last_error)
    .bind(p.polls)
    .bind(p.retries)
    .bind(&p.engine)
    .bind(p.next_poll_at.map(ms))
    .bind(ms(now))
    .bind(p.ended.then_some(ms(now)))
    .bind(p.ended)
    .bind(n_events)
    .bind(p.id)
    .bind(owner)
    .bind(p.epoch)
    .fetch_optional(&mut **tx)
    .await?;
    let Some((seq, tenant)) = row else {
        return Ok(None);
    };
    let notice = append_events(tx, p.id, &tenant, now, &p.events, seq - n_events).await?;
    Ok(Some(notice))
}
