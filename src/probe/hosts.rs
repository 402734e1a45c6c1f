//! What the prober does beyond one request: the pauses it announces to the other
//! replicas and those it hears of, and its share of `--host-rate`.

use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use super::Prober;
use crate::bus::PauseCause;

impl Prober {
    /// The pauses this prober sets from now on, to tell the other replicas of
    /// (only the first call gets them). A pause is dropped rather than waited for
    /// when 256 are not sent yet: a later answer of that host pauses it again.
    pub fn announce_pauses(&self) -> tokio::sync::mpsc::Receiver<crate::bus::HostPause> {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let _ = self.inner.announced.set(tx);
        rx
    }

    pub(super) fn announce(&self, whose: &super::Whose, until: SystemTime, cause: PauseCause) {
        if let Some(tx) = self.inner.announced.get() {
            let _ = tx.try_send(crate::bus::HostPause {
                key: whose.key,
                host: whose.host.clone(),
                until,
                cause,
            });
        }
    }

    /// A pause another replica set: this one keeps the same requests quiet as
    /// long, at most `--max-host-pause` from now (and never shortens a pause it
    /// has).
    pub fn heard_pause(&self, pause: &crate::bus::HostPause) {
        let now = SystemTime::now();
        if let Ok(left) = pause.until.duration_since(now) {
            let added = self.inner.pauses.pause(
                &pause.key,
                now,
                left.min(self.inner.max_host_pause),
                pause.cause,
            );
            self.inner
                .shares
                .counts
                .paused_ms
                .fetch_add(added.as_millis() as u64, Relaxed);
        }
    }

    /// How many replicas share `--host-rate` (this one's share is the rate
    /// divided by it).
    pub fn set_replicas(&self, n: u32) {
        if let Some(rate) = &self.inner.rate {
            rate.set_replicas(n);
            self.inner
                .shares
                .counts
                .rate_replicas
                .store(i64::from(n.max(1)), Relaxed);
        }
    }

    /// Whether `--host-rate` is set.
    pub fn has_host_rate(&self) -> bool {
        self.inner.rate.is_some()
    }
}
