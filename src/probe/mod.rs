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

mod auth;
mod conditional;
mod connection;
pub mod dns;
pub mod grpc;
mod hosts;
mod method;
mod observe;
mod pause;
mod read;
mod share;
mod target;
mod tcp;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{ACCEPT, HeaderMap, HeaderName, HeaderValue, USER_AGENT as UA};
use http::{Method, Request, StatusCode, Uri};
use serde_json::Value;

use crate::engine::{Observation, Spec, ValuePath};
use crate::model::LastPoll;
use crate::outbound::credentials::{Bearer, Credentials};
use crate::outbound::rate::HostRate;
use crate::outbound::token::Tokens;
use crate::outbound::{Body, Client, KeyedSlots, Peer, TlsClient, TlsClients};
pub use pause::{Pause, asked as pause_asked};
pub use read::{Memo, callback_observation, header_map, judge, judge_took};
use share::{Fetched, Response, Turn};
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

/// A wait's target as every poll of it needs it, made once ([`Prober::target`]):
/// the request URI, the key of its host's place in the per-host limit, the
/// request's headers, and the SSRF guard's verdict on the URL (the guard does not
/// change while the process runs). A million held waits keep a million of these,
/// so it is kept small: RSS a wait grew by about 0.1 KiB over the parsed URL alone.
#[derive(Debug)]
pub struct Target {
    uri: Uri,
    /// "host:port".
    host: Arc<str>,
    /// Whose requests it sends, as pauses and the host rate's turns know them:
    /// its tenant's, to its host, with its headers, credential and TLS settings.
    pause: crate::bus::PauseKey,
    /// The request's headers when the target has headers of its own (the prober's
    /// defaults beneath them); `None`: the prober's defaults alone, shared rather
    /// than kept a wait (a header map is about a kilobyte, as much as the rest of
    /// a held wait).
    headers: Option<Box<HeaderMap>>,
    /// The guard refuses the URL itself (an address literal, `localhost`): why.
    refused: Option<Box<str>>,
    /// The wait's tenant: reading its answers takes that tenant's turns on the
    /// CPU pool.
    tenant: Arc<str>,
    /// The request's group, when its polls may be shared.
    group: Option<Arc<share::Group>>,
    /// The client of the target's own TLS settings; `None`: the prober's.
    tls: Option<Arc<TlsClient>>,
    /// When the wait last polled (or was taken up): it never reads a response
    /// begun before.
    last: share::LastPoll,
    /// The last response of an unshared request, kept for a `304`.
    kept: conditional::Slot,
    /// How the last poll's response came ([`Came`]).
    came: Came,
    /// A poll of it is waiting for its credential's token endpoint.
    minting: std::sync::atomic::AtomicBool,
    /// Where the token that goes with each request comes from, when the spec has
    /// `auth`.
    auth: Option<Bearer>,
    /// The method and body of a request that is not a GET.
    sent: Option<Box<method::Sent>>,
}

/// How a target's last poll got its response, in one byte: 0 before the first.
#[derive(Debug, Default)]
struct Came(AtomicU8);

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(group) = self.group.take() {
            share::Group::release(group);
        }
    }
}

impl Came {
    fn set(&self, how: LastPoll) {
        let b = match how {
            LastPoll::Sent => 1,
            LastPoll::Shared => 2,
            LastPoll::NotModified => 3,
            LastPoll::Paused => 4,
        };
        self.0.store(b, Relaxed);
    }

    fn get(&self) -> Option<LastPoll> {
        match self.0.load(Relaxed) {
            1 => Some(LastPoll::Sent),
            2 => Some(LastPoll::Shared),
            3 => Some(LastPoll::NotModified),
            4 => Some(LastPoll::Paused),
            _ => None,
        }
    }
}

/// Whose a request is, for the host rate's turns and the pauses: its host, its
/// tenant, and the key of its tenant's requests with its headers, credential and
/// TLS settings to that host.
#[derive(Clone, Debug)]
pub(crate) struct Whose {
    pub host: Arc<str>,
    pub tenant: Arc<str>,
    pub key: crate::bus::PauseKey,
}

impl Target {
    /// Whose its requests are.
    fn whose(&self) -> Whose {
        Whose {
            host: self.host.clone(),
            tenant: self.tenant.clone(),
            key: self.pause,
        }
    }

    /// The host, for the log (never the path or query).
    fn log_host(&self) -> &str {
        self.uri.host().unwrap_or_default()
    }

    /// How the last poll's response came: sent, shared, a `304` or paused; `None`
    /// before the first poll (and for a target the guard refuses).
    pub fn last_poll(&self) -> Option<LastPoll> {
        self.came.get()
    }

    /// Whether a poll of it is waiting for its credential's token endpoint now
    /// (then the deadline's sentence names the token endpoint, not the target).
    pub fn minting(&self) -> bool {
        self.minting.load(Relaxed) || self.group.as_ref().is_some_and(|g| g.minting.load(Relaxed))
    }
}

sentence_error! {
    /// Why a wait's target cannot be polled (a URL that does not parse, a header
    /// that is not a valid header, TLS settings rustls refuses): the observation
    /// every probe of it makes.
    pub struct TargetError;
}

/// The spec's target URL, parsed; the error is the observation a probe of it makes.
pub fn target_url(spec: &Spec) -> Result<url::Url, TargetError> {
    let Some(target) = &spec.target else {
        return Err("a callback wait has no target to poll".to_string().into());
    };
    url::Url::parse(&target.url)
        .map_err(|e| format!("the target URL is not a valid absolute URL ({e})").into())
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

    /// [`Prober::probe`] of a target made already ([`Prober::target`]), with what
    /// the wait's conditions decided on the last response ([`Memo`]), updated; or
    /// nothing sent, while the target's requests are paused.
    pub async fn probe_memo(
        &self,
        wait: uuid::Uuid,
        spec: &Spec,
        target: &Target,
        memo: &mut Option<Memo>,
    ) -> Polled {
        if let Some(refused) = &target.refused {
            return Polled::Observed(refusal(wait, target.log_host(), refused.to_string()), None);
        }
        if connection::SCHEMES.contains(&target.uri.scheme_str().unwrap_or_default()) {
            let observed = self.poll_connection(wait, spec, target).await;
            return Polled::Observed(observed, None);
        }
        if let Some(pause) = self.inner.pauses.paused(&target.pause, SystemTime::now) {
            target.came.set(LastPoll::Paused);
            return Polled::Held(pause);
        }
        let (fetched, came) = match &target.group {
            Some(group) => self.shared(wait, target, group).await,
            None => {
                let read_body = spec.success_condition.is_some()
                    || spec.failure_condition.is_some()
                    || !spec.output.is_empty()
                    || matches!(&spec.state, Some(p) if !matches!(p, ValuePath::HttpStatus));
                let request = self.request(target);
                let via = auth::Via {
                    client: self.client_of(target),
                    auth: target.auth.as_ref(),
                    minting: Some(&target.minting),
                };
                self.fetch_authed(wait, via, target.whose(), request, read_body, &target.kept)
                    .await
            }
        };
        target.came.set(came);
        let (obs, output) = self.read(wait, target, spec, memo, &fetched).await;
        Polled::Observed(obs, output)
    }

    /// The response a wait of a shared request reads: that of a request begun
    /// since its last poll, in flight or within the share window, or of one it
    /// sends now. The request runs on its own, so a wait cut at its deadline does
    /// not cut it for the others.
    async fn shared(
        &self,
        wait: uuid::Uuid,
        target: &Target,
        group: &Arc<share::Group>,
    ) -> share::Delivered {
        let now = tokio::time::Instant::now();
        let previous = target.last.replace(now);
        if Arc::strong_count(group) == 1 && target.auth.is_none() {
            // Only this wait sends the request, and no request of the group is in
            // flight (each holds the group): there is nobody to share with, so the
            // request is sent here, without a task and a channel of its own. A wait
            // taken up meanwhile sends its own first request. (A request with a
            // credential runs on its own as below, so that a token endpoint still
            // minting at the wait's deadline is what the wait names.)
            let via = auth::Via {
                client: self.client_of(target),
                auth: None,
                minting: None,
            };
            let request = self.request(target);
            return self
                .fetch_authed(wait, via, target.whose(), request, true, &group.kept)
                .await;
        }
        let (mut rx, joined) = match group.turn(previous, now, self.inner.share_window) {
            Turn::Join(rx) => {
                self.inner.shares.counts.shared.fetch_add(1, Relaxed);
                (rx, true)
            }
            Turn::Send(tx, began) => {
                let rx = tx.subscribe();
                let prober = self.clone();
                let request = self.request(target);
                let client = self.client_of(target).clone();
                let whose = target.whose();
                let held = share::Sending::new(group.clone());
                let group = Arc::downgrade(group);
                let window = self.inner.share_window;
                let auth = target.auth.clone();
                let traced = self.inner.client.traces().is_on();
                let send = async move {
                    // The waits that hold the request hold its group: when only
                    // requests in flight hold it, every one was let go, and the
                    // request is not sent, or is given up while in flight.
                    let fetch = prober.fetch_authed(
                        wait,
                        auth::Via {
                            client: &client,
                            auth: auth.as_ref(),
                            minting: Some(&held.0.minting),
                        },
                        whose,
                        request,
                        true,
                        &held.0.kept,
                    );
                    // Looked at first: a request whose host place comes just as
                    // its last wait goes is not sent.
                    let fetched = tokio::select! {
                        biased;
                        () = share::Group::unwanted(&held) => {
                            (Arc::new(Fetched::Failed(abandoned())), LastPoll::Sent)
                        }
                        fetched = fetch => fetched,
                    };
                    drop(held);
                    tx.send_replace(Some(fetched));
                    // A request only this wait sends is not kept; another's is
                    // kept for the rest of the window, then let go.
                    let alone = group.upgrade().is_none_or(|g| Arc::strong_count(&g) <= 2);
                    if !alone {
                        tokio::time::sleep_until(began + window).await;
                    }
                    if let Some(g) = group.upgrade() {
                        g.forget(began);
                    }
                };
                // The request is the span of the poll that sends it.
                if traced {
                    use opentelemetry::context::FutureExt as _;
                    tokio::spawn(send.with_current_context());
                } else {
                    tokio::spawn(send);
                }
                (rx, false)
            }
        };
        let (fetched, came) = match rx.wait_for(Option::is_some).await {
            Ok(delivered) => delivered
                .clone()
                .unwrap_or_else(|| (Arc::new(Fetched::Failed(abandoned())), LastPoll::Sent)),
            Err(_) => (Arc::new(Fetched::Failed(abandoned())), LastPoll::Sent),
        };
        // A wait that joined another's request read a shared response, whether
        // that request was answered in full or by a `304`.
        (fetched, if joined { LastPoll::Shared } else { came })
    }

    /// The client a target's requests go through: its own TLS settings', or the
    /// prober's.
    fn client_of<'a>(&'a self, target: &'a Target) -> &'a Client {
        target
            .tls
            .as_deref()
            .map_or(&self.inner.client, TlsClient::client)
    }

    /// The request of a target: a GET of its URI with its headers, or its own
    /// method and body with a new `Idempotency-Key`.
    fn request(&self, target: &Target) -> Request<Body> {
        let mut request = Request::new(Body::new(Bytes::new()));
        *request.method_mut() = Method::GET;
        *request.uri_mut() = target.uri.clone();
        *request.headers_mut() = target
            .headers
            .as_deref()
            .unwrap_or(&self.inner.defaults)
            .clone();
        if let Some(sent) = &target.sent {
            method::apply(sent, &mut request);
        }
        request
    }

    /// Sends one request under the per-host limit, bounded by the timeout from
    /// connecting to the last byte of the body (read when `read_body`).
    async fn fetch(
        &self,
        wait: uuid::Uuid,
        client: &Client,
        whose: Whose,
        mut request: Request<Body>,
        read_body: bool,
        kept: &conditional::Slot,
    ) -> share::Delivered {
        // The URI's parts are shared, not copied: a host named in a failure only.
        let uri = request.uri().clone();
        let log_host = || uri.host().unwrap_or_default();
        // A response is kept only when its body was read, so only then can a
        // `304` stand for it; and only a GET's.
        let revalidate = read_body && request.method() == Method::GET;
        let previous = revalidate.then(|| conditional::kept(kept)).flatten();
        if let Some(k) = &previous {
            k.condition(request.headers_mut());
        }
        if let Some(rate) = &self.inner.rate {
            let asked = tokio::time::Instant::now();
            rate.turn(&whose.host, &whose.tenant, &whose.key).await;
            self.inner
                .shares
                .counts
                .rate_waited_ms
                .fetch_add(asked.elapsed().as_millis() as u64, Relaxed);
        }
        let _slot = self.inner.hosts.acquire(whose.host.clone()).await;
        self.inner.shares.counts.sent.fetch_add(1, Relaxed);
        let started = tokio::time::Instant::now();
        let exchange = async {
            let mut response = match client.send(request, Peer::Target).await {
                Ok(r) => r,
                Err(e) => return Fetched::Failed(self.failure(wait, log_host(), e)),
            };
            if client.traces().is_on() {
                crate::traces::status_seen(response.status());
            }
            let now = SystemTime::now();
            if let Some((quiet, cause)) = pause::asked(
                response.status(),
                response.headers(),
                now,
                self.inner.max_host_pause,
            ) {
                let added = self.inner.pauses.pause(&whose.key, now, quiet, cause);
                self.inner
                    .shares
                    .counts
                    .paused_ms
                    .fetch_add(added.as_millis() as u64, Relaxed);
                if !added.is_zero() {
                    self.announce(&whose, now + quiet, cause);
                }
            }
            if response.status() == StatusCode::NOT_MODIFIED {
                return match &previous {
                    // Marked: the caller returns the response kept.
                    Some(_) => Fetched::NotModified,
                    None => Fetched::Failed(Observation::Transient {
                        error: "the target answered 304 Not Modified to a request that was not conditional, so there is no response to read; it is asked again without conditions at the next poll".into(),
                        retry_after: None,
                    }),
                };
            }
            let body = if read_body {
                let read = crate::outbound::read_body(
                    response.body_mut(),
                    self.inner.max_body,
                    Peer::Target,
                );
                Some(match read.await {
                    Ok(body) => Ok(Bytes::from(body)),
                    Err(e) => Err(self.failure(wait, log_host(), e)),
                })
            } else {
                None
            };
            let (parts, _) = response.into_parts();
            Fetched::Answered(Response {
                status: parts.status,
                headers: parts.headers,
                body,
                elapsed: started.elapsed(),
            })
        };
        let fetched = match tokio::time::timeout(self.inner.timeout, exchange).await {
            Ok(fetched) => fetched,
            Err(_) => Fetched::Failed(self.failure(
                wait,
                log_host(),
                crate::outbound::Error::Timeout {
                    peer: Peer::Target,
                    within: self.inner.timeout,
                },
            )),
        };
        match (fetched, previous) {
            (Fetched::NotModified, Some(k)) => {
                self.inner.shares.counts.not_modified.fetch_add(1, Relaxed);
                (k.fetched.clone(), LastPoll::NotModified)
            }
            (fetched, _) => {
                let fetched = Arc::new(fetched);
                if revalidate {
                    conditional::remember(kept, &fetched, &self.inner.kept);
                }
                (fetched, LastPoll::Sent)
            }
        }
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

    /// A request that came to nothing: a refusal by the SSRF guard is logged as
    /// well; what may pass (DNS, connection, TLS, a timeout, a broken body) is
    /// transient, the rest (a body over the cap) permanent.
    fn failure(&self, wait: uuid::Uuid, host: &str, e: crate::outbound::Error) -> Observation {
        if let crate::outbound::Error::Refused(error) = e {
            return refusal(wait, host, error);
        }
        let error = e.to_string();
        if e.is_transient() {
            Observation::Transient {
                error,
                retry_after: None,
            }
        } else {
            Observation::Permanent { error }
        }
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
