//! Black-box tests of the wait API: blocking reads and creates (every status code a
//! blocked request can answer), cancel, idempotency, redaction, listing, restarts,
//! graceful shutdown and the operational endpoints.

use crate::support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use support::*;

/// Sends a request; returns the status, the headers and the body as JSON (Null if not JSON).
async fn send(req: reqwest::RequestBuilder) -> (u16, HeaderMap, Value) {
    let r = req.send().await.expect("request sent");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

fn content_type(h: &HeaderMap) -> String {
    h.get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn id_of(w: &Value) -> String {
    w["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {w}"))
        .to_string()
}

/// A spec that never polls during the test (first poll 15 s after creation).
fn idle_spec(url: &str) -> Value {
    let mut s = spec(url);
    s["poll"]["delay"] = json!("15s");
    s
}

// ---------------------------------------------------------------------------------
// Blocking: every status code
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_blocking_post_answers_201_with_the_wait_when_it_succeeds() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![
            Reply::status("deploying"),
            Reply::status("deploying"),
            Reply::status("on"),
        ],
    );
    let app = App::start(&db).await;
    let (status, h, w) = send(
        app.client
            .post(app.url("/waits?wait=10s"))
            .json(&spec(&url)),
    )
    .await;
    assert_eq!(status, 201, "{w}");
    assert!(content_type(&h).starts_with("application/json"), "{h:?}");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["state"], "on");
    assert!(w["finished_at"].is_string(), "{w}");
    let id = id_of(&w);
    assert_eq!(
        h.get("location").and_then(|v| v.to_str().ok()),
        Some(format!("/waits/{id}").as_str())
    );
    assert_eq!(up.hits("/s/1"), 3);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_get_answers_200_with_the_wait_when_it_succeeds() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![
            Reply::status("deploying"),
            Reply::status("deploying"),
            Reply::status("on"),
        ],
    );
    let app = App::start(&db).await;
    let (status, w) = app.create(spec(&url)).await;
    assert_eq!(status, 201, "{w}");
    let id = id_of(&w);
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=10s")))).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["id"], id.as_str());
    // `wait=true` on an ended wait answers at once with the same code.
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=true")))).await;
    assert_eq!(status, 200, "{w}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_get_with_wait_true_holds_until_the_wait_ends() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let mut replies = vec![Reply::status("deploying"); 10];
    replies.push(Reply::status("on"));
    let url = up.script("/s/1", replies);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=true")))).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(up.hits("/s/1"), 11);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

fn failing_body() -> Value {
    json!({"data": {"attributes": {
        "status": "failed_deployment",
        "error": {"code": "E42", "message": "disk full"}
    }}})
}

#[tokio::test]
async fn a_blocking_get_answers_422_with_the_error_detail_when_the_target_fails() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![Reply::status("deploying"), Reply::json(200, failing_body())],
    );
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["error"] = json!("/data/attributes/error");
    let (_, w) = app.create(s).await;
    let id = id_of(&w);
    let (status, h, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=10s")))).await;
    assert_eq!(status, 422, "{w}");
    // The body is the wait, not a problem document.
    assert!(content_type(&h).starts_with("application/json"), "{h:?}");
    assert_eq!(w["status"], "failed", "{w}");
    assert_eq!(w["state"], "failed_deployment");
    assert_eq!(
        w["error_detail"],
        json!({"code": "E42", "message": "disk full"})
    );
    assert!(
        w["reason"]
            .as_str()
            .is_some_and(|r| r.contains("failed_deployment")),
        "{w}"
    );
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_post_answers_422_when_the_target_fails() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::json(200, failing_body())]);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["error"] = json!("/data/attributes/error");
    let (status, _, w) = send(app.client.post(app.url("/waits?wait=10s")).json(&s)).await;
    assert_eq!(status, 422, "{w}");
    assert_eq!(w["status"], "failed", "{w}");
    assert_eq!(w["error_detail"]["code"], "E42", "{w}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_get_answers_412_with_the_last_state_in_the_reason_when_the_deadline_passes() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["timeout"] = json!("400ms");
    let (_, w) = app.create(s).await;
    let id = id_of(&w);
    let started = Instant::now();
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=10s")))).await;
    assert_eq!(status, 412, "{w}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(w["status"], "timed_out", "{w}");
    assert_eq!(w["state"], "deploying", "{w}");
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("\"deploying\""), "reason: {reason}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_post_answers_412_when_the_deadline_passes() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["timeout"] = json!("300ms");
    let (status, _, w) = send(app.client.post(app.url("/waits?wait=true")).json(&s)).await;
    assert_eq!(status, 412, "{w}");
    assert_eq!(w["status"], "timed_out", "{w}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_get_answers_409_promptly_when_another_task_cancels_the_wait() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    let mut heard = app.heard();
    let blocked = {
        let c = app.client.clone();
        let u = app.url(&format!("/waits/{id}?wait=30s"));
        tokio::spawn(async move {
            let (status, _, w) = send(c.get(u)).await;
            (status, w, Instant::now())
        })
    };
    heard.holding(&id).await;
    assert!(up.hit("/s/1", 2, Duration::from_secs(5)).await);
    // The point: the blocked GET is still held while the wait is polled three
    // times more.
    let polled = up.hits("/s/1");
    assert!(up.hit("/s/1", polled + 3, Duration::from_secs(5)).await);
    assert!(
        !blocked.is_finished(),
        "the blocked GET answered before the cancel"
    );
    let canceled_at = Instant::now();
    let (status, w) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "canceled", "{w}");
    let (status, w, answered_at) = tokio::time::timeout(Duration::from_secs(10), blocked)
        .await
        .expect("the blocked GET answers")
        .unwrap();
    assert_eq!(status, 409, "{w}");
    assert_eq!(w["status"], "canceled", "{w}");
    let lag = answered_at.saturating_duration_since(canceled_at);
    assert!(
        lag < Duration::from_secs(2),
        "answered {lag:?} after the cancel"
    );
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_post_answers_409_when_the_wait_is_canceled_meanwhile() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let mut heard = app.heard();
    let blocked = {
        let c = app.client.clone();
        let u = app.url("/waits?wait=30s");
        let s = spec(&url);
        tokio::spawn(async move { send(c.post(u).json(&s)).await })
    };
    // The worker claims the wait the blocked POST created.
    let claimed = heard
        .next(
            Duration::from_secs(5),
            |s| matches!(s, signals::Signal::Claimed(ids) if !ids.is_empty()),
        )
        .await;
    let Some(signals::Signal::Claimed(ids)) = claimed else {
        panic!("the blocked POST created no wait");
    };
    let id = ids[0].to_string();
    let (status, _) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(status, 200);
    let (status, h, w) = tokio::time::timeout(Duration::from_secs(10), blocked)
        .await
        .expect("the blocked POST answers")
        .unwrap();
    assert_eq!(status, 409, "{w}");
    assert_eq!(w["status"], "canceled", "{w}");
    assert_eq!(w["id"], id.as_str());
    assert!(content_type(&h).starts_with("application/json"), "{h:?}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_get_answers_424_when_the_target_answers_401() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![
            Reply::status("deploying"),
            Reply::json(401, json!({"error": "unauthorized"})),
        ],
    );
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=10s")))).await;
    assert_eq!(status, 424, "{w}");
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        w["reason"].as_str().is_some_and(|r| r.contains("401")),
        "{w}"
    );
    // A permanent error is not retried.
    assert_eq!(up.hits("/s/1"), 2);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_post_answers_424_when_the_retries_are_exhausted() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::json(503, json!({"busy": true}))]);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["retry"]["max_retries"] = json!(2);
    let (status, _, w) = send(app.client.post(app.url("/waits?wait=10s")).json(&s)).await;
    assert_eq!(status, 424, "{w}");
    assert_eq!(w["status"], "error", "{w}");
    assert_eq!(w["retries"], 2, "{w}");
    assert!(
        w["reason"].as_str().is_some_and(|r| r.contains("503")),
        "{w}"
    );
    assert!(w["last_error"].is_string(), "{w}");
    // max_retries + 1 bad observations in a row.
    assert_eq!(up.hits("/s/1"), 3);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_get_answers_202_when_the_wait_is_still_running_after_the_duration() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    let started = Instant::now();
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=300ms")))).await;
    let took = started.elapsed();
    assert_eq!(status, 202, "{w}");
    assert_eq!(w["status"], "running", "{w}");
    assert!(
        took >= Duration::from_millis(280),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocking_post_answers_202_when_the_wait_is_still_running_after_the_duration() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let started = Instant::now();
    let (status, h, w) = send(
        app.client
            .post(app.url("/waits?wait=300ms"))
            .json(&spec(&url)),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(status, 202, "{w}");
    assert_eq!(w["status"], "running", "{w}");
    assert!(h.get("location").is_some(), "{h:?}");
    assert!(
        took >= Duration::from_millis(280),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_blocked_request_returns_promptly_when_the_wait_ends() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let mut replies = vec![Reply::status("deploying"); 5];
    replies.push(Reply::status("on"));
    let url = up.script("/s/1", replies);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["poll"] = json!({"initial": "40ms", "factor": 1, "jitter": 0});
    let (_, w) = app.create(s).await;
    let id = id_of(&w);
    let started = Instant::now();
    let (status, _, w) = send(app.client.get(app.url(&format!("/waits/{id}?wait=30s")))).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{w}");
    // Six polls 40 ms apart end the wait in about 200 ms; the block is 30 s.
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Cancel
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn canceling_a_running_wait_stops_its_polling() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["poll"] = json!({"initial": "5ms", "factor": 1, "jitter": 0});
    let (_, w) = app.create(s).await;
    let id = id_of(&w);
    assert!(up.hit("/s/1", 5, Duration::from_secs(5)).await);
    let (status, w) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "canceled", "{w}");
    assert!(w["finished_at"].is_string(), "{w}");
    assert!(w["reason"].is_string(), "{w}");
    // Let a probe that was already in flight land (the worker goes round 10
    // times), then watch for more.
    app.turns(&up, 10).await;
    let settled = up.hits("/s/1");
    // The point: no poll lands while the worker goes round 20 times more, each
    // time past a poll of another wait (a negative: a bounded window, anchored
    // to the worker's progress; the canceled wait polled every 5 ms).
    app.turns(&up, 20).await;
    assert_eq!(
        up.hits("/s/1"),
        settled,
        "the target was still polled after the cancel"
    );
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "canceled", "{w}");
    let (_, ev) = app.get(&format!("/waits/{id}/events")).await;
    let kinds: Vec<&str> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.last(), Some(&"canceled"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "canceled").count(), 1);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn canceling_an_ended_wait_returns_it_unchanged_with_200() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("on")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    let ended = app.wait_end(&id).await;
    assert_eq!(ended["status"], "succeeded", "{ended}");
    let (status, w) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w, ended, "cancel changed an ended wait");
    let (_, again) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(again, ended);
    let (_, ev) = app.get(&format!("/waits/{id}/events")).await;
    let kinds: Vec<&str> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "state", "succeeded"]);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn canceling_twice_ends_the_wait_once() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(idle_spec(&url)).await;
    let id = id_of(&w);
    let (s1, first) = app.post(&format!("/waits/{id}/cancel")).await;
    let (s2, second) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(first, second);
    let (_, ev) = app.get(&format!("/waits/{id}/events")).await;
    let kinds: Vec<&str> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "canceled"]);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Idempotency
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn the_same_idempotency_key_and_body_return_the_first_wait() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let s = idle_spec(&url);
    let post = || {
        app.client
            .post(app.url("/waits"))
            .header("Idempotency-Key", "deploy-1234")
            .json(&s)
    };
    let (s1, h1, w1) = send(post()).await;
    assert_eq!(s1, 201, "{w1}");
    assert!(h1.get("idempotent-replayed").is_none(), "{h1:?}");
    let (s2, h2, w2) = send(post()).await;
    assert_eq!(s2, 201, "{w2}");
    assert_eq!(w2["id"], w1["id"]);
    assert_eq!(
        h2.get("idempotent-replayed").and_then(|v| v.to_str().ok()),
        Some("true"),
        "{h2:?}"
    );
    assert_eq!(h2.get("location"), h1.get("location"));
    let (_, page) = app.get("/waits").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn the_same_idempotency_key_with_the_body_keys_reordered_is_still_a_replay() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let a = format!(
        r#"{{"target": {{"url": "{url}"}}, "state": "/data/attributes/status", "want": ["on"], "poll": {{"delay": "15s"}}}}"#
    );
    let b = format!(
        r#"{{"poll":{{"delay":"15s"}},"want":["on"],"state":"/data/attributes/status","target":{{"url":"{url}"}}}}"#
    );
    let post = |body: String| {
        app.client
            .post(app.url("/waits"))
            .header("Idempotency-Key", "k-1")
            .header("content-type", "application/json")
            .body(body)
    };
    let (s1, _, w1) = send(post(a)).await;
    assert_eq!(s1, 201, "{w1}");
    let (s2, h2, w2) = send(post(b)).await;
    assert_eq!(s2, 201, "{w2}");
    assert_eq!(w2["id"], w1["id"]);
    assert!(h2.get("idempotent-replayed").is_some(), "{h2:?}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn the_same_idempotency_key_with_another_body_is_a_409_problem() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let first = idle_spec(&url);
    let mut second = idle_spec(&url);
    second["labels"] = json!({"pipeline": "other"});
    let post = |body: &Value| {
        app.client
            .post(app.url("/waits"))
            .header("Idempotency-Key", "deploy-1234")
            .json(body)
    };
    let (s1, _, w1) = send(post(&first)).await;
    assert_eq!(s1, 201, "{w1}");
    let (s2, h2, p) = send(post(&second)).await;
    assert_eq!(s2, 409, "{p}");
    assert_eq!(content_type(&h2), "application/problem+json");
    assert_eq!(p["status"], 409, "{p}");
    assert!(p["type"].is_string() && p["title"].is_string(), "{p}");
    assert!(p["detail"].as_str().is_some_and(|d| d.contains(' ')), "{p}");
    // The first wait stands; no second one was made.
    let (_, page) = app.get("/waits").await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{page}");
    assert_eq!(items[0]["id"], w1["id"]);
    // A different key makes a new wait.
    let (s3, _, w3) = send(
        app.client
            .post(app.url("/waits"))
            .header("Idempotency-Key", "deploy-1235")
            .json(&second),
    )
    .await;
    assert_eq!(s3, 201, "{w3}");
    assert_ne!(w3["id"], w1["id"]);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Redaction
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn header_values_are_redacted_on_every_read_and_still_sent_to_the_target() {
    const SECRET: &str = "s3cr3t-value";
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["target"]["headers"] = json!({
        "Authorization": format!("Bearer {SECRET}"),
        "X-Api-Key": "k3y-s3cr3t-value"
    });
    s["labels"] = json!({"team": "red"});
    let r = app
        .client
        .post(app.url("/waits"))
        .json(&s)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let created = r.text().await.unwrap();
    let w: Value = serde_json::from_str(&created).unwrap();
    let id = id_of(&w);
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(
        end["spec"]["target"]["headers"]["Authorization"],
        "<redacted>"
    );
    assert_eq!(end["spec"]["target"]["headers"]["X-Api-Key"], "<redacted>");

    let mut bodies = vec![("POST /waits".to_string(), created)];
    for path in [
        format!("/waits/{id}"),
        format!("/waits/{id}?wait=1s"),
        "/waits".to_string(),
        "/waits?label=team:red".to_string(),
        format!("/waits/{id}/events"),
        format!("/waits/{id}/events?follow=true"),
        "/events".to_string(),
    ] {
        let text = app
            .client
            .get(app.url(&path))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        bodies.push((path, text));
    }
    for (path, body) in &bodies {
        assert!(!body.is_empty(), "{path} answered nothing");
        assert!(!body.contains(SECRET), "{path} shows the secret: {body}");
        assert!(!body.contains("k3y-s3cr3t"), "{path} shows the key: {body}");
    }
    // The upstream got the real values.
    let seen = up.headers_seen("/s/1");
    assert!(!seen.is_empty());
    for h in &seen {
        assert_eq!(
            h.get("authorization").and_then(|v| v.to_str().ok()),
            Some(format!("Bearer {SECRET}").as_str())
        );
        assert_eq!(
            h.get("x-api-key").and_then(|v| v.to_str().ok()),
            Some("k3y-s3cr3t-value")
        );
    }
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Listing
// ---------------------------------------------------------------------------------

fn ids(page: &Value) -> Vec<String> {
    page["items"]
        .as_array()
        .unwrap_or_else(|| panic!("not a page: {page}"))
        .iter()
        .map(id_of)
        .collect()
}

#[tokio::test]
async fn listing_filters_by_status_and_by_labels() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let done = up.script("/done", vec![Reply::status("on")]);
    let slow = up.script("/slow", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;

    let make = |url: &str, team: &str, env: &str, idle: bool| {
        let mut s = if idle { idle_spec(url) } else { spec(url) };
        s["labels"] = json!({"team": team, "env": env});
        s
    };
    let mut running_a = Vec::new();
    let mut succeeded_a = Vec::new();
    let mut b = Vec::new();
    for _ in 0..2 {
        let (_, w) = app.create(make(&slow, "a", "prod", true)).await;
        running_a.push(id_of(&w));
        let (_, w) = app.create(make(&done, "a", "dev", false)).await;
        succeeded_a.push(id_of(&w));
        let (_, w) = app.create(make(&done, "b", "prod", false)).await;
        b.push(id_of(&w));
    }
    for id in succeeded_a.iter().chain(&b) {
        assert_eq!(app.wait_end(id).await["status"], "succeeded");
    }
    let set = |v: &[String]| v.iter().cloned().collect::<HashSet<_>>();

    let (status, page) = app.get("/waits?status=running").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(set(&ids(&page)), set(&running_a));
    for w in page["items"].as_array().unwrap() {
        assert_eq!(w["status"], "running");
    }

    let (_, page) = app.get("/waits?status=succeeded").await;
    let want: Vec<String> = succeeded_a.iter().chain(&b).cloned().collect();
    assert_eq!(set(&ids(&page)), set(&want));

    let (_, page) = app.get("/waits?label=team:a").await;
    let want: Vec<String> = running_a.iter().chain(&succeeded_a).cloned().collect();
    assert_eq!(set(&ids(&page)), set(&want));

    let (_, page) = app.get("/waits?label=team:a&label=env:prod").await;
    assert_eq!(set(&ids(&page)), set(&running_a));

    let (_, page) = app.get("/waits?status=succeeded&label=env:prod").await;
    assert_eq!(set(&ids(&page)), set(&b));

    let (_, page) = app.get("/waits?label=team:nobody").await;
    assert!(ids(&page).is_empty(), "{page}");
    assert!(page["next_cursor"].is_null(), "{page}");

    let (_, page) = app.get("/waits?status=failed").await;
    assert!(ids(&page).is_empty(), "{page}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn listing_pages_newest_first_with_no_duplicates_across_pages() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let mut created = Vec::new();
    for i in 0..7 {
        let mut s = idle_spec(&url);
        s["labels"] = json!({"n": i.to_string()});
        let (status, w) = app.create(s).await;
        assert_eq!(status, 201, "{w}");
        created.push(id_of(&w));
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            None => "/waits?limit=3".to_string(),
            Some(c) => format!("/waits?limit=3&cursor={c}"),
        };
        let (status, page) = app.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let items = ids(&page);
        assert!(items.len() <= 3, "{page}");
        seen.extend(items);
        pages += 1;
        assert!(pages <= 5, "paging does not end: {seen:?}");
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, newest_first, "pages out of order or with duplicates");
    assert_eq!(pages, 3);
    // created_at is newest first too.
    let (_, page) = app.get("/waits").await;
    let times: Vec<String> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["created_at"].as_str().unwrap().to_string())
        .collect();
    let ts: Vec<chrono::DateTime<chrono::Utc>> = times.iter().map(|t| t.parse().unwrap()).collect();
    assert!(ts.windows(2).all(|p| p[0] >= p[1]), "{times:?}");
    assert_eq!(ids(&page), newest_first);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Restart and shutdown
// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_wait_survives_a_restart_on_the_same_database_and_ends() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let a = App::start(&db).await;
    let mut s = spec(&url);
    s["poll"] = json!({"initial": "400ms", "factor": 1, "jitter": 0});
    let (_, w) = a.create(s).await;
    let id = id_of(&w);
    assert!(up.hit("/s/1", 1, Duration::from_secs(5)).await);
    let (r, took) = a.stop().await;
    r.unwrap();
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    assert_eq!(
        db_count(&db, "SELECT count(*) FROM waits WHERE status = 'running'").await,
        1
    );
    let before = up.hits("/s/1");

    up.script("/s/1", vec![Reply::status("on")]);
    let b = App::start(&db).await;
    let (status, _, w) = send(b.client.get(b.url(&format!("/waits/{id}?wait=15s")))).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["state"], "on");
    assert!(up.hits("/s/1") > before);
    let (_, ev) = b.get(&format!("/waits/{id}/events")).await;
    let kinds: Vec<&str> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "state", "state", "succeeded"]);
    let seqs: Vec<i64> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    let (r, _) = b.stop().await;
    r.unwrap();
    db.drop_db().await;
}

/// Waits a replica holds: in a slot with a holder.
const HELD: &str =
    "SELECT count(*) FROM waits w JOIN slots s ON s.id = w.owner WHERE s.holder IS NOT NULL";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_exits_ok_promptly_and_releases_every_lease() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let app = App::start(&db).await;
    let mut ids_ = Vec::new();
    for i in 0..3 {
        let url = up.script(&format!("/s/{i}"), vec![Reply::status("deploying")]);
        let mut s = spec(&url);
        s["poll"] = json!({"initial": "20ms", "factor": 1, "jitter": 0});
        let (_, w) = app.create(s).await;
        ids_.push(id_of(&w));
    }
    for i in 0..3 {
        assert!(
            up.hit(&format!("/s/{i}"), 2, Duration::from_secs(5)).await,
            "the waits were not polled"
        );
    }
    assert_eq!(
        db_count(
            &db,
            "SELECT count(*) FROM waits WHERE status = 'running' AND owner IS NOT NULL"
        )
        .await,
        3,
        "the waits should be leased while running"
    );
    // A request blocked on a wait answers when the server stops.
    let mut heard = app.heard();
    let blocked = {
        let c = app.client.clone();
        let u = app.url(&format!("/waits/{}?wait=60s", ids_[0]));
        tokio::spawn(async move { send(c.get(u)).await })
    };
    heard.holding(&ids_[0]).await;
    let (r, took) = app.stop().await;
    assert!(r.is_ok(), "{r:?}");
    assert!(took < Duration::from_secs(3), "stop took {took:?}");
    let (status, h, w) = tokio::time::timeout(Duration::from_secs(5), blocked)
        .await
        .expect("the blocked request answered")
        .unwrap();
    // Never a 2xx for a wait that has not ended: a 503 that curl -f fails on and
    // curl --retry repeats.
    assert_eq!(status, 503, "{w}");
    assert_eq!(h["content-type"], "application/problem+json", "{h:?}");
    assert!(h.get("retry-after").is_some(), "{h:?}");
    assert_eq!(h["location"], format!("/waits/{}", ids_[0]), "{h:?}");
    assert!(
        w["detail"].as_str().unwrap().contains(&ids_[0].to_string()),
        "{w}"
    );
    assert_eq!(
        db_count(&db, HELD).await,
        0,
        "leases left after a graceful stop"
    );
    assert_eq!(
        db_count(&db, "SELECT count(*) FROM waits WHERE status = 'running'").await,
        3
    );
    // Nothing polls after the stop.
    let hits: Vec<usize> = (0..3).map(|i| up.hits(&format!("/s/{i}"))).collect();
    // The point: no poll lands in ten of their intervals (no loop is left to witness it).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let later: Vec<usize> = (0..3).map(|i| up.hits(&format!("/s/{i}"))).collect();
    assert_eq!(hits, later);
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_an_in_flight_probe_finish_and_still_releases_its_lease() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let mut slow = Reply::status("deploying");
    slow.delay = Duration::from_millis(700);
    let url = up.script("/s/1", vec![slow]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    // The first probe is now in flight (the upstream answers after 700 ms).
    assert!(up.hit("/s/1", 1, Duration::from_secs(5)).await);
    let (r, took) = app.stop().await;
    assert!(r.is_ok(), "{r:?}");
    assert!(took < Duration::from_secs(4), "stop took {took:?}");
    assert_eq!(
        db_count(&db, HELD).await,
        0,
        "the lease of a wait with a probe in flight was not released"
    );
    // The finished probe's observation was recorded, not lost.
    let b = App::start(&db).await;
    let (_, w) = b.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    assert_eq!(w["state"], "deploying", "{w}");
    b.post(&format!("/waits/{id}/cancel")).await;
    let (r, _) = b.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_blocked_on_a_replica_without_a_worker_sees_the_wait_end_on_another() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let mut replies = vec![Reply::status("deploying"); 3];
    replies.push(Reply::status("on"));
    let url = up.script("/s/1", replies);
    let api = App::start_with(&db, &["--no-worker"]).await;
    let (_, w) = api.create(spec(&url)).await;
    let id = id_of(&w);
    let mut heard = api.heard();
    let blocked = {
        let c = api.client.clone();
        let u = api.url(&format!("/waits/{id}?wait=20s"));
        tokio::spawn(async move {
            let r = send(c.get(u)).await;
            (r, chrono::Utc::now())
        })
    };
    heard.holding(&id).await;
    // The wait was due at once; a --no-worker replica that polled would have polled
    // it before the worker came.
    let worker_from = std::time::Instant::now();
    let worker = App::start(&db).await;
    let ((status, _, w), answered) = tokio::time::timeout(Duration::from_secs(15), blocked)
        .await
        .expect("the blocked request answers")
        .unwrap();
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(
        up.first_hit("/s/1").is_some_and(|t| t > worker_from),
        "a --no-worker replica polled"
    );
    // It answered on the end's notice, not on a timer.
    let (_, now) = worker.get(&format!("/waits/{id}")).await;
    let finished: chrono::DateTime<chrono::Utc> =
        now["finished_at"].as_str().unwrap().parse().unwrap();
    let lag = answered - finished;
    assert!(
        lag < chrono::TimeDelta::seconds(1),
        "answered {lag} after the wait ended"
    );
    let (r, _) = worker.stop().await;
    r.unwrap();
    let (r, _) = api.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_leased_by_a_dead_replica_is_taken_over_once_its_lease_expires() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("on")]);
    let api = App::start_with(&db, &["--no-worker"]).await;
    let (_, w) = api.create(spec(&url)).await;
    let id = id_of(&w);
    // A replica that claimed the wait and died: its lease runs for 3 s more, long
    // enough for a claim sweep of the worker started below on a busy machine.
    let n = db_exec(
        &db,
        "INSERT INTO replicas (id, lease_until)
         VALUES ('00000000-0000-7000-8000-000000000001', now() + interval '3 seconds')",
    )
    .await;
    assert_eq!(n, 1);
    let n = db_exec(
        &db,
        "UPDATE waits SET owner = '00000000-0000-7000-8000-000000000001', epoch = epoch + 1",
    )
    .await;
    assert_eq!(n, 1);
    // In a slot of its own, which the dead replica holds.
    let n = db_exec(
        &db,
        "INSERT INTO slots (id, holder)
         VALUES ('00000000-0000-7000-8000-000000000001', '00000000-0000-7000-8000-000000000001')",
    )
    .await;
    assert_eq!(n, 1);
    // Its claim sweep every 100 ms (a tenth of its TTL): one comes back while the
    // dead replica's lease is live.
    let worker = App::start_args(set_flag(test_args(&db.url), "--lease-ttl", "1s")).await;
    let mut heard = worker.heard();
    // The point: a claim sweep ran while the lease is live, and left the wait alone.
    let swept = heard
        .expect("a claim sweep", |s| {
            matches!(s, signals::Signal::Claimed(_))
        })
        .await;
    let wait: uuid::Uuid = id.parse().unwrap();
    assert!(
        !matches!(&swept, signals::Signal::Claimed(ids) if ids.contains(&wait)),
        "a live lease was ignored"
    );
    assert_eq!(up.hits("/s/1"), 0, "a live lease was ignored");
    let (status, _, w) = send(api.client.get(api.url(&format!("/waits/{id}?wait=10s")))).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(up.hits("/s/1"), 1);
    let (r, _) = worker.stop().await;
    r.unwrap();
    let (r, _) = api.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_posts_with_one_idempotency_key_make_one_wait() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let s = idle_spec(&url);
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let req = app
            .client
            .post(app.url("/waits"))
            .header("Idempotency-Key", "race-1")
            .json(&s);
        tasks.push(tokio::spawn(send(req)));
    }
    let mut ids_ = HashSet::new();
    let mut replayed = 0;
    for t in tasks {
        let (status, h, w) = t.await.unwrap();
        assert_eq!(status, 201, "{w}");
        ids_.insert(id_of(&w));
        if h.get("idempotent-replayed").is_some() {
            replayed += 1;
        }
    }
    assert_eq!(ids_.len(), 1, "{ids_:?}");
    assert_eq!(replayed, 5);
    assert_eq!(db_count(&db, "SELECT count(*) FROM waits").await, 1);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Operational endpoints
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn healthz_and_readyz_answer_200() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    for path in ["/healthz", "/readyz"] {
        let r = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path}");
    }
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_the_api_answer_503_problems_while_the_store_is_unreachable_and_recover() {
    let db = TestDb::new().await;
    let proxy = PgProxy::start();
    let app = App::start_args(test_args(&proxy.url(&db))).await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let (status, w) = app.create(idle_spec(&url)).await;
    assert_eq!(status, 201, "{w}");
    let id = id_of(&w);

    proxy.cut();
    let last = poll_for(Duration::from_secs(10), || async {
        let r = send(app.client.get(app.url("/readyz"))).await;
        (r.0 == 503).then_some(r)
    })
    .await
    .expect("readyz answers 503 while the store is unreachable");
    assert_eq!(content_type(&last.1), "application/problem+json");
    for req in [
        app.client.get(app.url("/waits")),
        app.client.get(app.url(&format!("/waits/{id}"))),
        app.client.post(app.url("/waits")).json(&idle_spec(&url)),
    ] {
        let (status, h, p) = send(req).await;
        assert_eq!(status, 503, "{p}");
        assert_eq!(content_type(&h), "application/problem+json");
        assert_eq!(p["status"], 503, "{p}");
        assert!(h.get("retry-after").is_some(), "{h:?}");
    }
    // The process itself is up.
    let (status, _, _) = send(app.client.get(app.url("/healthz"))).await;
    assert_eq!(status, 200);

    proxy.restore();
    let ready = eventually(Duration::from_secs(10), || async {
        send(app.client.get(app.url("/readyz"))).await.0 == 200
    })
    .await;
    assert!(ready, "readyz did not recover");
    let (status, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "running");
    let (r, took) = app.stop().await;
    r.unwrap();
    assert!(took < Duration::from_secs(10), "stop took {took:?}");
    db.drop_db().await;
}

#[tokio::test]
async fn metrics_are_prometheus_text_with_polls_and_active_waits() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let done = up.script(
        "/done",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let slow = up.script("/slow", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&done)).await;
    assert_eq!(app.wait_end(&id_of(&w)).await["status"], "succeeded");
    let (_, _) = app.create(idle_spec(&slow)).await;
    let (_, _) = app.create(idle_spec(&slow)).await;

    let r = app.client.get(app.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    assert!(ct.starts_with("text/plain"), "{ct}");
    let text = r.text().await.unwrap();
    assert!(text.contains("waitd_polls_total"), "{text}");
    assert!(text.contains("waitd_active_waits"), "{text}");
    let value = |prefix: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(prefix) && !l.starts_with('#'))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(value("waitd_active_waits"), 2.0, "{text}");
    assert!(value("waitd_polls_total") >= 2.0, "{text}");
    // Connections out of the pools at the scrape: never more than the pools hold
    // (`--db-connections` and the three Postgres keeps for leases and events).
    assert!(
        text.contains("# TYPE waitd_db_connections_in_use gauge"),
        "{text}"
    );
    let in_use = value("waitd_db_connections_in_use");
    assert!((0.0..=19.0).contains(&in_use), "{text}");
    // The count serves scrapes for 5 s (anyone may scrape, and a count over a
    // million rows is not free): one more wait does not show at once.
    let (_, _) = app.create(idle_spec(&slow)).await;
    let again = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(again.contains("waitd_active_waits 2\n"), "{again}");
    // The replica names the id it owns waits under: the store holds its live lease.
    let owner: uuid::Uuid = text
        .lines()
        .find_map(|l| l.strip_prefix("waitd_replica_info{owner=\""))
        .and_then(|l| l.split('"').next())
        .and_then(|o| o.parse().ok())
        .unwrap_or_else(|| panic!("no waitd_replica_info in {text}"));
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    let leased: i64 =
        sqlx::query_scalar("SELECT count(*) FROM replicas WHERE id = $1 AND lease_until > now()")
            .bind(owner)
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(leased, 1, "{text}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn the_openapi_document_is_served_as_openapi_3_1_json() {
    let app = support::in_process::InProcess::start().await;
    let r = app.get("/openapi.json").send().await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").starts_with("application/json"));
    let doc: Value = serde_json::from_str(&r.text).expect("valid JSON");
    assert!(
        doc["openapi"]
            .as_str()
            .is_some_and(|v| v.starts_with("3.1")),
        "{}",
        doc["openapi"]
    );
    for path in [
        "/waits",
        "/waits/{id}",
        "/waits/{id}/cancel",
        "/waits/{id}/events",
        "/events",
    ] {
        assert!(doc["paths"][path].is_object(), "no {path} in the document");
    }
    app.stop().await;
}

#[tokio::test]
async fn polls_that_change_nothing_are_not_rewritten_every_lease_but_a_growing_interval_is() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let fixed = up.script("/fixed", vec![Reply::status("deploying")]);
    let growing = up.script("/growing", vec![Reply::status("deploying")]);
    // A 1 s lease: checkpoints go every second; unchanged ones only every 10 s.
    let args: Vec<String> = test_args(&db.url)
        .into_iter()
        .map(|a| if a == "3s" { "1s".to_string() } else { a })
        .collect();
    let mut api_only = args.clone();
    api_only.push("--no-worker".into());
    let app = App::start_args(args).await;
    // What the store holds is read from a replica that polls nothing: the polling
    // one answers with its worker's current figures.
    let rows = App::start_args(api_only).await;
    let mut f = spec(&fixed);
    f["poll"] = json!({"initial": "20ms", "factor": 1, "max": "20ms", "jitter": 0});
    let mut g = spec(&growing);
    g["poll"] = json!({"initial": "20ms", "factor": 1.3, "max": "10s", "jitter": 0});
    let mut heard = app.heard();
    let (_, wf) = app.create(f).await;
    let (_, wg) = app.create(g).await;
    // Six renewals (one every third of the 1 s lease), each writing the
    // checkpoints due: more than two lease TTLs of them.
    heard.renewed(6).await;
    let (_, rf) = rows.get(&format!("/waits/{}", id_of(&wf))).await;
    let (_, rg) = rows.get(&format!("/waits/{}", id_of(&wg))).await;
    let (hf, hg) = (up.hits("/fixed"), up.hits("/growing"));
    // The fixed wait was polled all along, but only its first poll (a new state) is
    // in the store; the growing one's interval changed, so it was checkpointed.
    assert!(hf > 40, "the fixed wait was polled {hf} times");
    assert_eq!(rf["polls"], 1, "{rf}");
    assert!(hg > 3, "the growing wait was polled {hg} times");
    assert!(rg["polls"].as_i64().unwrap() > 1, "{rg} after {hg} polls");
    rows.stop().await.0.unwrap();
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}
