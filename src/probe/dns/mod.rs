//! A `dns://NAME?type=TYPE` target: one question a poll, to the operator's
//! resolver (`--dns-resolver`, else the first nameserver of /etc/resolv.conf),
//! or to the wait's own `resolver=` where the operator lets a wait name one;
//! that resolver is reached through the SSRF guard's resolver like any target.
//! Each poll runs under the per-host limit (keyed by the resolver) and the
//! probe timeout. Its state is `resolved`, `NODATA` or `NXDOMAIN`; conditions
//! see the answer as the map `dns`.

pub mod wire;

use std::net::SocketAddr;
use std::time::Duration;

use super::connection::{Conn, Probed};
use super::refusal;
use super::tcp::state;
use crate::engine::Observation;
use crate::engine::condition::Field;
use crate::engine::spec::dns::{Question, question};
use crate::outbound::ResolveError;
pub use wire::{Answer, Failure, read_answer};

/// Where a prober sends the questions of `dns://` targets.
#[derive(Clone, Debug, Default)]
pub struct Resolvers {
    /// The operator's resolver; `None`: none could be found, and every DNS wait
    /// says so.
    pub operator: Option<SocketAddr>,
    /// Whether a wait may name its own (`--dns-tenant-resolvers`).
    pub tenants: bool,
}

/// The most bytes of /etc/resolv.conf read.
const MAX_RESOLV_CONF: usize = 64 * 1024;

/// The first `nameserver` of /etc/resolv.conf, on port 53; `None` when there is
/// none (or the file cannot be read within the operator files' bounds).
pub async fn system_resolver() -> Option<SocketAddr> {
    let text = crate::files::read_text(std::path::Path::new("/etc/resolv.conf"), MAX_RESOLV_CONF)
        .await
        .ok()?;
    first_nameserver(&text)
}

/// The first `nameserver` line's address of a resolv.conf text.
pub fn first_nameserver(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("nameserver"))
            .then(|| words.next())
            .flatten()
            // A link-local IPv6 address may carry its zone (`fe80::1%eth0`).
            .and_then(|a| a.split('%').next())
            .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// The question of a `dns://` target's URI.
fn asked(uri: &http::Uri) -> Result<Question, String> {
    question(&format!(
        "dns://{}?{}",
        uri.host().unwrap_or_default(),
        uri.query().unwrap_or_default()
    ))
}

/// The key of a DNS target's place in the per-host limit: its resolver's.
pub(in crate::probe) fn host_key(url: &url::Url) -> String {
    match url.query_pairs().find(|(k, _)| k == "resolver") {
        Some((_, at)) => format!("dns:{at}"),
        None => "dns:".to_string(),
    }
}

impl super::Prober {
    /// One question of a `dns://` target, not yet judged by a wait's conditions.
    pub(in crate::probe) async fn dns_probed(&self, wait: uuid::Uuid, c: &Conn<'_>) -> Probed {
        let q = match asked(c.uri) {
            Ok(q) => q,
            Err(why) => {
                return Probed::bare(Observation::Permanent {
                    error: format!("the target URL {why}"),
                });
            }
        };
        let _slot = self.inner.hosts.acquire(c.host.clone()).await;
        self.inner
            .shares
            .counts
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        // A resolver the wait names may be a name to look up first: within the
        // same bound as the question.
        let resolver =
            match tokio::time::timeout(self.inner.timeout, self.resolver_of(wait, &q)).await {
                Ok(Ok(at)) => at,
                Ok(Err(obs)) => return Probed::bare(obs),
                Err(_) => {
                    return Probed::bare(Observation::Transient {
                        error: format!(
                            "the resolver {} could not be looked up within {}s",
                            q.resolver.as_deref().unwrap_or_default(),
                            self.inner.timeout.as_secs_f64()
                        ),
                        retry_after: None,
                    });
                }
            };
        let exchange = wire::exchange(resolver, &q.name, q.record_type);
        let left = self.inner.timeout.saturating_sub(started.elapsed());
        let answer = match tokio::time::timeout(left, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(Failure::Transient(format!(
                "the resolver {resolver} did not answer within {}s",
                self.inner.timeout.as_secs_f64()
            ))),
        };
        let elapsed = started.elapsed();
        Probed {
            base: observation(&answer, &q, resolver),
            kind: "dns",
            fields: Some(fields(&answer, &q, resolver, elapsed)),
            elapsed,
        }
    }

    /// The address a question goes to: the operator's resolver, or the wait's
    /// own through the SSRF guard; the error is the observation.
    async fn resolver_of(&self, wait: uuid::Uuid, q: &Question) -> Result<SocketAddr, Observation> {
        let dns = &self.inner.dns;
        let Some(named) = &q.resolver else {
            return dns.operator.ok_or_else(|| Observation::Permanent {
                error: "this server has no DNS resolver to ask: its operator sets one with --dns-resolver (none was found in /etc/resolv.conf)".into(),
            });
        };
        if !dns.tenants {
            return Err(Observation::Permanent {
                error: "the target names a resolver, which this server does not let a wait choose (--dns-tenant-resolvers is off)".into(),
            });
        }
        let (host, port) = named.rsplit_once(':').unwrap_or((named, "53"));
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port.parse().unwrap_or(53);
        match self.inner.client.resolver().resolve_host(host).await {
            Ok(addrs) => {
                let mut at = addrs
                    .first()
                    .copied()
                    .ok_or_else(|| Observation::Transient {
                        error: format!("the resolver {named} has no address"),
                        retry_after: None,
                    })?;
                at.set_port(port);
                Ok(at)
            }
            Err(e @ ResolveError::Forbidden { .. }) => Err(refusal(wait, host, e.to_string())),
            Err(e) => Err(Observation::Transient {
                error: e.to_string(),
                retry_after: None,
            }),
        }
    }
}

/// The observation an answer makes: `resolved` with records of the asked type,
/// `NODATA` without, `NXDOMAIN` for a name that does not exist (each progress,
/// as the name may yet be made); any other response code, and no answer, worth
/// asking again; an answer past waitd's bounds permanent.
pub fn observation(
    answer: &Result<Answer, Failure>,
    q: &Question,
    resolver: SocketAddr,
) -> Observation {
    match answer {
        Ok(a) if a.rcode == "NOERROR" && !a.records.is_empty() => state("resolved"),
        Ok(a) if a.rcode == "NOERROR" => state("NODATA"),
        Ok(a) if a.rcode == "NXDOMAIN" => state("NXDOMAIN"),
        Ok(a) => Observation::Transient {
            error: format!(
                "the resolver {resolver} answered {} for {} {}",
                a.rcode, q.name, q.record_type
            ),
            retry_after: None,
        },
        Err(Failure::Transient(error)) => Observation::Transient {
            error: error.clone(),
            retry_after: None,
        },
        Err(Failure::Bounded(error)) => Observation::Permanent {
            error: error.clone(),
        },
    }
}

fn fields(
    answer: &Result<Answer, Failure>,
    q: &Question,
    resolver: SocketAddr,
    elapsed: Duration,
) -> Vec<(&'static str, Field)> {
    let (rcode, records, ttl, tcp, error) = match answer {
        Ok(a) => (
            Field::Text(a.rcode.clone()),
            a.records.clone(),
            a.ttl.map_or(Field::Null, |t| Field::Int(i64::from(t))),
            a.tcp,
            Field::Null,
        ),
        Err(f) => (
            Field::Null,
            Vec::new(),
            Field::Null,
            false,
            Field::Text(f.sentence().to_string()),
        ),
    };
    vec![
        ("name", Field::Text(q.name.clone())),
        ("type", Field::Text(q.record_type.to_string())),
        ("rcode", rcode),
        ("records", Field::List(records)),
        ("ttl", ttl),
        ("tcp", Field::Bool(tcp)),
        ("resolver", Field::Text(resolver.to_string())),
        ("error", error),
        ("elapsed", Field::Duration(elapsed)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_nameserver_of_resolv_conf_is_the_operators_resolver() {
        let conf =
            "# generated\nsearch example.com\nnameserver fe80::1%eth0\nnameserver 10.0.0.2\n";
        assert_eq!(
            first_nameserver(conf),
            Some("[fe80::1]:53".parse().unwrap())
        );
        assert_eq!(
            first_nameserver("options ndots:5\nnameserver 127.0.0.53\n"),
            Some("127.0.0.53:53".parse().unwrap())
        );
        assert_eq!(
            first_nameserver("nameserver\nnameserver dns.example\n"),
            None
        );
        assert_eq!(first_nameserver(""), None);
    }
}
