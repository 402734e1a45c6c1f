//! The worker pool's side of the store: claims, renewals of the replica's lease,
//! checkpoints, releases and hand-overs, through the [`Leases`] handle, which the
//! worker holds; what its polls write is in [`super::progress`], on the same
//! handle. Every write here is fenced by owner and epoch.
//!
//! On SQLite there are no slots ([`slots`] is Postgres's alone): a replica holds
//! each wait it claimed by its own row (`owner` names the replica), a claim takes
//! a lapsed replica's waits one by one, the token a wait is held under is the
//! epoch of its claim, a hand-over at shutdown is a release, and a slot has no
//! takeovers to settle ([`Leases::settle`] does nothing). The replica's lease is
//! its row in `replicas` on both.

mod postgres;
pub(super) mod slots;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{CheckpointRow, ClaimRow, Core, Dialect, Progress, StoreError, WaitEpoch};
use crate::engine::{EngineState, Spec};

/// A wait the worker pool has just claimed.
#[derive(Clone, Debug)]
pub struct Claimed {
    pub id: Uuid,
    pub epoch: i64,
    /// Polls of this wait begun since one last completed (each by a replica that
    /// then stopped): see [`MAX_CLAIMS`].
    pub claims: i32,
    /// The tenant the wait belongs to: its work takes that tenant's turns on the
    /// CPU pool.
    pub tenant: String,
    pub spec: Spec,
    pub engine: EngineState,
    pub next_poll_at: DateTime<Utc>,
    /// The `traceparent` its polls join.
    pub trace: Option<Box<str>>,
    /// Polled before, by another replica or an earlier run of this one.
    pub resumed: bool,
    /// Its first poll is counted in its own row before it begins ([`MAX_CLAIMS`]):
    /// one whose poll began and never completed, one taken over in a slot whose
    /// holders kept dying ([`SLOT_CLAIMS`]), or on SQLite (which has no slots)
    /// any wait claimed.
    pub count_first_poll: bool,
    /// Its first poll is counted already, by the claim itself (a wait claimed on
    /// its own on Postgres that is already due and whose poll began before
    /// without completing): it starts at once, and only its completion is
    /// recorded.
    pub counted: bool,
    /// Taken over in a slot whose holder died: once every wait taken with it has
    /// been polled, the slot is settled ([`Leases::settle`]).
    pub settles: Option<SlotToken>,
}

/// A slot taken over, and the token its waits were taken under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotToken {
    pub slot: Uuid,
    pub token: i64,
}

/// A slot taken from holders that died this many times in a row, without its
/// waits all polled in between, has the first poll of each of its waits counted
/// one by one: one of them may be what takes its replicas down. A wait claimed on
/// its own goes into a slot of its claimer's, so this guards it too. One death is
/// not enough (a replica dies for many reasons), and counting every wait's first
/// poll would write every row a takeover takes.
pub const SLOT_CLAIMS: i32 = 2;

/// The counters and schedule of a held wait, written in periodic batches.
#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub id: Uuid,
    pub epoch: i64,
    /// `None` when nothing changed since the last checkpoint: only the lease is renewed.
    pub engine: Option<EngineState>,
    pub next_poll_at: Option<DateTime<Utc>>,
}

/// What a renewal found: the named waits no longer the owner's under the epoch
/// they were named with (taken over, or ended elsewhere), and the waits the owner
/// owns without naming them (a claim whose answer never came back: the connection
/// broke after its commit), each with its epoch.
#[derive(Debug, Default, PartialEq)]
pub struct Renewal {
    pub lost: Vec<WaitEpoch>,
    pub strays: Vec<WaitEpoch>,
}

/// The worker pool's leases on waits, and what its polls write. Cloning is
/// shallow.
#[derive(Clone, Debug)]
pub struct Leases {
    pub(super) core: Arc<Core>,
}

impl Leases {
    /// Claims up to `limit` running waits due within `lookahead` that are unowned or
    /// whose owner's lease has run out (epoch + 1). A row this version cannot read is
    /// ended in `error` rather than spun on.
    pub async fn claim(
        &self,
        owner: Uuid,
        ttl: Duration,
        lookahead: Duration,
        limit: i64,
    ) -> Result<Vec<Claimed>, StoreError> {
        let rows = sql!(self.claim(owner, ttl, lookahead, limit))?;
        let decoded = self.decode_all(rows).await;
        let mut claimed = Vec::with_capacity(decoded.len());
        for c in decoded {
            match c {
                Ok(c) => claimed.push(c),
                Err((id, epoch, why)) => {
                    tracing::error!(wait_id = %id, error = %why, "cannot decode a claimed wait; ending it in error");
                    let _ = self
                        .record(owner, Utc::now(), &Progress::undecodable(id, epoch, why))
                        .await;
                }
            }
        }
        Ok(claimed)
    }

    /// The claimed rows decoded, off the async runtime's threads: a slot taken
    /// over brings thousands at once (about 10 µs each), split over the cores.
    async fn decode_all(&self, rows: Vec<ClaimRow>) -> Vec<Result<Claimed, (Uuid, i64, String)>> {
        const SHARE: usize = 1024;
        if rows.len() <= SHARE {
            return rows.iter().map(|r| self.decode_one(r)).collect();
        }
        let parts = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, rows.len().div_ceil(SHARE));
        let per = rows.len().div_ceil(parts);
        let mut rows = rows;
        let mut tasks = Vec::with_capacity(parts);
        while !rows.is_empty() {
            let rest = rows.split_off(per.min(rows.len()));
            let share = std::mem::replace(&mut rows, rest);
            let leases = self.clone();
            tasks.push(tokio::task::spawn_blocking(move || {
                share
                    .iter()
                    .map(|r| leases.decode_one(r))
                    .collect::<Vec<_>>()
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            match t.await {
                Ok(mut part) => out.append(&mut part),
                // A panic in a decode: nothing to end the rows with; the claim
                // sweep finds them owned and not held (strays).
                Err(e) => tracing::error!(error = %e, "decoding claimed waits failed"),
            }
        }
        out
    }

    /// One claimed row as the worker holds it, or why it cannot be read.
    fn decode_one(&self, row: &ClaimRow) -> Result<Claimed, (Uuid, i64, String)> {
        let (spec, engine) = self
            .decode_claim(row)
            .map_err(|why| (row.id, row.epoch, why))?;
        Ok(Claimed {
            resumed: row.slot.is_some() || self.row_epoch(row.epoch) > 1,
            // On Postgres a wait claimed on its own enters a slot, and the slot's
            // count guards its first poll: counting it in the row as well wrote
            // each wait of a backlog two more times (the record, the confirmation).
            count_first_poll: row.claims > 0
                || row.slot_claims >= SLOT_CLAIMS
                || matches!(self.core.db, Dialect::Sqlite(_)),
            counted: row.counted,
            settles: row
                .slot
                .filter(|_| row.slot_claims > 0)
                .map(|slot| SlotToken {
                    slot,
                    token: row.epoch,
                }),
            id: row.id,
            epoch: row.epoch,
            claims: row.claims,
            tenant: row.tenant.clone(),
            next_poll_at: row.next_poll_at.map_or(engine.deadline, |t| t.0),
            spec,
            engine,
            trace: row.trace.as_deref().map(Box::from),
        })
    }

    /// How many times a wait's row was claimed, from the token it is held under
    /// (on Postgres the row's epoch and its slot's gen; on SQLite the epoch).
    fn row_epoch(&self, token: i64) -> i64 {
        match &self.core.db {
            Dialect::Postgres(_) => token >> 32,
            Dialect::Sqlite(_) => token,
        }
    }

    /// A claimed row's stored parts back into a spec (headers restored) and engine state.
    fn decode_claim(&self, row: &ClaimRow) -> Result<(Spec, EngineState), String> {
        let mut spec: Spec =
            serde_json::from_value(row.spec.0.clone()).map_err(|e| format!("spec: {e}"))?;
        if let Some(target) = &mut spec.target {
            target.restore_secrets(self.core.cipher.open(&row.headers.0).map_err(|e| e.0)?);
        }
        let mut engine: EngineState = serde_json::from_value(row.engine.0.clone())
            .map_err(|e| format!("engine state: {e}"))?;
        // A group's deadline may have capped the wait's since its engine began.
        engine.deadline = engine.deadline.min(row.deadline.0);
        Ok((spec, engine))
    }

    /// Renews the owner's lease (one row a replica, however many waits it holds)
    /// and writes `checkpoints`; says which of `named` (every wait the owner holds,
    /// with its epoch) are no longer the owner's under that epoch, and which waits
    /// the owner owns that `named` leaves out.
    ///
    /// The comparison is made here, not by the caller: for a replica holding a
    /// million waits it is a million lookups, which the worker's loop cannot spend.
    pub async fn renew(
        &self,
        owner: Uuid,
        ttl: Duration,
        named: &[WaitEpoch],
        checkpoints: &[Checkpoint],
    ) -> Result<Renewal, StoreError> {
        self.renew_lease(owner, ttl).await?;
        self.compare(owner, named, checkpoints).await
    }

    /// [`Leases::renew`] after its lease row: writes `checkpoints`, then compares
    /// `named` with what the owner owns.
    pub async fn compare(
        &self,
        owner: Uuid,
        named: &[WaitEpoch],
        checkpoints: &[Checkpoint],
    ) -> Result<Renewal, StoreError> {
        self.write_checkpoints(owner, checkpoints).await?;
        let mut owned: std::collections::HashMap<Uuid, i64> = sql!(self.owned(owner))?
            .into_iter()
            .map(|w| (w.id, w.epoch))
            .collect();
        let mut lost = Vec::new();
        for w in named {
            // Under another epoch it was claimed again since it was named: lost
            // under that one (the caller compares epochs), and no stray.
            if owned.remove(&w.id) != Some(w.epoch) {
                lost.push(*w);
            }
        }
        Ok(Renewal {
            lost,
            strays: owned.into_iter().map(WaitEpoch::from).collect(),
        })
    }

    /// Renews the owner's lease and writes `checkpoints` (those that carry a
    /// state), without comparing what it holds with what it owns.
    pub async fn checkpoint(
        &self,
        owner: Uuid,
        ttl: Duration,
        checkpoints: &[Checkpoint],
    ) -> Result<(), StoreError> {
        self.renew_lease(owner, ttl).await?;
        self.write_checkpoints(owner, checkpoints).await
    }

    /// Writes `checkpoints` (those that carry a state), fenced.
    pub async fn write_checkpoints(
        &self,
        owner: Uuid,
        checkpoints: &[Checkpoint],
    ) -> Result<(), StoreError> {
        let rows: Vec<CheckpointRow> = checkpoints.iter().map(CheckpointRow::from).collect();
        sql!(self.write_all_checkpoints(owner, &rows))
    }

    /// How many replicas hold a lease now (this one included, once it has
    /// claimed).
    pub async fn replicas_alive(&self) -> Result<i64, StoreError> {
        sql!(self.replicas_alive())
    }

    /// Renews the owner's lease only: one row, however many waits it holds. The
    /// lease lasts `ttl` on the store's clock and has run out at its end, so a `ttl`
    /// of zero ends it now.
    pub async fn renew_lease(&self, owner: Uuid, ttl: Duration) -> Result<(), StoreError> {
        sql!(self.renew_lease(owner, ttl))
    }

    /// Writes the last checkpoints and gives the leases up, so another replica can
    /// take them over at once; tells the other replicas there is work.
    pub async fn release(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError> {
        let rows: Vec<CheckpointRow> = held.iter().map(CheckpointRow::from).collect();
        sql!(self.release(owner, &rows))
    }

    /// Graceful shutdown: writes the last checkpoints and gives up everything the
    /// replica holds, so another replica takes it over at once. On Postgres the
    /// replica's slots are given up whole and no wait is written but those whose
    /// checkpoint carries a state; on SQLite every wait is given back.
    pub async fn hand_over(&self, owner: Uuid, held: &[Checkpoint]) -> Result<u64, StoreError> {
        let rows: Vec<CheckpointRow> = held.iter().map(CheckpointRow::from).collect();
        match &self.core.db {
            Dialect::Postgres(d) => d.hand_over(owner, &rows).await,
            Dialect::Sqlite(d) => d.release(owner, &rows).await,
        }
    }

    /// Every wait taken over with a slot from a holder that died has been polled
    /// once: the slot's count of such takeovers goes back to 0 (Postgres; SQLite
    /// has no slots).
    pub async fn settle(&self, owner: Uuid, slot: SlotToken) -> Result<(), StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.settle(owner, slot.slot, slot.token).await,
            Dialect::Sqlite(_) => Ok(()),
        }
    }

    /// Ends the replica's lease now, after its last release: it no longer counts
    /// among the replicas alive, so the others claim every wait it gave back,
    /// whatever their placement.
    pub async fn retire(&self, owner: Uuid) -> Result<(), StoreError> {
        sql!(self.retire(owner))
    }

    /// Periodic housekeeping, called on every lease renewal: forgets replicas gone
    /// for a day that own nothing.
    pub async fn maintain(&self) -> Result<(), StoreError> {
        sql!(self.maintain())
    }
}
