//! When each held wait is polled next: a heap of `(next poll, generation, id)`.
//! Rescheduling a wait bumps its generation rather than searching the heap, and
//! the stale entries are skipped as they come up. Timers do not fire while the
//! lease is stale ([`Loop::lease_stale`]).

use std::cmp::Reverse;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use uuid::Uuid;

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use super::{Loop, Phase};

/// Polls started and not over, at most, in multiples of the concurrency: enough
/// waiting for a probe's place that one is always ready when a place frees.
pub(super) const IN_FLIGHT: usize = 2;

/// One poll started: counted until its task ends, however it ends (an answer, a
/// deadline, or aborted because its wait was let go).
pub(super) struct Flight(Arc<AtomicUsize>);

impl Flight {
    pub(super) fn start(count: &Arc<AtomicUsize>) -> Flight {
        count.fetch_add(1, Relaxed);
        Flight(count.clone())
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A timer: when, in nanoseconds since the epoch (one integer for the heap to
/// compare rather than a date and a time of day), the generation it was set at,
/// and the wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Due {
    at: i64,
    pub(super) g: u64,
    pub(super) id: Uuid,
}

impl Due {
    pub(super) fn new(at: DateTime<Utc>, g: u64, id: Uuid) -> Due {
        Due {
            at: nanos(at),
            g,
            id,
        }
    }

    pub(super) fn at(&self) -> DateTime<Utc> {
        DateTime::from_timestamp_nanos(self.at)
    }

    /// Whether it is due later than `t`.
    pub(super) fn after(&self, t: DateTime<Utc>) -> bool {
        self.at > nanos(t)
    }
}

/// A time as [`Due`] keeps it; past 2262, the end of the range, never due.
fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(i64::MAX)
}

impl Loop {
    pub(super) fn next_wake(&self) -> Instant {
        if self.lease_stale() {
            // Paused: look again shortly (a renewal may have come through).
            return Instant::now() + Duration::from_millis(50);
        }
        if !self.room(0) {
            // As many polls started as may be: a poll that ends makes room (its
            // answer wakes the loop; one let go does not, hence the look).
            return Instant::now() + Duration::from_millis(10);
        }
        let mut timer = match self.timers.peek() {
            Some(Reverse(due)) => self.clock.instant_at(due.at()),
            None => Instant::now() + Duration::from_secs(3600),
        };
        if let Some(Reverse(due)) = self.unmarked.peek() {
            timer = timer.min(self.clock.instant_at(due.at() - super::guard::MARK_WHEN));
        }
        // Confirmations due wake the loop, unless every write slot is taken: the
        // write that ends wakes it then.
        match self.confirm_by {
            Some(c) if self.writing < self.w.cfg.max_writes.max(1) => c.min(timer),
            _ => timer,
        }
    }

    /// True when the earliest timer is due (and polling is not paused, and there
    /// is room for another poll).
    pub(super) fn timers_due(&self) -> bool {
        !self.timers.is_empty() && self.room(0) && self.next_wake() <= Instant::now()
    }

    /// Whether another poll may start, with `more` about to: a takeover or a
    /// restart finds hundreds of thousands of waits due at once, and a task each,
    /// waiting for a probe's place, would cost memory and hold the loop (and the
    /// lease renewals with it) for seconds.
    fn room(&self, more: usize) -> bool {
        self.in_flight.load(Relaxed) + more < self.w.cfg.concurrency.max(1) * IN_FLIGHT
    }

    pub(super) fn schedule(&mut self, id: Uuid, at: DateTime<Utc>) {
        self.generation += 1;
        let g = self.generation;
        if let Some(h) = self.held.get_mut(&id) {
            let at = super::nudge::next(&mut h.nudge, at, &self.w.metrics.nudged_polls);
            h.next = at;
            h.generation = g;
            let due = Due::new(at, g, id);
            self.timers.push(Reverse(due));
            if h.phase == Phase::Claimed {
                self.unmarked.push(Reverse(due));
            }
        }
    }

    /// Starts the polls that are due; a wait's first poll since its claim once the
    /// store has recorded that it begins ([`super::guard`]).
    pub(super) fn fire_due(&mut self) {
        if self.lease_stale() {
            if !self.paused {
                tracing::warn!(
                    held = self.held.len(),
                    "lease not renewed in time; polling paused until it is"
                );
                self.paused = true;
                self.need_full = true;
            }
            return;
        }
        if self.paused {
            tracing::info!("lease renewed; polling resumed");
            self.paused = false;
        }
        let now = self.clock.now();
        // The records of first polls due soon go first: each of those polls
        // starts from its timer once recorded.
        let marks = self.due_soon(now);
        if !marks.is_empty() {
            self.mark(marks);
        }
        let due_by = nanos(now);
        while let Some(Reverse(Due { at, g, id })) = self.timers.peek().copied() {
            if at > due_by || !self.room(0) {
                break;
            }
            self.timers.pop();
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            if h.generation != g || h.busy() {
                continue;
            }
            h.phase = match h.phase {
                Phase::Idle => Phase::Polling,
                Phase::Counted => Phase::FirstPoll,
                // Not recorded yet: its record is on its way, and it is
                // scheduled again once recorded.
                _ => continue,
            };
            self.w.metrics.schedule_lag.observe(
                (now - DateTime::from_timestamp_nanos(at))
                    .to_std()
                    .unwrap_or_default(),
            );
            self.start_probe(id, g);
        }
        self.note_held();
    }
}
