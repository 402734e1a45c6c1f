//! The CEL libraries through the API, on both stores: a header compared with
//! `lowerAscii()`, a condition on how long ago a target's timestamp was (`now`),
//! and a bad timestamp string or a missing key, which count as a missing state.

use crate::support;

use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};
use support::*;

/// How long the held-duration condition waits: many polls long, so a wait that
/// succeeds early shows it, and longer than a loaded machine's slowest gap
/// between two of the wait's 10–20 ms polls.
const HELD: Duration = Duration::from_secs(3);

fn poll() -> Value {
    json!({"initial": "10ms", "max": "20ms", "jitter": 0})
}

async fn header_lower_ascii(app: &App, up: &Upstream) {
    let url = up.script(
        "/phase",
        vec![
            Reply::json(200, json!({})).header("x-phase", "Running"),
            Reply::json(200, json!({})).header("x-phase", "DONE"),
        ],
    );
    let (code, w) = app
        .create(json!({
            "target": {"url": url},
            "success_condition": "headers['x-phase'].lowerAscii() == 'done'",
            "poll": poll(),
        }))
        .await;
    assert_eq!(code, 201, "{w}");
    let done = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert_eq!(up.hits("/phase"), 2);
}

/// A Kubernetes-shaped object whose Ready condition changed at `at`.
fn ready_since(at: &str) -> Value {
    json!({"status": {"conditions": [
        {"type": "Progressing", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"},
        {"type": "Ready", "status": "True", "lastTransitionTime": at},
    ]}})
}

async fn held_for_a_duration(app: &App, up: &Upstream) {
    // Ready since a time far ahead, until the wait has polled twice: then Ready
    // since now, the same body from there on.
    let url = up.script(
        "/held",
        vec![Reply::json(200, ready_since("2100-01-01T00:00:00Z"))],
    );
    let condition = format!(
        "now - timestamp(body.status.conditions.filter(c, c.type == 'Ready')[0].lastTransitionTime) > duration('{}ms')",
        HELD.as_millis()
    );
    let (code, w) = app
        .create(json!({
            "target": {"url": url},
            "success_condition": condition,
            "poll": poll(),
        }))
        .await;
    assert_eq!(code, 201, "{w}");
    // Twice: a first poll is written before the next begins (on Postgres, a write
    // that a loaded database may hold past HELD); the polls after it come at the
    // wait's 10–20 ms.
    let polled = up.hit("/held", 2, Duration::from_secs(10)).await;
    assert!(polled, "the wait polls its target");
    let since: DateTime<Utc> = Utc::now();
    up.script(
        "/held",
        vec![Reply::json(
            200,
            ready_since(&since.to_rfc3339_opts(SecondsFormat::Millis, true)),
        )],
    );
    let before = up.hits("/held");
    let done = app.wait_end(w["id"].as_str().unwrap()).await;
    let ended = Utc::now();
    assert_eq!(done["status"], "succeeded", "{done}");
    // The same body at every poll since: false until the duration had passed
    // since the target's timestamp, then true.
    assert!(
        ended - since > chrono::Duration::from_std(HELD).unwrap(),
        "ended {:?} after the timestamp",
        ended - since
    );
    let same_body_polls = up.hits("/held") - before;
    assert!(
        same_body_polls > 1,
        "polled {same_body_polls} times on the same body"
    );
}

/// A wait with `conditions` on `url`, polled once: the error its first poll left,
/// the wait still running; then it is canceled.
async fn first_error(app: &App, url: &str, conditions: Value) -> String {
    let mut request = json!({
        "target": {"url": url},
        "poll": poll(),
        "retry": {"delay": "10ms", "max_delay": "20ms"},
    });
    for (k, v) in conditions.as_object().unwrap() {
        request[k] = v.clone();
    }
    let mut heard = app.heard();
    let (code, w) = app.create(request).await;
    assert_eq!(code, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    // The first poll's error is progress the worker writes.
    heard.recorded(&id).await;
    let (_, running) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(running["status"], "running", "{running}");
    let (code, _) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(code, 200);
    running["last_error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn bad_timestamp(app: &App, up: &Upstream) {
    let url = up.script("/bad", vec![Reply::json(200, ready_since("yesterday"))]);
    let error = first_error(
        app,
        &url,
        json!({"success_condition": "now - timestamp(body.status.conditions.filter(c, c.type == 'Ready')[0].lastTransitionTime) > duration('1s')"}),
    )
    .await;
    assert!(
        error.contains("success_condition could not be evaluated") && error.contains("timestamp"),
        "{error}"
    );
}

/// A condition that reads a header the target does not send: the error names the
/// guards that read a key which may be missing.
async fn missing_key(app: &App, up: &Upstream) {
    let url = up.script("/no-phase", vec![Reply::json(200, json!({}))]);
    let error = first_error(
        app,
        &url,
        json!({"success_condition": "status == 299", "failure_condition": "headers['x-phase'] == 'failed'"}),
    )
    .await;
    assert!(
        error.contains("no such key \"x-phase\"")
            && error.contains("'x-phase' in headers")
            && error.contains("has("),
        "{error}"
    );
}

async fn all(app: &App) {
    let up = Upstream::start().await;
    header_lower_ascii(app, &up).await;
    held_for_a_duration(app, &up).await;
    bad_timestamp(app, &up).await;
    missing_key(app, &up).await;
}

#[tokio::test]
async fn the_cel_libraries_work_through_the_api_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    all(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn the_cel_libraries_work_through_the_api_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    all(&app).await;
    app.stop().await.0.unwrap();
}
