//! Events on SQLite: appending them, numbered as they are written, and the reads
//! of a wait's history and of the global feed.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use crate::bus::Notice;
use crate::model::{Event, EventBody};
use crate::store::sqlite::{SqliteDialect, at, ms};
use crate::store::{EventRow, FeedRow, StoreError};

impl SqliteDialect {
    pub(in crate::store) async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT id, seq, wait_id, kind, at, data FROM wait_events
             WHERE wait_id = ? AND tenant = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(wait_id)
        .bind(tenant)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    pub(in crate::store) async fn global_events(
        &self,
        tenant: &str,
        after: i64,
        labels: &BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        let mut sql = String::from(
            "SELECT e.id, e.seq, e.wait_id, e.kind, e.at, e.data FROM wait_events e
             JOIN waits w ON w.id = e.wait_id WHERE e.tenant = ? AND e.id > ?",
        );
        for _ in labels {
            sql.push_str(" AND json_extract(w.labels, ?) = ?");
        }
        sql.push_str(" ORDER BY e.id LIMIT ?");
        let mut q = sqlx::query_as::<_, EventRow>(sqlx::AssertSqlSafe(sql))
            .bind(tenant)
            .bind(after);
        for (k, v) in labels {
            q = q.bind(format!("$.\"{k}\"")).bind(v);
        }
        let rows = q.bind(limit).fetch_all(&self.pool).await?;
        Ok(rows)
    }

    pub(in crate::store) async fn feed(
        &self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<FeedRow>, StoreError> {
        let rows: Vec<FeedRow> = sqlx::query_as(
            "SELECT e.id, e.seq, e.wait_id, e.kind, e.at, e.data, e.tenant, w.labels
             FROM wait_events e JOIN waits w ON w.id = e.wait_id
             WHERE e.id > ? ORDER BY e.id LIMIT ?",
        )
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows)
    }

    pub(in crate::store) async fn last_event_id(
        &self,
        tenant: Option<&str>,
    ) -> Result<i64, StoreError> {
        let (n,): (Option<i64>,) =
            sqlx::query_as("SELECT max(id) FROM wait_events WHERE (? IS NULL OR tenant = ?)")
                .bind(tenant)
                .bind(tenant)
                .fetch_one(&self.pool)
                .await?;
        Ok(n.unwrap_or(0))
    }
}

/// Appends events numbered from `seq_before + 1`; the notice announcing them, with
/// them.
pub(in crate::store) async fn append_events(
    tx: &mut Transaction<'_, Sqlite>,
    wait_id: Uuid,
    tenant: &str,
    now: DateTime<Utc>,
    events: &[(&'static str, Value)],
    seq_before: i32,
) -> Result<Option<Notice>, StoreError> {
    let mut appended = Vec::with_capacity(events.len());
    for (i, (kind, data)) in events.iter().enumerate() {
        let seq = seq_before + 1 + i as i32;
        let (gid,): (i64,) = sqlx::query_as(
            "INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data) VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(wait_id)
        .bind(seq)
        .bind(tenant)
        .bind(kind)
        .bind(ms(now))
        .bind(data.to_string())
        .fetch_one(&mut **tx)
        .await?;
        if let Ok(body) = EventBody::from_parts(kind, data.clone()) {
            appended.push(Event {
                id: Some(gid),
                seq,
                wait_id,
                at: at(ms(now)),
                body,
            });
        }
    }
    Ok((!appended.is_empty()).then(|| Notice::announcing(wait_id, appended)))
}
