//! One GET of a wait's target → one [`Observation`].
//!
//! The prober knows nothing of storage, scheduling or serving: it takes a [`Spec`],
//! sends one request with one shared client (or the client of the wait's own TLS
//! settings, shared by every wait of them), and classifies the answer exactly as
//! docs/engine.md §3.2 says:
//!
//! | answer | observation |
//! |---|---|
//! | 2xx, JSON body, state present | [`Observation::State`] (with the `error` detail, if any) |
//! | 2xx, state `@status` | [`Observation::State`] with the status code (e.g. "200"); the body is not read |
//! | 2xx, state absent or null, or a body that is not JSON | [`Observation::Missing`] |
//! | 404, 410 | [`Observation::NotFound`] |
//! | connection, DNS, TLS or timeout errors; 408, 425, 429, 500, 502, 503, 504 | [`Observation::Transient`] |
//! | every other status (3xx, 400, 401, 403, 422, 501…), an SSRF refusal, a body over the cap | [`Observation::Permanent`] |
//! | 304 to a conditional request | the response kept for it, again ([`conditional`]) |
//! | 304 to a request that was not conditional | [`Observation::Transient`] |
//!
//! The client never follows redirects (a redirect is a permanent error: point the wait
//! at the final URL), uses no proxy (so the SSRF guard judges the address actually
//! connected to), bounds every request by [`ProbeConfig::timeout`] from connecting to
//! the last body byte, reads the body chunk by chunk and stops at
//! [`ProbeConfig::max_body`], and lets at most [`ProbeConfig::per_host_concurrency`]
//! probes talk to one host and port at a time.
//!
//! Error texts name the status, the cause and what to do; they never contain a header
//! value (header values are secrets) nor the target URL (the wait shows it already,
//! and its query may carry a token).
//!
//! This file is the prober's settings, the classes of a status and what one
//! prober holds. The rest have files of their own: [`target`] (a wait's target,
//! made once for its many polls), [`poll`] (one poll of it), [`fetch`] (one
//! request sent), [`auth`] (the token that goes with it), [`method`] (a request
//! that is not a GET), [`conditional`] (`304`s), [`share`] (the polls identical
//! requests share), [`pause`] and [`hosts`] (targets that ask for quiet, and
//! `--host-rate`), [`observe`] and [`read`] (what a wait makes of a response),
//! and [`connection`] with [`tcp`], [`tls`], [`grpc`] and [`dns`] (the targets
//! that are not an HTTP request).

mod auth;
mod conditional;
mod connection;
pub mod dns;
mod fetch;
pub mod grpc;
mod hosts;
mod method;
mod observe;
mod pause;
mod poll;
mod read;
mod share;
mod target;
mod tcp;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::StatusCode;
use http::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue, USER_AGENT as UA};
use serde_json::Value;

use crate::engine::{Observation, Spec};
use crate::outbound::credentials::Credentials;
use crate::outbound::rate::HostRate;
use crate::outbound::token::Tokens;
use crate::outbound::{Client, KeyedSlots, TlsClients};
pub use pause::{Pause, asked as pause_asked};
pub use read::{Memo, callback_observation, header_map, judge, judge_took};
use target::Whose;
pub use target::{Target, TargetError, target_url};
pub use tls::{Served, served};

pub use crate::outbound::guard;
pub use crate::outbound::{
    Guard, GuardedResolver, MAX_RETRY_AFTER, ResolveError, USER_AGENT, retry_after,
};

/// How the prober is set up. Build it with `..ProbeConfig::default()` so that new
/// fields keep their defaults.
#[derive(Clone, Debug)]
pub struct ProbeConfig {
    /// The bound on one request, from connecting to the last body byte (default 10s).
    pub timeout: Duration,
    /// The largest response body read (default 1 MiB); a larger one is a permanent
    /// error.
    pub max_body: usize,
    /// The SSRF guard (default: refuse every internal address).
    pub guard: Guard,
    /// At most this many probes in flight to one host and port (default 16).
    pub per_host_concurrency: usize,
    /// Fixed DNS answers used instead of the system resolver, still judged by the
    /// guard (tests make `evil.test` resolve to 127.0.0.1 with it). Port 0 means the
    /// URL's port.
    pub resolve_overrides: Vec<(String, SocketAddr)>,
    /// Sent as [`IDENTITY_HEADER`] with every probe (`--probe-identity`).
    pub identity: Option<String>,
    /// A wait that falls due reads the response of the identical request of its
    /// tenant begun at most this long ago, or still in flight (`--share-window`,
    /// default 1s); zero: every wait sends its own requests.
    pub share_window: Duration,
    /// The longest a host that asks for quiet is paused (`--max-host-pause`,
    /// default and most 1h).
    pub max_host_pause: Duration,
    /// Requests a second to one host across the replicas (`--host-rate`); zero:
    /// no limit.
    pub host_rate: f64,
    /// The credentials the operator holds (`--credentials-file`), which a
    /// target's `auth.credential` names.
    pub credentials: Arc<Credentials>,
    /// Every request is a client span when traces are on.
    pub traces: crate::traces::Traces,
    /// Where `dns://` targets are asked.
    pub dns: dns::Resolvers,
}

/// The header that names the replica a probe comes from, when it is configured.
pub const IDENTITY_HEADER: &str = "waitd-replica";

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            timeout: Duration::from_secs(10),
            max_body: 1024 * 1024,
            guard: Guard::default(),
            per_host_concurrency: 16,
            resolve_overrides: Vec::new(),
            identity: None,
            share_window: Duration::from_secs(1),
            max_host_pause: MAX_RETRY_AFTER,
            host_rate: 0.0,
            credentials: Arc::default(),
            traces: crate::traces::Traces::off(),
            dns: dns::Resolvers::default(),
        }
    }
}

/// How a status code is read, before the body is looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusClass {
    /// 2xx: read the body.
    Success,
    /// 404, 410.
    NotFound,
    /// 408, 425, 429, 500, 502, 503, 504.
    Transient,
    /// Everything else: 1xx, 3xx (redirects are not followed), other 4xx, 501, other 5xx.
    Permanent,
}

/// The class of an HTTP status code (docs/engine.md §3.2).
pub fn classify_status(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Success,
        404 | 410 => StatusClass::NotFound,
        408 | 425 | 429 | 500 | 502 | 503 | 504 => StatusClass::Transient,
        _ => StatusClass::Permanent,
    }
}

/// What a poll came to: an observation, or nothing sent, because the target
/// asked the wait's requests for quiet (a pause, which is no observation: the
/// engine [holds](crate::engine::hold) the wait).
#[derive(Clone, Debug, PartialEq)]
pub enum Polled {
    /// What the poll observed, and the wait's `output` as this response gives it
    /// (when its spec names one).
    Observed(Observation, Option<Value>),
    Held(Pause),
}

/// Sends the GETs. Cheap to clone: every clone shares one client (one connection
/// pool), one guard and one set of per-host limits.
#[derive(Clone)]
pub struct Prober {
    inner: Arc<Inner>,
}

struct Inner {
    /// The outbound client (see [`crate::outbound`]).
    client: Client,
    /// The clients of the targets with TLS settings of their own.
    tls: TlsClients,
    /// `User-Agent`, `Accept` and `--probe-identity`, under a target's own headers.
    defaults: HeaderMap,
    timeout: Duration,
    max_body: usize,
    /// Probes in flight per "host:port".
    hosts: Arc<KeyedSlots<Arc<str>>>,
    share_window: Duration,
    /// The distinct requests the held waits send, and the counts of requests.
    shares: Arc<share::Registry>,
    /// Bytes of responses kept for a `304`.
    kept: Arc<conditional::Budget>,
    /// The requests a target asked for quiet, and until when.
    pauses: pause::Pauses,
    max_host_pause: Duration,
    /// The tokens of the credentials held waits name.
    tokens: Arc<Tokens>,
    /// Where the pauses this replica sets go, for the other replicas
    /// ([`Prober::announce_pauses`]).
    announced: std::sync::OnceLock<tokio::sync::mpsc::Sender<crate::bus::HostPause>>,
    /// `--host-rate`, when it is set.
    rate: Option<Arc<HostRate>>,
    /// The credentials the operator holds.
    credentials: Arc<Credentials>,
    /// Where `dns://` targets are asked.
    dns: dns::Resolvers,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("guard", self.inner.client.guard())
            .field("timeout", &self.inner.timeout)
            .field("max_body", &self.inner.max_body)
            .field("per_host_concurrency", &self.inner.hosts.per_key())
            .finish_non_exhaustive()
    }
}

impl Prober {
    /// Builds the shared client: rustls with the ring provider (installed as the
    /// process default if none is), the guarded resolver, no redirects, no proxy, the
    /// per-request timeout, `User-Agent: waitd/<version>` and `Accept:
    /// application/json` (a target header of the same name replaces it).
    pub fn new(config: ProbeConfig) -> Result<Prober, crate::config::SettingError> {
        let mut defaults = HeaderMap::new();
        defaults.insert(UA, HeaderValue::from_static(USER_AGENT));
        defaults.insert(ACCEPT, HeaderValue::from_static("application/json"));
        if let Some(id) = &config.identity {
            let value = HeaderValue::from_str(id).map_err(|_| {
                crate::config::SettingError(format!(
                    "--probe-identity \"{}\" is not a valid header value (printable ASCII only)",
                    id.escape_debug()
                ))
            })?;
            defaults.insert(HeaderName::from_static(IDENTITY_HEADER), value);
        }
        let client = Client::new(Arc::new(config.guard), &config.resolve_overrides)?
            .with_traces(config.traces.clone());
        Ok(Prober {
            inner: Arc::new(Inner {
                tls: TlsClients::new(client.clone()),
                client,
                defaults,
                timeout: config.timeout,
                max_body: config.max_body,
                hosts: KeyedSlots::new(config.per_host_concurrency),
                share_window: config.share_window,
                shares: Arc::default(),
                kept: Arc::default(),
                pauses: pause::Pauses::default(),
                max_host_pause: config.max_host_pause.min(MAX_RETRY_AFTER),
                tokens: Arc::default(),
                announced: std::sync::OnceLock::new(),
                rate: HostRate::new(config.host_rate).map_err(crate::config::SettingError)?,
                credentials: config.credentials.clone(),
                dns: config.dns,
            }),
        })
    }

    /// The outbound client probes go through (webhooks share it).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The guard this prober applies (the API uses the same one at creation).
    pub fn guard(&self) -> &Guard {
        self.inner.client.guard()
    }

    /// One GET of `spec.target.url` with `spec.target.headers`, classified. Never
    /// panics and never fails: every problem is an observation. A pause its own
    /// earlier answers asked for is waited out before the request is sent (the
    /// caller bounds the wait by its deadline).
    ///
    /// A body larger than [`ProbeConfig::max_body`] is [`Observation::Permanent`]
    /// ("the response body exceeded the 1 MiB limit"): the target answered, so
    /// retrying would fetch the same oversized document again, and reading it whole
    /// is what the cap exists to prevent. Reading stops at the first chunk over the
    /// cap (or at once when `Content-Length` announces too much).
    pub async fn probe(&self, spec: &Spec) -> Observation {
        self.probe_output(spec).await.0
    }

    /// [`Prober::probe`], with the wait's `output` as the response gives it.
    pub async fn probe_output(&self, spec: &Spec) -> (Observation, Option<Value>) {
        // A single probe shares with nothing: it sends its own request.
        let target = match self.make_target(spec, Arc::from(crate::cpu::SYSTEM), false) {
            Ok(target) => target,
            Err(error) => return (Observation::Permanent { error: error.0 }, None),
        };
        loop {
            match self
                .probe_memo(uuid::Uuid::nil(), spec, &target, &mut None)
                .await
            {
                Polled::Observed(obs, output) => return (obs, output),
                Polled::Held(p) => {
                    let left = p
                        .until
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    tokio::time::sleep(left).await;
                }
            }
        }
    }

    /// The spec's target, made once for a wait polled many times; the error is the
    /// observation every probe of it makes (a URL that does not parse, a header
    /// that is not a valid header).
    pub fn target(&self, spec: &Spec) -> Result<Target, TargetError> {
        self.target_of(spec, Arc::from(crate::cpu::SYSTEM))
    }

    /// [`Prober::target`] of a wait of `tenant`.
    pub fn target_of(&self, spec: &Spec, tenant: Arc<str>) -> Result<Target, TargetError> {
        self.make_target(spec, tenant, true)
    }

    /// The counts of requests sent and polls shared, as the metrics show them.
    pub fn request_counts(&self) -> Arc<crate::metrics::ProbeRequests> {
        self.inner.shares.counts.clone()
    }

    /// How many distinct requests the held waits send (their shared polls).
    pub fn requests_held(&self) -> usize {
        self.inner.shares.held()
    }

    /// The tokens of the credentials held waits name, with their counts.
    pub fn tokens(&self) -> Arc<Tokens> {
        self.inner.tokens.clone()
    }

    /// How many hosts the per-host limit tracks now: those with a probe in flight.
    pub fn hosts_tracked(&self) -> usize {
        self.inner.hosts.keys()
    }
}

/// The observation of a poll whose response never came to it (a request that
/// ended without an answer, which does not happen while the process runs).
fn abandoned() -> Observation {
    Observation::Transient {
        error:
            "the request for this poll ended without an answer; it is sent again at the next poll"
                .into(),
        retry_after: None,
    }
}

/// "503 Service Unavailable", or "599" for a code without a standard reason.
fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// The guard refused the target: a permanent error, and a warning for the operator
/// (most often the allow-list was narrowed since the wait was created). The log
/// names the wait and the host, never the query.
fn refusal(wait: uuid::Uuid, host: &str, error: String) -> Observation {
    tracing::warn!(
        wait_id = %wait,
        host,
        "the SSRF guard refuses this wait's target; it ends in error"
    );
    Observation::Permanent { error }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_fall_into_the_classes_of_the_design() {
        use StatusClass::*;
        for (code, class) in [
            (200, Success),
            (201, Success),
            (204, Success),
            (299, Success),
            (404, NotFound),
            (410, NotFound),
            (408, Transient),
            (425, Transient),
            (429, Transient),
            (500, Transient),
            (502, Transient),
            (503, Transient),
            (504, Transient),
            (100, Permanent),
            (301, Permanent),
            (302, Permanent),
            (304, Permanent),
            (400, Permanent),
            (401, Permanent),
            (403, Permanent),
            (405, Permanent),
            (409, Permanent),
            (422, Permanent),
            (501, Permanent),
            (505, Permanent),
            (599, Permanent),
        ] {
            assert_eq!(classify_status(code), class, "{code}");
        }
    }
}
