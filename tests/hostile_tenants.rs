//! What a hostile tenant can send, on both stores: NUL in every field, label
//! filters that try quoting tricks or sheer number, connections that trickle or
//! stall, bodies that lie about their length, and streams by the thousand. Every
//! answer is a 4xx with a sentence or a closed connection, never a 5xx, and the
//! same from SQLite and Postgres.

use crate::support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::{App, Reply, TempDir, TestDb, Upstream, spec};

/// An app on each store, with `extra` flags.
async fn apps(extra: &[&str]) -> (Vec<App>, TestDb, TempDir) {
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-test");
    let pg = App::start_with(&db, extra).await;
    let mut args = support::test_args(&dir.sqlite_url());
    args.extend(extra.iter().map(|s| s.to_string()));
    let lite = App::start_args(args).await;
    (vec![pg, lite], db, dir)
}

async fn stop_all(apps: Vec<App>, db: TestDb) {
    for a in apps {
        a.stop().await.0.unwrap();
    }
    db.drop_db().await;
}

/// status, content type, body.
async fn answer(req: reqwest::RequestBuilder) -> (u16, String, Value) {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (status, ct, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn nul_in_any_field_is_a_400_naming_it_on_both_stores() {
    let up = Upstream::start().await;
    let url = up.script("/s", vec![Reply::status("deploying")]);
    let (apps, db, _dir) = apps(&[]).await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("want", json!(["o\u{0}n"]), "want[0]"),
        ("fail", json!(["x\u{0}"]), "fail[0]"),
        ("pending", json!(["p\u{0}"]), "pending[0]"),
        ("state", json!("/data/\u{0}"), "state"),
        ("error", json!("/e\u{0}"), "error"),
        ("labels", json!({"team": "a\u{0}b"}), "labels.team"),
    ];
    let mut answers: Vec<Vec<(u16, Value)>> = Vec::new();
    for app in &apps {
        let mut mine = Vec::new();
        for (field, value, named) in &cases {
            let mut s = spec(&url);
            s[*field] = value.clone();
            let (status, ct, body) = answer(app.client.post(app.url("/waits")).json(&s)).await;
            assert_eq!(status, 400, "{field}: {body}");
            assert_eq!(ct, "application/problem+json");
            assert_eq!(body["errors"][0]["field"], *named, "{body}");
            mine.push((status, body["errors"].clone()));
        }
        // And in a filter: 400, never a 5xx.
        let (status, _, body) = answer(app.client.get(app.url("/waits?label=team:a%00b"))).await;
        assert_eq!(status, 400, "{body}");
        mine.push((status, Value::Null));
        answers.push(mine);
    }
    assert_eq!(answers[0], answers[1], "the stores answer alike");
    stop_all(apps, db).await;
}

#[tokio::test]
async fn label_filters_match_keys_exactly_are_capped_and_never_fail_on_both_stores() {
    let up = Upstream::start().await;
    let url = up.script("/s", vec![Reply::status("deploying")]);
    let (apps, db, _dir) = apps(&[]).await;
    for app in &apps {
        let mut s = spec(&url);
        s["labels"] = json!({"inj": "v1", "team": "a"});
        let (status, _) = app.create(s).await;
        assert_eq!(status, 201);
        // A quote, a backslash or a NUL in a key names no label a wait can have.
        for bad in [
            "inj%22:v1",
            "in%5Cj:v1",
            "in%00j:v1",
            "%22%29%20OR%201%3D1:x",
        ] {
            let (status, ct, body) =
                answer(app.client.get(app.url(&format!("/waits?label={bad}")))).await;
            assert_eq!(status, 400, "{bad}: {body}");
            assert_eq!(ct, "application/problem+json");
            assert!(
                body["detail"].as_str().unwrap().contains("label name"),
                "{body}"
            );
        }
        // A key is matched exactly.
        let (_, page) = app.get("/waits?label=inj:v1").await;
        assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
        let (_, page) = app.get("/waits?label=in:v1").await;
        assert_eq!(page["items"], json!([]));
        // On Postgres an event is numbered just after its commit (§5.5): the
        // wait's first event must be readable before it is filtered for.
        let numbered = support::poll_for(Duration::from_secs(10), || async {
            let (_, page) = app.get("/events?after=0").await;
            (!page["items"].as_array()?.is_empty()).then_some(())
        })
        .await;
        assert!(numbered.is_some(), "the wait's events were never numbered");
        // Two values for one label: a wait has one, so none matches; the same
        // value twice is that one filter.
        for path in ["/waits?", "/events?after=0&"] {
            let (status, page) = app.get(&format!("{path}label=inj:v1&label=inj:v2")).await;
            assert_eq!(status, 200, "{page}");
            assert_eq!(page["items"], json!([]), "{path}");
            let (_, page) = app.get(&format!("{path}label=inj:v1&label=inj:v1")).await;
            assert!(
                !page["items"].as_array().unwrap().is_empty(),
                "{path}: {page}"
            );
            let (_, page) = app
                .get(&format!("{path}label=inj:v2&label=inj:v1&label=inj:v2"))
                .await;
            assert_eq!(page["items"], json!([]), "{path}");
        }
        // Many filters: at most as many as a wait can have labels.
        let many: String = (0..33).map(|i| format!("&label=k{i}:v")).collect();
        let (status, _, body) = answer(
            app.client
                .get(app.url(&format!("/waits?status=running{many}"))),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["detail"].as_str().unwrap().contains("at most 32"),
            "{body}"
        );
        let thousand: String = (0..1000).map(|i| format!("&label=k{i}:v")).collect();
        let (status, _, _) =
            answer(app.client.get(app.url(&format!("/events?x=1{thousand}")))).await;
        assert!((400..500).contains(&status), "{status}");
        let (status, _, body) = answer(
            app.client
                .get(app.url(&format!("/events?after=0{thousand}"))),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        // A URI past what any query of this API needs: 414, still problem+json.
        let huge: String = (0..2000).map(|i| format!("&label=k{i}:v")).collect();
        let (status, ct, body) =
            answer(app.client.get(app.url(&format!("/waits?x=1{huge}")))).await;
        assert_eq!(status, 414, "{body}");
        assert_eq!(ct, "application/problem+json");
        // 32 filters are fine.
        let fine: String = (0..32).map(|i| format!("&label=k{i}:v")).collect();
        let (status, _, body) =
            answer(app.client.get(app.url(&format!("/events?after=0{fine}")))).await;
        assert_eq!(status, 200, "{body}");
    }
    stop_all(apps, db).await;
}

#[tokio::test]
async fn stalled_connections_are_closed_and_lying_bodies_refused() {
    let db = TestDb::new().await;
    let app = App::start_with(
        &db,
        &["--header-timeout", "300ms", "--body-timeout", "300ms"],
    )
    .await;
    let addr = app.base.trim_start_matches("http://").to_string();

    // Silent, half a request line, half the headers: closed after the header timeout.
    for sent in [
        &b""[..],
        b"GET /healthz HT",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
    ] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(sent).await.unwrap();
        let started = Instant::now();
        assert!(
            support::closes_within(&mut s, Duration::from_secs(3)).await,
            "{:?} held open",
            String::from_utf8_lossy(sent)
        );
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );
    }
    // An idle keep-alive connection is closed too.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        support::closes_within(&mut s, Duration::from_secs(3)).await,
        "idle keep-alive held open"
    );

    // A body that never arrives: 408, in time.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        b"POST /waits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"ta",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("application/problem+json"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // A Content-Length over the limit: 413 at once, without the body.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        b"POST /waits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000000000\r\n\r\n",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let mut got = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut got))
        .await
        .expect("answered at once")
        .unwrap();
    let text = String::from_utf8_lossy(&got[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("64 KiB"), "{text}");
    assert!(started.elapsed() < Duration::from_millis(250));

    // A malformed chunked body: 400, not 413.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        b"POST /waits HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains("chunked"), "{text}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn streams_are_capped_per_tenant_and_per_replica_with_a_429_and_a_sentence() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/s", vec![Reply::status("deploying")]);
    let app = App::start_with(
        &db,
        &["--max-streams-per-tenant", "2", "--max-streams", "3"],
    )
    .await;
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let open = |path: String| {
        let c = app.client.clone();
        async move {
            c.get(path)
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap()
        }
    };
    let a = open(app.url("/events")).await;
    assert_eq!(a.status(), 200);
    let b = open(app.url(&format!("/waits/{id}/events"))).await;
    assert_eq!(b.status(), 200);
    // The third of this tenant (a stream or a blocked request) is refused.
    let c = open(app.url("/events")).await;
    assert_eq!(c.status(), 429);
    assert!(c.headers().get("retry-after").is_some());
    let body: Value = c.json().await.unwrap();
    assert!(
        body["detail"].as_str().unwrap().contains("event streams"),
        "{body}"
    );
    let (status, _, body) = answer(app.client.get(app.url(&format!("/waits/{id}?wait=10s")))).await;
    assert_eq!(status, 429, "{body}");
    // A blocking create at the cap makes nothing: a client that retries on the
    // 429 makes no twins.
    for body in [spec(&url), json!({"all": [spec(&url)]})] {
        let (status, _, text) =
            answer(app.client.post(app.url("/waits?wait=10s")).json(&body)).await;
        assert_eq!(status, 429, "{text}");
    }
    let (_, page) = app.get("/waits").await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    // Closing one frees its place.
    drop(a);
    let ok = support::eventually(Duration::from_secs(3), || async {
        open(app.url("/events")).await.status() == 200
    })
    .await;
    assert!(ok, "a closed stream did not free its place");
    drop(b);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_followers_of_events_each_see_every_event_once_in_order_on_both_stores() {
    let up = Upstream::start().await;
    let (apps, db, _dir) = apps(&[]).await;
    for app in &apps {
        // Followers first, some filtered by label.
        let mut followers = Vec::new();
        for i in 0..40 {
            let filter = if i % 2 == 0 { "" } else { "&label=half:odd" };
            let r = app
                .client
                .get(app.url(&format!("/events?follow=true{filter}")))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            followers.push((i % 2 == 1, r.bytes_stream().boxed()));
        }
        // Twenty waits, half labelled, each deploying then on.
        let mut ids = Vec::new();
        for i in 0..20 {
            let url = up.script(
                &format!("/f/{i}/{}", app.base.len()),
                vec![
                    Reply::status("deploying"),
                    Reply::status("deploying"),
                    Reply::status("on"),
                ],
            );
            let mut s = spec(&url);
            if i % 2 == 1 {
                s["labels"] = json!({"half": "odd"});
            }
            let (status, w) = app.create(s).await;
            assert_eq!(status, 201);
            ids.push(w["id"].as_str().unwrap().to_string());
        }
        for id in &ids {
            app.wait_end(id).await;
        }
        // Each wait: created, state (deploying), state (on), succeeded.
        for (filtered, stream) in followers {
            let want = if filtered { 40 } else { 80 };
            let mut events = eventsource_stream::Eventsource::eventsource(stream);
            let mut seen: Vec<(i64, String, String)> = Vec::new();
            while seen.len() < want {
                let e = tokio::time::timeout(Duration::from_secs(10), events.next())
                    .await
                    .expect("every event arrives")
                    .unwrap()
                    .unwrap();
                let data: Value = serde_json::from_str(&e.data).unwrap();
                seen.push((
                    e.id.parse().unwrap(),
                    data["wait_id"].as_str().unwrap().to_string(),
                    e.event,
                ));
            }
            let ids_seen: Vec<i64> = seen.iter().map(|s| s.0).collect();
            let mut sorted = ids_seen.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(ids_seen, sorted, "in order, no repeats");
            for (i, id) in ids.iter().enumerate() {
                let kinds: Vec<&str> = seen
                    .iter()
                    .filter(|s| &s.1 == id)
                    .map(|s| s.2.as_str())
                    .collect();
                let expected: Vec<&str> = if filtered && i % 2 == 0 {
                    vec![]
                } else {
                    vec!["created", "state", "state", "succeeded"]
                };
                assert_eq!(kinds, expected, "wait {i} (filtered {filtered})");
            }
        }
    }
    stop_all(apps, db).await;
}

/// A wait let go stops its poll: one in flight to a target that never answers
/// gives its host's place back at once, and one waiting for that place is never
/// sent.
#[tokio::test]
async fn a_canceled_waits_poll_gives_its_hosts_place_back_and_a_queued_one_is_never_sent() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let mut hang = Reply::status("deploying");
    hang.delay = Duration::from_secs(120);
    let busy = up.script("/busy", vec![hang]);
    let queued = up.script("/queued", vec![Reply::status("deploying")]);
    let last = up.script("/last", vec![Reply::status("on")]);
    let app = App::start_with(
        &db,
        &["--per-host-concurrency", "1", "--probe-timeout", "60s"],
    )
    .await;
    let create = |url: &str| {
        let mut s = spec(url);
        s["timeout"] = json!("60s");
        app.create(s)
    };
    let (_, b) = create(&busy).await;
    // The host's one place is taken by a request that is never answered.
    assert!(
        up.requested(Duration::from_secs(10), |u| u.hits("/busy") == 1)
            .await
    );
    let (_, q) = create(&queued).await;
    // Its first poll is due at once: wait until its timer has fired (the second
    // poll begun), so that it waits for the host's place.
    let begun = support::eventually(Duration::from_secs(10), || async {
        app.metrics()
            .await
            .lines()
            .find_map(|l| l.strip_prefix("waitd_schedule_lag_seconds_count "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .is_some_and(|n| n >= 2.0)
    })
    .await;
    assert!(begun, "the queued wait's poll never began");
    for w in [&q, &b] {
        let id = w["id"].as_str().unwrap();
        let (status, _) = app.post(&format!("/waits/{id}/cancel")).await;
        assert_eq!(status, 200);
    }
    // The place is free again: a new wait on the host is polled and ends.
    let (_, l) = create(&last).await;
    let end = app.wait_end(l["id"].as_str().unwrap()).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(
        up.hits("/queued"),
        0,
        "a canceled wait's queued poll was sent"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// Requests in flight for waits of one request, each sent on its own, give their
/// host places back once every one of those waits is let go.
#[tokio::test]
async fn requests_in_flight_for_one_request_stop_when_its_waits_are_let_go() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let mut hang = Reply::status("deploying");
    hang.delay = Duration::from_secs(120);
    let shared = up.script("/shared", vec![hang]);
    let last = up.script("/last", vec![Reply::status("on")]);
    let app = App::start_with(
        &db,
        &["--per-host-concurrency", "2", "--probe-timeout", "60s"],
    )
    .await;
    let long = |url: &str| {
        let mut s = spec(url);
        s["timeout"] = json!("60s");
        s
    };
    // Two waits of one request, the second taken up after the first's request
    // began: each sends its own, and both of the host's places are taken.
    let (_, a) = app.create(long(&shared)).await;
    assert!(
        up.requested(Duration::from_secs(10), |u| u.hits("/shared") == 1)
            .await
    );
    let (_, b) = app.create(long(&shared)).await;
    assert!(
        up.requested(Duration::from_secs(10), |u| u.hits("/shared") == 2)
            .await
    );
    for w in [&a, &b] {
        let (status, _) = app
            .post(&format!("/waits/{}/cancel", w["id"].as_str().unwrap()))
            .await;
        assert_eq!(status, 200);
    }
    let (_, l) = app.create(long(&last)).await;
    let end = app.wait_end(l["id"].as_str().unwrap()).await;
    assert_eq!(end["status"], "succeeded", "{end}");

    app.stop().await.0.unwrap();
    db.drop_db().await;
}
