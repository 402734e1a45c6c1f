//! A pause as replicas tell each other of it: whose requests it holds back (the
//! key of a tenant's requests with one credential to one host, a digest that
//! reveals neither), why, until when, and the host for the log, on one line:
//! `<until, ms since the epoch> <key, 64 hex digits> <cause> <host>`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest host a pause names (a URL's host and port).
const MAX_HOST: usize = 300;

/// Whose requests a pause holds back: a digest of the tenant, the target's host
/// and port, and what its requests carry (their headers, credential and TLS
/// settings). Every replica makes the same one for the same wait.
pub type PauseKey = [u8; 32];

/// What asked for the pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PauseCause {
    /// `429` with `Retry-After` (or its millisecond forms).
    TooManyRequests,
    /// `503` with `Retry-After` (or its millisecond forms).
    Unavailable,
    /// `X-RateLimit-Remaining: 0`, until `X-RateLimit-Reset`.
    RateLimitReset,
    /// The IETF `RateLimit` header with `r=0`.
    RateLimit,
}

impl PauseCause {
    const ALL: [PauseCause; 4] = [
        PauseCause::TooManyRequests,
        PauseCause::Unavailable,
        PauseCause::RateLimitReset,
        PauseCause::RateLimit,
    ];

    /// Its name on the wire.
    pub fn code(self) -> &'static str {
        match self {
            PauseCause::TooManyRequests => "429",
            PauseCause::Unavailable => "503",
            PauseCause::RateLimitReset => "x-ratelimit",
            PauseCause::RateLimit => "ratelimit",
        }
    }

    /// Why a wait's polls are held back, as a sentence.
    pub fn reason(self) -> &'static str {
        match self {
            PauseCause::TooManyRequests => {
                "the target answered 429 Too Many Requests with Retry-After to a request of this tenant with the same credentials, so waitd sends those nothing until then"
            }
            PauseCause::Unavailable => {
                "the target answered 503 Service Unavailable with Retry-After to a request of this tenant with the same credentials, so waitd sends those nothing until then"
            }
            PauseCause::RateLimitReset => {
                "the target said none of the rate limit of this tenant's credentials remains (X-RateLimit-Remaining: 0), so waitd sends their requests nothing until it resets (X-RateLimit-Reset)"
            }
            PauseCause::RateLimit => {
                "the target said none of the rate limit of this tenant's credentials remains (RateLimit with r=0), so waitd sends their requests nothing until it resets"
            }
        }
    }
}

/// A pause of a key's requests, until when, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPause {
    pub key: PauseKey,
    /// "host:port", for the log only.
    pub host: Arc<str>,
    pub until: SystemTime,
    pub cause: PauseCause,
}

impl HostPause {
    pub fn encode(&self) -> String {
        let ms = self
            .until
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!(
            "{ms} {} {} {}",
            hex::encode(self.key),
            self.cause.code(),
            self.host
        )
    }

    /// The pause a line says, if it says one.
    pub fn decode(line: &str) -> Option<HostPause> {
        let mut parts = line.split(' ');
        let (ms, key, cause, host) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || host.is_empty() || host.len() > MAX_HOST {
            return None;
        }
        let ms: u64 = ms.parse().ok()?;
        let mut k = [0u8; 32];
        hex::decode_to_slice(key, &mut k).ok()?;
        Some(HostPause {
            key: k,
            host: host.into(),
            until: UNIX_EPOCH.checked_add(Duration::from_millis(ms))?,
            cause: PauseCause::ALL.into_iter().find(|c| c.code() == cause)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_reads_back_as_written_and_nothing_else_reads_as_one() {
        for cause in PauseCause::ALL {
            let p = HostPause {
                key: [7; 32],
                host: "api.example.com:443".into(),
                until: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
                cause,
            };
            assert_eq!(HostPause::decode(&p.encode()), Some(p));
        }
        let key = "07".repeat(32);
        for bad in [
            String::new(),
            "12".into(),
            format!("x {key} 429 api:443"),
            format!("12 {key} 429 "),
            format!("12 {key} 429 a b"),
            format!("12 {key} 418 api:443"),
            format!("12 {} 429 api:443", "07".repeat(31)),
            format!("12 {}zz 429 api:443", "07".repeat(31)),
            "12 api:443".into(),
            format!("1 {key} 429 {}", "h".repeat(301)),
        ] {
            assert_eq!(HostPause::decode(&bad), None, "{bad}");
        }
    }
}
