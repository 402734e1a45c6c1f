//! What the worker pool asks of the store: claims, the counts of polls begun and
//! completed, progress, renewals of the replica's lease, checkpoints and releases.
//! Every write here is fenced by owner and epoch.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    Checkpoint, CheckpointRow, ClaimRow, Claimed, Dialect, Progress, Renewal, SLOT_CLAIMS,
    SlotToken, Store, StoreError, WaitEpoch,
};
use crate::engine::{EngineState, Spec};

impl Store {
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
            let store = self.clone();
            tasks.push(tokio::task::spawn_blocking(move || {
                share
                    .iter()
                    .map(|r| store.decode_one(r))
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
            count_first_poll: row.slot.is_none()
                || row.claims > 0
                || row.slot_claims >= SLOT_CLAIMS,
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
        match &self.db {
            Dialect::Postgres(_) => token >> 32,
            Dialect::Sqlite(_) => token,
        }
    }

    /// A claimed row's stored parts back into a spec (headers restored) and engine state.
    fn decode_claim(&self, row: &ClaimRow) -> Result<(Spec, EngineState), String> {
        let mut spec: Spec =
            serde_json::from_value(row.spec.0.clone()).map_err(|e| format!("spec: {e}"))?;
        spec.target
            .restore_secrets(self.cipher.open(&row.headers.0).map_err(|e| e.0)?);
        let mut engine: EngineState = serde_json::from_value(row.engine.0.clone())
            .map_err(|e| format!("engine state: {e}"))?;
        // A group's deadline may have capped the wait's since its engine began.
        engine.deadline = engine.deadline.min(row.deadline.0);
        Ok((spec, engine))
    }

    /// Records that a poll of each of these waits (id, epoch) begins, the first
    /// since its claim: it adds one to the wait's `claims`, which a completed poll's
    /// write sets back to 0 ([`MAX_CLAIMS`]). Fenced by owner and epoch; returns
    /// the ids still the owner's.
    pub async fn mark_polling(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.count_polls(owner, ids, true).await
    }

    /// Records that the first poll since the claim of each of these waits (id,
    /// epoch) completed and changed nothing worth an event: their `claims` goes back
    /// to 0, and nothing else is written (the poll count and schedule follow in a
    /// checkpoint). One statement for all of them; a claim of a million waits
    /// writes each row a third time otherwise, with every progress column.
    /// Fenced by owner and epoch; returns the ids still the owner's.
    pub async fn confirm_polled(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.count_polls(owner, ids, false).await
    }

    async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        sql!(self.count_polls(owner, ids, begun))
    }

    /// Writes what one poll changed, fenced by owner and epoch; false when the wait is
    /// no longer this owner's. `now` (the writer's clock) is when it is written: the
    /// wait's `updated_at`, and `finished_at` when it ends.
    pub async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        progress: &Progress,
    ) -> Result<bool, StoreError> {
        Ok(self
            .record_many(owner, now, std::slice::from_ref(progress))
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// [`Store::record`] for many waits in one transaction: one answer per entry, in
    /// order. A wait may appear once. The written rows' polls-begun counts go back
    /// to 0.
    pub async fn record_many(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError> {
        if progress.is_empty() {
            return Ok(Vec::new());
        }
        let rows = progress
            .iter()
            .map(Progress::row)
            .collect::<Result<Vec<_>, _>>()?;
        let written = sql!(self.record(owner, now, &rows))?;
        if self.postgres().is_some() && self.ends.receiver_count() > 0 {
            let ended: Arc<[Uuid]> = progress
                .iter()
                .zip(&written)
                .filter(|(p, w)| **w && p.end.is_some())
                .map(|(p, _)| p.id)
                .collect();
            if !ended.is_empty() {
                let _ = self.ends.send(ended);
            }
        }
        Ok(written)
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

    /// [`Store::renew`] after its lease row: writes `checkpoints`, then compares
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
        match &self.db {
            Dialect::Postgres(d) => d.hand_over(owner, &rows).await,
            Dialect::Sqlite(d) => d.release(owner, &rows).await,
        }
    }

    /// Every wait taken over with a slot from a holder that died has been polled
    /// once: the slot's count of such takeovers goes back to 0 (Postgres; SQLite
    /// has no slots).
    pub async fn settle(&self, owner: Uuid, slot: SlotToken) -> Result<(), StoreError> {
        match &self.db {
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
