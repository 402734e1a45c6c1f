//! The worker's leases: claiming waits, the replica's lease row, checkpoints
//! and releases, and forgetting replicas long gone. On the lease pool.

use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{CHECKPOINT_CHUNK, PgDialect, WORK_CHANNEL};
use crate::store::{CheckpointRow, ClaimRow, StoreError, WaitEpoch};

/// How long past its due time a wait waits for the replica its placement gives
/// it before any replica claims it.
pub(in crate::store) const PLACEMENT_GRACE: Duration = Duration::from_secs(2);

impl PgDialect {
    /// Claims up to `limit` running waits that are due within `lookahead` and unowned
    /// or owned by a replica whose lease has run out. The same statement gives
    /// `owner` a lease row if it has none yet, so a wait is never owned by a replica
    /// without one; it does not extend an existing lease (only renewals do, so a
    /// dead replica's lease runs out at most one TTL after its last renewal).
    ///
    /// A lapsed replica's waits are read per replica in `claim_at` order from
    /// `waits_owner` (`owner`, `claim_at`), so a batch reads the rows it takes,
    /// not every wait the dead replica still holds.
    ///
    /// Of several replicas alive, each claims the waits whose placement falls to
    /// it (placement modulo the replicas alive, against its rank among them by
    /// id), so the waits of one tenant on one URL are held together and share
    /// their polls; a wait without a placement, or overdue by [`PLACEMENT_GRACE`]
    /// (its replica is full, or has just died), goes to any.
    pub(in crate::store) async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<ClaimRow>, StoreError> {
        Ok(sqlx::query_as(
            "WITH me AS (
                 INSERT INTO replicas (id, lease_until) VALUES ($1, now() + $2)
                 ON CONFLICT (id) DO NOTHING),
             alive AS MATERIALIZED (
                 SELECT count(*) AS n, count(*) FILTER (WHERE id < $1) AS rank,
                        coalesce(bool_or(id = $1), false) AS listed
                 FROM replicas WHERE lease_until > now()),
             unowned AS MATERIALIZED (
                 SELECT id FROM waits
                 WHERE status = 'running' AND owner IS NULL AND claim_at <= now() + $3
                   AND (placement IS NULL OR claim_at < now() - $5
                        OR (SELECT n < 2 OR NOT listed FROM alive)
                        OR placement % (SELECT n FROM alive) = (SELECT rank FROM alive))
                 ORDER BY claim_at
                 LIMIT $4
                 FOR UPDATE SKIP LOCKED),
             orphaned AS MATERIALIZED (
                 SELECT o.id FROM (SELECT id FROM replicas WHERE lease_until <= now() AND id <> $1) r,
                 LATERAL (
                     SELECT id, claim_at FROM waits
                     WHERE owner = r.id AND status = 'running' AND claim_at <= now() + $3
                       AND (placement IS NULL OR claim_at < now() - $5
                            OR (SELECT n < 2 OR NOT listed FROM alive)
                            OR placement % (SELECT n FROM alive) = (SELECT rank FROM alive))
                     ORDER BY claim_at
                     LIMIT $4
                     FOR UPDATE SKIP LOCKED) o
                 ORDER BY o.claim_at
                 LIMIT $4),
             due AS (SELECT id FROM unowned UNION ALL SELECT id FROM orphaned LIMIT $4)
             UPDATE waits w SET owner = $1, epoch = w.epoch + 1, claim_at = w.next_poll_at
             FROM due, wait_specs s
             WHERE w.id = due.id AND s.wait_id = w.id
             RETURNING w.id, w.epoch, w.claims, w.tenant, w.engine, w.next_poll_at, w.deadline, s.spec, s.headers, s.trace",
        )
        .bind(owner)
        .bind(ttl)
        .bind(lookahead)
        .bind(limit)
        .bind(PLACEMENT_GRACE)
        .fetch_all(&self.lease_pool)
        .await?)
    }

    /// Every running wait `owner` owns, with its epoch (a full renewal compares them
    /// with what it holds).
    pub(in crate::store) async fn owned(&self, owner: Uuid) -> Result<Vec<WaitEpoch>, StoreError> {
        let rows: Vec<(Uuid, i64)> =
            sqlx::query_as("SELECT id, epoch FROM waits WHERE owner = $1 AND status = 'running'")
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

    /// Writes the last checkpoints and gives the waits up, so another replica can
    /// take them over at once (graceful shutdown, or waits this replica let go).
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
            "UPDATE waits w SET owner = CASE WHEN $8 THEN NULL ELSE w.owner END,
                    engine = CASE WHEN u.polls > w.polls THEN u.engine::jsonb ELSE w.engine END,
                    polls = GREATEST(w.polls, COALESCE(u.polls, w.polls)),
                    retries = CASE WHEN u.polls > w.polls THEN u.retries ELSE w.retries END,
                    next_poll_at = CASE WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    claim_at = CASE WHEN NOT $8 THEN w.claim_at
                                    WHEN u.polls > w.polls THEN u.next_poll_at ELSE w.next_poll_at END,
                    updated_at = CASE WHEN u.polls > w.polls THEN now() ELSE w.updated_at END,
                    claims = CASE WHEN u.polls > w.polls THEN 0 ELSE w.claims END
             FROM unnest($2::uuid[], $3::bigint[], $4::text[], $5::int[], $6::int[], $7::timestamptz[],
                         array_fill($1::uuid, ARRAY[cardinality($2::uuid[])]),
                         array_fill('running'::text, ARRAY[cardinality($2::uuid[])]))
                  AS u(id, epoch, engine, polls, retries, next_poll_at, owner, running)
             WHERE w.id = u.id AND w.owner IS NOT DISTINCT FROM u.owner AND w.epoch = u.epoch AND w.status = u.running",
        )
        .bind(owner)
        .bind(ids)
        .bind(epochs)
        .bind(engines)
        .bind(polls)
        .bind(retries)
        .bind(nexts)
        .bind(release)
        .execute(&self.lease_pool)
        .await?
        .rows_affected();
        Ok(n)
    }

    /// Forgets replicas gone for a day that own nothing (the lease condition is
    /// checked again under the row lock, so a replica that claims at that moment
    /// keeps its row).
    pub(in crate::store) async fn maintain(&self) -> Result<(), StoreError> {
        sqlx::query(
            "DELETE FROM replicas r WHERE r.lease_until < now() - interval '1 day'
               AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = r.id AND w.status = 'running')",
        )
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }
}
