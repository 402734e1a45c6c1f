//! A scripted OAuth 2.0 token endpoint and the API it guards, on 127.0.0.1:0.
//!
//! `POST /token` answers the client-credentials grant for [`CLIENT_ID`] and the
//! issuer's secret (as form fields, HTTP Basic, or a JWT bearer assertion) with a token living
//! [`Issuer::set_lifetime`]; [`Issuer::set_mode`] makes it fail instead.
//! `GET /target` answers `401` to a token it did not issue, one revoked, or one
//! past its life (plus [`GRACE`] for the trip), else the Latitude-shaped status:
//! `on` once [`Issuer::on_after`] tokens have been issued, `deploying` before.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde_json::json;
use tokio::net::TcpListener;

pub const CLIENT_ID: &str = "waitd-test-client";

/// How long after its life the target still takes a token: the time a request
/// may spend between waitd and the target on a loaded machine.
pub const GRACE: Duration = Duration::from_millis(500);

/// What `POST /token` does.
#[derive(Clone, Debug)]
pub enum Mode {
    /// Issues tokens.
    Issue,
    /// `503` to the next `n` requests, then issues.
    DownFor(usize),
    /// `401 invalid_client`, with a description that repeats the secret in
    /// every encoding of [`echoes`] and echoes the request.
    InvalidClient,
    /// `400` with an error code of its own (the secret reversed) and a
    /// description that is the secret in Base64.
    OwnCode,
    /// Takes the request and never answers.
    Hang,
}

struct State {
    secret: String,
    lifetime: Duration,
    mode: Mode,
    /// Token → when it was issued.
    issued: HashMap<String, Instant>,
    current: Option<String>,
    revoked: HashSet<String>,
    on_after: usize,
    token_requests: usize,
    /// How each token request authenticated: "body", "basic" or "assertion".
    client_auth: Vec<&'static str>,
    forms: Vec<HashMap<String, String>>,
    target_ok: usize,
    unauthorized: usize,
}

#[derive(Clone)]
pub struct Issuer {
    pub token_url: String,
    pub target_url: String,
    state: Arc<Mutex<State>>,
    heard: Arc<tokio::sync::Notify>,
}

impl Issuer {
    pub async fn start(secret: &str) -> Issuer {
        let state = Arc::new(Mutex::new(State {
            secret: secret.to_string(),
            lifetime: Duration::from_secs(3600),
            mode: Mode::Issue,
            issued: HashMap::new(),
            current: None,
            revoked: HashSet::new(),
            on_after: usize::MAX,
            token_requests: 0,
            client_auth: Vec::new(),
            forms: Vec::new(),
            target_ok: 0,
            unauthorized: 0,
        }));
        let heard = Arc::new(tokio::sync::Notify::new());
        let app = axum::Router::new()
            .route("/token", axum::routing::post(token))
            .route("/target", axum::routing::get(target))
            .with_state((state.clone(), heard.clone()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Issuer {
            token_url: format!("{base}/token"),
            target_url: format!("{base}/target"),
            state,
            heard,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    pub fn set_lifetime(&self, d: Duration) {
        self.with(|s| s.lifetime = d);
    }

    pub fn set_mode(&self, m: Mode) {
        self.with(|s| s.mode = m);
    }

    /// The target answers `on` once `n` tokens have been issued.
    pub fn on_after(&self, n: usize) {
        self.with(|s| s.on_after = n);
    }

    /// The target refuses the token issued last from now on.
    pub fn revoke_current(&self) {
        self.with(|s| {
            if let Some(t) = s.current.clone() {
                s.revoked.insert(t);
            }
        });
    }

    pub fn token_requests(&self) -> usize {
        self.with(|s| s.token_requests)
    }

    pub fn tokens_issued(&self) -> usize {
        self.with(|s| s.issued.len())
    }

    pub fn client_auth_seen(&self) -> Vec<&'static str> {
        self.with(|s| s.client_auth.clone())
    }

    pub fn forms(&self) -> Vec<HashMap<String, String>> {
        self.with(|s| s.forms.clone())
    }

    /// Polls the target answered with a status (the token was good).
    pub fn target_ok(&self) -> usize {
        self.with(|s| s.target_ok)
    }

    /// Polls the target answered `401`.
    pub fn unauthorized(&self) -> usize {
        self.with(|s| s.unauthorized)
    }

    /// Whether `check` holds within `within`: looked at after each request either
    /// endpoint answers, not on a clock.
    pub async fn until(&self, within: Duration, check: impl Fn(&Issuer) -> bool) -> bool {
        super::heard_that(&self.heard, within, || check(self)).await
    }
}

type Shared = (Arc<Mutex<State>>, Arc<tokio::sync::Notify>);

async fn token(
    axum::extract::State((state, heard)): axum::extract::State<Shared>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let hang = {
        let mut s = state.lock().unwrap();
        let hang = matches!(s.mode, Mode::Hang);
        if hang {
            s.token_requests += 1;
        }
        hang
    };
    if hang {
        heard.notify_waiters();
        std::future::pending::<()>().await;
    }
    let answer = {
        let mut s = state.lock().unwrap();
        s.token_requests += 1;
        let form: HashMap<String, String> = url::form_urlencoded::parse(body.as_bytes())
            .into_owned()
            .collect();
        s.forms.push(form.clone());
        let basic = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Basic "))
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .and_then(|b| String::from_utf8(b).ok());
        let assertion = form
            .get("client_assertion")
            .filter(|_| {
                form.get("client_assertion_type").map(String::as_str)
                    == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
            })
            .cloned();
        let (id, secret, how) = match basic {
            Some(pair) => {
                let (id, secret) = pair.split_once(':').unwrap_or((&pair, ""));
                let dec = |s: &str| {
                    url::form_urlencoded::parse(format!("x={s}").as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default()
                };
                (dec(id), dec(secret), "basic")
            }
            None => match assertion {
                Some(a) => (
                    form.get("client_id").cloned().unwrap_or_default(),
                    a,
                    "assertion",
                ),
                None => (
                    form.get("client_id").cloned().unwrap_or_default(),
                    form.get("client_secret").cloned().unwrap_or_default(),
                    "body",
                ),
            },
        };
        s.client_auth.push(how);
        let grant = form.get("grant_type").map(String::as_str);
        match s.mode.clone() {
            Mode::DownFor(n) if n > 0 => {
                s.mode = Mode::DownFor(n - 1);
                (StatusCode::SERVICE_UNAVAILABLE, "down for maintenance").into_response()
            }
            Mode::InvalidClient => (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({
                    "error": "invalid_client",
                    // It repeats the secret, and echoes the request in which
                    // it came (form-encoded, or inside the Basic credentials).
                    "error_description": format!(
                        "client secret '{}' is not valid for this tenant; read as: {}; sent: {body}; authorization: {}; as escaped by some: {}; also: {}",
                        s.secret,
                        uri_encoded(&secret),
                        headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("none"),
                        body.to_ascii_lowercase(),
                        echoes(&s.secret).join(" / "),
                    ),
                })),
            )
                .into_response(),
            Mode::OwnCode => {
                use base64::Engine as _;
                (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({
                        "error": s.secret.chars().rev().collect::<String>(),
                        "error_description": base64::engine::general_purpose::STANDARD.encode(&s.secret),
                    })),
                )
                    .into_response()
            }
            _ if grant != Some("client_credentials") => (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": "unsupported_grant_type"})),
            )
                .into_response(),
            _ if id != CLIENT_ID || secret != s.secret => (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"error": "invalid_client"})),
            )
                .into_response(),
            _ => {
                let n = s.issued.len() + 1;
                let token = format!("tok-{n}-{}", uuid::Uuid::now_v7().simple());
                s.issued.insert(token.clone(), Instant::now());
                s.current = Some(token.clone());
                axum::Json(json!({
                    "access_token": token,
                    "token_type": "Bearer",
                    "expires_in": s.lifetime.as_secs_f64(),
                }))
                .into_response()
            }
        }
    };
    heard.notify_waiters();
    answer
}

async fn target(
    axum::extract::State((state, heard)): axum::extract::State<Shared>,
    headers: HeaderMap,
) -> Response {
    let answer = {
        let mut s = state.lock().unwrap();
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_string();
        let good = s
            .issued
            .get(&token)
            .is_some_and(|at| at.elapsed() < s.lifetime + GRACE)
            && !s.revoked.contains(&token);
        if good {
            s.target_ok += 1;
            let status = if s.issued.len() >= s.on_after {
                "on"
            } else {
                "deploying"
            };
            axum::Json(json!({"data": {"attributes": {"status": status}}})).into_response()
        } else {
            s.unauthorized += 1;
            (
                StatusCode::UNAUTHORIZED,
                axum::Json(json!({"message": "the token is not valid"})),
            )
                .into_response()
        }
    };
    heard.notify_waiters();
    answer
}

/// `text` percent-encoded as RFC 3986 encodes a URI component: how an endpoint
/// that decoded the form may write the secret back.
/// `secret` as a token endpoint may write it back without any encoding a
/// redaction could undo: reversed, spaced out, in halves, in Base64 and in
/// hexadecimal.
pub fn echoes(secret: &str) -> Vec<String> {
    use base64::Engine as _;
    let half = secret.len() / 2;
    vec![
        secret.chars().rev().collect(),
        secret.chars().map(|c| format!("{c} ")).collect(),
        secret[..half].to_string(),
        secret[half..].to_string(),
        base64::engine::general_purpose::STANDARD.encode(secret),
        secret.bytes().map(|b| format!("{b:02x}")).collect(),
    ]
}

pub fn uri_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
