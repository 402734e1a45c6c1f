//! A wait's target made once for the many polls of it: the request URI, its host's
//! place in the per-host limit, its headers, the guard's verdict, the group of
//! identical requests it shares polls with, its own TLS client and its token.

use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::Ordering::Relaxed;

use http::Uri;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use super::{Prober, conditional, method, share};
use crate::engine::Spec;
use crate::engine::spec::Auth;
use crate::model::LastPoll;
use crate::outbound::credentials::Bearer;
use crate::outbound::{TlsClient, TlsSettings};

/// A wait's target as every poll of it needs it, made once ([`Prober::target`]):
/// the request URI, the key of its host's place in the per-host limit, the
/// request's headers, and the SSRF guard's verdict on the URL (the guard does not
/// change while the process runs). A million held waits keep a million of these,
/// so it is kept small: RSS a wait grew by about 0.1 KiB over the parsed URL alone.
#[derive(Debug)]
pub struct Target {
    pub(super) uri: Uri,
    /// "host:port".
    pub(super) host: Arc<str>,
    /// Whose requests it sends, as pauses and the host rate's turns know them:
    /// its tenant's, to its host, with its headers, credential and TLS settings.
    pub(super) pause: crate::bus::PauseKey,
    /// The request's headers when the target has headers of its own (the prober's
    /// defaults beneath them); `None`: the prober's defaults alone, shared rather
    /// than kept a wait (a header map is about a kilobyte, as much as the rest of
    /// a held wait).
    pub(super) headers: Option<Box<HeaderMap>>,
    /// The guard refuses the URL itself (an address literal, `localhost`): why.
    pub(super) refused: Option<Box<str>>,
    /// The wait's tenant: reading its answers takes that tenant's turns on the
    /// CPU pool.
    pub(super) tenant: Arc<str>,
    /// The request's group, when its polls may be shared.
    pub(super) group: Option<Arc<share::Group>>,
    /// The client of the target's own TLS settings; `None`: the prober's.
    pub(super) tls: Option<Arc<TlsClient>>,
    /// When the wait last polled (or was taken up): it never reads a response
    /// begun before.
    pub(super) last: share::LastPoll,
    /// The last response of an unshared request, kept for a `304`.
    pub(super) kept: conditional::Slot,
    /// How the last poll's response came ([`Came`]).
    pub(super) came: Came,
    /// A poll of it is waiting for its credential's token endpoint.
    pub(super) minting: std::sync::atomic::AtomicBool,
    /// Where the token that goes with each request comes from, when the spec has
    /// `auth`.
    pub(super) auth: Option<Bearer>,
    /// The method and body of a request that is not a GET.
    pub(super) sent: Option<Box<method::Sent>>,
}

/// How a target's last poll got its response, in one byte: 0 before the first.
#[derive(Debug, Default)]
pub(super) struct Came(AtomicU8);

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(group) = self.group.take() {
            share::Group::release(group);
        }
    }
}

impl Came {
    pub(super) fn set(&self, how: LastPoll) {
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
    pub(super) fn whose(&self) -> Whose {
        Whose {
            host: self.host.clone(),
            tenant: self.tenant.clone(),
            key: self.pause,
        }
    }

    /// The host, for the log (never the path or query).
    pub(super) fn log_host(&self) -> &str {
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
    pub(super) fn make_target(
        &self,
        spec: &Spec,
        tenant: Arc<str>,
        shareable: bool,
    ) -> Result<Target, TargetError> {
        let url = target_url(spec)?;
        let Some(target) = &spec.target else {
            return Err("a callback wait has no target to poll".to_string().into());
        };
        let uri: Uri = url
            .as_str()
            .parse()
            .map_err(|e| format!("the target URL is not a valid request URI ({e})"))?;
        // A dns:// target's questions go to its resolver, whose place it takes.
        let host: Arc<str> = if url.scheme() == "dns" {
            super::dns::host_key(&url).into()
        } else {
            format!(
                "{}:{}",
                url.host_str().unwrap_or_default(),
                url.port_or_known_default().unwrap_or(0)
            )
            .into()
        };
        let mut headers = HeaderMap::new();
        for (name, value) in &target.headers {
            let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
                return Err(format!(
                    "the target header name \"{name}\" is not a valid header name"
                )
                .into());
            };
            let Ok(mut value) = HeaderValue::from_str(value) else {
                // Never echo the value: it may be a secret.
                return Err(format!(
                    "the value of the target header {name} is not a valid header value (printable ASCII only)"
                ).into());
            };
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let own = super::method::sent(spec, &mut headers);
        // The defaults go under the target's own headers of the same name.
        let headers = (!headers.is_empty()).then(|| {
            for (name, value) in &self.inner.defaults {
                if !headers.contains_key(name) {
                    headers.insert(name.clone(), value.clone());
                }
            }
            Box::new(headers)
        });
        // Address literals never reach the resolver, so they are judged here; names
        // are judged by the resolver, on the addresses it returns.
        let refused = self
            .guard()
            .check_url(&url)
            .err()
            .map(|r| r.to_string().into_boxed_str());
        let mut granted_tls = None;
        let auth = match &target.auth {
            Some(Auth::Oauth2(o)) => Some(Bearer::Minted(
                self.inner
                    .tokens
                    .credential(&tenant, o)
                    .map_err(|e| format!("no token for the target: {e}"))?,
            )),
            Some(Auth::Credential(name)) => {
                let granted = self
                    .inner
                    .credentials
                    .for_target(&tenant, name, &url)
                    .map_err(|e| format!("no token for the target: {e}"))?;
                granted_tls = granted.tls;
                Some(granted.bearer)
            }
            None => None,
        };
        let credential = auth.as_ref().map(|c| hex::encode(c.key()));
        let tls = match target.tls.as_ref().filter(|_| url.scheme() != "tls") {
            Some(own) => {
                let unusable =
                    |why: String| format!("the target's TLS settings cannot be used: {why}");
                let settings = TlsSettings {
                    roots: own.roots().map_err(unusable)?,
                    identity: own.identity().map_err(unusable)?,
                };
                Some(
                    self.inner
                        .tls
                        .client(&settings)
                        .map_err(|e| unusable(e.0))?,
                )
            }
            None => match &granted_tls {
                Some(settings) => Some(self.inner.tls.client(settings).map_err(|why| {
                    format!("the credential's TLS settings cannot be used: {why}")
                })?),
                None => None,
            },
        };
        // What the request sends but its URL: the headers (names in lower case,
        // sorted) and the credential (the same one, of the same tenant, sends the
        // same token).
        let mut sent: Vec<(String, &str)> = target
            .headers
            .iter()
            .map(|(n, v)| (n.to_ascii_lowercase(), v.as_str()))
            .collect();
        if let Some(c) = &credential {
            sent.push((":auth".into(), c.as_str()));
        }
        sent.sort();
        let tls_digest = tls.as_ref().map(|t| t.digest());
        // The shared request's key without its path: a digest, so that every
        // replica makes the same one and a pause can name it to the others.
        let pause: crate::bus::PauseKey =
            Sha256::digest(share::key(&tenant, &host, tls_digest, &sent)).into();
        // A request with another method than GET changes something at the
        // target, and each carries its own key: it is never shared. A probe of a
        // connection target is its URL, and for a tls:// one the authorities and
        // the name it asks for.
        let key = || {
            if !super::connection::SCHEMES.contains(&url.scheme()) {
                return share::key(&tenant, &uri.to_string(), tls_digest, &sent);
            }
            let own_tls = target
                .tls
                .as_ref()
                .map(|t| serde_json::to_string(t).unwrap_or_default())
                .unwrap_or_default();
            share::key(
                &tenant,
                &uri.to_string(),
                None,
                &[(":tls".into(), &own_tls)],
            )
        };
        let group = (shareable
            && own.is_none()
            && target.share
            && !self.inner.share_window.is_zero()
            && refused.is_none())
        .then(|| self.inner.shares.group(key()))
        .flatten();
        Ok(Target {
            uri,
            host,
            pause,
            headers,
            refused,
            tenant,
            group,
            tls,
            last: share::LastPoll::now(),
            kept: std::sync::Mutex::new(None),
            came: Came::default(),
            minting: Default::default(),
            auth,
            sent: own,
        })
    }
}
