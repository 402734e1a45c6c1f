//! Nudges: a POST to a wait's nudge URL ([`crate::api::nudges`]) reaches the
//! replica that holds the wait as [`crate::bus::BusMsg::Nudge`], and its poll is
//! brought forward here. A nudge decides nothing; it only moves the next poll.
//!
//! Nudges coalesce and are paced: a wait's nudged polls are at least the
//! operator's minimum poll interval (the worker's floor) apart, so that a storm
//! of nudges is one poll, and a nudge that comes while a poll or its write is in
//! flight brings the poll after it forward (that poll may have been sent before
//! whatever the nudge announces).

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{Loop, Phase};

/// What nudges asked of a held wait.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Nudge {
    /// None since it was taken up.
    #[default]
    None,
    /// A nudged poll was scheduled for this time: the next comes a floor later
    /// at the soonest.
    Polled(DateTime<Utc>),
    /// A nudge came while the wait was busy: when it is next scheduled, it is
    /// polled at this time at the latest.
    Pending(DateTime<Utc>),
}

impl Loop {
    /// A nudge of `id`: its next poll is brought forward, as pacing allows.
    pub(super) fn nudged(&mut self, id: Uuid) {
        let now = self.clock.now();
        let floor = chrono::Duration::from_std(self.w.cfg.floor).unwrap_or_default();
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        let at = match h.nudge {
            // Coalesced with the nudge already waiting.
            Nudge::Pending(_) => return,
            Nudge::Polled(t) => (t + floor).max(now),
            Nudge::None => now,
        };
        if h.busy() {
            h.nudge = Nudge::Pending(at);
            return;
        }
        // A first poll recorded as due soon polls soon anyway.
        if at >= h.next || h.phase == Phase::Counted {
            return;
        }
        h.nudge = Nudge::Polled(at);
        self.w
            .metrics
            .nudged_polls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.schedule(id, at);
    }
}

/// When a wait is polled next: at `at`, or sooner when a nudge is waiting.
pub(super) fn next(
    nudge: &mut Nudge,
    at: DateTime<Utc>,
    counter: &std::sync::atomic::AtomicU64,
) -> DateTime<Utc> {
    match *nudge {
        Nudge::Pending(t) if t < at => {
            *nudge = Nudge::Polled(t);
            counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            t
        }
        Nudge::Pending(t) => {
            *nudge = Nudge::Polled(t);
            at
        }
        _ => at,
    }
}
