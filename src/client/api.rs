//! The server's HTTP API as the client uses it: one JSON request, a wait's event
//! stream followed across dropped connections, and a refusal turned into the
//! server's own sentence.

use std::time::{Duration, Instant};

use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{Problem, check_id, note};
use crate::model::{Event, Status, Wait};

/// How long a follow keeps trying to reach a server that stopped answering.
const RECONNECT_FOR: Duration = Duration::from_secs(120);
/// Bound on each plain (non-streaming) request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A JSON answer as one of the server's own types.
pub(super) fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Problem> {
    serde_json::from_value(v).map_err(|e| {
        Problem(format!(
            "the server's answer does not read as this client expects ({e}); are the client and server versions the same?"
        ))
    })
}

/// The server's HTTP API.
pub(super) struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Api {
    pub(super) fn new(server: &str) -> Result<Api, Problem> {
        let base = server.trim_end_matches('/').to_string();
        let url = url::Url::parse(&base).map_err(|e| {
            format!("--server (or WAITD_URL) \"{server}\" is not a URL ({e}); write e.g. http://127.0.0.1:8080")
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "--server (or WAITD_URL) \"{server}\" must be an http or https URL"
            )
            .into());
        }
        let token = std::env::var("WAITD_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let http = reqwest::Client::builder()
            .user_agent(concat!("waitd-client/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
        Ok(Api { base, http, token })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut rb = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            rb = rb.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        rb
    }

    /// One JSON request; a non-2xx answer becomes a [`Problem`] with the server's
    /// explanation.
    pub(super) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
        headers: &[(&str, String)],
    ) -> Result<Value, Problem> {
        let path = if query.is_empty() {
            path.to_string()
        } else {
            let q: String = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(query)
                .finish();
            format!("{path}?{q}")
        };
        let mut rb = self.request(method, &path).timeout(REQUEST_TIMEOUT);
        if let Some(b) = body {
            rb = rb
                .header(CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        for (k, v) in headers {
            rb = rb.header(*k, v);
        }
        let res = rb.send().await.map_err(|e| {
            format!(
                "cannot reach the waitd server at {}: {}",
                self.base,
                cause(&e)
            )
        })?;
        let status = res.status();
        let bytes = res
            .bytes()
            .await
            .map_err(|e| format!("the waitd server's answer broke off: {}", cause(&e)))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|_| {
                Problem(format!(
                    "the server at {} answered {status} with something that is not JSON; is it a waitd server?",
                    self.base
                ))
            });
        }
        Err(problem(status, &bytes))
    }

    /// Creates the wait: the wait, and the server's answer as it came (which
    /// carries what this client's [`Wait`] does not, such as a callback_url).
    pub(super) async fn create(
        &self,
        req: &Value,
        key: Option<&str>,
    ) -> Result<(Wait, Value), Problem> {
        let headers: Vec<(&str, String)> = key
            .map(|k| vec![("idempotency-key", k.to_string())])
            .unwrap_or_default();
        let answer = self
            .send(Method::POST, "/waits", &[], Some(req), &headers)
            .await?;
        Ok((typed(answer.clone())?, answer))
    }

    /// The wait, and the server's answer as it came.
    pub(super) async fn get_wait(&self, id: &str) -> Result<(Wait, Value), Problem> {
        check_id(id)?;
        let answer = self
            .send(Method::GET, &format!("/waits/{id}"), &[], None, &[])
            .await?;
        Ok((typed(answer.clone())?, answer))
    }

    pub(super) async fn cancel(&self, id: &str) -> Result<Wait, Problem> {
        check_id(id)?;
        typed(
            self.send(Method::POST, &format!("/waits/{id}/cancel"), &[], None, &[])
                .await?,
        )
    }

    /// Follows the wait's event stream, calling `each` once per event (with its JSON
    /// as sent), until the terminal event, whose status it returns. A dropped
    /// connection is resumed with `Last-Event-ID`; a server that stays unreachable
    /// for [`RECONNECT_FOR`], or refuses the request (a 4xx), is a [`Problem`].
    pub(super) async fn follow(
        &self,
        id: &str,
        mut each: impl FnMut(&Event, &str),
    ) -> Result<Status, Problem> {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        check_id(id)?;
        let path = format!("/waits/{id}/events");
        let mut last_id: Option<String> = None;
        let mut delay = Duration::from_millis(200);
        let mut failing_since: Option<Instant> = None;
        loop {
            let mut rb = self
                .request(Method::GET, &path)
                .header(ACCEPT, HeaderValue::from_static("text/event-stream"));
            if let Some(l) = &last_id {
                rb = rb.header("last-event-id", l);
            }
            let trouble = match rb.send().await {
                Ok(res) if res.status().is_success() => {
                    let mut events = res.bytes_stream().eventsource();
                    loop {
                        match events.next().await {
                            Some(Ok(frame)) => {
                                failing_since = None;
                                delay = Duration::from_millis(200);
                                let e: Event = serde_json::from_str(&frame.data).map_err(|e| {
                                    Problem(format!("an event from the server does not read as this client expects ({e})"))
                                })?;
                                if !frame.id.is_empty() {
                                    last_id = Some(frame.id.clone());
                                }
                                each(&e, &frame.data);
                                if let Some((status, _)) = e.body.ending() {
                                    return Ok(status);
                                }
                            }
                            None => break "the event stream ended early".to_string(),
                            Some(Err(e)) => break format!("the event stream broke off: {e}"),
                        }
                    }
                }
                Ok(res) => {
                    let status = res.status();
                    let bytes = res.bytes().await.unwrap_or_default();
                    if status.is_client_error() {
                        return Err(problem(status, &bytes));
                    }
                    format!("the server answered {status}")
                }
                Err(e) => format!(
                    "cannot reach the waitd server at {}: {}",
                    self.base,
                    cause(&e)
                ),
            };
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= RECONNECT_FOR {
                return Err(format!(
                    "{trouble}; gave up after trying for {}s",
                    RECONNECT_FOR.as_secs()
                )
                .into());
            }
            note(&format!(
                "waitd: {trouble}; reconnecting{}",
                last_id
                    .as_ref()
                    .map(|l| format!(" after event {l}"))
                    .unwrap_or_default()
            ));
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

/// A non-2xx answer as a problem: the server's problem+json detail and field errors,
/// or the status and a hint.
fn problem(status: StatusCode, body: &[u8]) -> Problem {
    match serde_json::from_slice::<Value>(body) {
        Ok(p) if p["detail"].is_string() => {
            let mut text = p["detail"].as_str().unwrap_or_default().to_string();
            if let Some(errors) = p["errors"].as_array().filter(|e| e.len() > 1) {
                for e in errors {
                    text.push_str(&format!(
                        "\n  {}: {}",
                        e["field"].as_str().unwrap_or(""),
                        e["message"].as_str().unwrap_or("")
                    ));
                }
            }
            if status == StatusCode::UNAUTHORIZED {
                text.push_str(" (set WAITD_TOKEN)");
            }
            Problem(text)
        }
        _ => Problem(format!(
            "the server answered {status}; is --server (or WAITD_URL) a waitd server?"
        )),
    }
}

/// The innermost cause of a reqwest error, which is the useful part.
fn cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(s) = source.source() {
        source = s;
    }
    let inner = source.to_string();
    let outer = e.to_string();
    if inner == outer {
        outer
    } else {
        format!("{outer} ({inner})")
    }
}
