//! One request to a target, sent: through the client of its TLS settings, in its
//! turn of `--host-rate` and its place in the per-host limit, bounded by the
//! timeout from connecting to the last byte of the body, the pause it asks for
//! noted, and a `304` to a conditional request answered by the response kept.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use bytes::Bytes;
use http::{Method, Request, StatusCode};

use super::share::{self, Fetched, Response};
use super::{Prober, Target, Whose, conditional, method, pause, refusal};
use crate::engine::Observation;
use crate::model::LastPoll;
use crate::outbound::{Body, Client, Peer, TlsClient};

impl Prober {
    /// The client a target's requests go through: its own TLS settings', or the
    /// prober's.
    pub(super) fn client_of<'a>(&'a self, target: &'a Target) -> &'a Client {
        target
            .tls
            .as_deref()
            .map_or(&self.inner.client, TlsClient::client)
    }

    /// The request of a target: a GET of its URI with its headers, or its own
    /// method and body with a new `Idempotency-Key`.
    pub(super) fn request(&self, target: &Target) -> Request<Body> {
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
    pub(super) async fn fetch(
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

    /// A request that came to nothing: a refusal by the SSRF guard is logged as
    /// well; what may pass (DNS, connection, TLS, a timeout, a broken body) is
    /// transient, the rest (a body over the cap) permanent.
    pub(super) fn failure(
        &self,
        wait: uuid::Uuid,
        host: &str,
        e: crate::outbound::Error,
    ) -> Observation {
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
