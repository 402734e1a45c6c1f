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
//! [`MAX_TOKEN`] bytes that can be a header value, and its error texts are cut
//! short, stripped of control characters and of the client's secret.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, USER_AGENT as UA};
use http::{Method, Request, StatusCode, Uri};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

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
/// The longest error text kept from a token endpoint's answer.
const MAX_DESCRIPTION: usize = 300;

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
        let credential = Arc::new(Credential::new(key, spec)?);
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
    form: Bytes,
    basic: Option<HeaderValue>,
    /// Scrubbed from every text taken from the endpoint's answer.
    secret: String,
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

/// A token endpoint's answer, read.
#[derive(Debug, PartialEq, Eq)]
pub struct Minted {
    /// The token.
    pub token: String,
    /// How long it lives.
    pub lifetime: Duration,
}

impl Credential {
    fn new(key: [u8; 32], spec: &OAuth2) -> Result<Credential, TokenError> {
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
        let mut form = url::form_urlencoded::Serializer::new(String::new());
        form.append_pair("grant_type", "client_credentials");
        let basic = match spec.client_auth {
            ClientAuth::Body => {
                form.append_pair("client_id", &spec.client_id);
                form.append_pair("client_secret", &spec.client_secret);
                None
            }
            ClientAuth::Basic => {
                // RFC 6749 §2.3.1: each part form-encoded before it is joined.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>()
                };
                let pair = format!("{}:{}", enc(&spec.client_id), enc(&spec.client_secret));
                let b64 = base64::engine::general_purpose::STANDARD.encode(pair);
                let mut v = HeaderValue::from_str(&format!("Basic {b64}")).map_err(|_| {
                    TokenError::Refused("the client credentials cannot be sent in a header".into())
                })?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        if let Some(scope) = &spec.scope {
            form.append_pair("scope", scope);
        }
        if let Some(audience) = &spec.audience {
            form.append_pair("audience", audience);
        }
        for (name, value) in &spec.params {
            form.append_pair(name, value);
        }
        Ok(Credential {
            key,
            uri,
            host: host.into(),
            form: Bytes::from(form.finish()),
            basic,
            secret: spec.client_secret.clone(),
            state: Mutex::default(),
            minting: tokio::sync::Mutex::new(()),
        })
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
        counts
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let minted = {
            let _slot = hosts.acquire(self.host.clone()).await;
            match tokio::time::timeout(timeout, self.mint(client)).await {
                Ok(minted) => minted,
                Err(_) => Err(TokenError::Transient(
                    Error::Timeout {
                        peer: Peer::TokenEndpoint,
                        within: timeout,
                    }
                    .to_string(),
                )),
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

    async fn mint(&self, client: &Client) -> Result<Minted, TokenError> {
        let mut request = Request::new(Body::new(self.form.clone()));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(UA, HeaderValue::from_static(USER_AGENT));
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        if let Some(basic) = &self.basic {
            headers.insert(AUTHORIZATION, basic.clone());
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
                    super::format_size(MAX_ANSWER)
                )));
            }
            Err(e) => return Err(failed(e)),
        };
        read_answer(status, &body, &self.secret)
    }
}

/// What is left of a token's life when it is minted again: a tenth of it, at
/// most a minute.
pub fn margin(lifetime: Duration) -> Duration {
    (lifetime / 10).min(Duration::from_secs(60))
}

/// Reads a token endpoint's answer (RFC 6749 §5.1, §5.2). `secret` never appears
/// in what it returns.
pub fn read_answer(status: StatusCode, body: &[u8], secret: &str) -> Result<Minted, TokenError> {
    let json: Option<serde_json::Map<String, Value>> = serde_json::from_slice(body).ok();
    if status.is_success() {
        let Some(json) = json else {
            return Err(TokenError::Refused(format!(
                "the token endpoint answered {status} with a body that is not a JSON object, so there is no access_token in it"
            )));
        };
        let token = match json.get("access_token") {
            Some(Value::String(t)) if !t.is_empty() => t,
            _ => {
                return Err(TokenError::Refused(format!(
                    "the token endpoint answered {status} without an access_token"
                )));
            }
        };
        if token.len() > MAX_TOKEN {
            return Err(TokenError::Refused(format!(
                "the token endpoint issued a token of {} bytes; the limit is {}",
                token.len(),
                super::format_size(MAX_TOKEN)
            )));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Refused(
                "the token endpoint issued a token with characters a header cannot carry".into(),
            ));
        }
        if let Some(kind) = json.get("token_type")
            && !kind
                .as_str()
                .is_some_and(|k| k.eq_ignore_ascii_case("bearer"))
        {
            return Err(TokenError::Refused(format!(
                "the token endpoint issued a token of type {}; waitd sends bearer tokens only",
                clean(&kind.to_string(), secret)
            )));
        }
        let seconds = match json.get("expires_in") {
            Some(Value::Number(n)) => n.as_f64(),
            // Some endpoints write it as a string.
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        let lifetime = match seconds {
            Some(s) if s.is_finite() && s >= 1.0 => {
                Duration::from_secs_f64(s.min(MAX_LIFETIME.as_secs_f64()))
            }
            Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs(1),
            _ => DEFAULT_LIFETIME,
        };
        return Ok(Minted {
            token: token.clone(),
            lifetime,
        });
    }
    let code = json
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(Value::as_str)
        .map(|c| clean(c, secret));
    let description = json
        .as_ref()
        .and_then(|j| j.get("error_description"))
        .and_then(Value::as_str)
        .map(|d| clean(d, secret));
    let said = match (&code, &description) {
        (Some(c), Some(d)) => format!(": {c}: {d}"),
        (Some(c), None) => format!(": {c}"),
        (None, Some(d)) => format!(": {d}"),
        (None, None) => String::new(),
    };
    if matches!(status.as_u16(), 408 | 425 | 429) || status.is_server_error() {
        return Err(TokenError::Transient(format!(
            "the token endpoint answered {status}{said}"
        )));
    }
    if code.is_some() {
        return Err(TokenError::Refused(format!(
            "the token endpoint refused the client credentials ({status}){said}"
        )));
    }
    Err(TokenError::Refused(format!(
        "the token endpoint answered {status}{said}; check target.auth.oauth2.token_url"
    )))
}

/// A stranger's text made fit for a reason: at most [`MAX_DESCRIPTION`]
/// characters, control characters as spaces, the secret as `<redacted>`.
fn clean(text: &str, secret: &str) -> String {
    let scrubbed = if secret.is_empty() {
        text.to_string()
    } else {
        text.replace(secret, crate::engine::spec::REDACTED)
    };
    let mut out: String = scrubbed
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_DESCRIPTION)
        .collect();
    if scrubbed.chars().count() > MAX_DESCRIPTION {
        out.push('…');
    }
    // A cut may have left the start of the secret at the end.
    if !secret.is_empty() {
        for n in (1..secret.len().min(out.len())).rev() {
            if secret.is_char_boundary(n) && out.ends_with(&secret[..n]) && n >= 4 {
                out.truncate(out.len() - n);
                out.push('…');
                break;
            }
        }
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "s3cret-value";

    fn ok(body: &str) -> Result<Minted, TokenError> {
        read_answer(StatusCode::OK, body.as_bytes(), SECRET)
    }

    #[test]
    fn a_token_answer_gives_the_token_and_its_life() {
        let m = ok(r#"{"access_token":"abc","token_type":"Bearer","expires_in":3599}"#).unwrap();
        assert_eq!(m.token, "abc");
        assert_eq!(m.lifetime, Duration::from_secs(3599));
        let m = ok(r#"{"access_token":"abc","expires_in":"120"}"#).unwrap();
        assert_eq!(m.lifetime, Duration::from_secs(120));
        let m = ok(r#"{"access_token":"abc"}"#).unwrap();
        assert_eq!(m.lifetime, DEFAULT_LIFETIME);
        let m = ok(r#"{"access_token":"abc","expires_in":1e12}"#).unwrap();
        assert_eq!(m.lifetime, MAX_LIFETIME);
        let m = ok(r#"{"access_token":"abc","expires_in":0}"#).unwrap();
        assert_eq!(m.lifetime, Duration::from_secs(1));
    }

    #[test]
    fn what_is_not_a_bearer_token_is_refused_with_a_sentence() {
        for (body, says) in [
            ("<html>", "not a JSON object"),
            (r#"{"token":"x"}"#, "without an access_token"),
            (r#"{"access_token":""}"#, "without an access_token"),
            (r#"{"access_token":"a b"}"#, "cannot carry"),
            (
                r#"{"access_token":"x","token_type":"mac"}"#,
                "bearer tokens only",
            ),
        ] {
            match ok(body) {
                Err(TokenError::Refused(why)) => assert!(why.contains(says), "{body}: {why}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        let long = format!(r#"{{"access_token":"{}"}}"#, "a".repeat(MAX_TOKEN + 1));
        assert!(matches!(ok(&long), Err(TokenError::Refused(w)) if w.contains("limit")));
    }

    #[test]
    fn an_oauth_error_is_refused_with_its_code_and_description_without_the_secret() {
        let body = format!(
            r#"{{"error":"invalid_client","error_description":"client secret {SECRET} is wrong\r\nreally"}}"#
        );
        let err = read_answer(StatusCode::UNAUTHORIZED, body.as_bytes(), SECRET).unwrap_err();
        let TokenError::Refused(why) = err else {
            panic!("{err:?}")
        };
        assert!(why.contains("invalid_client"), "{why}");
        assert!(why.contains("is wrong"), "{why}");
        assert!(!why.contains(SECRET), "{why}");
        assert!(!why.contains('\n'), "{why}");
    }

    #[test]
    fn a_server_error_or_throttling_may_pass() {
        for status in [500, 502, 503, 504, 429, 408] {
            let s = StatusCode::from_u16(status).unwrap();
            assert!(
                matches!(read_answer(s, b"", SECRET), Err(TokenError::Transient(_))),
                "{status}"
            );
        }
        assert!(matches!(
            read_answer(StatusCode::NOT_FOUND, b"", SECRET),
            Err(TokenError::Refused(w)) if w.contains("token_url")
        ));
    }

    #[test]
    fn the_margin_is_a_tenth_of_the_life_at_most_a_minute() {
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(margin(Duration::from_secs(3600)), Duration::from_secs(60));
    }

    /// JSON-ish answers, nested and long, past the read limit.
    fn answer() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            "[a-z0-9 \\\\\"]{0,40}".prop_map(|s| format!("\"{s}\"")),
            any::<f64>().prop_map(|f| f.to_string()),
            Just(format!("\"{SECRET}\"")),
        ];
        let value = leaf.prop_recursive(200, 400, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(
                    (
                        prop_oneof![
                            Just("access_token".to_string()),
                            Just("expires_in".to_string()),
                            Just("token_type".to_string()),
                            Just("error".to_string()),
                            Just("error_description".to_string()),
                            "[a-z]{1,8}".prop_map(|s| s),
                        ],
                        inner
                    ),
                    0..5
                )
                .prop_map(|v| {
                    let fields: Vec<String> =
                        v.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        });
        prop_oneof![
            value.prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..MAX_ANSWER * 2),
            (1usize..5000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn any_answer_is_read_to_an_end_without_the_secret(
            body in answer(),
            status in prop_oneof![Just(200u16), Just(400), Just(401), Just(500), 100u16..600],
        ) {
            let status = StatusCode::from_u16(status).unwrap();
            match read_answer(status, &body, SECRET) {
                Ok(m) => {
                    prop_assert!(status.is_success());
                    prop_assert!(m.token.len() <= MAX_TOKEN);
                    prop_assert!(m.lifetime >= Duration::from_secs(1) && m.lifetime <= MAX_LIFETIME);
                }
                Err(TokenError::Refused(why) | TokenError::Transient(why)) => {
                    prop_assert!(!why.contains(SECRET), "{}", why);
                    prop_assert!(why.chars().count() < 800, "{}", why.len());
                }
            }
        }
    }
}
