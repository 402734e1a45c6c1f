//! `--host-rate`: at most so many requests a second to one host ("host:port")
//! across the replicas, each replica taking its share of the replicas alive.
//!
//! Requests to a host are spaced evenly: each takes the next free moment of its
//! host, one interval (replicas ÷ rate) after the one before, and waits for it
//! without holding a place in the per-host concurrency limit. Waiting never
//! keeps a wait past its deadline: the worker cuts a probe at the deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// The most hosts whose next moment is kept; past it, moments gone by are let go.
const MAX_HOSTS: usize = 10_000;

/// The longest time between two requests to one host.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// The least rate that is not none: one request to a host in about 17 minutes.
pub const MIN_RATE: f64 = 0.001;

/// The next free moment of each host.
#[derive(Debug)]
pub struct HostRate {
    /// Requests a second to one host, across the replicas.
    rate: f64,
    replicas: AtomicU32,
    next: Mutex<HashMap<Arc<str>, Instant>>,
}

impl HostRate {
    /// `rate` requests a second to one host; none when it is zero (unlimited).
    /// A rate that is negative, not finite or under [`MIN_RATE`] is refused with
    /// a sentence.
    pub fn new(rate: f64) -> Result<Option<HostRate>, String> {
        if rate == 0.0 {
            return Ok(None);
        }
        if !rate.is_finite() || rate < MIN_RATE {
            return Err(format!(
                "--host-rate is requests a second to one host: 0 for no limit, or at least {MIN_RATE}"
            ));
        }
        Ok(Some(HostRate {
            rate,
            replicas: AtomicU32::new(1),
            next: Mutex::default(),
        }))
    }

    /// How many replicas share the rate (at least 1).
    pub fn set_replicas(&self, n: u32) {
        self.replicas.store(n.max(1), Relaxed);
    }

    /// The time between two requests to one host from this replica, at most an
    /// hour.
    pub fn interval(&self) -> Duration {
        let secs = f64::from(self.replicas.load(Relaxed)) / self.rate;
        Duration::try_from_secs_f64(secs)
            .unwrap_or(MAX_INTERVAL)
            .min(MAX_INTERVAL)
    }

    /// Takes the next free moment of `host` (now, if it is free) and returns it.
    pub fn reserve(&self, host: &Arc<str>, now: Instant) -> Instant {
        let interval = self.interval();
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if next.len() >= MAX_HOSTS && !next.contains_key(host) {
            next.retain(|_, t| *t > now);
        }
        let at = next.get(host).copied().filter(|t| *t > now).unwrap_or(now);
        next.insert(host.clone(), at + interval);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_to_one_host_are_spaced_by_the_replicas_share_of_the_rate() {
        let r = HostRate::new(10.0).unwrap().unwrap();
        let (h, g): (Arc<str>, Arc<str>) = ("a:443".into(), "b:443".into());
        let t0 = Instant::now();
        assert_eq!(r.reserve(&h, t0), t0);
        assert_eq!(r.reserve(&h, t0), t0 + Duration::from_millis(100));
        assert_eq!(r.reserve(&g, t0), t0, "another host has its own moments");
        r.set_replicas(2);
        assert_eq!(r.reserve(&h, t0), t0 + Duration::from_millis(200));
        assert_eq!(r.reserve(&h, t0), t0 + Duration::from_millis(400));
        // Moments gone by are not owed.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(r.reserve(&h, later), later);
        assert!(HostRate::new(0.0).unwrap().is_none());
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e-20] {
            assert!(HostRate::new(bad).is_err(), "{bad}");
        }
        // The least rate and a million replicas still space requests without
        // overflowing a time.
        let slow = HostRate::new(MIN_RATE).unwrap().unwrap();
        slow.set_replicas(u32::MAX);
        let t = slow.reserve(&h, later);
        assert!(slow.reserve(&h, t) > t);
    }
}
