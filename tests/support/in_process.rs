//! waitd in this process without a socket: [`waitd::App`] on an in-memory SQLite
//! store, its router called directly (`tower::ServiceExt::oneshot`). For what the API
//! answers to a request (validation, problems, authentication): no Postgres, no
//! listener, no port. What only a connection shows (the HTTP layer's own limits, a
//! malformed chunked body, header timeouts) stays on [`super::App`].

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, header};
use serde_json::Value;
use tower::ServiceExt;

/// A running waitd whose router the test calls.
pub struct InProcess {
    app: waitd::App,
}

impl InProcess {
    /// With the usual test flags (see [`super::test_args`]).
    pub async fn start() -> InProcess {
        InProcess::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> InProcess {
        let mut args = super::test_args("sqlite::memory:");
        args.extend(extra.iter().map(|s| s.to_string()));
        InProcess::start_args(args).await
    }

    /// With exactly these flags; a `--database-url` other than `sqlite::memory:` is
    /// the caller's to clean up.
    pub async fn start_args(args: Vec<String>) -> InProcess {
        let config = waitd::Config::from_args(args).expect("valid test flags");
        let app = waitd::App::start(config, "127.0.0.1:0".parse().unwrap())
            .await
            .expect("waitd starts");
        InProcess { app }
    }

    /// The signals sent from now on.
    pub fn heard(&self) -> super::signals::Heard {
        super::signals::Heard::from(&self.app.signals)
    }

    pub fn request(&self, method: Method, path: &str) -> Call {
        Call {
            router: self.app.router.clone(),
            request: Request::builder().method(method).uri(path),
            body: None,
        }
    }

    pub fn get(&self, path: &str) -> Call {
        self.request(Method::GET, path)
    }

    pub fn post(&self, path: &str) -> Call {
        self.request(Method::POST, path)
    }

    pub fn put(&self, path: &str) -> Call {
        self.request(Method::PUT, path)
    }

    pub fn delete(&self, path: &str) -> Call {
        self.request(Method::DELETE, path)
    }

    /// Posts `spec` to /waits: the status and the JSON answer.
    pub async fn create(&self, spec: Value) -> (u16, Value) {
        self.post("/waits").json(&spec).answer().await
    }

    /// Stops it as `serve` would: the worker, the event tasks, the store.
    pub async fn stop(self) {
        self.app.stop().await;
    }
}

/// One request being built, as with reqwest's builder.
pub struct Call {
    router: axum::Router,
    request: axum::http::request::Builder,
    body: Option<Vec<u8>>,
}

impl Call {
    pub fn header<K, V>(mut self, name: K, value: V) -> Call
    where
        HeaderName: TryFrom<K>,
        <HeaderName as TryFrom<K>>::Error: Into<axum::http::Error>,
        HeaderValue: TryFrom<V>,
        <HeaderValue as TryFrom<V>>::Error: Into<axum::http::Error>,
    {
        self.request = self.request.header(name, value);
        self
    }

    pub fn bearer_auth(self, token: &str) -> Call {
        self.header("authorization", format!("Bearer {token}"))
    }

    pub fn json(self, body: &Value) -> Call {
        self.header("content-type", "application/json")
            .body(body.to_string())
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Call {
        self.body = Some(body.into());
        self
    }

    /// The answer, its body read whole. A body is sent with its length, as a client
    /// that has it all at hand does.
    pub async fn send(self) -> Answer {
        let mut request = self.request;
        if let Some(b) = &self.body {
            request = request.header(header::CONTENT_LENGTH, b.len());
        }
        let request = request
            .body(self.body.map_or_else(Body::empty, Body::from))
            .expect("a valid request");
        let response = self.router.oneshot(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX)
            .await
            .expect("the body reads");
        Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            text: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }
}

impl Call {
    /// Sends it: the status and the body as JSON (Null when it is not).
    pub async fn answer(self) -> (u16, Value) {
        let a = self.send().await;
        (a.status, a.json())
    }
}

/// What came back.
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub text: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as JSON (Null when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::Null)
    }
}
