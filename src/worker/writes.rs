//! Write batching. A new state, a retry or the end is written at once (fenced by
//! owner and epoch), batched with whatever else changed meanwhile into one
//! transaction: at most `max_writes` batches are in flight, and what changes while
//! they are grows the next one, so a burst becomes a few large transactions.
//! First polls that changed nothing are confirmed in batches of their own, after
//! progress, which is what followers wait for. A confirmation only clears the
//! crash-loop guard's count, so it waits to share its batch: until
//! [`CONFIRM_BATCH`] are queued, [`CONFIRM_DELAY`] has passed since the first of
//! them, or a wait queued is due to poll again (it polls once confirmed). A backlog
//! of first polls (a restart, a takeover, an import) so costs a write a batch,
//! not a write a poll.

use std::collections::HashSet;
use std::sync::Arc;

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::clock::Clock;
use super::{Loop, Msg, Phase, Signal, Worker, fingerprint};
use crate::model::Status;
use crate::store::{Progress, StoreError, WaitEpoch};

/// Most waits in one batch (one transaction).
const MAX_BATCH: usize = 1000;
/// Confirmations queued that are written without waiting for more.
const CONFIRM_BATCH: usize = 500;
/// The longest a confirmation waits for others to share its batch.
pub(super) const CONFIRM_DELAY: Duration = Duration::from_millis(500);

/// What became of one wait's progress write.
#[derive(Clone, Debug)]
pub(super) enum Written {
    Yes,
    /// The wait is no longer this replica's (taken over, canceled, ended elsewhere).
    NotOwned,
    /// The store refused what the target answered; the wait was ended in `error`
    /// instead.
    Abandoned,
    /// The store could not be reached: let the wait go.
    Failed(String),
}

impl Loop {
    /// Starts writing the pending progress, all of it in one batch, unless as many
    /// batches as allowed are already on their way: then it waits for the next free
    /// slot and grows meanwhile, so a burst becomes a few large transactions.
    pub(super) fn flush_writes(&mut self) {
        let slots = self.w.cfg.max_writes.max(1);
        while !self.pending.is_empty() && self.writing < slots {
            let take = self.pending.len().min(MAX_BATCH);
            let (progress, generations): (Vec<Progress>, Vec<u64>) =
                self.pending.drain(..take).unzip();
            self.writing += 1;
            let w = self.w.clone();
            let tx = self.tx.clone();
            let clock = self.clock;
            tokio::spawn(async move {
                let started = Instant::now();
                let written = write_progress(&w, clock, &progress).await;
                tracing::debug!(
                    n = progress.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "progress written"
                );
                let batch = progress
                    .into_iter()
                    .zip(generations)
                    .zip(written)
                    .map(|((p, g), written)| (p.id, g, p.end.map(|e| e.status), written))
                    .collect();
                let _ = tx.send(Msg::Recorded { batch });
            });
        }
        // Then confirmations: progress (ends, new states) is what followers wait for.
        let due = self.stopping
            || self.confirming.len() >= CONFIRM_BATCH
            || self.confirm_by.is_some_and(|t| t <= Instant::now());
        while due && !self.confirming.is_empty() && self.writing < slots {
            let take = self.confirming.len().min(MAX_BATCH);
            let batch: Vec<(WaitEpoch, u64)> = self.confirming.drain(..take).collect();
            self.writing += 1;
            let w = self.w.clone();
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let ids: Vec<WaitEpoch> = batch.iter().map(|(at, _)| *at).collect();
                let result = w.leases.confirm_polled(w.owner, &ids).await;
                let _ = tx.send(Msg::Confirmed { batch, result });
            });
        }
        if self.confirming.is_empty() {
            self.confirm_by = None;
        }
    }

    /// Queues the confirmation of a first poll that changed nothing, to be
    /// written by [`CONFIRM_DELAY`] from now, or by `next`, when its wait polls
    /// again, if that comes first.
    pub(super) fn confirm(&mut self, at: (WaitEpoch, u64), next: Instant) {
        let by = next.min(Instant::now() + CONFIRM_DELAY);
        self.confirm_by = Some(self.confirm_by.map_or(by, |t| t.min(by)));
        self.confirming.push(at);
    }

    /// A batch of progress came back.
    pub(super) fn recorded(&mut self, batch: Vec<(Uuid, u64, Option<Status>, Written)>) {
        self.writing -= 1;
        self.w.metrics.write();
        for (id, generation, end, written) in batch {
            self.recorded_one(id, generation, end, written);
        }
        self.note_held();
    }

    fn recorded_one(&mut self, id: Uuid, generation: u64, end: Option<Status>, written: Written) {
        // Counted here, once the end is in the store: never twice, never for an end
        // that another replica or a cancel got to first, and even when the wait's
        // own terminal notice came back first and it is no longer held.
        match (&written, &end) {
            (Written::Yes, Some(status)) => self.w.metrics.ended(*status),
            (Written::Abandoned, _) => self.w.metrics.ended(Status::Error),
            _ => {}
        }
        if matches!(written, Written::Yes | Written::Abandoned) {
            let ended = end.is_some() || matches!(written, Written::Abandoned);
            self.w.signals.send(|| Signal::Recorded { id, ended });
        }
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        if h.generation != generation {
            return;
        }
        match written {
            Written::Yes if end.is_none() => {
                h.phase = Phase::Idle;
                h.dirty = false;
                h.written = fingerprint(&h.engine);
                h.written_at = Instant::now();
                let next = h.next;
                self.schedule(id, next);
            }
            Written::Yes | Written::Abandoned | Written::NotOwned => {
                self.settled_one(id);
                self.held.remove(&id);
            }
            Written::Failed(e) => {
                // Give it back with the next renewal: another claim resumes from the
                // last checkpoint (at-least-once polling, exactly-once ending).
                tracing::warn!(wait_id = %id, error = %e, "could not record progress; letting the wait go");
                self.let_go(id);
            }
        }
    }
}

/// The ids of a batch's answer, or none when the store could not answer.
pub(super) fn answered(result: &Result<Vec<Uuid>, StoreError>) -> HashSet<Uuid> {
    match result {
        Ok(ids) => ids.iter().copied().collect(),
        Err(_) => HashSet::new(),
    }
}

/// Writes a batch of progress in one transaction. When the store refuses the batch
/// for what it holds rather than for being away (a byte Postgres will not store,
/// say), the waits are written one at a time, and each one the store still refuses
/// is ended in `error` instead: a wait must end by its deadline, not be let go and
/// polled again forever.
pub(super) async fn write_progress(
    w: &Arc<Worker>,
    clock: Clock,
    progress: &[Progress],
) -> Vec<Written> {
    let refused = match w.leases.record_many(w.owner, clock.now(), progress).await {
        Ok(done) => {
            return done
                .into_iter()
                .map(|ok| if ok { Written::Yes } else { Written::NotOwned })
                .collect();
        }
        Err(e @ StoreError::Unavailable(_)) => {
            return vec![Written::Failed(e.to_string()); progress.len()];
        }
        Err(e) => e,
    };
    tracing::warn!(error = %refused, n = progress.len(), "the store refused a batch of progress; writing it one wait at a time");
    let mut out = Vec::with_capacity(progress.len());
    for p in progress {
        w.metrics.write();
        let why = match w.leases.record(w.owner, clock.now(), p).await {
            Ok(true) => {
                out.push(Written::Yes);
                continue;
            }
            Ok(false) => {
                out.push(Written::NotOwned);
                continue;
            }
            Err(e @ StoreError::Unavailable(_)) => {
                out.push(Written::Failed(e.to_string()));
                continue;
            }
            Err(e) => e,
        };
        tracing::warn!(wait_id = %p.id, error = %why, "the store refused this wait's progress; ending it in error");
        let end = Progress::abandon(
            p.id,
            p.epoch,
            &p.engine,
            format!("could not store what the target answered: {why}"),
        );
        w.metrics.write();
        out.push(match w.leases.record(w.owner, clock.now(), &end).await {
            Ok(true) => Written::Abandoned,
            Ok(false) => Written::NotOwned,
            Err(e) => Written::Failed(e.to_string()),
        });
    }
    out
}
