//! A host pause as replicas tell each other of it: the host ("host:port") and
//! until when, on one line, `<until, ms since the epoch> <host>`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest host a pause names (a URL's host and port).
const MAX_HOST: usize = 300;

/// A target host that asked for quiet, and until when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPause {
    pub host: Arc<str>,
    pub until: SystemTime,
}

impl HostPause {
    pub fn encode(&self) -> String {
        let ms = self
            .until
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis();
        format!("{ms} {}", self.host)
    }

    /// The pause a line says, if it says one.
    pub fn decode(line: &str) -> Option<HostPause> {
        let (ms, host) = line.split_once(' ')?;
        let ms: u64 = ms.parse().ok()?;
        if host.is_empty() || host.len() > MAX_HOST || host.contains(char::is_whitespace) {
            return None;
        }
        Some(HostPause {
            host: host.into(),
            until: UNIX_EPOCH.checked_add(Duration::from_millis(ms))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_reads_back_as_written_and_nothing_else_reads_as_one() {
        let p = HostPause {
            host: "api.example.com:443".into(),
            until: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
        };
        assert_eq!(HostPause::decode(&p.encode()), Some(p));
        for bad in [
            "",
            "12",
            "x api:443",
            "12 ",
            "12 a b",
            &format!("1 {}", "h".repeat(301)),
        ] {
            assert_eq!(HostPause::decode(bad), None, "{bad}");
        }
    }
}
