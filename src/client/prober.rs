//! The one place `waitd wait` reaches the prober: one constructor and one call, so
//! that the in-process wait polls exactly as a server's worker does (the same
//! client, SSRF guard, body cap and conditions) through the smallest surface.

use crate::config::SettingError;
use crate::engine::{Observation, Spec};
use crate::probe::dns::Resolvers;
use crate::probe::{Guard, ProbeConfig, Prober};

/// Polls a wait's target as a server's worker does.
pub(super) struct Poller {
    prober: Prober,
}

impl Poller {
    /// A prober whose SSRF guard lets through what `allow_targets` names
    /// (`--allow-targets`), asking `dns://` targets of `dns` (`--resolver`),
    /// with the server's defaults for everything else.
    pub(super) fn new(allow_targets: &[String], dns: Resolvers) -> Result<Poller, SettingError> {
        let guard = Guard::new(allow_targets)?;
        let prober = Prober::new(ProbeConfig {
            guard,
            dns,
            ..ProbeConfig::default()
        })?;
        Ok(Poller { prober })
    }

    /// Why the SSRF guard refuses this URL outright (an internal address literal,
    /// `localhost`), as a server refuses it at creation; `None` when it does not.
    pub(super) fn refusal(&self, url: &url::Url) -> Option<String> {
        self.prober
            .guard()
            .check_url(url)
            .err()
            .map(|r| r.to_string())
    }

    /// One GET of the target, classified (and judged by the wait's conditions),
    /// and the wait's `output` as its response gives it.
    pub(super) async fn poll(&self, spec: &Spec) -> (Observation, Option<serde_json::Value>) {
        self.prober.probe_output(spec).await
    }
}
