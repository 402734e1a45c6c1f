//! The worker's leases on Postgres: claiming waits, the replica's lease row, checkpoints
//! and releases, and forgetting replicas long gone. On the lease pool.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::slots::{fence, fenced};
use crate::store::postgres::{CHECKPOINT_CHUNK, PgDialect, WORK_CHANNEL};
use crate::store::{CheckpointRow, ClaimRow, StoreError, WaitEpoch};

/// How long past its due time a wait waits for the replica its placement gives
/// it before any replica claims it.
const PLACEMENT_GRACE: Duration = Duration::from_secs(2);

/// Unowned waits one claim statement takes at most: a claim of more (a backlog)
/// runs two statements at once, one on the lease pool and one on the main pool,
/// since a statement is one backend's work and Postgres has more cores.
const CLAIM_STATEMENT: i64 = 1000;

/// Pages of `waits` a claim of a backlog reads at most (32 MiB), from the page of
/// an unowned wait due soon: a backlog's waits are taken in the order they lie in.
/// Where they lie scattered (new rows in the room vacuums left), a claim reads
/// these pages for a few of them and the next claim goes by the index again.
const SWEEP_PAGES: i64 = 4096;

impl PgDialect {
    /// Claims up to `limit` running waits (more when a slot taken holds more):
    /// first unowned waits due within `lookahead`, each put in one of `owner`'s
    /// slots, then whole slots nobody holds ([`PgDialect::adopt`]: a released one,
    /// or a dead replica's). The first statement gives `owner` a lease row if it
    /// has none, so a wait is never held by a replica without one; it does not
    /// extend an existing lease (only renewals do, so a dead replica's lease runs
    /// out at most one TTL after its last renewal).
    ///
    /// Of several replicas alive, each claims the unowned waits whose placement
    /// falls to it (placement modulo the replicas alive, against its rank among
    /// them by id), so the waits of one tenant on one URL are held together and
    /// share their polls; they go to the slot of `owner`'s that their placement
    /// picks, so a takeover keeps them together too. A wait without a placement,
    /// or overdue by [`PLACEMENT_GRACE`] (its replica is full, or has just died),
    /// goes to any.
    pub(in crate::store) async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        let mut rows = if limit > CLAIM_STATEMENT {
            let half = limit / 2;
            let (a, b) = tokio::join!(
                self.claim_unowned(
                    &self.lease_pool,
                    owner,
                    ttl,
                    lookahead,
                    half,
                    false,
                    Some(0)
                ),
                self.claim_unowned(
                    &self.pool,
                    owner,
                    ttl,
                    lookahead,
                    limit - half,
                    false,
                    Some(half)
                )
            );
            // What one of them took is held even when the other failed.
            match (a, b) {
                (Ok(mut a), Ok(b)) => {
                    a.extend(b);
                    a
                }
                (Ok(rows), Err(e)) | (Err(e), Ok(rows)) if !rows.is_empty() => {
                    tracing::debug!(error = %e, "one of two claims failed");
                    rows
                }
                (Err(e), _) | (_, Err(e)) => return Err(e),
            }
        } else {
            self.claim_unowned(&self.lease_pool, owner, ttl, lookahead, limit, false, None)
                .await?
        };
        // A replica that holds no slot (its first claim) makes its own, and claims
        // the waits it could not put anywhere then, as a first claim does (any).
        if self.enlist(owner).await? {
            let first = limit.min(CLAIM_STATEMENT);
            rows = self
                .claim_unowned(&self.lease_pool, owner, ttl, lookahead, first, true, None)
                .await?;
        }
        // Two slots at once: reading a slot's waits is most of a takeover's
        // time in Postgres, one backend's work, and two use both of its cores.
        while (rows.len() as i64) < limit {
            let (a, b) = tokio::join!(
                self.adopt(owner, PLACEMENT_GRACE),
                self.adopt(owner, PLACEMENT_GRACE)
            );
            let (mut took, mut failed) = (false, None);
            for r in [a, b] {
                match r {
                    Ok(Some(slot)) => {
                        took = true;
                        rows.extend(slot);
                    }
                    Ok(None) => {}
                    Err(e) => failed = Some(e),
                }
            }
            // What one of them took is held even when the other failed: its
            // slot is this replica's now.
            match failed {
                Some(e) if rows.is_empty() => return Err(e),
                Some(_) => break,
                None if !took => break,
                None => {}
            }
        }
        Ok(rows)
    }

    /// Claims up to `limit` unowned waits due within `lookahead` into `owner`'s
    /// slots (none when it holds none). The statement gives `owner` a lease row if
    /// it has none, and takes any wait on a replica's `first` claim (or while it is
    /// not among the alive).
    ///
    /// With `sweep`, the waits are taken in the order they lie in the table, not in
    /// the order they fall due: from the page of the `sweep`-th unowned wait to fall
    /// due, through the next [`SWEEP_PAGES`] pages. A backlog is claimed so (one
    /// whose waits were inserted in another order than they fall due touches a page
    /// of `waits` and writes it whole to the WAL for each wait taken in due order,
    /// and walks past the index entries of those already taken); a claim of a few
    /// waits is not (it would read the pages for nothing).
    #[allow(clippy::too_many_arguments)]
    async fn claim_unowned(
        &self,
        pool: &sqlx::PgPool,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
        first: bool,
        sweep: Option<i64>,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        // Which unowned waits this replica takes: its placement's, or any.
        macro_rules! takes {
            () => {
                "status = 'running' AND owner IS NULL AND claim_at <= now() + $3
                 AND (placement IS NULL OR claim_at < now() - $5
                      OR (SELECT n < 2 OR NOT listed FROM alive) OR $6
                      OR placement % (SELECT n FROM alive) = (SELECT rank FROM alive))"
            };
        }
        macro_rules! claim {
            ($due:expr) => {
                concat!(
                    "WITH me AS (
                         INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
                         ON CONFLICT (id) DO NOTHING),
                     alive AS MATERIALIZED (
                         SELECT count(*) AS n, count(*) FILTER (WHERE id < $1) AS rank,
                                coalesce(bool_or(id = $1), false) AS listed
                         FROM replicas WHERE lease_until > now()),
                     held AS MATERIALIZED (SELECT id, gen FROM slots WHERE holder = $1 FOR SHARE),
                     mine AS MATERIALIZED (
                         SELECT array_agg(id ORDER BY id) AS ids, array_agg(gen ORDER BY id) AS gens FROM held), ",
                    $due,
                    ", pick AS (
                         SELECT due.id, due.counted,
                                1 + (abs(coalesce(due.placement, hashtext(due.id::text)::bigint))
                                     % cardinality(mine.ids))::int AS i
                         FROM due, mine)
                     UPDATE waits w SET owner = mine.ids[pick.i], epoch = w.epoch + 1, claim_at = w.next_poll_at,
                            claims = w.claims + pick.counted::int
                     FROM pick, mine, wait_specs s
                     WHERE w.id = pick.id AND s.wait_id = w.id
                     RETURNING w.id, (w.epoch << 32) | mine.gens[pick.i] AS epoch,
                               w.claims - pick.counted::int AS claims, w.tenant, w.engine,
                               w.next_poll_at, w.deadline, s.spec, s.headers, s.trace,
                               NULL::uuid AS slot, 0 AS slot_claims, pick.counted"
                )
            };
        }
        const IN_DUE_ORDER: &str = claim!(concat!(
            "due AS MATERIALIZED (
                 SELECT id, placement, (claims > 0 AND coalesce(next_poll_at <= now(), false)) AS counted FROM waits
                 WHERE ",
            takes!(),
            " AND (SELECT cardinality(ids) > 0 FROM mine)
                 ORDER BY claim_at
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED)"
        ));
        // The pages are a TID range (a scan of those pages only); the first is
        // found by the index of unowned waits.
        const IN_TABLE_ORDER: &str = claim!(concat!(
            "seed AS MATERIALIZED (
                 SELECT (ctid::text::point)[0]::bigint AS page FROM waits WHERE ",
            takes!(),
            " ORDER BY claim_at OFFSET $7 LIMIT 1),
             due AS MATERIALIZED (
                 SELECT id, placement, (claims > 0 AND coalesce(next_poll_at <= now(), false)) AS counted FROM waits
                 WHERE ctid >= format('(%s,0)', coalesce((SELECT page FROM seed), 0))::tid
                   AND ctid < format('(%s,0)', coalesce((SELECT page FROM seed) + $8, 0))::tid AND ",
            takes!(),
            " AND (SELECT cardinality(ids) > 0 FROM mine)
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED)"
        ));
        let q = sqlx::query_as(if sweep.is_some() {
            IN_TABLE_ORDER
        } else {
            IN_DUE_ORDER
        })
        .bind(owner)
        .bind(ttl)
        .bind(lookahead)
        .bind(limit)
        .bind(PLACEMENT_GRACE)
        .bind(first);
        let q = match sweep {
            Some(offset) => q.bind(offset).bind(SWEEP_PAGES),
            None => q,
        };
        Ok(q.fetch_all(pool).await?)
    }

    /// Every running wait in the slots `owner` holds, with its token (a full
    /// renewal compares them with what it holds).
    pub(in crate::store) async fn owned(&self, owner: Uuid) -> Result<Vec<WaitEpoch>, StoreError> {
        let rows: Vec<(Uuid, i64)> = sqlx::query_as(
            "SELECT w.id, (w.epoch << 32) | s.gen FROM slots s JOIN waits w ON w.owner = s.id
             WHERE s.holder = $1 AND w.status = 'running'",
        )
        .bind(owner)
        .fetch_all(&self.lease_pool)
        .await?;
        Ok(rows.into_iter().map(WaitEpoch::from).collect())
    }

    /// The checkpoints that carry a state, in chunks (the others only name a wait).
    pub(in crate::store) async fn write_all_checkpoints(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<(), StoreError> {
        let dirty: Vec<&CheckpointRow> = held.iter().filter(|c| c.engine.is_some()).collect();
        for chunk in dirty.chunks(CHECKPOINT_CHUNK) {
            self.write_checkpoints(owner, chunk, false).await?;
        }
        Ok(())
    }

    /// The replica's one lease row, extended.
    pub(in crate::store) async fn replicas_alive(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM replicas WHERE lease_until > now()")
                .fetch_one(&self.lease_pool)
                .await?,
        )
    }

    pub(in crate::store) async fn renew_lease(
        &self,
        owner: Uuid,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
             ON CONFLICT (id) DO UPDATE SET lease_until = EXCLUDED.lease_until",
        )
        .bind(owner)
        .bind(ttl)
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }

    /// Ends `owner`'s lease now and tells the other replicas there is work: what it
    /// released is theirs, whatever its placement.
    pub(in crate::store) async fn retire(&self, owner: Uuid) -> Result<(), StoreError> {
        sqlx::query(
            "WITH r AS (UPDATE replicas SET lease_until = now() WHERE id = $1)
             SELECT pg_notify($2, 'retired')",
        )
        .bind(owner)
        .bind(WORK_CHANNEL)
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }

    /// Writes the last checkpoints of these waits and takes them out of their
    /// slots, so that any replica claims them again (waits this replica let go).
    pub(in crate::store) async fn release(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<u64, StoreError> {
        if held.is_empty() {
            return Ok(0);
        }
        let all: Vec<&CheckpointRow> = held.iter().collect();
        let mut n = 0;
        for chunk in all.chunks(CHECKPOINT_CHUNK) {
            n += self.write_checkpoints(owner, chunk, true).await?;
        }
        // Tell the other replicas there is work to claim.
        sqlx::query("SELECT pg_notify($1, 'released')")
            .bind(WORK_CHANNEL)
            .execute(&self.lease_pool)
            .await?;
        Ok(n)
    }

    /// One statement for a chunk of checkpoints, fenced by owner and epoch; with
    /// `release`, the waits are given up too. The fences travel in the batch, as in
    /// [`PgDialect::record`], so the update is driven by the batch.
    async fn write_checkpoints(
        &self,
        owner: Uuid,
        chunk: &[&CheckpointRow],
        release: bool,
    ) -> Result<u64, StoreError> {
        let ids: Vec<Uuid> = chunk.iter().map(|c| c.id).collect();
        let epochs: Vec<i64> = chunk.iter().map(|c| c.epoch).collect();
        let engines: Vec<Option<&str>> = chunk.iter().map(|c| c.engine.as_deref()).collect();
        let polls: Vec<Option<i32>> = chunk.iter().map(|c| c.polls).collect();
        let retries: Vec<Option<i32>> = chunk.iter().map(|c| c.retries).collect();
        let nexts: Vec<Option<DateTime<Utc>>> = chunk.iter().map(|c| c.next_poll_at).collect();
        let n = sqlx::query(
            concat!(fence!(
                "unnest($2::uuid[], $3::bigint[], $4::text[], $5::int[], $6::int[], $7::timestamptz[],
                        array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                 AS u(id, epoch, engine, polls, retries, next_poll_at, running)",
                "$2"
            ), "UPDATE waits w SET owner = CASE WHEN $8 THEN NULL ELSE w.owner END,
                    engine = CASE WHEN u.polls > w.polls THEN u.engine::jsonb ELSE w.engine END,
                    polls = GREATEST(w.polls, COALESCE(u.polls, w.polls)),
                    retries = CASE WHEN u.polls > w.polls THEN u.retries ELSE w.retries END,
                    next_poll_at = CASE WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    claim_at = CASE WHEN NOT $8 THEN w.claim_at
                                    WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    updated_at = CASE WHEN u.polls > w.polls THEN now() ELSE w.updated_at END,
                    claims = CASE WHEN u.polls > w.polls THEN 0 ELSE w.claims END
             FROM cur u, fence f
             WHERE w.id = u.id AND w.status = u.running AND ", fenced!()),
        )
        .bind(owner)
        .bind(ids)
        .bind(epochs)
        .bind(engines)
        .bind(polls)
        .bind(retries)
        .bind(nexts)
        .bind(release)
        .persistent(false)
        .execute(&self.lease_pool)
        .await?
        .rows_affected();
        Ok(n)
    }

    /// Forgets slots nobody has held for a day that hold no running wait, then
    /// replicas gone for a day that hold no slot (the conditions are checked again
    /// under the row locks, so a replica that claims at that moment keeps its rows).
    pub(in crate::store) async fn maintain(&self) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM slots s
             WHERE coalesce(s.released_at, '-infinity') < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM replicas r
                               WHERE r.id = s.holder AND r.lease_until > now() - interval '1 day')
               AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = s.id AND w.status = 'running')",
        )
        .execute(&self.lease_pool)
        .await?;
        sqlx::query(
            "DELETE FROM replicas r WHERE r.lease_until < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM slots s WHERE s.holder = r.id)",
        )
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }
}
