//! The worker's one clock.
//!
//! Schedules, deadlines and leases are wall times: the store keeps them and the other
//! replicas read them. Timers run on tokio's clock. Reading the wall time off tokio's
//! clock (the wall time at an anchor, plus tokio's time since it) makes the two one:
//! a poll due at a wall time fires when tokio's clock says so, and a test that pauses
//! and advances tokio's clock (`tokio::time::pause`) moves the worker's wall time
//! with it.
//!
//! A step of the system's wall clock (NTP after a suspend, an operator) is taken in
//! by [`Clock::resync`], which compares the wall clock with the real monotonic clock
//! (not tokio's, which a paused test moves by itself) and moves the anchor by the
//! step.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

/// Smallest wall-clock step [`Clock::resync`] takes in: below it, the two clocks are
/// the same clock read at slightly different moments.
const STEP: TimeDelta = TimeDelta::milliseconds(500);

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    /// The wall time at `at` and at `real`.
    wall: DateTime<Utc>,
    /// tokio's clock at the anchor.
    at: Instant,
    /// The real monotonic clock at the anchor.
    real: std::time::Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl Clock {
    /// Anchored now.
    pub fn new() -> Clock {
        Clock {
            wall: Utc::now(),
            at: Instant::now(),
            real: std::time::Instant::now(),
        }
    }

    /// The wall time now, by tokio's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.wall + delta(Instant::now().saturating_duration_since(self.at))
    }

    /// When tokio's clock reaches the wall time `t` (now or later, for a time past).
    pub fn instant_at(&self, t: DateTime<Utc>) -> Instant {
        let now = Instant::now();
        match (t - self.wall).to_std() {
            Ok(after) => (self.at + after).max(now),
            Err(_) => now,
        }
    }

    /// Takes in a step of the system's wall clock since the anchor; returns it when
    /// there was one.
    pub fn resync(&mut self) -> Option<TimeDelta> {
        let expected = self.wall + delta(self.real.elapsed());
        let step = Utc::now() - expected;
        if step.abs() < STEP {
            return None;
        }
        self.wall += step;
        Some(step)
    }
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_wall_time_moves_with_tokios_clock() {
        let c = Clock::new();
        let t0 = c.now();
        tokio::time::advance(Duration::from_secs(3600)).await;
        let t1 = c.now();
        assert_eq!((t1 - t0).num_seconds(), 3600);
        // A paused clock that ran ahead is not a step of the wall clock.
        let mut c2 = c;
        assert_eq!(c2.resync(), None);
        assert_eq!((c2.now() - t1).num_seconds(), 0);
        let due = t1 + TimeDelta::seconds(90);
        assert_eq!(c.instant_at(due) - Instant::now(), Duration::from_secs(90));
        assert_eq!(c.instant_at(t0), Instant::now());
    }

    #[test]
    fn a_step_of_the_wall_clock_is_taken_in() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = Clock::new();
            // As if the wall clock had jumped an hour back since the anchor.
            c.wall += TimeDelta::hours(1);
            let step = c.resync().expect("a step");
            assert!((step + TimeDelta::hours(1)).abs() < STEP, "{step}");
            assert!((c.now() - Utc::now()).abs() < STEP);
        });
    }
}
