//! Retention on both stores: ended waits older than `--retention` are deleted
//! with their rows; a running wait and a wait with a pending delivery stay; a
//! deleted wait reads 404 with a sentence that says why; a `/events` cursor before
//! what is kept is a 410 problem; the sweep's metrics count what it deleted; and
//! a SQLite file under steady churn stops growing.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};

use support::receiver::Receiver;
use support::{App, Reply, TempDir, TestDb, Upstream};

/// A secret of the Standard Webhooks form (its bytes do not matter here).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw3aYQ6EHrZ5k=";

async fn metric(app: &App, series: &str) -> f64 {
    let text = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn created(app: &App, spec: Value) -> String {
    let (st, w) = app.create(spec).await;
    assert_eq!(st, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

async fn retention_keeps_what_it_must_and_deletes_the_rest(app: &App) {
    let mut heard = app.heard();
    let up = Upstream::start().await;
    let done_url = up.script("/done", vec![Reply::status("on")]);
    let running_url = up.script("/running", vec![Reply::status("pending")]);
    // Deliveries to a receiver that is not there stay pending (retries an hour apart).
    let hook = Receiver::down().url("/hook");

    let running = {
        let mut s = support::spec(&running_url);
        s["timeout"] = json!("10m");
        s["poll"] = json!({"initial": "1s", "max": "1s", "jitter": 0});
        created(app, s).await
    };
    let owed = {
        let mut s = support::spec(&done_url);
        s["notify"] = json!([{"url": hook, "secret": SECRET}]);
        created(app, s).await
    };
    // A running group's member that has ended is kept while the group runs: the
    // group shows each of its members.
    let (st, group) = app
        .create(json!({"all": [support::spec(&done_url), {"id": running}], "timeout": "10m"}))
        .await;
    assert_eq!(st, 201, "{group}");
    let member = group["members"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(app.wait_end(&member).await["status"], "succeeded");
    // An ended group kept for its pending delivery keeps its member, and is still
    // a group.
    let owed_group = created(
        app,
        json!({"all": [support::spec(&done_url)], "notify": [{"url": hook, "secret": SECRET}]}),
    )
    .await;
    let g = app.wait_end(&owed_group).await;
    assert_eq!(g["status"], "succeeded", "{g}");
    let owed_member = g["members"][0]["id"].as_str().unwrap().to_string();
    let mut ended = Vec::new();
    for _ in 0..20 {
        ended.push(created(app, support::spec(&done_url)).await);
    }
    for id in ended.iter().chain([&owed]) {
        let w = app.wait_end(id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
    }
    let (st, page) = app.get("/events?after=0").await;
    assert_eq!(st, 200, "{page}");
    let first = page["items"][0]["id"].as_i64().unwrap();

    // The 20 ended waits without a pending delivery are all there is to delete.
    heard.swept(20).await;
    let gone = format!("/waits/{}", ended[0]);
    let (status, problem) = app.get(&gone).await;
    assert_eq!(status, 404, "the ended wait was not deleted: {problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("ended waits are kept for the server's retention"),
        "{detail}"
    );
    assert!(metric(app, r#"waitd_retention_deleted_rows_total{table="waits"} "#).await >= 20.0);
    for id in &ended {
        assert_eq!(app.get(&format!("/waits/{id}")).await.0, 404, "{id}");
        assert_eq!(app.get(&format!("/waits/{id}/events")).await.0, 404, "{id}");
    }
    assert!(
        metric(
            app,
            r#"waitd_retention_deleted_rows_total{table="wait_events"} "#
        )
        .await
            >= 60.0
    );
    let (st, w) = app.get(&format!("/waits/{running}")).await;
    assert_eq!((st, w["status"].as_str()), (200, Some("running")), "{w}");
    let (st, w) = app.get(&format!("/waits/{owed}")).await;
    assert_eq!(st, 200, "the wait with a pending delivery was deleted: {w}");
    let (st, w) = app.get(&format!("/waits/{member}")).await;
    assert_eq!(st, 200, "a running group's ended member was deleted: {w}");
    let (_, g) = app
        .get(&format!("/waits/{}", group["id"].as_str().unwrap()))
        .await;
    assert_eq!(g["members"].as_array().map(Vec::len), Some(2), "{g}");
    let (st, w) = app.get(&format!("/waits/{owed_member}")).await;
    assert_eq!(st, 200, "a kept group's member was deleted: {w}");
    let (_, g) = app.get(&format!("/waits/{owed_group}")).await;
    assert_eq!(g["members"].as_array().map(Vec::len), Some(1), "{g}");
    let (st, p) = app.create(json!({"all": [{"id": owed_group}]})).await;
    assert_eq!(st, 400, "a kept group became a member: {p}");

    // A cursor before the deleted events would skip them: a 410 that says so.
    let (st, p) = app.get(&format!("/events?after={first}")).await;
    assert_eq!(st, 410, "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("start again from after="),
        "{p}"
    );
    let (st, _) = app.get("/events?after=0").await;
    assert_eq!(st, 200);
}

#[tokio::test]
async fn retention_on_postgres_deletes_ended_waits_and_nothing_owed() {
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--retention", "2s", "--webhook-retry-base", "1h"]).await;
    retention_keeps_what_it_must_and_deletes_the_rest(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn retention_on_sqlite_deletes_ended_waits_and_nothing_owed() {
    let dir = TempDir::new("waitd-retention");
    let mut args = support::test_args(&dir.sqlite_url());
    args.extend(["--retention", "2s", "--webhook-retry-base", "1h"].map(String::from));
    let app = App::start_args(args).await;
    retention_keeps_what_it_must_and_deletes_the_rest(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn without_retention_nothing_is_deleted() {
    let mut args = support::test_args("sqlite::memory:");
    args.extend(["--retention", "0"].map(String::from));
    let app = App::start_args(args).await;
    let up = Upstream::start().await;
    let id = created(
        &app,
        support::spec(&up.script("/done", vec![Reply::status("on")])),
    )
    .await;
    app.wait_end(&id).await;
    // No witness: a sweep that never runs gives no signal; three 1 s rounds' worth.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(app.get(&format!("/waits/{id}")).await.0, 200);
    app.stop().await.0.unwrap();
}

/// The SQLite file and its write-ahead log, in bytes.
fn sqlite_size(dir: &TempDir) -> u64 {
    ["waitd.db", "waitd.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.path.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

#[tokio::test]
async fn a_sqlite_file_under_steady_churn_stops_growing() {
    const ROUND: usize = 250;
    const ROUNDS: usize = 8;
    let dir = TempDir::new("waitd-retention-size");
    let mut args = support::test_args(&dir.sqlite_url());
    args.extend(["--retention", "1s"].map(String::from));
    let app = App::start_args(args).await;
    let up = Upstream::start().await;
    let url = up.script("/done", vec![Reply::status("on")]);
    let mut heard = app.heard();
    let mut sizes = Vec::new();
    for round in 1..=ROUNDS {
        let mut ids = Vec::new();
        for _ in 0..ROUND {
            ids.push(created(&app, support::spec(&url)).await);
        }
        for id in &ids {
            app.wait_end(id).await;
        }
        heard.swept(ROUND as u64).await;
        let swept = (round * ROUND) as f64;
        assert!(
            metric(
                &app,
                r#"waitd_retention_deleted_rows_total{table="waits"} "#
            )
            .await
                >= swept,
            "round {round} was not swept"
        );
        sizes.push(sqlite_size(&dir));
    }
    eprintln!(
        "SQLite file + WAL after each round of {ROUND} waits created, ended and swept: {sizes:?}"
    );
    let half = sizes[ROUNDS / 2 - 1];
    let last = sizes[ROUNDS - 1];
    assert!(
        last <= half + half / 4,
        "the file grew from {half} to {last} bytes over the second half: {sizes:?}"
    );
    app.stop().await.0.unwrap();
}
