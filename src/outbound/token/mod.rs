//! Bearer tokens minted by the OAuth 2.0 client-credentials grant (RFC 6749
//! §4.4), for the waits whose target says `auth.oauth2`.
//!
//! A [`Credential`] is one client at one token endpoint for one tenant: every
//! wait of that tenant that names the same endpoint, client, secret, scope,
//! audience and fields holds the same one ([`Tokens::credential`]), so they share
//! its token and one mint at a time however many need it. A token is minted
//! again [`margin`] before it expires (a tenth of its life, at most a minute), or
//! when the target refuses it ([`Credential::reject`]). Tokens live only in the
//! process: a replica that takes waits over mints its own.
//!
//! The token endpoint is a stranger: its answer is read to at most
//! [`MAX_ANSWER`] bytes, its token must be a bearer token of at most
//! [`MAX_TOKEN`] bytes that can be a header value, and none of its text reaches a
//! sentence but an error code the RFCs define ([`answer`]), since it may write
//! the client's secret back in any encoding.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, USER_AGENT as UA};
use http::{Method, Request, Uri};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

mod answer;

pub use answer::{Minted, margin, read_answer};

use super::{Body, Client, Error, KeyedSlots, Peer, USER_AGENT, read_body};
use crate::engine::spec::{ClientAuth, OAuth2};

/// The most of a token endpoint's answer read.
pub const MAX_ANSWER: usize = 16 * 1024;
/// The longest token sent.
pub const MAX_TOKEN: usize = 8 * 1024;
/// The life of a token whose answer gives no `expires_in`.
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(600);
/// The longest life taken from `expires_in`.
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a failed mint answers for every wait that asks meanwhile, so that a
/// queue of waits does not send one request each to an endpoint that is down.
pub const FAILURE_HELD: Duration = Duration::from_secs(1);

/// Why there is no token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// It may pass: the endpoint timed out, could not be reached or answered 5xx.
    #[error("{0}")]
    Transient(String),
    /// It will not pass by itself: the endpoint refused the client, or answered
    /// something that is not a token.
    #[error("{0}")]
    Refused(String),
}

/// Tokens the process holds, by tenant and credential.
#[derive(Default)]
pub struct Tokens {
    held: Mutex<HashMap<[u8; 32], Weak<Credential>>>,
    /// Mints sent and their outcome, for the metrics.
    pub counts: Counts,
}

/// How many mints went out, how many came back with a token, and how many
/// tokens targets refused.
#[derive(Debug, Default)]
pub struct Counts {
    pub sent: std::sync::atomic::AtomicU64,
    pub minted: std::sync::atomic::AtomicU64,
    /// Tokens a target answered `401` to.
    pub rejected: std::sync::atomic::AtomicU64,
}

impl Tokens {
    /// The credential of `tenant` that `spec` names: the one already held when
    /// another wait holds it. The token URL must have passed the SSRF guard's
    /// [`super::Guard::check_url`] (it did, when the wait was created).
    pub fn credential(&self, tenant: &str, spec: &OAuth2) -> Result<Arc<Credential>, TokenError> {
        let key = digest(tenant, spec);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = held.get(&key).and_then(Weak::upgrade) {
            return Ok(c);
        }
        let credential = Arc::new(Credential::new(
            key,
            spec,
            Secret::Inline(spec.client_secret.clone()),
        )?);
        // Credentials no wait holds any more are let go once they outnumber
        // those held; the map stays within twice the live ones.
        if held.len() >= 64 && held.len().is_power_of_two() {
            held.retain(|_, c| c.strong_count() > 0);
        }
        held.insert(key, Arc::downgrade(&credential));
        Ok(credential)
    }

    /// How many credentials held waits name.
    pub fn held(&self) -> usize {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.values().filter(|c| c.strong_count() > 0).count()
    }
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("held", &self.held())
            .field("counts", &self.counts)
            .finish()
    }
}

/// One client at one token endpoint for one tenant, and its current token.
pub struct Credential {
    key: [u8; 32],
    uri: Uri,
    /// "host:port", the key of the endpoint's place in the per-host limit.
    host: Arc<str>,
    client_id: String,
    client_auth: ClientAuth,
    /// `scope`, `audience` and the further fields, form-encoded.
    fields: String,
    secret: Secret,
    state: Mutex<State>,
    /// Held while a mint is under way: one at a time.
    minting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    token: Option<(HeaderValue, Instant)>,
    failed: Option<(Instant, TokenError)>,
}

/// Where a credential's proof of the client comes from.
#[derive(Clone)]
pub enum Secret {
    /// A client secret given with the wait (sealed at rest).
    Inline(String),
    /// A client secret read from the operator's file at each mint.
    File(PathBuf),
    /// A signed assertion read from the operator's file at each mint (RFC 7523;
    /// Azure workload identity's federated token), sent as `client_assertion`
    /// with its `client_assertion_type`.
    Assertion { path: PathBuf, kind: String },
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Inline(<redacted>)"),
            Secret::File(p) => f.debug_tuple("File").field(p).finish(),
            Secret::Assertion { path, kind } => f
                .debug_struct("Assertion")
                .field("path", path)
                .field("kind", kind)
                .finish(),
        }
    }
}

/// The most of a secret or assertion file read.
pub const MAX_FILE: usize = 16 * 1024;

/// A small file of the operator's, read whole (at most [`MAX_FILE`] bytes) off the
/// runtime's threads ([`crate::files`]) and trimmed. A file that cannot be read,
/// blocks, or is empty may be in the middle of a rotation or a mount's hiccup:
/// that may pass.
pub async fn read_small(path: &Path, what: &str) -> Result<String, TokenError> {
    use crate::files::FileError;
    let bytes = crate::files::read(path, MAX_FILE)
        .await
        .map_err(|e| match e {
            FileError::TooLarge(_) => TokenError::Refused(format!("the {what} {e}")),
            _ => TokenError::Transient(format!("the {what} {e}")),
        })?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| TokenError::Refused(format!("the {what} is not UTF-8 text")))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(TokenError::Transient(format!("the {what} is empty")));
    }
    Ok(text.to_string())
}

impl Secret {
    async fn read(&self) -> Result<String, TokenError> {
        match self {
            Secret::Inline(s) => Ok(s.clone()),
            Secret::File(p) => read_small(p, "credential's client_secret_file").await,
            Secret::Assertion { path, .. } => {
                read_small(path, "credential's client_assertion_file").await
            }
        }
    }
}

impl Credential {
    /// The credential of the client `spec` names (its `client_secret` is not
    /// read: `secret` says where the proof comes from).
    pub fn new(key: [u8; 32], spec: &OAuth2, secret: Secret) -> Result<Credential, TokenError> {
        let url = url::Url::parse(&spec.token_url)
            .map_err(|e| TokenError::Refused(format!("the token URL is not a valid URL ({e})")))?;
        let uri: Uri = url.as_str().parse().map_err(|e| {
            TokenError::Refused(format!("the token URL is not a valid request URI ({e})"))
        })?;
        let host = format!(
            "{}:{}",
            url.host_str().unwrap_or_default(),
            url.port_or_known_default().unwrap_or(0)
        );
        let mut fields = url::form_urlencoded::Serializer::new(String::new());
        if let Some(scope) = &spec.scope {
            fields.append_pair("scope", scope);
        }
        if let Some(audience) = &spec.audience {
            fields.append_pair("audience", audience);
        }
        for (name, value) in &spec.params {
            fields.append_pair(name, value);
        }
        Ok(Credential {
            key,
            uri,
            host: host.into(),
            client_id: spec.client_id.clone(),
            client_auth: spec.client_auth,
            fields: fields.finish(),
            secret,
            state: Mutex::default(),
            minting: tokio::sync::Mutex::new(()),
        })
    }

    /// The token request's body and its `Authorization: Basic`, if any, with
    /// the proof read now.
    async fn request_parts(&self) -> Result<(String, Option<HeaderValue>), TokenError> {
        let proof = self.secret.read().await?;
        let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        let mut basic = None;
        match (&self.secret, self.client_auth) {
            (Secret::Assertion { kind, .. }, _) => {
                form.append_pair("client_id", &self.client_id);
                form.append_pair("client_assertion_type", kind);
                form.append_pair("client_assertion", &proof);
            }
            (_, ClientAuth::Body) => {
                form.append_pair("client_id", &self.client_id);
                form.append_pair("client_secret", &proof);
            }
            (_, ClientAuth::Basic) => {
                // RFC 6749 §2.3.1: each part form-encoded before it is joined.
                let pair = format!("{}:{}", enc(&self.client_id), enc(&proof));
                let b64 = base64::engine::general_purpose::STANDARD.encode(pair);
                let mut v = HeaderValue::from_str(&format!("Basic {b64}")).map_err(|_| {
                    TokenError::Refused("the client credentials cannot be sent in a header".into())
                })?;
                v.set_sensitive(true);
                basic = Some(v);
            }
        }
        let mut body = form.finish();
        if !self.fields.is_empty() {
            body.push('&');
            body.push_str(&self.fields);
        }
        Ok((body, basic))
    }

    /// Names the credential without revealing it (a digest of the tenant and
    /// every field): two requests with the same one may share a poll.
    pub fn key(&self) -> &[u8; 32] {
        &self.key
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn fresh(&self, now: Instant) -> Option<HeaderValue> {
        let state = self.state();
        state
            .token
            .as_ref()
            .filter(|(_, refresh_at)| now < *refresh_at)
            .map(|(v, _)| v.clone())
    }

    /// The `Authorization` value to send: the current token, or one minted now
    /// (one mint at a time; the others wait for it). `hosts` bounds the requests
    /// in flight to the endpoint's host, as it bounds probes; `timeout` bounds the
    /// mint from connecting to the last byte of the answer.
    pub async fn bearer(
        &self,
        client: &Client,
        hosts: &Arc<KeyedSlots<Arc<str>>>,
        timeout: Duration,
        counts: &Counts,
    ) -> Result<HeaderValue, TokenError> {
        if let Some(v) = self.fresh(Instant::now()) {
            return Ok(v);
        }
        let _one = self.minting.lock().await;
        let now = Instant::now();
        if let Some(v) = self.fresh(now) {
            return Ok(v);
        }
        if let Some((at, why)) = &self.state().failed
            && now.duration_since(*at) < FAILURE_HELD
        {
            return Err(why.clone());
        }
        // The proof is read before the endpoint's place in the per-host limit is
        // taken: a file that blocks holds no place.
        let minted = match self.request_parts().await {
            Err(why) => Err(why),
            Ok(parts) => {
                counts
                    .sent
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _slot = hosts.acquire(self.host.clone()).await;
                match tokio::time::timeout(timeout, self.mint(client, parts)).await {
                    Ok(minted) => minted,
                    Err(_) => Err(TokenError::Transient(
                        Error::Timeout {
                            peer: Peer::TokenEndpoint,
                            within: timeout,
                        }
                        .to_string(),
                    )),
                }
            }
        };
        let now = Instant::now();
        let mut state = self.state();
        match minted {
            Ok(m) => {
                counts
                    .minted
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {}", m.token)).map_err(|_| {
                        TokenError::Refused(
                            "the token endpoint issued a token that cannot be a header value"
                                .into(),
                        )
                    })?;
                value.set_sensitive(true);
                state.token = Some((value.clone(), now + m.lifetime - margin(m.lifetime)));
                state.failed = None;
                Ok(value)
            }
            Err(why) => {
                state.token = None;
                state.failed = Some((now, why.clone()));
                Err(why)
            }
        }
    }

    /// Drops `sent` if it is still the current token (the target refused it):
    /// the next [`Credential::bearer`] mints another.
    pub fn reject(&self, sent: &HeaderValue) {
        let mut state = self.state();
        if state.token.as_ref().is_some_and(|(v, _)| v == sent) {
            state.token = None;
        }
    }

    async fn mint(
        &self,
        client: &Client,
        (body, basic): (String, Option<HeaderValue>),
    ) -> Result<Minted, TokenError> {
        let mut request = Request::new(Body::new(Bytes::from(body)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(UA, HeaderValue::from_static(USER_AGENT));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        if let Some(basic) = basic {
            headers.insert(AUTHORIZATION, basic);
        }
        if let Some(host) = self.uri.host()
            && let Ok(url) = url::Url::parse(&format!("http://{host}/"))
            && let Err(refused) = client.guard().check_url(&url)
        {
            return Err(TokenError::Refused(format!(
                "the token endpoint: {refused}"
            )));
        }
        let failed = |e: Error| {
            if e.is_transient() {
                TokenError::Transient(e.to_string())
            } else {
                TokenError::Refused(format!("the token endpoint: {e}"))
            }
        };
        let mut response = client
            .send(request, Peer::TokenEndpoint)
            .await
            .map_err(failed)?;
        let status = response.status();
        let body = match read_body(response.body_mut(), MAX_ANSWER, Peer::TokenEndpoint).await {
            Ok(body) => body,
            Err(Error::TooLarge { .. }) => {
                return Err(TokenError::Refused(format!(
                    "the token endpoint's answer ({status}) is larger than {}, which no token answer is",
                    crate::engine::bound::format_size(MAX_ANSWER)
                )));
            }
            Err(e) => return Err(failed(e)),
        };
        read_answer(status, &body)
    }
}

fn digest(tenant: &str, spec: &OAuth2) -> [u8; 32] {
    let mut h = Sha256::new();
    let mut part = |s: &str| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s.as_bytes());
    };
    part(tenant);
    part(&spec.token_url);
    part(&spec.client_id);
    part(&spec.client_secret);
    part(spec.scope.as_deref().unwrap_or("\u{0}"));
    part(spec.audience.as_deref().unwrap_or("\u{0}"));
    for (k, v) in &spec.params {
        part(k);
        part(v);
    }
    part(match spec.client_auth {
        ClientAuth::Body => "body",
        ClientAuth::Basic => "basic",
    });
    h.finalize().into()
}
