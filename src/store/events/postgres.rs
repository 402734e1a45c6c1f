//! Events on Postgres: the sequencer that gives them their global cursor and
//! announces them, and the reads of a wait's history and of the global feed.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::bus::notice::{self, Notice};
use crate::model::{Event, EventBody};
use crate::store::postgres::{EVENTS_CHANNEL, PgDialect, SEQUENCER_LOCK, labels_json};
use crate::store::{EventRow, FeedRow, StoreError};

impl PgDialect {
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

    pub(in crate::store) async fn events(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<EventRow>, StoreError> {
        // The tenant is checked on the wait's own events, after they are found by
        // `(wait_id, seq)`: as a condition beside the others, the planner (with
        // statistics older than the table's growth) also read `wait_events_tenant_gid`
        // for every event of the tenant and intersected the two, 14 to 22 ms a read
        // at 400,000 events where this takes a few hundred microseconds. Every event
        // of a wait is its tenant's, so the answer is the same.
        let rows: Vec<EventRow> = sqlx::query_as(
            "SELECT id, seq, wait_id, kind, at, data FROM (
                 SELECT gid AS id, seq, wait_id, kind, at, data, tenant FROM wait_events
                 WHERE wait_id = $1 AND seq > $3 ORDER BY seq LIMIT $4) e
             WHERE tenant = $2 ORDER BY seq",
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

    pub(in crate::store) async fn feed(
        &self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<FeedRow>, StoreError> {
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

    pub(in crate::store) async fn last_event_id(
        &self,
        tenant: Option<&str>,
    ) -> Result<i64, StoreError> {
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
}

/// A sequenced event: wait, gid, seq, kind, time, fields.
type Sequenced = (Uuid, i64, i32, String, DateTime<Utc>, Value);

/// Gives every committed event without a global cursor one (and, inside `tx`, the
/// events `tx` itself wrote), and queues the notices, which go out at commit: one
/// per wait on the events channel. The caller holds [`SEQUENCER_LOCK`] until its
/// commit.
pub(in crate::store) async fn sequence_in(
    tx: &mut Transaction<'_, Postgres>,
) -> Result<usize, StoreError> {
    let done: Vec<Sequenced> = sqlx::query_as(
        "WITH base AS (SELECT COALESCE(max(gid), 0) AS b FROM wait_events),
              pending AS (SELECT id, row_number() OVER (ORDER BY id) AS rn
                          FROM wait_events WHERE gid IS NULL ORDER BY id LIMIT 10000)
         UPDATE wait_events e SET gid = base.b + pending.rn
         FROM base, pending WHERE e.id = pending.id
         RETURNING e.wait_id, e.gid, e.seq, e.kind, e.at, e.data",
    )
    // Planned at each run, as the fenced batches are (store/leases/slots.rs): a
    // plan kept from when `wait_events` was small hash-joined the pending events
    // with a read of every event, 150 to 300 ms a run at 200,000 events.
    .persistent(false)
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
