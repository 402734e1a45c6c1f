//! Pauses: a target that asks for quiet gets it from the requests it asked it
//! of, and from no one else's.
//!
//! A `429` or `503` with `Retry-After` (or its millisecond forms), GitHub's
//! `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` (epoch seconds), or the
//! IETF `RateLimit` header with `r=0` (its `t=` the seconds to wait) pauses the
//! requests of its [`PauseKey`]: one tenant's, to one host and port, with the same
//! headers, credential and TLS settings (the shared request's key without its
//! path), until the time given, at most `--max-host-pause`. So one tenant's
//! exhausted token quiets that tenant's requests with that token, and nobody
//! else's. A `200` that carries a rate limit is read as any `200`, and pauses its
//! key until the limit resets.
//!
//! A poll due meanwhile sends nothing and is no observation ([`super::Polled`]):
//! the engine holds the wait until the pause ends or its deadline comes.
//!
//! The table holds only keys paused now, at most [`MAX_PAUSED`]; looking a key
//! up costs nothing while it is empty.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, StatusCode};

use crate::bus::{PauseCause, PauseKey};

/// The most keys paused at once; a pause past it is not kept (the waits of that
/// key still honour their own `Retry-After`).
pub const MAX_PAUSED: usize = 10_000;

/// A pause: until when, and what asked for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    pub until: SystemTime,
    pub cause: PauseCause,
}

impl Pause {
    /// The pause as the engine holds a wait by it, and the wait shows it.
    pub fn paused(&self) -> crate::engine::Paused {
        crate::engine::Paused {
            until: self.until.into(),
            reason: self.cause.reason().to_string(),
        }
    }
}

/// The keys paused now, and until when.
#[derive(Debug, Default)]
pub(super) struct Pauses {
    until: Mutex<HashMap<PauseKey, Pause>>,
    /// How many entries the table has, read without its lock.
    len: AtomicUsize,
}

impl Pauses {
    /// The pause of `key`, if it is paused at the time `now` gives. The clock is
    /// not read while nothing is paused.
    pub fn paused(&self, key: &PauseKey, now: impl FnOnce() -> SystemTime) -> Option<Pause> {
        if self.len.load(Relaxed) == 0 {
            return None;
        }
        let now = now();
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        let found = match until.get(key) {
            Some(p) if p.until > now => Some(*p),
            Some(_) => {
                until.remove(key);
                None
            }
            None => None,
        };
        self.len.store(until.len(), Relaxed);
        found
    }

    /// Pauses `key` for `pause` from `now` (never shortening a pause set); how
    /// much longer it is paused than it was.
    pub fn pause(
        &self,
        key: &PauseKey,
        now: SystemTime,
        pause: Duration,
        cause: PauseCause,
    ) -> Duration {
        let end = now + pause;
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        if until.len() >= MAX_PAUSED && !until.contains_key(key) {
            until.retain(|_, p| p.until > now);
            if until.len() >= MAX_PAUSED {
                self.len.store(until.len(), Relaxed);
                return Duration::ZERO;
            }
        }
        let before = until
            .get(key)
            .map(|p| p.until)
            .filter(|t| *t > now)
            .unwrap_or(now);
        let added = end.duration_since(before).unwrap_or_default();
        if !added.is_zero() {
            until.insert(*key, Pause { until: end, cause });
        }
        self.len.store(until.len(), Relaxed);
        added
    }
}

/// How long an answer asks its requests to stay quiet, if it does, and why; at
/// most `max`. Never more than the answer says, whatever it says: a date, a
/// number too large for any clock, or a negative one.
pub fn asked(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
    max: Duration,
) -> Option<(Duration, PauseCause)> {
    // Names made once: a name given as text is parsed at every lookup, and every
    // answer is looked at.
    const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
    const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
    const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
    let text = |name: &HeaderName| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let found = match status.as_u16() {
        429 => crate::outbound::retry_after(headers, now).map(|d| (d, PauseCause::TooManyRequests)),
        503 => crate::outbound::retry_after(headers, now).map(|d| (d, PauseCause::Unavailable)),
        _ => None,
    };
    let found = found.or_else(|| {
        // GitHub's shape: none remain until the reset, in epoch seconds.
        (text(&REMAINING) == Some("0"))
            .then(|| text(&RESET)?.parse::<u64>().ok())
            .flatten()
            .and_then(|reset| epoch_plus(reset)?.duration_since(now).ok())
            .map(|d| (d, PauseCause::RateLimitReset))
    });
    let found = found.or_else(|| {
        // IETF RateLimit: `"policy";r=0;t=30`.
        let v = text(&RATELIMIT)?;
        let item = |key: &str| {
            v.split([';', ','])
                .map(str::trim)
                .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
                .map(str::trim)
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                // Too many digits for any clock: as long as the cap.
                .map(|n| n.parse::<u64>().unwrap_or(u64::MAX))
        };
        (item("r")? == 0).then(|| {
            (
                Duration::from_secs(item("t").unwrap_or(1)),
                PauseCause::RateLimit,
            )
        })
    });
    found
        .filter(|(d, _)| !d.is_zero())
        .map(|(d, why)| (d.min(max), why))
}

/// `UNIX_EPOCH + secs`, when a clock can hold it.
fn epoch_plus(secs: u64) -> Option<SystemTime> {
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn each_shape_of_asking_for_quiet_pauses_its_requests() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let max = Duration::from_secs(3600);
        let ask = |s: u16, h: &[(&'static str, &str)]| {
            asked(StatusCode::from_u16(s).unwrap(), &headers(h), now, max).map(|(d, _)| d)
        };
        assert_eq!(
            ask(429, &[("retry-after", "20")]),
            Some(Duration::from_secs(20))
        );
        assert_eq!(ask(503, &[("retry-after", "7200")]), Some(max));
        assert_eq!(ask(500, &[("retry-after", "20")]), None);
        assert_eq!(ask(200, &[("retry-after", "20")]), None);
        assert_eq!(
            ask(
                200,
                &[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "1000030")
                ]
            ),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            ask(
                200,
                &[
                    ("x-ratelimit-remaining", "0"),
                    ("x-ratelimit-reset", "99999999999999999")
                ]
            ),
            Some(max)
        );
        assert_eq!(
            ask(
                200,
                &[
                    ("x-ratelimit-remaining", "5"),
                    ("x-ratelimit-reset", "1000030")
                ]
            ),
            None
        );
        assert_eq!(
            ask(200, &[("ratelimit", "\"default\";r=0;t=12")]),
            Some(Duration::from_secs(12))
        );
        assert_eq!(
            ask(
                200,
                &[("ratelimit", "\"default\";r=0;t=999999999999999999999")]
            ),
            Some(max)
        );
        assert_eq!(
            ask(200, &[("ratelimit", "\"default\";r=0;t=-5")]),
            Some(Duration::from_secs(1))
        );
        assert_eq!(ask(200, &[("ratelimit", "\"default\";r=3;t=12")]), None);
    }

    #[test]
    fn a_pause_ends_is_never_shortened_and_holds_its_key_alone() {
        let p = Pauses::default();
        let (key, other) = ([1u8; 32], [2u8; 32]);
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        let cause = PauseCause::TooManyRequests;
        assert_eq!(p.paused(&key, || now), None);
        assert_eq!(
            p.pause(&key, now, Duration::from_secs(20), cause),
            Duration::from_secs(20)
        );
        assert_eq!(
            p.pause(&key, now, Duration::from_secs(5), cause),
            Duration::ZERO
        );
        assert_eq!(
            p.paused(&key, || now).map(|p| p.until),
            Some(now + Duration::from_secs(20))
        );
        assert_eq!(p.paused(&other, || now), None);
        assert_eq!(p.paused(&key, || now + Duration::from_secs(21)), None);
        // Gone from the table, which is empty again: the clock is not read.
        assert_eq!(p.paused(&key, || unreachable!()), None);
    }
}
