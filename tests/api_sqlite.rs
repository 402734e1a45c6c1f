//! The black-box API on the embedded SQLite store: create, block, cancel, follow,
//! and a restart on the same file.

use crate::support;

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use support::*;

#[tokio::test]
async fn a_wait_on_sqlite_is_created_blocked_on_and_succeeds() {
    let dir = TempDir::new("waitd-test");
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let r = app
        .client
        .post(app.url("/waits?wait=10s"))
        .json(&spec(&url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let w: Value = r.json().await.unwrap();
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(up.hits("/s/1"), 2);
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_blocked_read_on_sqlite_answers_409_when_the_wait_is_canceled() {
    let dir = TempDir::new("waitd-test");
    let up = Upstream::start().await;
    let url = up.script("/s/2", vec![Reply::status("deploying")]);
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let mut heard = app.heard();
    let blocked = {
        let (client, u) = (
            app.client.clone(),
            app.url(&format!("/waits/{id}?wait=10s")),
        );
        tokio::spawn(async move { client.get(u).send().await.unwrap() })
    };
    // Held before the cancel, so the cancel's notice is what answers it.
    heard.holding(&id).await;
    let (status, canceled) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(
        (status, canceled["status"].as_str()),
        (200, Some("canceled"))
    );
    let r = tokio::time::timeout(Duration::from_secs(3), blocked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), 409);
    // A poll begun before the cancel committed may still land (§2.4): the count is
    // taken once the worker has gone round twice since, past the cancel's notice.
    app.turns(&up, 2).await;
    let hits = up.hits("/s/2");
    // The point: nothing more is polled while the worker goes round 10 times (a
    // negative: a bounded window, anchored to the worker's progress).
    app.turns(&up, 10).await;
    assert_eq!(up.hits("/s/2"), hits, "polling stopped after the cancel");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_follower_on_sqlite_sees_every_event_in_order_and_the_stream_ends() {
    let dir = TempDir::new("waitd-test");
    let up = Upstream::start().await;
    let url = up.script(
        "/s/3",
        vec![
            Reply::status("deploying"),
            Reply::status("deploying"),
            Reply::status("booting"),
            Reply::status("on"),
        ],
    );
    let mut s = spec(&url);
    s["poll"] = serde_json::json!({"initial": "30ms", "max": "30ms", "jitter": 0});
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let (_, w) = app.create(s).await;
    let id = w["id"].as_str().unwrap();
    let r = app
        .client
        .get(app.url(&format!("/waits/{id}/events")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    let events: Vec<_> = tokio::time::timeout(
        Duration::from_secs(10),
        eventsource_stream::EventStream::new(r.bytes_stream()).collect::<Vec<_>>(),
    )
    .await
    .expect("the stream ends after the terminal event");
    let kinds: Vec<String> = events.into_iter().map(|e| e.unwrap().event).collect();
    assert_eq!(kinds, ["created", "state", "state", "state", "succeeded"]);
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_wait_on_sqlite_survives_a_restart_and_ends() {
    let dir = TempDir::new("waitd-test");
    let up = Upstream::start().await;
    let url = up.script("/s/4", vec![Reply::status("deploying")]);
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    assert!(up.hit("/s/4", 1, Duration::from_secs(5)).await);
    app.stop().await.0.unwrap();
    up.script("/s/4", vec![Reply::status("on")]);
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    app.stop().await.0.unwrap();
}

/// More waits than a renewal goes over in one turn of the worker's loop (4,096): its
/// pass is split over several turns, and every share of it still lands. A poll that
/// changes nothing but the interval (it grows) reaches the store only with the next
/// checkpoint round, once a lease TTL: every wait's poll count there must move past
/// its first poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_pass_split_over_turns_still_checkpoints_every_held_wait() {
    const N: usize = 4_500;
    let dir = TempDir::new("waitd-test");
    let up = Upstream::start().await;
    let url = up.script("/s/many", vec![Reply::status("deploying")]);
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    let mut heard = app.heard();
    let mut spec = spec(&url);
    spec["timeout"] = "2m".into();
    spec["poll"] = serde_json::json!({"initial": "500ms", "factor": 1.5, "max": "4s", "jitter": 0});
    let ids: Vec<String> = futures_util::stream::iter(0..N)
        .map(|_| {
            let app = &app;
            let spec = &spec;
            async move {
                let (status, w) = app.create(spec.clone()).await;
                assert_eq!(status, 201, "{w}");
                w["id"].as_str().unwrap().to_string()
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let polls = || async {
        let mut seen = std::collections::HashMap::new();
        let mut cursor = String::new();
        loop {
            let (status, page) = app
                .get(&format!("/waits?limit=500&status=running{cursor}"))
                .await;
            assert_eq!(status, 200, "{page}");
            for w in page["items"].as_array().unwrap() {
                seen.insert(
                    w["id"].as_str().unwrap().to_string(),
                    w["polls"].as_u64().unwrap(),
                );
            }
            match page["next_cursor"].as_str() {
                Some(c) => cursor = format!("&cursor={c}"),
                None => break,
            }
        }
        seen
    };
    // Checkpoints land with renewals: look again after each one that came back.
    let until = tokio::time::Instant::now() + Duration::from_secs(45);
    let settled = loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        let renewed = heard
            .next(left, |s| matches!(s, signals::Signal::Renewed { ok: true }))
            .await;
        if renewed.is_none() {
            break false;
        }
        let seen = polls().await;
        if seen.len() == N && ids.iter().all(|id| seen[id] >= 2) {
            break true;
        }
    };
    let seen = polls().await;
    let behind = ids
        .iter()
        .filter(|id| seen.get(*id).is_none_or(|p| *p < 3))
        .count();
    assert!(
        settled,
        "{behind} of {N} waits never checkpointed past their first polls ({} running)",
        seen.len()
    );
    app.stop().await.0.unwrap();
    // Each by its checkpoints, not by being given back as a stray (a wait the pass
    // left out) and claimed again: every wait was claimed once.
    let db = sqlx::SqlitePool::connect(&dir.sqlite_url()).await.unwrap();
    let (claimed_again,): (i64,) = sqlx::query_as("SELECT count(*) FROM waits WHERE epoch > 1")
        .fetch_one(&db)
        .await
        .unwrap();
    assert_eq!(claimed_again, 0, "waits claimed more than once");
    db.close().await;
}
