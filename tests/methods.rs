//! Targets polled with another method than GET: the method, the body and a new
//! `Idempotency-Key` at each poll, never shared between waits; and the response
//! time, `elapsed`, that conditions read. Through the API, on both stores.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::*;

/// One request as the target saw it.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub method: Method,
    pub path: String,
    pub key: Option<String>,
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// A target that refuses a request without an `Idempotency-Key` (400), and
/// answers `{"data": {"status": "on"}}` to the `ready`-th request of a path
/// (`pending` before), after `delay`.
#[derive(Clone)]
pub(crate) struct Target {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    heard: Arc<tokio::sync::Notify>,
}

impl Target {
    pub(crate) async fn start(ready: usize, delay: Duration) -> Target {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let heard = Arc::new(tokio::sync::Notify::new());
        let (s, h) = (seen.clone(), heard.clone());
        let app = axum::Router::new().fallback(
            move |method: Method, uri: axum::http::Uri, headers: HeaderMap, body: Bytes| {
                let (seen, heard) = (s.clone(), h.clone());
                async move {
                    let text = |n: &str| {
                        headers
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string)
                    };
                    let path = uri.path().to_string();
                    let key = text("idempotency-key");
                    let n = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(Seen {
                            method: method.clone(),
                            path: path.clone(),
                            key: key.clone(),
                            content_type: text("content-type"),
                            body,
                        });
                        seen.iter().filter(|s| s.path == path).count()
                    };
                    heard.notify_waiters();
                    if !delay.is_zero() {
                        // The target's own pace, which `elapsed` measures.
                        tokio::time::sleep(delay).await;
                    }
                    if method != Method::GET && key.is_none() {
                        return (StatusCode::BAD_REQUEST, "an Idempotency-Key is required")
                            .into_response();
                    }
                    let status = if n >= ready { "on" } else { "pending" };
                    axum::Json(json!({"data": {"status": status}})).into_response()
                }
            },
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Target { addr, seen, heard }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn seen(&self, path: &str) -> Vec<Seen> {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|s| s.path == path).cloned().collect()
    }
}

/// A POST of a GraphQL query, polled every few milliseconds until it says "on".
fn graphql(url: &str) -> Value {
    json!({
        "target": {
            "url": url,
            "method": "POST",
            "body": {"query": "query { deployment(id: 7) { status } }"}
        },
        "state": "/data/status",
        "want": ["on"],
        "timeout": "20s",
        "poll": {"initial": "5ms", "max": "5ms", "factor": 1, "jitter": 0},
        "retry": {"delay": "5ms", "max_delay": "5ms"}
    })
}

async fn created(app: &App, spec: Value) -> String {
    let (code, w) = app.create(spec).await;
    assert_eq!(code, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

async fn posts_with_a_new_key_at_each_poll(app: &App) {
    let target = Target::start(3, Duration::ZERO).await;
    let id = created(app, graphql(&target.url("/graphql"))).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["spec"]["target"]["method"], "POST", "{w}");
    assert_eq!(
        w["spec"]["target"]["body"]["query"], "query { deployment(id: 7) { status } }",
        "the body is shown back: {w}"
    );
    let seen = target.seen("/graphql");
    assert_eq!(seen.len(), 3, "{seen:?}");
    let mut keys = HashSet::new();
    for s in &seen {
        assert_eq!(s.method, Method::POST);
        assert_eq!(s.content_type.as_deref(), Some("application/json"));
        let body: Value = serde_json::from_slice(&s.body).unwrap();
        assert_eq!(
            body,
            json!({"query": "query { deployment(id: 7) { status } }"})
        );
        assert!(keys.insert(s.key.clone().expect("a key at every poll")));
    }
}

#[tokio::test]
async fn a_post_carries_its_body_and_a_new_idempotency_key_at_each_poll() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    posts_with_a_new_key_at_each_poll(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_post_on_sqlite_carries_its_body_and_a_new_key_at_each_poll() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    posts_with_a_new_key_at_each_poll(&app).await;
    app.stop().await.0.unwrap();
}

/// Identical POSTs of two waits, and a GET of the same URL, are never one
/// request: every poll of each is sent, with its own key.
#[tokio::test]
async fn waits_that_post_never_share_a_poll() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let target = Target::start(usize::MAX, Duration::ZERO).await;
    let url = target.url("/shared");
    let mut put = graphql(&url);
    put["target"]["method"] = json!("PUT");
    put["target"]["body"] = json!("plain text");
    put["poll"] = json!({"initial": "1s", "max": "1s", "factor": 1, "jitter": 0});
    let mut get = put.clone();
    get["target"] = json!({"url": url});
    let ids = [
        created(&app, put.clone()).await,
        created(&app, put).await,
        created(&app, get).await,
    ];
    // Three polls of each: every one reaches the target.
    let all = heard_that(&target.heard, Duration::from_secs(15), || {
        target.seen("/shared").len() >= 9
    })
    .await;
    assert!(all, "{:?}", target.seen("/shared"));
    let mut polls = 0;
    for id in &ids {
        let (_, w) = app.post(&format!("/waits/{id}/cancel")).await;
        polls += w["polls"].as_u64().unwrap();
        assert_ne!(w["last_poll"], "shared", "{w}");
    }
    let seen = target.seen("/shared");
    assert!(seen.len() as u64 >= polls, "{polls} polls, {seen:?}");
    let puts: Vec<&Seen> = seen.iter().filter(|s| s.method == Method::PUT).collect();
    let keys: HashSet<&str> = puts.iter().filter_map(|s| s.key.as_deref()).collect();
    assert_eq!(
        keys.len(),
        puts.len(),
        "a key of its own for each: {puts:?}"
    );
    for s in &puts {
        assert_eq!(s.body, "plain text");
        assert_eq!(s.content_type.as_deref(), Some("text/plain; charset=utf-8"));
    }
    assert!(
        seen.iter()
            .filter(|s| s.method == Method::GET)
            .all(|s| s.key.is_none() && s.body.is_empty()),
        "{seen:?}"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// `elapsed` is the response time: a target that takes 200 ms fails a wait that
/// wants it under 100 ms, and meets one that allows 10 s.
#[tokio::test]
async fn conditions_read_the_response_time_as_elapsed() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let target = Target::start(1, Duration::from_millis(200)).await;
    let mut slow = graphql(&target.url("/slow"));
    slow["failure_condition"] = json!("elapsed > duration('100ms')");
    let w = app.wait_end(&created(&app, slow).await).await;
    assert_eq!(w["status"], "failed", "{w}");
    let mut fine = graphql(&target.url("/fine"));
    fine["target"]["method"] = json!("GET");
    fine["target"].as_object_mut().unwrap().remove("body");
    fine["success_condition"] =
        json!("elapsed >= duration('200ms') && elapsed < duration('10s') && status == 200");
    let w = app.wait_end(&created(&app, fine).await).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// Each mistake is a 400 that names its field and says what to write.
#[tokio::test]
async fn a_method_or_body_that_cannot_be_sent_is_refused_by_name() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let target = Target::start(1, Duration::ZERO).await;
    let url = &target.url("/refused");
    let cases = [
        (
            json!({"url": url, "body": "x"}),
            "target.body",
            "needs target.method",
        ),
        (
            json!({"url": url, "method": "GET", "body": {"a": 1}}),
            "target.body",
            "another method than GET",
        ),
        (
            json!({"url": url, "method": "FETCH"}),
            "target.method",
            "POST",
        ),
        (
            json!({"url": url, "method": 1}),
            "target.method",
            "a number",
        ),
        (
            json!({"url": url, "method": "POST", "headers": {"Idempotency-Key": "k"}}),
            "target.headers.Idempotency-Key",
            "new one at each poll",
        ),
        (
            json!({"url": url, "method": "POST", "body": "x".repeat(16 * 1024 + 1)}),
            "target.body",
            "the limit is 16384",
        ),
    ];
    for (target, field, says) in cases {
        let mut s = graphql(url);
        s["target"] = target;
        let (code, body) = app.create(s).await;
        assert_eq!(code, 400, "{body}");
        let errors = body["errors"].as_array().expect("errors");
        assert!(
            errors
                .iter()
                .any(|e| e["field"] == field && e["message"].as_str().unwrap().contains(says)),
            "{field}: {body}"
        );
    }
    // A GET may still name its method, and a DELETE needs no body.
    for method in ["get", "DELETE"] {
        let mut s = graphql(url);
        s["target"] = json!({"url": url, "method": method});
        let id = created(&app, s).await;
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
    }
    let methods: Vec<Method> = target
        .seen("/refused")
        .into_iter()
        .map(|s| s.method)
        .collect();
    assert_eq!(methods, [Method::GET, Method::DELETE]);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
