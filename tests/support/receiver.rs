//! A webhook receiver on 127.0.0.1: scripted answers per path, and every request
//! that reached it (arrival time, headers, body). And the check of a request's
//! signature by the `standardwebhooks` package from PyPI, in a virtualenv of the
//! tests' own.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

/// How the receiver answers one request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// This status, with these headers.
    Status(u16, Vec<(String, String)>),
    /// Never answer (until the sender gives up).
    Hold,
    /// 200 and a body that never ends.
    Endless,
}

impl Answer {
    pub fn code(status: u16) -> Answer {
        Answer::Status(status, Vec::new())
    }
}

/// One request the receiver got.
#[derive(Clone, Debug)]
pub struct Received {
    pub path: String,
    pub at: Instant,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Received {
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a webhook body is JSON")
    }
}

#[derive(Default)]
struct Inner {
    /// Per path: the answers left; the last one repeats (none: 200).
    script: HashMap<String, Vec<Answer>>,
    got: Vec<Received>,
    /// Told of every request as it is added to `got`.
    arrived: Arc<tokio::sync::Notify>,
}

/// The receiver. Cloning is shallow.
#[derive(Clone)]
pub struct Receiver {
    pub base: String,
    pub port: u16,
    inner: Arc<Mutex<Inner>>,
}

impl Receiver {
    /// On a port of its own.
    pub async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Receiver::serve(listener, Default::default())
    }

    /// On `port` (one a test kept free, to be "down" until now), sharing what
    /// `earlier` was scripted with and got.
    pub async fn start_on(port: u16, earlier: Option<&Receiver>) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let inner = earlier.map(|r| r.inner.clone()).unwrap_or_default();
        Receiver::serve(listener, inner)
    }

    /// A receiver that is not listening yet: its URLs refuse connections until
    /// [`Receiver::start_on`] its port.
    pub fn down() -> Receiver {
        let port = super::replica::free_port();
        Receiver {
            base: format!("http://127.0.0.1:{port}"),
            port,
            inner: Default::default(),
        }
    }

    fn serve(listener: TcpListener, inner: Arc<Mutex<Inner>>) -> Receiver {
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::post(receive))
            .with_state(inner.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Receiver {
            base: format!("http://{addr}"),
            port: addr.port(),
            inner,
        }
    }

    /// Scripts `path`; returns its URL.
    pub fn script(&self, path: &str, answers: Vec<Answer>) -> String {
        self.inner
            .lock()
            .unwrap()
            .script
            .insert(path.trim_start_matches('/').to_string(), answers);
        format!("{}{}", self.base, path)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// What reached `path`, in arrival order.
    pub fn got(&self, path: &str) -> Vec<Received> {
        let key = path.trim_start_matches('/');
        self.inner
            .lock()
            .unwrap()
            .got
            .iter()
            .filter(|r| r.path == key)
            .cloned()
            .collect()
    }

    /// Everything that reached it.
    pub fn all(&self) -> Vec<Received> {
        self.inner.lock().unwrap().got.clone()
    }

    /// Until `n` requests reached `path` (or `within` passes): whether they did.
    /// Looked at again as each request arrives, not on a clock.
    pub async fn until_got(&self, path: &str, n: usize, within: Duration) -> bool {
        let key = path.trim_start_matches('/');
        self.received(within, |got| {
            got.iter().filter(|r| r.path == key).count() >= n
        })
        .await
    }

    /// Whether `check` holds of everything that reached it within `within`: looked
    /// at again as each request arrives, not on a clock.
    pub async fn received(&self, within: Duration, check: impl Fn(&[Received]) -> bool) -> bool {
        let arrived = self.inner.lock().unwrap().arrived.clone();
        super::heard_that(&arrived, within, || check(&self.inner.lock().unwrap().got)).await
    }
}

async fn receive(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (answer, arrived) = {
        let mut s = inner.lock().unwrap();
        s.got.push(Received {
            path: path.clone(),
            at: Instant::now(),
            headers,
            body: body.to_vec(),
        });
        let answer = match s.script.get_mut(&path) {
            Some(list) if list.len() > 1 => list.remove(0),
            Some(list) => list.first().cloned().unwrap_or(Answer::Status(200, vec![])),
            None => Answer::Status(200, vec![]),
        };
        (answer, s.arrived.clone())
    };
    arrived.notify_waiters();
    match answer {
        Answer::Status(code, headers) => {
            let mut res = (StatusCode::from_u16(code).unwrap(), "ok").into_response();
            for (k, v) in headers {
                res.headers_mut().insert(
                    axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    axum::http::HeaderValue::from_str(&v).unwrap(),
                );
            }
            res
        }
        Answer::Hold => {
            // Held until the sender hangs up.
            std::future::pending::<()>().await;
            unreachable!()
        }
        Answer::Endless => {
            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
            let stream =
                futures_util::stream::repeat_with(move || Ok::<_, std::io::Error>(chunk.clone()));
            (StatusCode::OK, Body::from_stream(stream)).into_response()
        }
    }
}

/// A Python with the `standardwebhooks` package: `WAITD_TEST_PYTHON`, or a
/// virtualenv under the tests' scratch directory, made (once: tests that run at
/// the same time wait for the first to make it) when missing.
pub fn python_with_standardwebhooks() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON.get_or_init(find_or_make_python).clone()
}

fn find_or_make_python() -> PathBuf {
    super::venv::python_with(
        "WAITD_TEST_PYTHON",
        "webhooks-venv",
        "standardwebhooks==1.1.0",
        "import standardwebhooks",
        "python3 with venv for the webhook signature check",
    )
}

/// What the `standardwebhooks` package says of each request signed with `secret`:
/// `ok` and the payload's type, or the verifier's error.
pub fn verify_with_standardwebhooks(secret: &str, got: &[Received]) -> Vec<String> {
    let messages: Vec<serde_json::Value> = got
        .iter()
        .map(|r| {
            serde_json::json!({
                "headers": {
                    "webhook-id": r.header("webhook-id"),
                    "webhook-timestamp": r.header("webhook-timestamp"),
                    "webhook-signature": r.header("webhook-signature"),
                },
                "body": String::from_utf8_lossy(&r.body),
            })
        })
        .collect();
    const SCRIPT: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
req = json.load(sys.stdin)
wh = Webhook(req["secret"])
for m in req["messages"]:
    try:
        payload = wh.verify(m["body"], m["headers"])
        print("ok " + payload["type"])
    except Exception as e:
        print("error " + type(e).__name__ + ": " + str(e))
"#;
    let mut child = Command::new(python_with_standardwebhooks())
        .args(["-c", SCRIPT])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            serde_json::json!({"secret": secret, "messages": messages})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the verifier failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
