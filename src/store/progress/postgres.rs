//! Progress on Postgres: first polls counted, and batches of waits' progress written with
//! their events.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::store::events::postgres::sequence_in;
use crate::store::leases::slots::{fence, fenced};
use crate::store::postgres::{PgDialect, SEQUENCER_LOCK};
use crate::store::{ProgressRow, StoreError, WaitEpoch};

impl PgDialect {
    /// One statement for every first poll due at once (`begun`: one more poll begun)
    /// or completed unchanged (its count back to 0); the fences travel in the
    /// batch, as in [`PgDialect::record`].
    pub(in crate::store) async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        let (id, epoch): (Vec<Uuid>, Vec<i64>) = ids.iter().map(|w| (w.id, w.epoch)).unzip();
        let rows: Vec<(Uuid,)> = sqlx::query_as(concat!(
            fence!(
                "unnest($2::uuid[], $3::bigint[],
                        array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                 AS u(id, epoch, running)",
                "$2"
            ),
            "UPDATE waits w SET claims = CASE WHEN $4 THEN w.claims + 1 ELSE 0 END
             FROM cur u, fence f
             WHERE w.id = u.id AND w.status = u.running AND ",
            fenced!(),
            "
             RETURNING w.id"
        ))
        .bind(owner)
        .bind(id)
        .bind(epoch)
        .bind(begun)
        .persistent(false)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// Many waits' progress in one transaction: one statement updates the rows
    /// (each fenced by its slot and token, see [`super::slots`]), inserts the events
    /// of the rows that were still this owner's and, when there are events, tries the
    /// sequencer's lock; a second and third sequence them and announce them when the
    /// lock was free. Each statement is a round trip that an end's webhook and its
    /// followers wait for, on a machine that may be busy with other tenants' work.
    ///
    /// The fences (token, `running`) are columns of the batch rather than
    /// conditions on `waits` alone. Without statistics on `waits` (a new database,
    /// before autovacuum's first analyze), the planner took `owner = $1 AND status =
    /// 'running'` for one row, scanned every wait the replica owns and matched each
    /// against the whole batch: 4.7 s for 100 rows among 100,000 waits. With nothing
    /// to filter `waits` by but the join, it looks each batch row up by primary key,
    /// whatever the statistics say (3 ms).
    ///
    /// The slot fence is written `IS NOT DISTINCT FROM` (the same answer here, since
    /// a fenced slot's id is never null) so that it cannot be an index condition:
    /// with statistics taken while the waits were unowned, the planner otherwise
    /// drove the join from `waits_owner` (`owner = …`, thought to match one row)
    /// and scanned every wait the replica owns for each batch row: 30 s for a batch
    /// of a few hundred among a million waits, measured by the scale benchmark.
    /// Each batch row is looked up by primary key instead.
    ///
    /// An event's `seq` is its wait's new `seq` less the number of its events after
    /// it in the batch. The events are inserted in batch order, so ids (and so gids) follow
    /// each wait's `seq`. The lock is tried in this statement but the events are
    /// sequenced by the next one: its snapshot is taken after the lock is held, so
    /// it sees every event an earlier holder numbered.
    pub(in crate::store) async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        batch: &[ProgressRow],
    ) -> Result<Vec<bool>, StoreError> {
        let c = RecordColumns::of(batch);
        let e = EventColumns::of(batch);
        let mut tx = self.pool.begin().await?;
        let rows: Vec<(Uuid, bool, bool)> = sqlx::query_as(
            concat!(fence!(
                "unnest($3::uuid[], $4::bigint[], $5::text[], $6::text[], $7::text[], $8::text[],
                        $9::text[], $10::int[], $11::int[], $12::text[], $13::timestamptz[], $14::int[],
                        array_fill('running'::text, ARRAY[cardinality($3::uuid[])]), $20::text[])
                 AS u(id, epoch, status, state, reason, detail, last_error, polls, retries, engine,
                      next_poll_at, n_events, running, output)",
                "$3"
            ), ",
             written AS (
                UPDATE waits w SET status = u.status, state = COALESCE(u.state, w.state), reason = u.reason,
                    error_detail = u.detail::jsonb, output = u.output::jsonb, last_error = u.last_error, polls = u.polls,
                    retries = u.retries, engine = u.engine::jsonb, next_poll_at = u.next_poll_at,
                    updated_at = $2,
                    finished_at = CASE WHEN u.status = 'running' THEN NULL ELSE $2 END,
                    owner = CASE WHEN u.status = 'running' THEN w.owner ELSE NULL END,
                    seq = w.seq + u.n_events, claims = 0
                FROM cur u, fence f
                WHERE w.id = u.id AND w.status = u.running AND ", fenced!(), "
                RETURNING w.id, w.seq, w.tenant),
             added AS (
                INSERT INTO wait_events (wait_id, seq, tenant, kind, at, data)
                SELECT e.wait_id, x.seq + e.k, x.tenant, e.kind, $2, e.data::jsonb
                FROM unnest($15::uuid[], $16::int[], $17::text[], $18::text[])
                     WITH ORDINALITY AS e(wait_id, k, kind, data, ord)
                JOIN written x ON x.id = e.wait_id
                ORDER BY e.ord
                RETURNING 1),
             lock AS (
                SELECT CASE WHEN EXISTS (SELECT 1 FROM added)
                            THEN pg_try_advisory_xact_lock($19) END AS locked
                OFFSET 0)
             SELECT x.id, l.locked IS NOT NULL, COALESCE(l.locked, false)
             FROM written x, lock l"),
        )
        .bind(owner)
        .bind(now)
        .bind(&c.id)
        .bind(&c.epoch)
        .bind(&c.status)
        .bind(&c.state)
        .bind(&c.reason)
        .bind(&c.detail)
        .bind(&c.last_error)
        .bind(&c.polls)
        .bind(&c.retries)
        .bind(&c.engine)
        .bind(&c.next)
        .bind(&c.n_events)
        .bind(&e.wait_id)
        .bind(&e.k)
        .bind(&e.kind)
        .bind(&e.data)
        .bind(SEQUENCER_LOCK)
        .bind(&c.output)
        .persistent(false)
        .fetch_all(&mut *tx)
        .await?;
        let any_events = rows.first().is_some_and(|(_, tried, _)| *tried);
        let locked = rows.first().is_some_and(|(_, _, locked)| *locked);
        // When no sequencer is running, these events get their cursor in this
        // transaction: one commit, not two, before followers hear of them. The lock
        // is held to the commit, so cursors still become visible in order; a writer
        // that finds it taken leaves its events to the sequencer and goes on.
        if locked {
            sequence_in(&mut tx).await?;
        }
        tx.commit().await?;
        if any_events && !locked {
            self.committed.notify_one();
        }
        let written: HashSet<Uuid> = rows.into_iter().map(|(id, _, _)| id).collect();
        Ok(c.id.iter().map(|id| written.contains(id)).collect())
    }
}

/// The columns of [`PgDialect::record`]'s update, one entry per wait.
#[derive(Default)]
struct RecordColumns {
    id: Vec<Uuid>,
    epoch: Vec<i64>,
    status: Vec<&'static str>,
    state: Vec<Option<String>>,
    reason: Vec<Option<String>>,
    detail: Vec<Option<String>>,
    output: Vec<Option<String>>,
    last_error: Vec<Option<String>>,
    polls: Vec<i32>,
    retries: Vec<i32>,
    engine: Vec<String>,
    next: Vec<Option<DateTime<Utc>>>,
    n_events: Vec<i32>,
}

impl RecordColumns {
    fn of(batch: &[ProgressRow]) -> RecordColumns {
        let mut c = RecordColumns::default();
        for p in batch {
            c.id.push(p.id);
            c.epoch.push(p.epoch);
            c.status.push(p.status);
            c.state.push(p.state.clone());
            c.reason.push(p.reason.clone());
            c.detail.push(p.detail.as_ref().map(Value::to_string));
            c.output.push(p.output.as_ref().map(Value::to_string));
            c.last_error.push(p.last_error.clone());
            c.polls.push(p.polls);
            c.retries.push(p.retries);
            c.engine.push(p.engine.clone());
            c.next.push(p.next_poll_at);
            c.n_events.push(p.events.len() as i32);
        }
        c
    }
}

/// The columns of [`PgDialect::record`]'s event insert, one entry per event of the
/// batch, each with its place among its wait's events in the batch, counted back
/// from the wait's last: 0 for the last, -1 for the one before, and so on.
#[derive(Default)]
struct EventColumns {
    wait_id: Vec<Uuid>,
    k: Vec<i32>,
    kind: Vec<&'static str>,
    data: Vec<String>,
}

impl EventColumns {
    fn of(batch: &[ProgressRow]) -> EventColumns {
        let mut e = EventColumns::default();
        for p in batch {
            let n = p.events.len() as i32;
            for (k, (kind, data)) in p.events.iter().enumerate() {
                e.wait_id.push(p.id);
                e.k.push(k as i32 + 1 - n);
                e.kind.push(kind);
                e.data.push(data.to_string());
            }
        }
        e
    }
}
