//! Host pauses: a target host that asks for quiet gets it from every wait of every
//! tenant on the replica, not only from the wait whose request it answered.
//!
//! A `429` or `503` with `Retry-After` (or its millisecond forms), GitHub's
//! `X-RateLimit-Remaining: 0` with `X-RateLimit-Reset` (epoch seconds), or the
//! IETF `RateLimit` header with `r=0` (its `t=` the seconds to wait) pauses the
//! host ("host:port") until the time given, at most `--max-host-pause`. A poll due
//! meanwhile sends nothing: it is a transient error naming the pause, whose
//! `retry_after` is the pause's end (so a wait whose deadline comes first ends
//! `timed_out` on time, saying why it was not polled).
//!
//! The table holds only hosts paused now, at most [`MAX_PAUSED_HOSTS`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};

/// The most hosts paused at once; a pause past it is not kept (the waits on that
/// host still honour their own `Retry-After`).
pub const MAX_PAUSED_HOSTS: usize = 10_000;

/// The hosts paused now, and until when.
#[derive(Debug, Default)]
pub(super) struct Pauses {
    until: Mutex<HashMap<std::sync::Arc<str>, SystemTime>>,
}

impl Pauses {
    /// Until when `host` is paused, if it is at `now`.
    pub fn paused(&self, host: &str, now: SystemTime) -> Option<SystemTime> {
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        match until.get(host) {
            Some(t) if *t > now => Some(*t),
            Some(_) => {
                until.remove(host);
                None
            }
            None => None,
        }
    }

    /// Pauses `host` for `pause` from `now` (never shortening a pause set); how
    /// much longer the host is paused than it was.
    pub fn pause(&self, host: &std::sync::Arc<str>, now: SystemTime, pause: Duration) -> Duration {
        let end = now + pause;
        let mut until = self.until.lock().unwrap_or_else(|p| p.into_inner());
        if until.len() >= MAX_PAUSED_HOSTS && !until.contains_key(host) {
            until.retain(|_, t| *t > now);
            if until.len() >= MAX_PAUSED_HOSTS {
                return Duration::ZERO;
            }
        }
        let before = until.get(host).copied().filter(|t| *t > now).unwrap_or(now);
        if end <= before {
            return Duration::ZERO;
        }
        until.insert(host.clone(), end);
        end.duration_since(before).unwrap_or_default()
    }
}

/// How long an answer asks its host to stay quiet, if it does; at most `max`.
pub(super) fn asked(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
    max: Duration,
) -> Option<(Duration, &'static str)> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let found = if matches!(status.as_u16(), 429 | 503) {
        crate::outbound::retry_after(headers, now).map(|d| (d, "Retry-After"))
    } else {
        None
    };
    let found = found.or_else(|| {
        // GitHub's shape: none remain until the reset, in epoch seconds.
        (text("x-ratelimit-remaining") == Some("0"))
            .then(|| text("x-ratelimit-reset")?.parse::<u64>().ok())
            .flatten()
            .and_then(|reset| {
                (SystemTime::UNIX_EPOCH + Duration::from_secs(reset))
                    .duration_since(now)
                    .ok()
            })
            .map(|d| (d, "X-RateLimit-Reset"))
    });
    let found = found.or_else(|| {
        // IETF RateLimit: `"policy";r=0;t=30`.
        let v = text("ratelimit")?;
        let item = |key: &str| {
            v.split([';', ','])
                .map(str::trim)
                .find_map(|p| p.strip_prefix(key)?.strip_prefix('='))
                .and_then(|n| n.trim().parse::<u64>().ok())
        };
        (item("r")? == 0).then(|| (Duration::from_secs(item("t").unwrap_or(1)), "RateLimit"))
    });
    found
        .filter(|(d, _)| !d.is_zero())
        .map(|(d, why)| (d.min(max), why))
}

/// The sentence of a poll not sent because its host is paused.
pub(super) fn sentence(until: SystemTime) -> String {
    let at: chrono::DateTime<chrono::Utc> = until.into();
    format!(
        "the target host asked for a pause (429/503 Retry-After or a rate limit with none remaining), so waitd sends it nothing until {}",
        at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )
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
    fn each_shape_of_asking_for_quiet_pauses_the_host() {
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
        assert_eq!(ask(200, &[("ratelimit", "\"default\";r=3;t=12")]), None);
    }

    #[test]
    fn a_pause_ends_and_is_never_shortened() {
        let p = Pauses::default();
        let host: std::sync::Arc<str> = "h:443".into();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(100);
        assert_eq!(
            p.pause(&host, now, Duration::from_secs(20)),
            Duration::from_secs(20)
        );
        assert_eq!(p.pause(&host, now, Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(p.paused("h:443", now), Some(now + Duration::from_secs(20)));
        assert_eq!(p.paused("h:443", now + Duration::from_secs(21)), None);
    }
}
