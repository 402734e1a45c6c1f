//! Slots: what a replica holds its waits through on Postgres, and only there
//! (docs/replicas.md §6.2). A wait's `owner` names a slot; a replica holds slots, and a wait is
//! its holder's. A wait enters one of its claimer's slots when first claimed,
//! and stays in it: taking a dead replica's waits over is taking its slots
//! (a few rows) and reading their waits, without writing one of them.
//!
//! Every fenced write carries, per wait, a token: the wait's own epoch (one more
//! at every claim of the row) in the high 32 bits, and the gen its slot is held
//! under (one more at every change of holder) in the low 32. The write locks the
//! slots it names `FOR SHARE` and checks that this replica holds them under
//! those gens; a takeover locks a slot `FOR UPDATE` (skipping it while a write
//! holds it), so a write either commits before the takeover reads the slot's
//! waits or finds the slot no longer its writer's.

use std::time::Duration;

use uuid::Uuid;

use crate::store::postgres::{PgDialect, WORK_CHANNEL};
use crate::store::{CheckpointRow, ClaimRow, StoreError};

/// Slots a replica makes for the waits it claims one by one, when it holds none.
/// Its waits spread over them by placement, so the waits of one request stay in
/// one slot and a takeover keeps them together.
const OWN_SLOTS: i32 = 64;

/// The lock every fenced write takes first, as common table expressions: the
/// batch `$rows` (an `unnest(…) AS u(id, epoch, …)` whose ids are `$ids`) with
/// each wait's slot as it stands (`cur`), and the slots of those that `$1` holds
/// (`fence`), `FOR SHARE`. A takeover cannot change their holder until the write
/// commits, and a write that waited for a takeover sees the new holder. The
/// batch joins `cur u, fence f` (see [`fenced`]).
///
/// The batch and its waits' slots are one relation, so that no plan matches
/// each batch row against the whole batch (read apart and joined, they made a
/// nested loop of 1,000 × 1,000 rows for a checkpoint chunk: 0.5 s instead of
/// 40 ms). The waits are found by `id = ANY($ids)`, which no plan answers by
/// reading every wait. The statements that use it are planned at each run
/// ([`sqlx::query::Query::persistent`] off): a plan kept from when `waits` was
/// small (on a new database, or with autovacuum off) read every wait for each
/// batch, whatever the table had grown to.
macro_rules! fence {
    ($rows:literal, $ids:literal) => {
        concat!(
            "WITH cur AS MATERIALIZED (
                 SELECT u.*, x.owner AS slot FROM ",
            $rows,
            " JOIN waits x ON x.id = u.id WHERE x.id = ANY(",
            $ids,
            "::uuid[])),
             fence AS MATERIALIZED (
                 SELECT id, gen FROM slots WHERE holder = $1 AND id IN (SELECT slot FROM cur)
                 FOR SHARE) "
        )
    };
}
/// The condition that joins a batch row `u` of `cur` (its token in `u.epoch`)
/// and its wait `w` to the slot `f` it is held in: each batch row meets one slot
/// (joined on the slot's id, not on its gen, which many slots share). `IS NOT
/// DISTINCT FROM` cannot be an index condition, so the planner looks each batch
/// row up by primary key rather than walking `waits_owner` (see
/// [`PgDialect::record`]).
macro_rules! fenced {
    () => {
        "f.id = u.slot AND f.gen = (u.epoch & 4294967295)
         AND w.owner IS NOT DISTINCT FROM f.id AND w.epoch = (u.epoch >> 32)"
    };
}
pub(in crate::store) use {fence, fenced};

impl PgDialect {
    /// Makes slots of `owner`'s own when it holds none (its first claim, or every
    /// slot it held was taken over while its lease had run out). True when it did.
    pub(super) async fn enlist(&self, owner: Uuid) -> Result<bool, StoreError> {
        let made = sqlx::query(
            "INSERT INTO slots (id, holder)
             SELECT gen_random_uuid(), $1 FROM generate_series(1, $2)
             WHERE NOT EXISTS (SELECT 1 FROM slots WHERE holder = $1)",
        )
        .bind(owner)
        .bind(OWN_SLOTS)
        .execute(&self.lease_pool)
        .await?
        .rows_affected();
        Ok(made > 0)
    }

    /// Takes one slot that nobody holds (released, or its holder's lease ran out),
    /// and reads every running wait in it. Of several replicas alive, each takes
    /// the slots whose hash falls to it (as waits by placement, §6.2), unless the
    /// slot has been free for `grace`. A slot taken from a holder whose lease ran
    /// out counts one more claim (the crash-loop guard); a slot with no running
    /// wait left is deleted instead. `None` when there is none to take.
    pub(super) async fn adopt(
        &self,
        owner: Uuid,
        grace: Duration,
    ) -> Result<Option<Vec<ClaimRow>>, StoreError> {
        let taken: Option<(Uuid, i64, i32)> = sqlx::query_as(
            "WITH alive AS MATERIALIZED (
                 SELECT count(*) AS n, count(*) FILTER (WHERE id < $1) AS rank,
                        coalesce(bool_or(id = $1), false) AS listed
                 FROM replicas WHERE lease_until > now()),
             free AS (
                 SELECT s.id, s.holder IS NOT NULL AS lapsed
                 FROM slots s LEFT JOIN replicas r ON r.id = s.holder
                 WHERE s.holder IS DISTINCT FROM $1
                   AND (s.holder IS NULL OR r.lease_until IS NULL OR r.lease_until <= now())
                   AND (coalesce(s.released_at, r.lease_until, '-infinity') < now() - $2
                        OR (SELECT n < 2 OR NOT listed FROM alive)
                        OR abs(hashtext(s.id::text)::bigint) % (SELECT n FROM alive) = (SELECT rank FROM alive))
                 LIMIT 1
                 FOR UPDATE OF s SKIP LOCKED)
             UPDATE slots s SET holder = $1, gen = s.gen + 1, claims = s.claims + free.lapsed::int,
                    released_at = NULL
             FROM free WHERE s.id = free.id
             RETURNING s.id, s.gen, s.claims",
        )
        .bind(owner)
        .bind(grace)
        .fetch_optional(&self.lease_pool)
        .await?;
        let Some((slot, held_as, claims)) = taken else {
            return Ok(None);
        };
        let rows: Vec<ClaimRow> = sqlx::query_as(
            "SELECT w.id, (w.epoch << 32) | $2 AS epoch, w.claims, w.tenant, w.engine, w.next_poll_at,
                    w.deadline, s.spec, s.headers, s.trace, $1 AS slot, $3 AS slot_claims, false AS counted
             FROM waits w JOIN wait_specs s ON s.wait_id = w.id
             WHERE w.owner = $1 AND w.status = 'running'",
        )
        .bind(slot)
        .bind(held_as)
        .bind(claims)
        // On the main pool: the lease pool's two connections stay free for
        // renewals while slots are read.
        .fetch_all(&self.pool)
        .await?;
        if rows.is_empty() {
            // Nothing left in it: no replica needs it again.
            sqlx::query(
                "DELETE FROM slots s WHERE s.id = $1 AND s.holder = $2
                   AND NOT EXISTS (SELECT 1 FROM waits w WHERE w.owner = s.id AND w.status = 'running')",
            )
            .bind(slot)
            .bind(owner)
            .execute(&self.lease_pool)
            .await?;
        }
        Ok(Some(rows))
    }

    /// The waits of a slot taken from a holder that died have all been polled
    /// once since: its count of such takeovers goes back to 0.
    pub(in crate::store) async fn settle(
        &self,
        owner: Uuid,
        slot: Uuid,
        token: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE slots SET claims = 0 WHERE id = $1 AND holder = $2 AND gen = ($3 & 4294967295)",
        )
        .bind(slot)
        .bind(owner)
        .bind(token)
        .execute(&self.lease_pool)
        .await?;
        Ok(())
    }

    /// Writes the checkpoints that carry a state, then gives up every slot
    /// `owner` holds, so another replica takes their waits over at once, with
    /// none of them written (graceful shutdown).
    pub(in crate::store) async fn hand_over(
        &self,
        owner: Uuid,
        held: &[CheckpointRow],
    ) -> Result<u64, StoreError> {
        self.write_all_checkpoints(owner, held).await?;
        let given: Vec<(Uuid,)> = sqlx::query_as(
            "UPDATE slots SET holder = NULL, released_at = now() WHERE holder = $1 RETURNING id",
        )
        .bind(owner)
        .fetch_all(&self.lease_pool)
        .await?;
        let given: Vec<Uuid> = given.into_iter().map(|(id,)| id).collect();
        let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM waits WHERE owner = ANY($1) AND status = 'running'",
        )
        .bind(&given)
        .fetch_one(&self.lease_pool)
        .await?;
        // Tell the other replicas there is work to claim.
        sqlx::query("SELECT pg_notify($1, 'released')")
            .bind(WORK_CHANNEL)
            .execute(&self.lease_pool)
            .await?;
        Ok(n as u64)
    }
}
