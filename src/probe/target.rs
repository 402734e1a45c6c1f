//! A wait's target made once for the many polls of it: the request URI, its host's
//! place in the per-host limit, its headers, the guard's verdict, the group of
//! identical requests it shares polls with, its own TLS client and its token.

use std::sync::Arc;

use http::Uri;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};

use super::{Came, Prober, Target, TargetError, share, target_url};
use crate::engine::Spec;
use crate::engine::spec::Auth;
use crate::outbound::TlsSettings;
use crate::outbound::credentials::Bearer;

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
