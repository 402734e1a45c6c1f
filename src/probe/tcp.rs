//! A `tcp://host:port` target: one connection a poll, through the SSRF guard's
//! resolver, under the per-host limit and the probe timeout. Its state is
//! `connected` or `refused`; conditions see it as the map `tcp`.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

use super::connection::{Conn, Probed};
use super::read::decide;
use super::{Target, refusal};
use crate::engine::condition::{Field, Vars};
use crate::engine::{Observation, Spec};
use crate::outbound::ResolveError;

/// What one connection came to.
#[derive(Debug)]
pub(super) struct Connect {
    /// The address connected to, or the last one tried.
    pub(super) address: Option<SocketAddr>,
    pub(super) elapsed: Duration,
    pub(super) outcome: Outcome,
}

#[derive(Debug)]
pub(super) enum Outcome {
    Connected(TcpStream),
    /// Every address refused the connection: the port is closed.
    Refused,
    /// Anything else that may pass: no route, a reset, a failed lookup, the
    /// timeout.
    Failed(String),
    /// The guard refuses every address of the host.
    Forbidden(String),
}

impl super::Prober {
    /// One connection to a `tcp://` target, not yet judged by a wait's
    /// conditions.
    pub(super) async fn tcp_probed(&self, wait: uuid::Uuid, c: &Conn<'_>) -> Probed {
        let (host, port) = host_port(c.uri);
        let _slot = self.inner.hosts.acquire(c.host.clone()).await;
        self.inner
            .shares
            .counts
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let seen = self.connect(&host, port).await;
        let base = match &seen.outcome {
            Outcome::Connected(_) => state("connected"),
            Outcome::Refused => state("refused"),
            Outcome::Failed(error) => Observation::Transient {
                error: error.clone(),
                retry_after: None,
            },
            Outcome::Forbidden(error) => return Probed::bare(refusal(wait, &host, error.clone())),
        };
        let fields = vec![
            (
                "connected",
                Field::Bool(matches!(seen.outcome, Outcome::Connected(_))),
            ),
            ("elapsed", Field::Duration(seen.elapsed)),
            (
                "address",
                seen.address
                    .map_or(Field::Null, |a| Field::Text(a.to_string())),
            ),
            (
                "error",
                match &seen.outcome {
                    Outcome::Connected(_) => Field::Null,
                    Outcome::Refused => Field::Text("connection refused".into()),
                    Outcome::Failed(e) | Outcome::Forbidden(e) => Field::Text(e.clone()),
                },
            ),
        ];
        Probed {
            base,
            kind: "tcp",
            fields: Some(fields),
            elapsed: seen.elapsed,
        }
    }

    /// Connects to `host:port`: each address the guard lets through in turn,
    /// until one accepts, all bounded by the probe timeout.
    pub(super) async fn connect(&self, host: &str, port: u16) -> Connect {
        let started = tokio::time::Instant::now();
        let mut address = None;
        let attempt = async {
            let addrs = match self.inner.client.resolver().resolve_host(host).await {
                Ok(addrs) => addrs,
                Err(e @ ResolveError::Forbidden { .. }) => {
                    return Outcome::Forbidden(e.to_string());
                }
                Err(e) => return Outcome::Failed(e.to_string()),
            };
            let mut refused = true;
            let mut last = String::new();
            for mut addr in addrs {
                addr.set_port(port);
                address = Some(addr);
                match TcpStream::connect(addr).await {
                    Ok(stream) => return Outcome::Connected(stream),
                    Err(e) => {
                        refused &= e.kind() == std::io::ErrorKind::ConnectionRefused;
                        last = e.to_string();
                    }
                }
            }
            if refused {
                Outcome::Refused
            } else {
                Outcome::Failed(format!("could not connect to {host}:{port}: {last}"))
            }
        };
        let outcome = match tokio::time::timeout(self.inner.timeout, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => Outcome::Failed(format!(
                "the connection to {host}:{port} was not accepted within {}s",
                self.inner.timeout.as_secs_f64()
            )),
        };
        Connect {
            address,
            elapsed: started.elapsed(),
            outcome,
        }
    }
}

/// The host (an IPv6 literal without its brackets, which the resolver does not
/// take) and the port of a `tcp://`, `tls://` or `grpc://` target's URI.
pub(super) fn host_port(uri: &http::Uri) -> (String, u16) {
    let host = uri.host().unwrap_or_default();
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    (host, uri.port_u16().unwrap_or_default())
}

/// The wait's conditions on a connection's observation, the map `kind`, on the
/// CPU pool in the tenant's turn as a response's are.
pub(super) async fn judge_connection(
    spec: &Spec,
    target: &Target,
    base: Observation,
    kind: &'static str,
    fields: Vec<(&'static str, Field)>,
    elapsed: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Observation {
    let spec = spec.clone();
    let judged = crate::cpu::pool()
        .run(crate::cpu::Lane::Long, &target.tenant, move || {
            let state = match &base {
                Observation::State { values, .. } => values.first().cloned(),
                _ => None,
            }
            .map(serde_json::Value::String);
            let headers = Default::default();
            let vars = Vars::new(None, 0, &headers, state.as_ref())
                .at(now)
                .took(elapsed)
                .observed(kind, &fields);
            decide(&spec, &vars, 0, base)
        })
        .await;
    judged.unwrap_or_else(|lost| Observation::Permanent {
        error: format!("the conditions could not be evaluated: {lost}"),
    })
}

pub(super) fn state(s: &str) -> Observation {
    Observation::State {
        values: vec![s.to_string()],
        detail: None,
    }
}
