//! A scripted upstream plays the attacker, and waitd runs as a real process on each
//! store: explosive documents, huge and deeply nested answers, NUL and invalid
//! UTF-8, bodies that drip or never end, targets that never answer, and a wait
//! whose poll keeps killing the replica that polls it. Each test checks that the
//! process survives, that its memory stays under a stated bound (its peak RSS,
//! read from /proc), and that every wait ends with a sentence.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use support::follower::send;
use support::replica::{Replica, free_port, replica_args};
use support::{TempDir, TestDb, client};

/// The most memory (peak resident set) a replica may reach while it polls every
/// hostile target below at once. A debug build idles at about 20 MiB; before the
/// evaluation budget, one of these targets took a replica past 2 GiB in seconds.
/// With mimalloc the peak is 103–108 MiB: it keeps freed pages a moment before it
/// returns them (with `MIMALLOC_PURGE_DELAY=0`, 69–71 MiB), so the bound leaves room
/// for those and still fails at a tenth of that 2 GiB.
const RSS_BOUND_KIB: u64 = 160 * 1024;

/// What one path of the hostile upstream does.
#[derive(Clone)]
enum Play {
    /// 200 with this body (any bytes).
    Body(Vec<u8>),
    /// Headers, then one byte of body every `every`, forever.
    Drip(Duration),
    /// A chunked body that never ends.
    Endless,
    /// Reads the request and never answers.
    Hang,
}

/// An HTTP/1.1 server written on raw sockets, so it can misbehave in ways a
/// framework would not let it.
struct Hostile {
    base: String,
    plays: Arc<Mutex<HashMap<String, Play>>>,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    /// Told of every request.
    hit: Arc<tokio::sync::Notify>,
}

impl Hostile {
    async fn start() -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let plays: Arc<Mutex<HashMap<String, Play>>> = Arc::default();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let hit = Arc::new(tokio::sync::Notify::new());
        let (p, h, n) = (plays.clone(), hits.clone(), hit.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    continue;
                };
                let (p, h, n) = (p.clone(), h.clone(), n.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 8192];
                    let mut got = Vec::new();
                    // One request per connection: read to the end of its head.
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&got).to_string();
                    let path = head.split(' ').nth(1).unwrap_or("/").to_string();
                    *h.lock().unwrap().entry(path.clone()).or_default() += 1;
                    n.notify_waiters();
                    let play = p.lock().unwrap().get(&path).cloned();
                    let Some(play) = play else {
                        let _ = sock
                            .write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                            .await;
                        return;
                    };
                    match play {
                        Play::Body(body) => {
                            let head = format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                                body.len()
                            );
                            let _ = sock.write_all(head.as_bytes()).await;
                            let _ = sock.write_all(&body).await;
                        }
                        Play::Drip(every) => {
                            let _ = sock
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n{")
                                .await;
                            loop {
                                // Pacing: the scripted target trickles its body.
                                tokio::time::sleep(every).await;
                                if sock.write_all(b" ").await.is_err() {
                                    return;
                                }
                            }
                        }
                        Play::Endless => {
                            let _ = sock
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
                                .await;
                            let chunk = format!("{:x}\r\n{}\r\n", 16 * 1024, "[".repeat(16 * 1024));
                            loop {
                                if sock.write_all(chunk.as_bytes()).await.is_err() {
                                    return;
                                }
                            }
                        }
                        Play::Hang => {
                            // The point: a target that never answers.
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Hostile {
            base,
            plays,
            hits,
            hit,
        }
    }

    fn play(&self, path: &str, play: Play) -> String {
        self.plays.lock().unwrap().insert(path.to_string(), play);
        format!("{}{path}", self.base)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// Whether `path` has had at least `n` requests within `within`: woken by each
    /// request, not by a clock.
    async fn hit(&self, path: &str, n: usize, within: Duration) -> bool {
        let heard = async {
            loop {
                let next = self.hit.notified();
                tokio::pin!(next);
                next.as_mut().enable();
                if self.hits(path) >= n {
                    return;
                }
                next.await;
            }
        };
        tokio::time::timeout(within, heard).await.is_ok()
    }
}

fn json_body(v: &Value) -> Play {
    Play::Body(v.to_string().into_bytes())
}

/// A 120-deep object, three keys a level (about 3.6 KB): `$..*..*` over it selects
/// about 65,000 nodes; each further `..*` multiplies that by about 120.
fn explosive() -> Value {
    let mut doc = json!("leaf");
    for _ in 0..120 {
        doc = json!({"a": doc, "b": 1, "c": 2});
    }
    doc
}

/// A spec polling `url` every few milliseconds for `state`. Each of these waits
/// ends by what its answers are, not by its deadline, which is only there to
/// end it should it not: a loaded machine, with the huge answers polled beside
/// it, can take seconds to give a poll its turn.
fn hostile_spec(url: &str, state: &str) -> Value {
    json!({
        "target": {"url": url},
        "state": state,
        "want": ["on"],
        "timeout": "60s",
        "poll": {"initial": "20ms", "factor": 1, "jitter": 0},
        "retry": {"delay": "20ms", "max_delay": "20ms", "max_retries": 3}
    })
}

/// Creates a wait (201 expected) and returns its id.
async fn create(r: &Replica, spec: Value) -> String {
    let a = send(client().post(r.url("/waits")).json(&spec)).await;
    assert_eq!(a.status, 201, "{}", a.body);
    a.body["id"].as_str().unwrap().to_string()
}

async fn ended(r: &Replica, id: &str) -> Value {
    let a = send(client().get(r.url(&format!("/waits/{id}?wait=25s")))).await;
    assert_ne!(a.status, 202, "still running: {}", a.body);
    assert_ne!(a.body["status"], "running", "{}", a.body);
    a.body
}

/// The stores to run on: a SQLite file, and a database on the test server.
async fn stores(dir: &TempDir) -> Vec<(String, Option<TestDb>)> {
    let db = TestDb::new().await;
    vec![(dir.sqlite_url(), None), (db.url.clone(), Some(db))]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_answers_end_their_waits_with_a_sentence_and_bounded_memory_on_both_stores() {
    let up = Hostile::start().await;
    let doc = explosive();
    let big = "x".repeat(500_000);
    let urls = [
        up.play("/explosive", json_body(&doc)),
        up.play(
            "/huge",
            json_body(&json!({"data": {"attributes": {"status": big}}})),
        ),
        up.play(
            "/nul",
            json_body(&json!({"data": {"attributes": {"status": "de\u{0}ploying"}}})),
        ),
        up.play(
            "/nul-detail",
            json_body(&json!({"data": {"attributes": {"status": "failed"}}, "err": {"k\u{0}": ["v\u{0}"], "s": "y".repeat(100_000)}})),
        ),
        up.play(
            "/bad-utf8",
            Play::Body(b"{\"data\":{\"attributes\":{\"status\":\"\xff\xfe\"}}}".to_vec()),
        ),
        up.play(
            "/deep",
            Play::Body(format!("{}{}", "[".repeat(5000), "]".repeat(5000)).into_bytes()),
        ),
        up.play(
            "/wide",
            Play::Body(
                format!("[{}0]", "0,".repeat(400_000)).into_bytes(),
            ),
        ),
        up.play("/drip", Play::Drip(Duration::from_millis(50))),
        up.play("/endless", Play::Endless),
    ];
    let dir = TempDir::new("waitd-hostile");
    for (url, db) in stores(&dir).await {
        let port = free_port();
        let mut r = Replica::spawn(
            "hostile",
            &dir.path,
            port,
            replica_args(&url, port, "3s", &["--probe-timeout", "500ms"]),
        );
        r.ready(Duration::from_secs(15)).await;

        // Creation refuses what is explosive on its face, naming the field.
        let a = send(
            client()
                .post(r.url("/waits"))
                .json(&hostile_spec(&urls[0], "$..*..*..*..*")),
        )
        .await;
        assert_eq!(a.status, 400, "{}", a.body);
        assert_eq!(a.body["errors"][0]["field"], "state", "{}", a.body);
        assert!(
            a.body["detail"].as_str().unwrap().contains("descendant"),
            "{}",
            a.body
        );

        let explosive_id = create(&r, hostile_spec(&urls[0], "$..*..*")).await;
        let huge_id = create(&r, hostile_spec(&urls[1], "/data/attributes/status")).await;
        let nul_id = create(&r, hostile_spec(&urls[2], "/data/attributes/status")).await;
        let mut detail_spec = hostile_spec(&urls[3], "/data/attributes/status");
        detail_spec["fail"] = json!(["failed"]);
        detail_spec["error"] = json!("/err");
        let detail_id = create(&r, detail_spec).await;
        let utf8_id = create(&r, hostile_spec(&urls[4], "/data/attributes/status")).await;
        let deep_id = create(&r, hostile_spec(&urls[5], "/data/attributes/status")).await;
        let wide_id = create(&r, hostile_spec(&urls[6], "$[*]")).await;
        let drip_id = create(&r, hostile_spec(&urls[7], "/data/attributes/status")).await;
        let endless_id = create(&r, hostile_spec(&urls[8], "/data/attributes/status")).await;

        // The explosive path: a permanent error that names the limit.
        let w = ended(&r, &explosive_id).await;
        assert_eq!(w["status"], "error", "{w}");
        assert!(
            w["reason"]
                .as_str()
                .unwrap()
                .contains("the most one poll may"),
            "{w}"
        );
        // 400,000 array elements: past the node budget too.
        let w = ended(&r, &wide_id).await;
        assert_eq!(w["status"], "error", "{w}");
        assert!(w["reason"].as_str().unwrap().contains("nodes"), "{w}");

        // A 500 KB status string is kept as 2 KiB with a marker.
        let huge = support::poll_for(Duration::from_secs(10), || async {
            let a = send(client().get(r.url(&format!("/waits/{huge_id}")))).await;
            a.body["state"].is_string().then_some(a.body)
        })
        .await
        .expect("the state was recorded");
        let state = huge["state"].as_str().unwrap();
        assert!(state.len() <= 2048, "{}", state.len());
        assert!(
            state.ends_with("(cut from 500000 bytes)"),
            "{}",
            &state[state.len() - 40..]
        );
        let events = send(client().get(r.url(&format!("/waits/{huge_id}/events")))).await;
        let text = events.body.to_string();
        assert!(
            text.len() < 16 * 1024,
            "the events page is {} bytes",
            text.len()
        );
        let list = send(client().get(r.url("/waits?limit=50"))).await;
        assert!(
            list.body.to_string().len() < 64 * 1024,
            "the list page is {} bytes",
            list.body.to_string().len()
        );

        // NUL in a state: stored (as U+FFFD) on either store, and the wait goes on.
        let nul = support::poll_for(Duration::from_secs(10), || async {
            let a = send(client().get(r.url(&format!("/waits/{nul_id}")))).await;
            a.body["state"].is_string().then_some(a.body)
        })
        .await
        .expect("the state was recorded");
        assert_eq!(nul["state"], "de\u{FFFD}ploying", "{nul}");
        assert_eq!(nul["status"], "running", "{nul}");

        // NUL and a long string in an error detail: failed, with the detail bounded.
        let w = ended(&r, &detail_id).await;
        assert_eq!(w["status"], "failed", "{w}");
        assert_eq!(w["error_detail"]["k\u{FFFD}"], json!(["v\u{FFFD}"]), "{w}");
        assert!(w["error_detail"].to_string().len() <= 8 * 1024, "{w}");

        // Invalid UTF-8 and nesting past the parser's depth: not JSON, retried, then
        // an error that says so.
        for id in [&utf8_id, &deep_id] {
            let w = ended(&r, id).await;
            assert_eq!(w["status"], "error", "{w}");
            assert!(w["reason"].as_str().unwrap().contains("not JSON"), "{w}");
        }
        // A body that drips: the probe timeout cuts it, and the retries run out.
        let w = ended(&r, &drip_id).await;
        assert_eq!(w["status"], "error", "{w}");
        assert!(
            w["reason"]
                .as_str()
                .unwrap()
                .contains("did not answer within"),
            "{w}"
        );
        // A body that never ends: cut at the body limit.
        let w = ended(&r, &endless_id).await;
        assert_eq!(w["status"], "error", "{w}");
        assert!(w["reason"].as_str().unwrap().contains("1 MiB"), "{w}");

        // The nul wait still polls; cancel it, and the process is alive throughout.
        let a = send(client().post(r.url(&format!("/waits/{nul_id}/cancel")))).await;
        assert_eq!(a.body["status"], "canceled", "{}", a.body);
        let a = send(client().post(r.url(&format!("/waits/{huge_id}/cancel")))).await;
        assert_eq!(a.body["status"], "canceled", "{}", a.body);
        assert!(r.running(), "the replica died:\n{}", r.log_tail(30));
        let peak = support::replica::peak_rss_kib(r.pid);
        eprintln!("{url}: peak RSS {} MiB", peak / 1024);
        assert!(peak > 0 && peak < RSS_BOUND_KIB, "peak RSS {peak} KiB");
        assert!(r.panics().is_empty(), "{:?}", r.panics());
        r.signal("TERM");
        r.wait_exit(Duration::from_secs(10)).await;
        if let Some(db) = db {
            db.drop_db().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_whose_polls_keep_killing_their_replica_is_ended_on_both_stores() {
    let up = Hostile::start().await;
    let url = up.play("/hang", Play::Hang);
    let dir = TempDir::new("waitd-crashloop");
    for (store_url, db) in stores(&dir).await {
        let port = free_port();
        let args = replica_args(&store_url, port, "500ms", &["--probe-timeout", "60s"]);
        let mut r = Replica::spawn("crashloop", &dir.path, port, args);
        r.ready(Duration::from_secs(15)).await;
        let mut spec = hostile_spec(&url, "/data/attributes/status");
        spec["timeout"] = json!("2m");
        // Counted before the create: the first poll may reach the target before the
        // create's answer reaches this test.
        let hits_before = up.hits("/hang");
        let id = create(&r, spec).await;
        // The poll is in flight (the target holds it), and the replica dies — as
        // if the answer had killed it. On SQLite each claim counts the wait's first
        // poll: three deaths. On Postgres the wait is in a slot, and the slot's
        // count starts the wait's own after two deaths (docs/replicas.md §6.6).
        let deaths = if db.is_some() { 5 } else { 3 };
        for round in 1..=deaths {
            let seen = up
                .hit("/hang", hits_before + round, Duration::from_secs(10))
                .await;
            assert!(
                seen,
                "poll {round} never reached the target:\n{}",
                r.log_tail(20)
            );
            r.kill9();
            r.respawn();
            r.ready(Duration::from_secs(15)).await;
        }
        // The next claim ends it without polling it again.
        let a = send(client().get(r.url(&format!("/waits/{id}?wait=10s")))).await;
        assert_eq!(a.body["status"], "error", "{}", a.body);
        let reason = a.body["reason"].as_str().unwrap();
        assert!(
            reason.contains("did not complete 3 times in a row"),
            "{reason}"
        );
        assert_eq!(
            up.hits("/hang"),
            hits_before + deaths,
            "polled after its {deaths} deaths"
        );
        r.signal("TERM");
        r.wait_exit(Duration::from_secs(10)).await;
        if let Some(db) = db {
            db.drop_db().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_wait_taken_over_again_and_again_is_never_ended_by_the_crash_loop_guard_on_both_stores()
 {
    // After a takeover, a wait polled before is claimed, its first poll is counted as
    // begun, and that poll, which changes nothing here, is recorded as completed
    // without its progress. Were it not, the count would grow by one a takeover and
    // the fourth claimer would end a healthy wait as a crash loop.
    let up = Hostile::start().await;
    let url = up.play(
        "/steady",
        Play::Body(br#"{"data":{"attributes":{"status":"deploying"}}}"#.to_vec()),
    );
    let dir = TempDir::new("waitd-takeovers");
    for (store_url, db) in stores(&dir).await {
        let port = free_port();
        let args = replica_args(&store_url, port, "500ms", &[]);
        let mut r = Replica::spawn("takeovers", &dir.path, port, args);
        r.ready(Duration::from_secs(15)).await;
        let mut spec = hostile_spec(&url, "/data/attributes/status");
        spec["timeout"] = json!("2m");
        let id = create(&r, spec).await;
        for round in 0..=5 {
            // Two polls by this replica: the second starts only once the first is
            // recorded (a held wait has one poll or write in flight), so the store
            // has heard that the first poll since the claim completed.
            let hits = up.hits("/steady");
            let polled = up.hit("/steady", hits + 2, Duration::from_secs(15)).await;
            assert!(
                polled,
                "round {round}: not polled again:\n{}",
                r.log_tail(20)
            );
            if round == 5 {
                break;
            }
            r.kill9();
            r.respawn();
            r.ready(Duration::from_secs(15)).await;
        }
        let w = send(client().get(r.url(&format!("/waits/{id}")))).await;
        assert_eq!(w.body["status"], "running", "{} on {store_url}", w.body);
        r.signal("TERM");
        r.wait_exit(Duration::from_secs(10)).await;
        if let Some(db) = db {
            db.drop_db().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_the_store_refuses_to_record_ends_in_error_while_its_neighbours_go_on() {
    // The last line of defence: a Postgres constraint (added by the test) refuses one
    // target's state, the way a byte Postgres cannot store once did.
    let db = TestDb::new().await;
    let up = support::Upstream::start().await;
    let poison = up.script("/poison", vec![support::Reply::status("poison")]);
    let fine = up.script(
        "/fine",
        vec![
            support::Reply::status("deploying"),
            support::Reply::status("on"),
        ],
    );
    let app = support::App::start(&db).await;
    support::db_exec(
        &db,
        "ALTER TABLE waits ADD CONSTRAINT no_poison CHECK (state IS DISTINCT FROM 'poison')",
    )
    .await;
    let mut heard = app.heard();
    let started = Instant::now();
    let (_, a) = app.create(support::spec(&poison)).await;
    let (_, b) = app.create(support::spec(&fine)).await;
    let a_id = a["id"].as_str().unwrap().to_string();
    let a = app.wait_end(&a_id).await;
    let b = app.wait_end(b["id"].as_str().unwrap()).await;
    assert_eq!(a["status"], "error", "{a}");
    assert!(
        a["reason"]
            .as_str()
            .unwrap()
            .starts_with("could not store what the target answered"),
        "{a}"
    );
    assert_eq!(b["status"], "succeeded", "{b}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Counted once, when the worker has its write back.
    let read = || async {
        let r = app.client.get(app.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    };
    heard.ended(&a_id).await;
    let m = read().await;
    assert!(
        m.contains("waitd_waits_ended_total{status=\"error\"} 1\n"),
        "{m}"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
