//! Callback waits across two replicas of the `waitd` binary on one Postgres
//! (docs/design.md §2.15): a wait made on one replica is completed through the
//! other, and the first's blocking read and stream see the end; completions sent
//! to both at once, a completion racing a cancel, and silence seen by both
//! replicas' looks each end a wait exactly once, with one terminal event; the
//! deadline ends a callback wait `timed_out`, even when the replica that held it
//! was killed. The same races on SQLite, with one server. A nudge (§2.17) sent
//! to the replica that does not hold its wait is polled by the one that does,
//! and so is an event source's event (§2.18) received by the other replica.
//!
//! Each client comes from a loopback address of its own (the server limits
//! callback requests per client address). `cargo test --test callback_replicas`.

mod support;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use support::follower::{Follower, TERMINAL, send};
use support::replica::Replica;
use support::{App, Reply, TempDir, TestDb, Upstream, client, client_builder};

/// One test at a time: each runs two processes.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many waits each race is run over.
const RACES: usize = 20;

/// A loopback address no other client of this process has used.
fn fresh_address() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let salt = (std::process::id() % 200) as u8 + 20;
    IpAddr::V4(Ipv4Addr::new(127, salt, (n >> 8) as u8, (n & 0xff) as u8))
}

/// A client whose connections come from an address of its own.
fn caller() -> reqwest::Client {
    client_builder()
        .local_address(fresh_address())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Two replicas on a fresh database.
struct Two {
    a: Replica,
    b: Replica,
    db: TestDb,
    _dir: TempDir,
}

impl Two {
    async fn start(lease_ttl: &str) -> Two {
        let dir = TempDir::new("waitd-cb-replicas");
        let db = TestDb::new().await;
        let a = Replica::start("a", &dir.path, &db.url, lease_ttl, &[]).await;
        let b = Replica::start("b", &dir.path, &db.url, lease_ttl, &[]).await;
        Two {
            a,
            b,
            db,
            _dir: dir,
        }
    }

    async fn stop(self) {
        for r in [&self.a, &self.b] {
            assert!(r.panics().is_empty(), "{}: {:?}", r.name, r.panics());
        }
        drop((self.a, self.b));
        self.db.drop_db().await;
    }
}

/// Creates a callback wait through `base`; its id and callback URL.
async fn create(base: &str, spec: Value) -> (String, String) {
    let a = send(client().post(format!("{base}/waits")).json(&spec)).await;
    assert_eq!(a.status, 201, "{}", a.body);
    let url = a.body["callback_url"].as_str().unwrap().to_string();
    assert!(url.starts_with(&format!("{base}/callbacks/")), "{url}");
    (a.body["id"].as_str().unwrap().to_string(), url)
}

/// The same callback URL on another server's address.
fn on(base: &str, url: &str) -> String {
    let path = &url[url.find("/callbacks/").expect("a callback URL")..];
    format!("{base}{path}")
}

/// Posts `body` to `url` from a client of its own: the status and the wait.
async fn post(url: String, body: Value) -> (u16, Value) {
    let a = send(caller().post(url).json(&body)).await;
    (a.status, a.body)
}

/// The wait as `base` reads it.
async fn read(base: &str, id: &str) -> Value {
    let a = send(client().get(format!("{base}/waits/{id}"))).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body
}

/// The wait once it has ended (blocking on `base`), answered with the code its
/// end has (§2.5).
async fn ended(base: &str, id: &str) -> Value {
    let a = send(client().get(format!("{base}/waits/{id}?wait=30s"))).await;
    let code = match a.body["status"].as_str() {
        Some("succeeded") => 200,
        Some("failed") => 422,
        Some("canceled") => 409,
        Some("timed_out") => 412,
        Some("error") => 424,
        _ => panic!("not ended within 30 s: {} {}", a.status, a.body),
    };
    assert_eq!(a.status, code, "{}", a.body);
    a.body
}

/// The kinds of the terminal events of wait `id`, as `base` lists them.
async fn terminal_events(base: &str, id: &str) -> Vec<String> {
    let a = send(client().get(format!("{base}/waits/{id}/events"))).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| TERMINAL.contains(k))
        .map(str::to_string)
        .collect()
}

/// How many terminal events of each wait the global feed of `base` has, read
/// page by page.
async fn feed_terminal_events(base: &str) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    let mut after = "0".to_string();
    loop {
        let a = send(client().get(format!("{base}/events?after={after}"))).await;
        assert_eq!(a.status, 200, "{}", a.body);
        let items = a.body["items"].as_array().unwrap();
        for e in items {
            if TERMINAL.contains(&e["kind"].as_str().unwrap_or("")) {
                *counts
                    .entry(e["wait_id"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
        match a.body["next_cursor"].as_i64() {
            Some(next) if !items.is_empty() => after = next.to_string(),
            _ => return counts,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_made_on_one_replica_is_completed_through_the_other() {
    let _serial = SERIAL.lock().await;
    let two = Two::start("3s").await;
    let (id, url) = create(&two.a.base, json!({"callback": {}, "timeout": "2m"})).await;
    // A's stream and a blocking read on A, open while it runs.
    let follower = Follower::start(two.a.url(&format!("/waits/{id}/events")), false);
    assert!(
        follower
            .seen_when(Duration::from_secs(10), |s| s
                .iter()
                .any(|e| e.kind == "created"))
            .await,
        "A's stream opened and sent the created event"
    );
    let blocked = tokio::spawn(ended_answer(two.a.url(&format!("/waits/{id}?wait=30s"))));
    let (status, w) = post(on(&two.b.base, &url), json!({"build": 42})).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "succeeded");
    let w = blocked.await.unwrap();
    assert_eq!(w["status"], "succeeded", "A's blocking read: {w}");
    assert_eq!(w["reason"], "the callback reported success", "{w}");
    assert!(
        follower
            .seen_when(Duration::from_secs(20), |s| s
                .iter()
                .any(|e| e.kind == "succeeded"))
            .await,
        "A's stream saw the end: {:?}",
        follower.seen()
    );
    let kinds: Vec<String> = follower.seen().iter().map(|e| e.kind.clone()).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| TERMINAL.contains(&k.as_str()))
            .count(),
        1,
        "{kinds:?}"
    );
    // A later completion, on A this time, finds it ended.
    let (status, w) = post(url.clone(), json!({})).await;
    assert_eq!((status, w["status"].as_str()), (409, Some("succeeded")));
    assert_eq!(terminal_events(&two.a.base, &id).await, ["succeeded"]);
    two.stop().await;
}

async fn ended_answer(url: String) -> Value {
    send(client().get(url)).await.body
}

/// The outcome of two ends sent at once to one wait: which route won, and the
/// wait's end as read afterwards.
struct Raced {
    answers: [(u16, Value); 2],
    end: Value,
    terminal: Vec<String>,
}

/// Sends `first` and `second` at once to each of `waits`, then reads each wait
/// through `read_via`.
async fn race_each<F, G, Fa, Fb>(
    waits: &[(String, String)],
    read_via: &str,
    first: F,
    second: G,
) -> Vec<Raced>
where
    F: Fn(&(String, String)) -> Fa,
    G: Fn(&(String, String)) -> Fb,
    Fa: std::future::Future<Output = (u16, Value)>,
    Fb: std::future::Future<Output = (u16, Value)>,
{
    let mut out = Vec::new();
    for w in waits {
        let (x, y) = tokio::join!(first(w), second(w));
        let end = ended(read_via, &w.0).await;
        let terminal = terminal_events(read_via, &w.0).await;
        out.push(Raced {
            answers: [x, y],
            end,
            terminal,
        });
    }
    out
}

/// One of two completions won: one `200`, one `409` carrying the end the `200`
/// made, and one terminal event, of that end.
fn one_completion_won(r: &Raced, statuses: [&str; 2]) -> usize {
    let codes = [r.answers[0].0, r.answers[1].0];
    let won = match codes {
        [200, 409] => 0,
        [409, 200] => 1,
        _ => panic!("not one 200 and one 409: {codes:?} {:?}", r.answers),
    };
    let status = statuses[won];
    assert_eq!(r.answers[won].1["status"], status, "{:?}", r.answers);
    assert_eq!(r.answers[1 - won].1["status"], status, "{:?}", r.answers);
    assert_eq!(r.end["status"], status, "{}", r.end);
    assert_eq!(r.terminal, [status], "one terminal event");
    won
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_sent_to_both_replicas_at_once_end_each_wait_once() {
    let _serial = SERIAL.lock().await;
    let two = Two::start("3s").await;
    let mut waits = Vec::new();
    for i in 0..RACES {
        let via = if i % 2 == 0 { &two.a } else { &two.b };
        waits.push(create(&via.base, json!({"callback": {}, "timeout": "2m"})).await);
    }
    // A completes through A while a failure is sent through B.
    let raced = race_each(
        &waits,
        &two.b.base,
        |(_, url)| post(on(&two.a.base, url), json!({"via": "a"})),
        |(_, url)| {
            post(
                format!("{}/fail", on(&two.b.base, url)),
                json!({"via": "b"}),
            )
        },
    )
    .await;
    let feed = feed_terminal_events(&two.a.base).await;
    let mut wins = [0, 0];
    for (r, (id, _)) in raced.iter().zip(&waits) {
        let won = one_completion_won(r, ["succeeded", "failed"]);
        wins[won] += 1;
        if won == 1 {
            assert_eq!(r.end["error_detail"], json!({"via": "b"}), "{}", r.end);
        }
        assert_eq!(feed.get(id), Some(&1), "{id} in the feed");
    }
    println!(
        "{RACES} waits completed through both replicas at once: A won {}, B won {}; each one 200, one 409, one terminal event",
        wins[0], wins[1]
    );
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_racing_a_cancel_ends_the_wait_once() {
    let _serial = SERIAL.lock().await;
    let two = Two::start("3s").await;
    let mut waits = Vec::new();
    for _ in 0..RACES {
        waits.push(create(&two.a.base, json!({"callback": {}, "timeout": "2m"})).await);
    }
    let raced = race_each(
        &waits,
        &two.a.base,
        |(_, url)| post(on(&two.b.base, url), json!({})),
        |(id, _)| {
            let r = client().post(two.a.url(&format!("/waits/{id}/cancel")));
            async move {
                let a = send(r).await;
                (a.status, a.body)
            }
        },
    )
    .await;
    let mut canceled = 0;
    for r in &raced {
        let ((cb, cbw), (cancel, cw)) = (&r.answers[0], &r.answers[1]);
        // A cancel answers 200 whatever came first, with the wait as it ended.
        assert_eq!(*cancel, 200, "{cw}");
        let status = r.end["status"].as_str().unwrap();
        match *cb {
            200 => assert_eq!(status, "succeeded", "{}", r.end),
            409 => {
                assert_eq!(status, "canceled", "{}", r.end);
                canceled += 1;
            }
            other => panic!("the callback got {other}: {cbw}"),
        }
        assert_eq!(cbw["status"], status);
        assert_eq!(cw["status"], status, "the cancel's answer: {cw}");
        assert_eq!(r.terminal, [status], "one terminal event");
    }
    println!(
        "{RACES} completions racing a cancel on the other replica: {canceled} canceled, {} succeeded, each one end",
        RACES - canceled
    );
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_seen_by_both_replicas_ends_each_wait_once() {
    let _serial = SERIAL.lock().await;
    let two = Two::start("3s").await;
    let mut waits = Vec::new();
    for i in 0..RACES {
        let via = if i % 2 == 0 { &two.a } else { &two.b };
        let spec = json!({"callback": {"heartbeat": "400ms"}, "timeout": "2m"});
        waits.push(create(&via.base, spec).await);
    }
    for (i, (id, url)) in waits.iter().enumerate() {
        let via = if i % 2 == 0 { &two.b } else { &two.a };
        let w = ended(&via.base, id).await;
        assert_eq!(w["status"], "failed", "{w}");
        assert_eq!(
            w["reason"],
            "no heartbeat or completion came to the callback URL for 400ms (the wait's callback.heartbeat)",
            "{w}"
        );
        assert_eq!(terminal_events(&via.base, id).await, ["failed"]);
        let (status, w) = post(on(&via.base, url), json!({})).await;
        assert_eq!((status, w["status"].as_str()), (409, Some("failed")), "{w}");
    }
    // Both replicas go on looking: another second of looks ends nothing again.
    let (id, _) = create(
        &two.a.base,
        json!({"callback": {"heartbeat": "1s"}, "timeout": "2m"}),
    )
    .await;
    ended(&two.b.base, &id).await;
    for (id, _) in &waits {
        assert_eq!(terminal_events(&two.a.base, id).await, ["failed"]);
    }
    println!("{RACES} silent callback waits, both replicas looking: each ended failed once");
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_through_one_replica_keep_a_wait_the_other_also_looks_at() {
    let _serial = SERIAL.lock().await;
    let two = Two::start("3s").await;
    let (id, url) = create(
        &two.a.base,
        json!({"callback": {"heartbeat": "1s"}, "timeout": "2m"}),
    )
    .await;
    // Beats through B, each within the heartbeat, for three heartbeats' time:
    // A's looks see them too.
    let started = std::time::Instant::now();
    let beater = caller();
    while started.elapsed() < Duration::from_secs(3) {
        let a = send(beater.post(format!("{}/heartbeat", on(&two.b.base, &url)))).await;
        assert_eq!(
            (a.status, a.body["status"].as_str()),
            (200, Some("running")),
            "{}",
            a.body
        );
        // The beat's pace: well within the 1 s heartbeat.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(read(&two.a.base, &id).await["status"], "running");
    let (status, _) = post(on(&two.a.base, &url), json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(terminal_events(&two.b.base, &id).await, ["succeeded"]);
    two.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_ends_a_callback_wait_timed_out_even_after_its_holder_is_killed() {
    let _serial = SERIAL.lock().await;
    let mut two = Two::start("2s").await;
    let (held, held_url) = create(&two.a.base, json!({"callback": {}, "timeout": "2s"})).await;
    // Beaten through B within its heartbeat until a beat finds it ended: the
    // deadline holds whatever the heartbeats.
    let (other, other_url) = create(
        &two.b.base,
        json!({"callback": {"heartbeat": "1s"}, "timeout": "2s"}),
    )
    .await;
    let beater = caller();
    let started = std::time::Instant::now();
    loop {
        let a = send(beater.post(format!("{}/heartbeat", on(&two.b.base, &other_url)))).await;
        if a.status == 409 {
            break;
        }
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(started.elapsed() < Duration::from_secs(20), "never ended");
        // The beat's pace: well within the 1 s heartbeat.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let w = ended(&two.a.base, &other).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    assert_eq!(
        w["reason"],
        "the deadline passed before a callback completed the wait"
    );
    // Whichever replica holds the first, killing A leaves it to B.
    two.a.kill9();
    let w = ended(&two.b.base, &held).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    for id in [&held, &other] {
        assert_eq!(terminal_events(&two.b.base, id).await, ["timed_out"]);
    }
    let (status, w) = post(on(&two.b.base, &held_url), json!({})).await;
    assert_eq!((status, w["status"].as_str()), (409, Some("timed_out")));
    two.stop().await;
}

/// The same races on SQLite, one server: two completions at once, and a
/// completion racing a cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_concurrent_completions_and_cancels_end_each_wait_once() {
    let dir = TempDir::new("waitd-cb-sqlite");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let base = app.base.clone();
    let mut waits = Vec::new();
    for _ in 0..2 * RACES {
        waits.push(create(&base, json!({"callback": {}, "timeout": "2m"})).await);
    }
    let (twice, canceled) = waits.split_at(RACES);
    let raced = race_each(
        twice,
        &base,
        |(_, url)| post(url.clone(), json!({"n": 1})),
        |(_, url)| post(format!("{url}/fail"), json!({"n": 2})),
    )
    .await;
    for r in &raced {
        one_completion_won(r, ["succeeded", "failed"]);
    }
    let raced = race_each(
        canceled,
        &base,
        |(_, url)| post(url.clone(), json!({})),
        |(id, _)| {
            let r = client().post(format!("{base}/waits/{id}/cancel"));
            async move {
                let a = send(r).await;
                (a.status, a.body)
            }
        },
    )
    .await;
    for r in &raced {
        let status = r.end["status"].as_str().unwrap();
        let expected = if status == "succeeded" { 200 } else { 409 };
        assert!(status == "succeeded" || status == "canceled", "{}", r.end);
        assert_eq!(r.answers[0].0, expected, "{:?}", r.answers);
        assert_eq!(r.answers[1].1["status"], status);
        assert_eq!(r.terminal, [status]);
    }
    // Every end is in the feed once.
    let feed = feed_terminal_events(&base).await;
    for (id, _) in &waits {
        assert_eq!(feed.get(id), Some(&1), "{id} in the feed");
    }
    let _ = app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nudge_sent_to_the_other_replica_is_polled_by_the_holder() {
    let _serial = SERIAL.lock().await;
    let dir = TempDir::new("waitd-nudge-replicas");
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let target = up.script("/sv", vec![Reply::status("deploying")]);
    // A alone holds the wait: B starts after A's first poll of it.
    let a = Replica::start("a", &dir.path, &db.url, "3s", &[]).await;
    let made = send(client().post(a.url("/waits")).json(&json!({
        "target": {"url": target},
        "state": "/data/attributes/status",
        "want": ["on"],
        "timeout": "30m",
        "poll": {"initial": "10m", "max": "10m"},
        "nudge": true,
    })))
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let id = made.body["id"].as_str().unwrap().to_string();
    let nudge_url = made.body["nudge_url"].as_str().unwrap().to_string();
    assert!(
        up.hit("/sv", 1, Duration::from_secs(20)).await,
        "A's first poll"
    );
    let b = Replica::start("b", &dir.path, &db.url, "3s", &[]).await;
    up.script("/sv", vec![Reply::status("on")]);
    let path = &nudge_url[nudge_url.find("/nudges/").expect("a nudge URL")..];
    let nudged = send(caller().post(format!("{}{path}", b.base))).await;
    assert_eq!(nudged.status, 202, "{}", nudged.body);
    let w = ended(&b.base, &id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    let seen = up.headers_seen("/sv");
    assert_eq!(seen.len(), 2, "one poll, then the nudged one");
    assert_eq!(seen[1]["waitd-replica"], "a", "the holder polled");
    for r in [&a, &b] {
        assert!(r.panics().is_empty(), "{}: {:?}", r.name, r.panics());
    }
    drop((a, b));
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_received_by_the_other_replica_is_polled_by_the_holder() {
    use hmac::{KeyInit, Mac};
    let _serial = SERIAL.lock().await;
    let dir = TempDir::new("waitd-source-replicas");
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let target = up.script("/sv", vec![Reply::status("deploying")]);
    let secret = "replica-secret-0123456789";
    // A alone holds the wait: B starts after A's first poll of it.
    let a = Replica::start("a", &dir.path, &db.url, "3s", &[]).await;
    let made = send(client().post(a.url("/sources")).json(&json!({
        "name": "gh", "kind": "github", "secret": secret, "key": "/workflow_run/id",
    })))
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let hook = made.body["hook_url"].as_str().unwrap().to_string();
    let made = send(client().post(a.url("/waits")).json(&json!({
        "target": {"url": target},
        "state": "/data/attributes/status",
        "want": ["on"],
        "timeout": "30m",
        "poll": {"initial": "10m", "max": "10m"},
        "on_event": {"source": "gh", "key": "31"},
    })))
    .await;
    assert_eq!(made.status, 201, "{}", made.body);
    let id = made.body["id"].as_str().unwrap().to_string();
    assert!(
        up.hit("/sv", 1, Duration::from_secs(20)).await,
        "A's first poll"
    );
    let b = Replica::start("b", &dir.path, &db.url, "3s", &[]).await;
    up.script("/sv", vec![Reply::status("on")]);
    let body = json!({"action": "completed", "workflow_run": {"id": 31}}).to_string();
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let path = &hook[hook.find("/hooks/").expect("a hook URL")..];
    let received = send(
        caller()
            .post(format!("{}{path}", b.base))
            .header("content-type", "application/json")
            .header("x-github-delivery", "r-1")
            .header("x-hub-signature-256", signature)
            .body(body),
    )
    .await;
    assert_eq!(received.status, 202, "{}", received.body);
    assert_eq!(received.body["matched"], 1, "{}", received.body);
    let w = ended(&b.base, &id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    let seen = up.headers_seen("/sv");
    assert_eq!(
        seen.len(),
        2,
        "one poll, then the one the event brought forward"
    );
    assert_eq!(seen[1]["waitd-replica"], "a", "the holder polled");
    for r in [&a, &b] {
        assert!(r.panics().is_empty(), "{}: {:?}", r.name, r.panics());
    }
    drop((a, b));
    db.drop_db().await;
}
