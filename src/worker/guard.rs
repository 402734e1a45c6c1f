//! The first poll after a claim, and the crash-loop guard it feeds.
//!
//! Before the first probe since a claim of a wait whose first poll is counted
//! ([`crate::store::Claimed::count_first_poll`]: on SQLite every claimed wait; on
//! Postgres one whose count is not 0, or taken in a slot whose holders kept
//! dying), the store records that the poll begins, ahead of time: once the first
//! of the waits not yet recorded is due within [`MARK_WHEN`], one statement records
//! every one due within [`MARK_AHEAD`], and each starts when due. A backlog of
//! first polls (a restart, an import, a burst of creates) so costs a write a
//! batch, not a write a poll, and a poll is not held back by its record. The
//! write of a completed poll clears that count, and the first completed poll is
//! always written, even when it changed nothing ([`Phase::Confirming`]). A wait
//! whose polls began [`crate::store::MAX_CLAIMS`] times in a row without
//! completing took down every replica that polled it: its next claimer ends it
//! instead of polling it.

use std::cmp::Reverse;

use chrono::{DateTime, TimeDelta, Utc};
use uuid::Uuid;

use super::writes::answered;
use super::{Loop, Msg, Phase};
use crate::store::{Progress, StoreError, WaitEpoch};

/// How far ahead of its poll a first poll is recorded as begun. A replica that
/// stops between the record and the poll leaves a poll counted that never began:
/// the guard counts [`crate::store::MAX_CLAIMS`] in a row, so only a wait whose
/// replicas stop within this of its first poll that many times over is ended by it.
pub(super) const MARK_AHEAD: TimeDelta = TimeDelta::seconds(1);
/// Records are written once the first of the waits not yet recorded is due within
/// this, so a batch holds about half a second of first polls.
pub(super) const MARK_WHEN: TimeDelta = TimeDelta::milliseconds(500);

impl Loop {
    /// Records in the store that the first polls of these waits since their claim
    /// begin: if a poll takes the replica down, the next claimer finds it counted
    /// ([`crate::store::MAX_CLAIMS`]). One write for all of them; each poll starts
    /// from its timer once recorded.
    pub(super) fn mark(&mut self, marks: Vec<(WaitEpoch, u64)>) {
        let w = self.w.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let ids: Vec<WaitEpoch> = marks.iter().map(|(at, _)| *at).collect();
            let result = w.leases.mark_polling(w.owner, &ids).await;
            w.metrics.write();
            let _ = tx.send(Msg::Marked { marks, result });
        });
    }

    /// The waits whose first poll is not recorded yet and is due within
    /// [`MARK_AHEAD`] (or overdue), once the first of them is due within
    /// [`MARK_WHEN`]; each is [`Phase::Marking`] from here.
    pub(super) fn due_soon(&mut self, now: DateTime<Utc>) -> Vec<(WaitEpoch, u64)> {
        let mut out = Vec::new();
        if self
            .unmarked
            .peek()
            .is_none_or(|Reverse(due)| due.after(now + MARK_WHEN))
        {
            return out;
        }
        while let Some(Reverse(due)) = self.unmarked.peek().copied() {
            if due.after(now + MARK_AHEAD) {
                break;
            }
            let (g, id) = (due.g, due.id);
            self.unmarked.pop();
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            if h.generation != g || h.phase != Phase::Claimed {
                continue;
            }
            h.phase = Phase::Marking;
            out.push((WaitEpoch { id, epoch: h.epoch }, g));
        }
        out
    }

    /// First polls were recorded as begun (or not): each recorded one starts from
    /// its timer, under the bound on polls started (its timer may have fired while
    /// it was recorded: it is scheduled again).
    pub(super) fn marked(
        &mut self,
        marks: Vec<(WaitEpoch, u64)>,
        result: Result<Vec<Uuid>, StoreError>,
    ) {
        if let Err(e) = &result {
            tracing::warn!(error = %e, "could not record that polls begin; trying again shortly");
        }
        let marked = answered(&result);
        for (at, g) in marks {
            let Some(h) = self.held.get_mut(&at.id) else {
                continue;
            };
            if h.generation != g || h.epoch != at.epoch || h.phase != Phase::Marking {
                continue;
            }
            if marked.contains(&at.id) {
                h.phase = Phase::Counted;
                let next = h.next;
                self.schedule(at.id, next);
            } else {
                // Not this replica's any more, or the store is away: the next
                // renewal finds out which; look again in a second.
                self.need_full = true;
                h.phase = Phase::Claimed;
                let again = self.clock.now() + chrono::TimeDelta::seconds(1);
                let deadline = h.engine.deadline;
                self.schedule(at.id, again.min(deadline));
            }
        }
    }

    /// First polls that changed nothing were recorded as completed (or not).
    pub(super) fn confirmed(
        &mut self,
        batch: Vec<(WaitEpoch, u64)>,
        result: Result<Vec<Uuid>, StoreError>,
    ) {
        self.writing -= 1;
        self.w.metrics.write();
        let done = answered(&result);
        for (at, generation) in batch {
            let id = at.id;
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            if h.generation != generation {
                continue;
            }
            if done.contains(&id) {
                h.phase = Phase::Idle;
                let next = h.next;
                self.schedule(id, next);
            } else if let Err(e) = &result {
                // As for progress that cannot be written: let it go, and another
                // claim resumes it from its last checkpoint.
                tracing::warn!(wait_id = %id, error = %e, "could not record that a poll completed; letting the wait go");
                self.let_go(id);
            } else {
                // No longer this replica's.
                self.settled_one(id);
                self.held.remove(&id);
            }
        }
        self.note_held();
    }

    /// A wait taken over with a slot whose holder died was polled once (or is
    /// no longer held): when it was the last of that slot's, the slot's count of
    /// takeovers goes back to 0, since none of its waits took this replica down.
    pub(super) fn settled_one(&mut self, id: Uuid) {
        if self.unsettled.is_empty() {
            return;
        }
        let Some(slot) = self.unsettled.remove(&id) else {
            return;
        };
        let Some(left) = self.settling.get_mut(&slot) else {
            return;
        };
        *left -= 1;
        if *left > 0 {
            return;
        }
        self.settling.remove(&slot);
        let w = self.w.clone();
        tokio::spawn(async move {
            if let Err(e) = w.leases.settle(w.owner, slot).await {
                // It stays counted: the next takeover of it counts its waits'
                // first polls one by one, which costs writes, not safety.
                tracing::warn!(error = %e, "could not record that a slot's waits were all polled");
            }
            w.metrics.write();
        });
    }

    /// A wait claimed with [`crate::store::MAX_CLAIMS`] polls begun and none completed: every
    /// replica that polled it since died meanwhile. It is ended in `error` rather
    /// than polled by this one next.
    pub(super) fn end_crash_loop(&mut self, id: Uuid, claims: i32) {
        tracing::error!(wait_id = %id, polls_begun = claims, "a wait's polls keep taking their replica down; ending it in error");
        self.generation += 1;
        let g = self.generation;
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        h.phase = Phase::Writing;
        h.generation = g;
        let progress = Progress::abandon(
            id,
            h.epoch,
            &h.engine,
            format!(
                "waitd ended this wait because a poll of it did not complete {claims} times in a row: each time, the replica polling it stopped (it crashed, was killed or ran out of memory); it is not polled again so that it cannot take down another replica"
            ),
        );
        self.pending.push((progress, g));
    }
}
