//! A read of a running wait shows its progress as it is, not as last checkpointed:
//! the replica that polls it answers with the figures its worker holds, and a
//! replica that does not says, through `progress_at`, how old its figures are.

use std::time::Duration;

use crate::support::*;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

/// Test flags with a lease long enough that no checkpoint lands during the test:
/// without the worker's answer, a read would show the first poll's row.
fn args(db_url: &str) -> Vec<String> {
    set_flag(test_args(db_url), "--lease-ttl", "30s")
}

fn at(w: &Value, field: &str) -> DateTime<Utc> {
    w[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{field} is a timestamp: {w}"))
}

/// Creates a wait polled every 20 ms that never ends by itself, and returns its id
/// once the target has answered `polls` times.
async fn a_busy_wait(app: &App, up: &Upstream, path: &str, polls: usize) -> String {
    let url = up.script(path, vec![Reply::status("deploying")]);
    let mut s = spec(&url);
    s["poll"] = json!({"initial": "20ms", "max": "20ms", "jitter": 0});
    s["timeout"] = json!("2m");
    let (code, created) = app.create(s).await;
    assert_eq!(code, 201, "{created}");
    assert!(
        up.hit(path, polls, Duration::from_secs(20)).await,
        "the target is polled"
    );
    created["id"].as_str().unwrap().to_string()
}

/// On the replica that polls it, the read and the list show the polls made so far
/// (the row still holds the first), a `next_poll_at` ahead of the read, and
/// `progress_at` the moment of the read.
async fn the_polling_replica_answers_current(app: &App) {
    let up = Upstream::start().await;
    let id = a_busy_wait(app, &up, "/s/current", 10).await;
    let before = Utc::now();
    let (code, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(code, 200, "{w}");
    assert!(w["polls"].as_i64().unwrap() >= 10, "current polls: {w}");
    let progress_at = at(&w, "progress_at");
    assert!(
        progress_at >= before - chrono::TimeDelta::milliseconds(1),
        "progress_at is the read's time: {w}"
    );
    assert!(
        at(&w, "next_poll_at") >= progress_at - chrono::TimeDelta::milliseconds(100),
        "the next poll is not in the past: {w}"
    );
    assert!(at(&w, "updated_at") < progress_at, "{w}");

    let (code, page) = app.get("/waits?status=running").await;
    assert_eq!(code, 200, "{page}");
    let item = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["id"] == id.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("listed: {page}"));
    assert!(item["polls"].as_i64().unwrap() >= 10, "{item}");

    // An ended wait reads as written.
    let (code, ended) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(code, 200, "{ended}");
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "canceled", "{w}");
    assert_eq!(w["progress_at"], w["updated_at"], "{w}");
}

#[tokio::test]
async fn the_polling_replica_reads_current_progress_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(args(&dir.sqlite_url())).await;
    the_polling_replica_answers_current(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn the_polling_replica_reads_current_progress_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start_args(args(&db.url)).await;
    the_polling_replica_answers_current(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A replica that does not hold the wait shows the row's figures, and `progress_at`
/// says they are as old as the row: it never passes a stale count off as current.
#[tokio::test]
async fn another_replica_says_how_old_its_figures_are() {
    let db = TestDb::new().await;
    let polling = App::start_args(args(&db.url)).await;
    let mut api_only = args(&db.url);
    api_only.push("--no-worker".into());
    let reading = App::start_args(api_only).await;
    let up = Upstream::start().await;
    let id = a_busy_wait(&polling, &up, "/s/elsewhere", 10).await;

    let (code, there) = reading.get(&format!("/waits/{id}")).await;
    assert_eq!(code, 200, "{there}");
    assert_eq!(there["progress_at"], there["updated_at"], "{there}");
    let (_, here) = polling.get(&format!("/waits/{id}")).await;
    assert!(
        here["polls"].as_i64() > there["polls"].as_i64(),
        "the polling replica is ahead of the row: {here}\n{there}"
    );
    assert!(at(&here, "progress_at") > at(&there, "progress_at"));

    reading.stop().await.0.unwrap();
    polling.stop().await.0.unwrap();
    db.drop_db().await;
}
