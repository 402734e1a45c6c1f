//! Black-box tests of event history and server-sent event streams: per wait
//! (`/waits/{id}/events`) and global (`/events`).

use crate::support;

use std::pin::Pin;
use std::time::Duration;

use eventsource_stream::{Event as SseEvent, EventStreamError, Eventsource};
use futures_util::{Stream, StreamExt};
use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use support::*;

type Events =
    Pin<Box<dyn Stream<Item = Result<SseEvent, EventStreamError<reqwest::Error>>> + Send>>;

/// An open SSE stream and the response headers it came with.
struct Sse {
    status: u16,
    headers: HeaderMap,
    events: Events,
}

impl Sse {
    async fn open(req: reqwest::RequestBuilder) -> Sse {
        let r = req.send().await.expect("stream request sent");
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        Sse {
            status,
            headers,
            events: Box::pin(r.bytes_stream().eventsource()),
        }
    }

    /// The next event, or `None` when the stream has ended; panics if nothing comes
    /// within `within`.
    async fn next(&mut self, within: Duration) -> Option<SseEvent> {
        match tokio::time::timeout(within, self.events.next()).await {
            Ok(Some(Ok(e))) => Some(e),
            Ok(Some(Err(e))) => panic!("the stream failed: {e}"),
            Ok(None) => None,
            Err(_) => panic!("no event and no end within {within:?}"),
        }
    }

    /// Reads until the stream ends (bounded by `within` per event).
    async fn until_end(&mut self, within: Duration) -> Vec<SseEvent> {
        let mut out = Vec::new();
        while let Some(e) = self.next(within).await {
            out.push(e);
            assert!(out.len() < 1000, "the stream does not end");
        }
        out
    }
}

fn data(e: &SseEvent) -> Value {
    serde_json::from_str(&e.data).unwrap_or_else(|err| panic!("data is not JSON ({err}): {e:?}"))
}

/// Checks one wait's stream event: `id:` is the seq, `event:` the kind.
fn check_wait_event(e: &SseEvent, wait_id: &str) -> (i64, String) {
    let d = data(e);
    let seq = d["seq"].as_i64().unwrap_or_else(|| panic!("no seq: {d}"));
    assert_eq!(e.id, seq.to_string(), "id is not the seq: {e:?}");
    assert_eq!(
        Some(e.event.as_str()),
        d["kind"].as_str(),
        "event is not the kind: {e:?}"
    );
    assert_eq!(d["wait_id"], wait_id, "{d}");
    assert!(d["at"].is_string(), "{d}");
    (seq, e.event.clone())
}

const TERMINAL: &[&str] = &["succeeded", "failed", "timed_out", "canceled", "error"];

fn id_of(w: &Value) -> String {
    w["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {w}"))
        .to_string()
}

/// A spec whose first poll comes `delay` after creation, so a stream opened at once
/// sees history first and then live events.
fn delayed_spec(url: &str, delay: &str) -> Value {
    let mut s = spec(url);
    s["poll"]["delay"] = json!(delay);
    s
}

async fn follows_history_then_live(accept_header: bool) {
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
    let (_, w) = app.create(delayed_spec(&url, "500ms")).await;
    let id = id_of(&w);
    let req = if accept_header {
        app.client
            .get(app.url(&format!("/waits/{id}/events")))
            .header("accept", "text/event-stream")
    } else {
        app.client
            .get(app.url(&format!("/waits/{id}/events?follow=true")))
    };
    let mut sse = Sse::open(req).await;
    assert_eq!(sse.status, 200);
    let ct = sse
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(ct.starts_with("text/event-stream"), "{ct}");

    // History: the `created` event, before any poll has happened.
    let first = sse.next(signals::BOUND).await.expect("a first event");
    assert_eq!(up.hits("/s/1"), 0, "the first event came after a poll");
    assert_eq!(check_wait_event(&first, &id), (1, "created".to_string()));

    // Live: the rest, in order, ending with the terminal event; then the stream ends.
    let rest = sse.until_end(signals::BOUND).await;
    let got: Vec<(i64, String)> = rest.iter().map(|e| check_wait_event(e, &id)).collect();
    assert_eq!(
        got,
        [
            (2, "state".to_string()),
            (3, "state".to_string()),
            (4, "succeeded".to_string())
        ]
    );
    let d = data(&rest[0]);
    assert_eq!(
        (d["from"].clone(), d["to"].clone()),
        (Value::Null, json!("deploying"))
    );
    let d = data(&rest[1]);
    assert_eq!(
        (d["from"].clone(), d["to"].clone()),
        (json!("deploying"), json!("on"))
    );
    // The stream carried exactly what the JSON history holds.
    let (_, page) = app.get(&format!("/waits/{id}/events")).await;
    let from_json: Vec<Value> = page["items"].as_array().unwrap().clone();
    let from_sse: Vec<Value> = std::iter::once(&first)
        .chain(rest.iter())
        .map(data)
        .collect();
    assert_eq!(from_sse, from_json);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_wait_stream_by_accept_header_sends_history_then_live_events_and_ends() {
    follows_history_then_live(true).await;
}

#[tokio::test]
async fn a_wait_stream_by_follow_true_sends_history_then_live_events_and_ends() {
    follows_history_then_live(false).await;
}

#[tokio::test]
async fn a_stream_forbids_caching_proxy_buffering_and_compression() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("on")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    for path in [format!("/waits/{id}/events"), "/events".to_string()] {
        let sse = Sse::open(
            app.client
                .get(app.url(&path))
                .header("accept", "text/event-stream")
                .header("accept-encoding", "gzip, br, deflate"),
        )
        .await;
        assert_eq!(sse.status, 200, "{path}");
        let h = |k: &str| {
            sse.headers
                .get(k)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        assert!(
            h("content-type").is_some_and(|c| c.starts_with("text/event-stream")),
            "{path}: {:?}",
            sse.headers
        );
        assert_eq!(h("cache-control").as_deref(), Some("no-cache"), "{path}");
        assert_eq!(h("x-accel-buffering").as_deref(), Some("no"), "{path}");
        assert_eq!(h("content-encoding"), None, "{path}");
    }
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn last_event_id_resumes_a_wait_stream_after_that_seq() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![
            Reply::status("deploying"),
            Reply::status("booting"),
            Reply::status("on"),
        ],
    );
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    assert_eq!(app.wait_end(&id).await["status"], "succeeded");
    // created, state, state, state, succeeded
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events")))
            .header("accept", "text/event-stream")
            .header("last-event-id", "2"),
    )
    .await;
    assert_eq!(sse.status, 200);
    let got: Vec<(i64, String)> = sse
        .until_end(signals::BOUND)
        .await
        .iter()
        .map(|e| check_wait_event(e, &id))
        .collect();
    assert_eq!(
        got,
        [
            (3, "state".to_string()),
            (4, "state".to_string()),
            (5, "succeeded".to_string())
        ]
    );
    // Resumed at the terminal event: nothing is left and the stream ends at once.
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events?follow=true")))
            .header("last-event-id", "5"),
    )
    .await;
    assert!(sse.until_end(signals::BOUND).await.is_empty());
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn last_event_id_resumes_a_running_wait_stream_then_follows_it_live() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let app = App::start(&db).await;
    let (_, w) = app.create(delayed_spec(&url, "400ms")).await;
    let id = id_of(&w);
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events")))
            .header("accept", "text/event-stream")
            .header("last-event-id", "1"),
    )
    .await;
    let got: Vec<(i64, String)> = sse
        .until_end(signals::BOUND)
        .await
        .iter()
        .map(|e| check_wait_event(e, &id))
        .collect();
    assert_eq!(
        got,
        [
            (2, "state".to_string()),
            (3, "state".to_string()),
            (4, "succeeded".to_string())
        ]
    );
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_follower_of_an_ended_wait_gets_the_full_history_and_the_stream_ends() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![
            Reply::status("deploying"),
            Reply::json(503, json!({})),
            Reply::status("failed_deployment"),
        ],
    );
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    assert_eq!(app.wait_end(&id).await["status"], "failed");
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events?follow=true"))),
    )
    .await;
    assert_eq!(sse.status, 200);
    let events = sse.until_end(signals::BOUND).await;
    let got: Vec<(i64, String)> = events.iter().map(|e| check_wait_event(e, &id)).collect();
    assert_eq!(
        got,
        [
            (1, "created".to_string()),
            (2, "state".to_string()),
            (3, "retry".to_string()),
            (4, "state".to_string()),
            (5, "failed".to_string())
        ]
    );
    let retry = data(&events[2]);
    assert_eq!(retry["attempt"], 1, "{retry}");
    assert!(
        retry["error"].as_str().is_some_and(|e| e.contains("503")),
        "{retry}"
    );
    assert!(retry["delay"].is_string(), "{retry}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_follower_of_a_canceled_wait_sees_the_cancel_and_the_stream_ends() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(delayed_spec(&url, "15s")).await;
    let id = id_of(&w);
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events?follow=true"))),
    )
    .await;
    let first = sse.next(signals::BOUND).await.unwrap();
    assert_eq!(check_wait_event(&first, &id).1, "created");
    let (status, _) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(status, 200);
    let rest = sse.until_end(signals::BOUND).await;
    let got: Vec<(i64, String)> = rest.iter().map(|e| check_wait_event(e, &id)).collect();
    assert_eq!(got, [(2, "canceled".to_string())]);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn the_wait_events_json_page_resumes_with_after() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/s/1",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = id_of(&w);
    app.wait_end(&id).await;
    let (status, page) = app.get(&format!("/waits/{id}/events?after=2")).await;
    assert_eq!(status, 200, "{page}");
    let seqs: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, [3, 4]);
    assert!(page["next_cursor"].is_null(), "{page}");
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// The global feed
// ---------------------------------------------------------------------------------

/// Creates a wait labelled `team` that succeeds, and waits for its end.
async fn ended_wait(app: &App, up: &Upstream, path: &str, team: &str) -> String {
    let url = up.script(path, vec![Reply::status("deploying"), Reply::status("on")]);
    let mut s = spec(&url);
    s["labels"] = json!({"team": team});
    let (status, w) = app.create(s).await;
    assert_eq!(status, 201, "{w}");
    let id = id_of(&w);
    assert_eq!(app.wait_end(&id).await["status"], "succeeded");
    id
}

#[tokio::test]
async fn the_global_feed_pages_as_json_with_a_global_id_cursor() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let app = App::start(&db).await;
    let a = ended_wait(&app, &up, "/a", "a").await;
    let b = ended_wait(&app, &up, "/b", "b").await;
    let (status, page) = app.get("/events").await;
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 8, "{page}");
    let ids: Vec<i64> = items.iter().map(|e| e["id"].as_i64().unwrap()).collect();
    assert!(
        ids.windows(2).all(|p| p[0] < p[1]),
        "ids not increasing: {ids:?}"
    );
    assert!(page["next_cursor"].is_null(), "{page}");
    // Each wait's events, in its seq order.
    for w in [&a, &b] {
        let seqs: Vec<i64> = items
            .iter()
            .filter(|e| e["wait_id"] == w.as_str())
            .map(|e| e["seq"].as_i64().unwrap())
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4], "{w}");
    }
    // `after` resumes by global id.
    let (_, later) = app.get(&format!("/events?after={}", ids[3])).await;
    let later_ids: Vec<i64> = later["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(later_ids, ids[4..]);
    // A label filter keeps only that wait's events.
    let (_, only_b) = app.get("/events?label=team:b").await;
    let only_b = only_b["items"].as_array().unwrap();
    assert_eq!(only_b.len(), 4);
    assert!(only_b.iter().all(|e| e["wait_id"] == b.as_str()));
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_global_stream_with_a_label_filter_sees_only_matching_waits() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let app = App::start(&db).await;
    let mut sse = Sse::open(
        app.client
            .get(app.url("/events?label=team:a"))
            .header("accept", "text/event-stream"),
    )
    .await;
    assert_eq!(sse.status, 200);
    // A non-matching wait first, then a matching one: by the time the matching one
    // ends, the other's events would have come had the filter let them through.
    let _b = ended_wait(&app, &up, "/b", "b").await;
    let a = ended_wait(&app, &up, "/a", "a").await;
    let mut got = Vec::new();
    loop {
        let e = sse
            .next(signals::BOUND)
            .await
            .expect("the global stream does not end by itself");
        let d = data(&e);
        assert_eq!(d["wait_id"], a.as_str(), "an event of another wait: {d}");
        assert_eq!(
            e.id,
            d["id"].as_i64().unwrap().to_string(),
            "id is not the global id: {e:?}"
        );
        assert_eq!(Some(e.event.as_str()), d["kind"].as_str());
        got.push((d["seq"].as_i64().unwrap(), e.event.clone()));
        if TERMINAL.contains(&e.event.as_str()) {
            break;
        }
    }
    assert_eq!(
        got,
        [
            (1, "created".to_string()),
            (2, "state".to_string()),
            (3, "state".to_string()),
            (4, "succeeded".to_string())
        ]
    );
    drop(sse);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn last_event_id_resumes_the_global_stream_by_global_id() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let app = App::start(&db).await;
    ended_wait(&app, &up, "/a", "a").await;
    ended_wait(&app, &up, "/b", "b").await;
    let (_, page) = app.get("/events").await;
    let ids: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids.len(), 8);
    let mut sse = Sse::open(
        app.client
            .get(app.url("/events?follow=true"))
            .header("last-event-id", ids[4].to_string()),
    )
    .await;
    assert_eq!(sse.status, 200);
    let mut got = Vec::new();
    while got.len() < 3 {
        let e = sse.next(signals::BOUND).await.expect("more events");
        assert_eq!(e.id, data(&e)["id"].as_i64().unwrap().to_string());
        got.push(e.id.parse::<i64>().unwrap());
    }
    assert_eq!(got, ids[5..]);
    // Then it follows live: a new wait's events arrive on the same stream.
    let c = ended_wait(&app, &up, "/c", "c").await;
    let next = sse.next(signals::BOUND).await.expect("a live event");
    let d = data(&next);
    assert_eq!(d["wait_id"], c.as_str(), "{d}");
    assert_eq!(d["kind"], "created");
    assert!(d["id"].as_i64().unwrap() > ids[7]);
    drop(sse);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_end_when_the_server_stops() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(delayed_spec(&url, "15s")).await;
    let id = id_of(&w);
    let mut per_wait = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events?follow=true"))),
    )
    .await;
    let mut global = Sse::open(app.client.get(app.url("/events?follow=true"))).await;
    assert!(per_wait.next(signals::BOUND).await.is_some());
    assert!(global.next(signals::BOUND).await.is_some());
    let stopping = tokio::spawn(app.stop());
    assert!(per_wait.until_end(signals::BOUND).await.is_empty());
    assert!(global.until_end(signals::BOUND).await.is_empty());
    let (r, took) = stopping.await.unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_longer_than_one_page_is_paged_as_json_and_streamed_whole() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    // 511 state changes: with `created` and the end, 513 events, over one page of 500.
    let mut replies: Vec<Reply> = (0..510)
        .map(|i| Reply::status(if i % 2 == 0 { "deploying" } else { "booting" }))
        .collect();
    replies.push(Reply::status("on"));
    let url = up.script("/s/1", replies);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["poll"] = json!({"initial": "1ms", "factor": 1, "jitter": 0});
    // 511 polls, each written: a busy host takes longer than the usual 20 s.
    s["timeout"] = json!("5m");
    let (_, w) = app.create(s).await;
    let id = id_of(&w);
    // Held until it ends, 20 s at a time, for at most two minutes.
    let mut held = 0;
    let (status, ended) = loop {
        let (status, w) = app.get(&format!("/waits/{id}?wait=20s")).await;
        held += 1;
        if status != 202 || held == 6 {
            break (status, w);
        }
    };
    assert_eq!(status, 200, "{ended}");

    // JSON: a full page with a cursor, then the rest.
    let (_, page) = app.get(&format!("/waits/{id}/events")).await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 500);
    let cursor = page["next_cursor"]
        .as_str()
        .expect("a cursor after a full page");
    let (_, rest) = app.get(&format!("/waits/{id}/events?after={cursor}")).await;
    let seqs: Vec<i64> = items
        .iter()
        .chain(rest["items"].as_array().unwrap())
        .map(|e| e["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=513).collect::<Vec<i64>>());
    assert!(rest["next_cursor"].is_null(), "{}", rest["next_cursor"]);

    // The global feed pages the same way.
    let (_, g) = app.get("/events").await;
    assert_eq!(g["items"].as_array().unwrap().len(), 500);
    let gc = g["next_cursor"].as_str().expect("a global cursor");
    let (_, g2) = app.get(&format!("/events?after={gc}")).await;
    assert_eq!(g2["items"].as_array().unwrap().len(), 13);

    // SSE: every event once, in order, then the end.
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events?follow=true"))),
    )
    .await;
    let got: Vec<i64> = sse
        .until_end(signals::BOUND)
        .await
        .iter()
        .map(|e| check_wait_event(e, &id).0)
        .collect();
    assert_eq!(got, (1..=513).collect::<Vec<i64>>());
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_a_store_outage_without_losing_or_repeating_events() {
    let db = TestDb::new().await;
    let proxy = PgProxy::start();
    let app = App::start_args(test_args(&proxy.url(&db))).await;
    let mut heard = app.heard();
    let up = Upstream::start().await;
    // The target says `deploying` until the test says `on`: polls whose answers the
    // outage keeps from the store are polled again (at-least-once polling), and
    // only a change of state makes an event.
    let url = up.script("/s/1", vec![Reply::status("deploying")]);
    let mut s = delayed_spec(&url, "1s");
    s["timeout"] = json!("5m");
    let (_, w) = app.create(s).await;
    let id = id_of(&w);
    let mut sse = Sse::open(
        app.client
            .get(app.url(&format!("/waits/{id}/events")))
            .header("accept", "text/event-stream"),
    )
    .await;
    let first = sse.next(signals::BOUND).await.expect("created");
    assert_eq!(check_wait_event(&first, &id), (1, "created".to_string()));
    // The store goes away across the first poll. The event listener's attempts to
    // come back fail at 0, 0.1, 0.3, 0.7 and 1.5 s, and it then waits until 3.1 s,
    // so the events written once the store is back (at 1.7 s) are, but for a host
    // that stalls for a second or more, written while it is away; the stream must
    // get them all the same. The sleep shapes the listener's backoff; nothing
    // below depends on how long it took.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(1700)).await;
    proxy.restore();
    heard.recorded(&id).await;
    up.script("/s/1", vec![Reply::status("on")]);
    let rest = sse.until_end(signals::BOUND).await;
    let got: Vec<(i64, String, Value)> = rest
        .iter()
        .map(|e| {
            let (seq, kind) = check_wait_event(e, &id);
            (seq, kind, data(e)["to"].clone())
        })
        .collect();
    assert_eq!(
        got,
        [
            (2, "state".to_string(), json!("deploying")),
            (3, "state".to_string(), json!("on")),
            (4, "succeeded".to_string(), Value::Null),
        ]
    );
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn after_latest_follows_only_new_events_and_a_cursor_ahead_of_every_event_is_refused() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let app = App::start(&db).await;
    let old = up.script("/old", vec![Reply::status("on")]);
    let (_, w) = app.create(spec(&old)).await;
    app.wait_end(w["id"].as_str().unwrap()).await;
    // As JSON: an empty page whose cursor is the newest event.
    let (status, page) = app.get("/events?after=latest").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"], json!([]));
    let (_, all) = app.get("/events").await;
    let newest = all["items"].as_array().unwrap().last().unwrap()["id"]
        .as_i64()
        .unwrap();
    assert_eq!(page["next_cursor"], newest.to_string());
    assert!(
        all["next_cursor"].is_null(),
        "one page holds them all: {all}"
    );
    // As a stream: nothing of the history, then what comes next.
    let mut sse = Sse::open(
        app.client
            .get(app.url("/events?after=latest"))
            .header("accept", "text/event-stream"),
    )
    .await;
    assert_eq!(sse.status, 200);
    let fresh = up.script("/fresh", vec![Reply::status("on")]);
    let (_, w2) = app.create(spec(&fresh)).await;
    let first = sse.next(signals::BOUND).await.unwrap();
    let data: Value = serde_json::from_str(&first.data).unwrap();
    assert_eq!(data["wait_id"], w2["id"], "{data}");
    assert_eq!(first.event, "created");
    assert!(first.id.parse::<i64>().unwrap() > newest);
    // A cursor past every event there is: 409 with a sentence, not a silent stream.
    for req in [
        app.client.get(app.url("/events?after=999999")),
        app.client
            .get(app.url("/events"))
            .header("accept", "text/event-stream")
            .header("last-event-id", "999999"),
    ] {
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 409);
        let body: Value = r.json().await.unwrap();
        assert!(
            body["detail"].as_str().unwrap().contains("after=latest"),
            "{body}"
        );
    }
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
