//! When each held wait is polled next: a heap of `(next poll, generation, id)`.
//! Rescheduling a wait bumps its generation rather than searching the heap, and
//! the stale entries are skipped as they come up. Timers do not fire while the
//! lease is stale ([`Loop::lease_stale`]).

use std::cmp::Reverse;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use uuid::Uuid;

use super::{Loop, Phase};
use crate::store::WaitEpoch;

impl Loop {
    pub(super) fn next_wake(&self) -> Instant {
        if self.lease_stale() {
            // Paused: look again shortly (a renewal may have come through).
            return Instant::now() + Duration::from_millis(50);
        }
        match self.timers.peek() {
            Some(Reverse((t, _, _))) => self.clock.instant_at(*t),
            None => Instant::now() + Duration::from_secs(3600),
        }
    }

    /// True when the earliest timer is due (and polling is not paused).
    pub(super) fn timers_due(&self) -> bool {
        !self.timers.is_empty() && self.next_wake() <= Instant::now()
    }

    pub(super) fn schedule(&mut self, id: Uuid, at: DateTime<Utc>) {
        self.generation += 1;
        let g = self.generation;
        if let Some(h) = self.held.get_mut(&id) {
            h.next = at;
            h.generation = g;
            self.timers.push(Reverse((at, g, id)));
        }
    }

    /// Starts the polls that are due: a wait polled since its claim at once, the
    /// others once the store has recorded that their first poll begins.
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
        let mut first_polls = Vec::new();
        while let Some(Reverse((at, g, id))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            if h.generation != g || h.busy() {
                continue;
            }
            self.w
                .metrics
                .schedule_lag
                .observe((now - at).to_std().unwrap_or_default());
            if h.phase == Phase::Idle {
                h.phase = Phase::Polling;
                self.start_probe(id, g);
            } else {
                h.phase = Phase::Marking;
                first_polls.push((WaitEpoch { id, epoch: h.epoch }, g));
            }
        }
        if !first_polls.is_empty() {
            self.mark(first_polls);
        }
        self.note_held();
    }
}
