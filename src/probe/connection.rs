//! The targets that are not an HTTP request (`tcp://`, `tls://`, `grpc://`,
//! `dns://`): one probe a poll ([`Probed`]), judged by each wait's own
//! conditions, and shared as HTTP polls are: waits of one tenant that ask the
//! same probe (the same URL, and for `tls://` the same authorities and server
//! name) read one probe begun within the share window, or still in flight,
//! rather than each making its own.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use http::Uri;

use super::share::{self, Fetched, Turn};
use super::tcp::judge_connection;
use super::{Prober, Target, abandoned};
use crate::engine::condition::Field;
use crate::engine::spec::tls::Tls;
use crate::engine::{Observation, Spec};
use crate::model::LastPoll;

/// The schemes of the targets this module probes.
pub(super) const SCHEMES: [&str; 4] = ["tcp", "tls", "grpc", "dns"];

/// What a probe of a connection target needs of its wait.
pub(super) struct Conn<'a> {
    pub uri: &'a Uri,
    /// The key of its place in the per-host limit.
    pub host: &'a Arc<str>,
    /// A `tls://` target's authorities and server name.
    pub tls: Option<&'a Tls>,
}

impl<'a> Conn<'a> {
    fn of(target: &'a Target, spec: &'a Spec) -> Conn<'a> {
        Conn {
            uri: &target.uri,
            host: &target.host,
            tls: spec.target.as_ref().and_then(|t| t.tls.as_ref()),
        }
    }
}

/// What one probe of a connection target saw, before a wait's conditions judge
/// it: what every wait that reads it is given.
#[derive(Clone, Debug)]
pub(super) struct Probed {
    /// The observation without conditions.
    pub base: Observation,
    /// The map conditions see it as (`tcp`, `tls`, `grpc`, `dns`).
    pub kind: &'static str,
    /// Its fields; `None`: the observation stands whatever the conditions say
    /// (the guard refused the target, or it could not be asked).
    pub fields: Option<Vec<(&'static str, Field)>>,
    pub elapsed: Duration,
}

impl Probed {
    /// An observation no condition judges.
    pub fn bare(base: Observation) -> Probed {
        Probed {
            base,
            kind: "",
            fields: None,
            elapsed: Duration::ZERO,
        }
    }

    /// The observation a wait makes of it: judged by its conditions, if any.
    pub async fn judge(self, spec: &Spec, target: &Target) -> Observation {
        match self.fields {
            Some(fields)
                if spec.success_condition.is_some() || spec.failure_condition.is_some() =>
            {
                judge_connection(
                    spec,
                    target,
                    self.base,
                    self.kind,
                    fields,
                    self.elapsed,
                    chrono::Utc::now(),
                )
                .await
            }
            _ => self.base,
        }
    }
}

impl Prober {
    /// One poll of a connection target: a probe of its own, or one it shares.
    pub(super) async fn poll_connection(
        &self,
        wait: uuid::Uuid,
        spec: &Spec,
        target: &Target,
    ) -> Observation {
        let (probed, came) = match &target.group {
            Some(group) => self.shared_probe(wait, spec, target, group).await,
            None => (
                self.probe_connection(wait, &Conn::of(target, spec)).await,
                LastPoll::Sent,
            ),
        };
        target.came.set(came);
        probed.judge(spec, target).await
    }

    async fn probe_connection(&self, wait: uuid::Uuid, c: &Conn<'_>) -> Probed {
        match c.uri.scheme_str() {
            Some("tcp") => self.tcp_probed(wait, c).await,
            Some("tls") => self.tls_probed(wait, c).await,
            Some("grpc") => self.grpc_probed(wait, c).await,
            _ => self.dns_probed(wait, c).await,
        }
    }

    /// The probe a wait of a shared connection target reads: one begun since
    /// its last poll, in flight or within the share window, or one it makes
    /// now. The probe runs on its own, so a wait cut at its deadline does not
    /// cut it for the others (as [`Prober::shared`] does for a request).
    async fn shared_probe(
        &self,
        wait: uuid::Uuid,
        spec: &Spec,
        target: &Target,
        group: &Arc<share::Group>,
    ) -> (Probed, LastPoll) {
        let now = tokio::time::Instant::now();
        let previous = target.last.replace(now);
        if Arc::strong_count(group) == 1 {
            // Nobody to share with: probed here, without a task of its own.
            let probed = self.probe_connection(wait, &Conn::of(target, spec)).await;
            return (probed, LastPoll::Sent);
        }
        let (mut rx, joined) = match group.turn(previous, now, self.inner.share_window) {
            Turn::Join(rx) => {
                self.inner.shares.counts.shared.fetch_add(1, Relaxed);
                (rx, true)
            }
            Turn::Send(tx, began) => {
                let rx = tx.subscribe();
                let prober = self.clone();
                let uri = target.uri.clone();
                let host = target.host.clone();
                let tls = spec.target.as_ref().and_then(|t| t.tls.clone());
                let held = share::Sending::new(group.clone());
                let group = Arc::downgrade(group);
                let window = self.inner.share_window;
                tokio::spawn(async move {
                    let conn = Conn {
                        uri: &uri,
                        host: &host,
                        tls: tls.as_ref(),
                    };
                    let probe = prober.probe_connection(wait, &conn);
                    // A probe whose last wait is let go is not made, or given up.
                    let probed = tokio::select! {
                        biased;
                        () = share::Group::unwanted(&held) => Probed::bare(abandoned()),
                        probed = probe => probed,
                    };
                    drop(held);
                    tx.send_replace(Some((Arc::new(Fetched::Probed(probed)), LastPoll::Sent)));
                    let alone = group.upgrade().is_none_or(|g| Arc::strong_count(&g) <= 2);
                    if !alone {
                        tokio::time::sleep_until(began + window).await;
                    }
                    if let Some(g) = group.upgrade() {
                        g.forget(began);
                    }
                });
                (rx, false)
            }
        };
        let delivered = match rx.wait_for(Option::is_some).await {
            Ok(delivered) => delivered.clone().map(|d| d.0),
            Err(_) => None,
        };
        let probed = match delivered.as_deref() {
            Some(Fetched::Probed(p)) => p.clone(),
            Some(Fetched::Failed(obs)) => Probed::bare(obs.clone()),
            _ => Probed::bare(abandoned()),
        };
        (
            probed,
            if joined {
                LastPoll::Shared
            } else {
                LastPoll::Sent
            },
        )
    }
}
