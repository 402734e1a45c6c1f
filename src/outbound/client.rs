//! The one HTTP client every outbound request goes through.
//!
//! hyper's pooled HTTP/1 client, its names resolved only by the SSRF guard's
//! [`GuardedResolver`], TLS by rustls with the process's crypto provider and the
//! platform's verifier, or a wait's own authorities and client certificate
//! ([`Client::with_tls`], shared by [`super::TlsClients`]). No proxy (the guard
//! judges the address actually connected to), no redirects and no retries inside
//! the client: one request is one exchange, and what to do about its answer is the
//! caller's.
//!
//! Not reqwest: its layers for redirects and retries (a request cloned for a retry
//! that never comes, the URL parsed again for the redirect policy and for the
//! response) were most of the CPU a poll saved by leaving it (BENCHMARKS.md).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use super::error::{Error, Peer, error_chain};
use super::guard::{Guard, GuardedResolver};
use super::tls::TlsSettings;
use crate::config::SettingError;
use crate::traces::Traces;

/// The `User-Agent` of every outbound request.
pub const USER_AGENT: &str = concat!("waitd/", env!("CARGO_PKG_VERSION"));

/// The largest `Retry-After` honoured; a longer one is cut to this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// A request's body: a probe's is empty, a delivery's its payload.
pub type Body = Full<Bytes>;

/// Names resolved only by the guard's resolver, then plain TCP or TLS by the URL's
/// scheme.
type Connector = hyper_rustls::HttpsConnector<HttpConnector<GuardedResolver>>;

/// The guarded client. Cheap to clone: clones share one connection pool and one
/// guard.
#[derive(Clone)]
pub struct Client {
    http: HttpClient<Connector, Body>,
    guard: Arc<Guard>,
    resolver: GuardedResolver,
    /// Each request is a client span when traces are on ([`crate::traces`]).
    traces: Traces,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Builds the client under `guard`; `overrides` map host names to fixed
    /// addresses instead of asking DNS (the guard still judges them). HTTP/1.1,
    /// `TCP_NODELAY`, idle connections kept 90 s.
    pub fn new(
        guard: Arc<Guard>,
        overrides: &[(String, SocketAddr)],
    ) -> Result<Client, SettingError> {
        let resolver = GuardedResolver::new(guard.clone(), overrides);
        let tls = tls_config(None).map_err(|e| {
            SettingError(format!(
                "could not build the HTTP client for outbound requests: {e}"
            ))
        })?;
        Ok(Client::build(guard, resolver, tls))
    }

    /// A client like this one (the same guard, resolver and settings, a pool of
    /// its own) whose TLS trusts `tls.roots` instead of the platform's roots when
    /// there are any, and presents `tls.identity` when the server asks for a
    /// client certificate. Building it is CPU work: [`super::TlsClients`] makes
    /// one per distinct setting.
    pub fn with_tls(&self, tls: &TlsSettings) -> Result<Client, TlsError> {
        let config = tls_config(Some(tls))?;
        Ok(
            Client::build(self.guard.clone(), self.resolver.clone(), config)
                .with_traces(self.traces.clone()),
        )
    }

    /// This client, its requests traced by `traces`.
    pub fn with_traces(mut self, traces: Traces) -> Client {
        self.traces = traces;
        self
    }

    /// The traces its requests are spans of.
    /// The guard's resolver, for connections that are not HTTP requests.
    pub fn resolver(&self) -> &GuardedResolver {
        &self.resolver
    }

    pub fn traces(&self) -> &Traces {
        &self.traces
    }

    fn build(guard: Arc<Guard>, resolver: GuardedResolver, tls: rustls::ClientConfig) -> Client {
        let mut http = HttpConnector::new_with_resolver(resolver.clone());
        http.enforce_http(false);
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Client {
            http,
            guard,
            resolver,
            traces: Traces::off(),
        }
    }

    /// The guard this client applies.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Sends one request; the answer's head, or why there is none. The URL's own
    /// host must have passed [`Guard::check_url`] (an address literal never reaches
    /// the resolver); a name is judged on the addresses it resolves to.
    pub async fn send(
        &self,
        mut request: Request<Body>,
        peer: Peer,
    ) -> Result<Response<Incoming>, Error> {
        let Some(span) = self.traces.outbound(&mut request, peer.as_str()) else {
            return self
                .http
                .request(request)
                .await
                .map_err(|e| Error::of(peer, &e));
        };
        let answer = self
            .http
            .request(request)
            .await
            .map_err(|e| Error::of(peer, &e));
        match &answer {
            Ok(r) => crate::traces::answered(&span, Ok(r.status())),
            Err(e) => crate::traces::answered(&span, Err(e)),
        }
        answer
    }
}

sentence_error! {
    /// Why rustls cannot take a client's TLS settings.
    pub struct TlsError;
}

/// rustls with the process's crypto provider and the platform's verifier, as
/// reqwest's rustls client has it; or, with `own` authorities, a verifier that
/// trusts exactly those; and `own` client certificate, if any.
fn tls_config(own: Option<&TlsSettings>) -> Result<rustls::ClientConfig, TlsError> {
    let why = |e: rustls::Error| TlsError(error_chain(&e));
    let provider = crate::engine::spec::tls::crypto_provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(why)?;
    let builder = match own.filter(|t| !t.roots.is_empty()) {
        Some(own) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in &own.roots {
                roots.add(cert.clone()).map_err(why)?;
            }
            let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| TlsError(error_chain(&e)))?;
            builder.with_webpki_verifier(verifier)
        }
        None => {
            let verifier = rustls_platform_verifier::Verifier::new(provider).map_err(why)?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(verifier))
        }
    };
    match own.and_then(|t| t.identity.as_ref()) {
        Some((chain, key)) => builder
            .with_client_auth_cert(chain.clone(), key.clone_key())
            .map_err(why),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// An answer's body, read chunk by chunk up to `max` bytes; past it (or at once
/// when `Content-Length` announces more), [`Error::TooLarge`].
pub async fn read_body(incoming: &mut Incoming, max: usize, peer: Peer) -> Result<Vec<u8>, Error> {
    let announced = hyper::body::Body::size_hint(incoming).exact();
    if announced.is_some_and(|n| n > max as u64) {
        return Err(Error::TooLarge { max });
    }
    let mut body: Vec<u8> = Vec::with_capacity(announced.map_or(0, |n| n as usize));
    loop {
        match incoming.frame().await {
            Some(Ok(frame)) => {
                // Trailers carry nothing a caller reads.
                let Ok(chunk) = frame.into_data() else {
                    continue;
                };
                if body.len() + chunk.len() > max {
                    return Err(Error::TooLarge { max });
                }
                body.extend_from_slice(&chunk);
            }
            None => return Ok(body),
            Some(Err(e)) => return Err(Error::of(peer, &e)),
        }
    }
}

/// Reads and drops up to about `max` bytes of an answer (a peer may want it
/// drained), never more; a body that breaks off is let go.
pub async fn drain(incoming: &mut Incoming, max: usize) {
    let mut read = 0;
    while read < max {
        match incoming.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            _ => break,
        }
    }
}

/// The peer's own lower bound on the next attempt, from the response headers, in
/// this order: `retry-after-ms`, `x-ms-retry-after-ms` (milliseconds, as Azure sends
/// them), then `Retry-After` as delta seconds or an HTTP date (relative to `now`). A
/// header that does not parse is skipped for the next one; a date in the past means
/// no bound (`None`); a bound over [`MAX_RETRY_AFTER`] is cut to it.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|s| !s.is_empty())
    };
    let found = ["retry-after-ms", "x-ms-retry-after-ms"]
        .iter()
        .find_map(|name| text(name).and_then(parse_millis))
        .or_else(|| {
            let v = text("retry-after")?;
            if v.bytes().all(|b| b.is_ascii_digit()) {
                // Delta seconds; absurdly long ones saturate (and are cut below).
                Some(Duration::from_secs(v.parse::<u64>().unwrap_or(u64::MAX)))
            } else {
                let at = httpdate::parse_http_date(v).ok()?;
                Some(at.duration_since(now).ok()?)
            }
        })?;
    Some(found.min(MAX_RETRY_AFTER))
}

fn parse_millis(v: &str) -> Option<Duration> {
    if v.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_millis(v.parse::<u64>().unwrap_or(u64::MAX)));
    }
    // Some servers send fractional milliseconds.
    let ms: f64 = v.parse().ok()?;
    (ms.is_finite() && ms >= 0.0).then(|| Duration::from_secs_f64((ms / 1000.0).min(1e9)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_reads_seconds_dates_and_milliseconds() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let date = httpdate::fmt_http_date(now + Duration::from_secs(90));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        for (pairs, want) in [
            (vec![("retry-after", "7")], Some(Duration::from_secs(7))),
            (vec![("retry-after", " 0 ")], Some(Duration::ZERO)),
            (
                vec![("retry-after", date.as_str())],
                Some(Duration::from_secs(90)),
            ),
            (vec![("retry-after", past.as_str())], None),
            (
                vec![("retry-after-ms", "250")],
                Some(Duration::from_millis(250)),
            ),
            (
                vec![("x-ms-retry-after-ms", "1500")],
                Some(Duration::from_millis(1500)),
            ),
            (
                vec![("retry-after-ms", "2.5")],
                Some(Duration::from_micros(2500)),
            ),
            (
                vec![("retry-after-ms", "100"), ("retry-after", "9")],
                Some(Duration::from_millis(100)),
            ),
            (
                vec![("retry-after-ms", "soon"), ("retry-after", "9")],
                Some(Duration::from_secs(9)),
            ),
            (vec![("retry-after", "86400")], Some(MAX_RETRY_AFTER)),
            (
                vec![("retry-after", "99999999999999999999999")],
                Some(MAX_RETRY_AFTER),
            ),
            (vec![("retry-after", "-1")], None),
            (vec![("retry-after", "tomorrow")], None),
            (vec![("retry-after-ms", "-5")], None),
            (vec![], None),
        ] {
            assert_eq!(retry_after(&headers(&pairs), now), want, "{pairs:?}");
        }
    }
}
