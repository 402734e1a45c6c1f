//! One tenant's request cannot take down or starve the others: waitd runs as real
//! processes (two replicas on one Postgres, one on a SQLite file) while tenant A
//! sends expressions and paths that nest past every limit and conditions whose
//! patterns come from the target's body, and tenant B waits on a healthy target.
//! Every hostile request is a `400` with a sentence or a wait that ends by its
//! deadline; no replica dies; `/healthz` keeps answering; B's wait ends promptly;
//! each replica's memory stays under a stated bound.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use chrono::DateTime;
use serde_json::{Value, json};

use support::follower::send;
use support::replica::{Replica, free_port, replica_args};
use support::{Reply, TempDir, TestDb, Upstream, client};

const TOKEN_A: &str = "tenant-a-token-0123456789";
const TOKEN_B: &str = "tenant-b-token-0123456789";

/// The most memory (peak resident set) a replica may reach through all of it: a
/// debug build idles at about 20 MiB, and the bodies below are about 100 KB each.
const RSS_BOUND_KIB: u64 = 200 * 1024;

/// C1: 640 comparisons, 1,281 bytes, no brackets.
fn comparisons() -> String {
    format!("1{}", "<1".repeat(640))
}

/// C2: a JSONPath function nested 31 deep (257 bytes).
fn nested_functions() -> String {
    format!("$[?{}@.v{}>0]", "length(".repeat(31), ")".repeat(31))
}

/// A pattern whose automaton would be megabytes: Unicode word classes repeated.
const HEAVY_PATTERN: &str = r"(?:\w{50}){50}";

async fn post(r: &Replica, token: &str, spec: &Value) -> (u16, Value, Duration) {
    let started = Instant::now();
    let a = send(client().post(r.url("/waits")).bearer_auth(token).json(spec)).await;
    (a.status, a.body, started.elapsed())
}

async fn ended(r: &Replica, token: &str, id: &str) -> Value {
    let a = send(
        client()
            .get(r.url(&format!("/waits/{id}?wait=30s")))
            .bearer_auth(token),
    )
    .await;
    assert_ne!(a.body["status"], "running", "{}", a.body);
    a.body
}

fn seconds_between(wait: &Value, from: &str, to: &str) -> f64 {
    let t = |k: &str| DateTime::parse_from_rfc3339(wait[k].as_str().unwrap()).unwrap();
    (t(to) - t(from)).as_seconds_f64()
}

/// Polls `/healthz` of every replica every 50 ms until told to stop; the slowest
/// answer in milliseconds, and whether every one was a 200.
fn watch_health(urls: Vec<String>) -> (Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicBool>) {
    let stop = Arc::new(AtomicBool::new(false));
    let slowest = Arc::new(AtomicU64::new(0));
    let healthy = Arc::new(AtomicBool::new(true));
    let (s, w, h) = (stop.clone(), slowest.clone(), healthy.clone());
    tokio::spawn(async move {
        let c = client();
        while !s.load(Relaxed) {
            for u in &urls {
                let t = Instant::now();
                let ok = c
                    .get(u)
                    .timeout(Duration::from_secs(10))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                w.fetch_max(t.elapsed().as_millis() as u64, Relaxed);
                if !ok {
                    h.store(false, Relaxed);
                }
            }
            // Pacing: every replica's /healthz is sampled every 50 ms throughout.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    (stop, slowest, healthy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenants_hostile_requests_leave_the_replicas_and_the_other_tenant_unharmed() {
    let up = Upstream::start().await;
    let items: Vec<Value> = (0..3000).map(|i| json!({"n": i})).collect();
    let same = up.script(
        "/same-pattern",
        vec![Reply::json(
            200,
            json!({"p": HEAVY_PATTERN, "items": items}),
        )],
    );
    // Every item its own pattern: nothing to reuse.
    let distinct: Vec<Value> = (0..3000)
        .map(|i| json!({"p": format!(r"(?:\w{{{}}}){{50}}", 40 + i % 500)}))
        .collect();
    let many = up.script(
        "/many-patterns",
        vec![Reply::json(200, json!({"items": distinct}))],
    );
    let healthy = up.script("/healthy", vec![Reply::status("on")]);

    let dir = TempDir::new("waitd-isolation");
    let db = TestDb::new().await;
    let tokens = format!("a:{TOKEN_A},b:{TOKEN_B}");
    let extra = ["--tokens", tokens.as_str()];
    let mut replicas = Vec::new();
    for (name, url) in [
        ("pg-1", db.url.clone()),
        ("pg-2", db.url.clone()),
        ("lite", dir.sqlite_url()),
    ] {
        let port = free_port();
        let args = replica_args(&url, port, "2s", &extra);
        let mut r = Replica::spawn(name, &dir.path, port, args);
        r.ready(Duration::from_secs(20)).await;
        replicas.push(r);
    }
    let (stop, slowest, all_ok) =
        watch_health(replicas.iter().map(|r| r.url("/healthz")).collect());

    for r in &replicas {
        // C1: refused at creation, with the sentence, at once.
        let spec = json!({"target": {"url": healthy}, "success_condition": comparisons()});
        let (status, body, took) = post(r, TOKEN_A, &spec).await;
        assert_eq!(status, 400, "{}: {body}", r.name);
        let text = body.to_string();
        assert!(text.contains("success_condition"), "{text}");
        assert!(text.contains("levels deep"), "{text}");
        assert!(took < Duration::from_secs(2), "{}: {took:?}", r.name);

        // C2: refused at creation, at once.
        let spec = json!({"target": {"url": healthy}, "state": nested_functions(), "want": ["on"]});
        let (status, body, took) = post(r, TOKEN_A, &spec).await;
        assert_eq!(status, 400, "{}: {body}", r.name);
        let text = body.to_string();
        assert!(text.contains("\"state\""), "{text}");
        assert!(text.contains("nest more than 32"), "{text}");
        assert!(took < Duration::from_secs(2), "{}: {took:?}", r.name);

        // H1: one pattern from the body over 3,000 items, and 3,000 distinct ones.
        let mut ids = Vec::new();
        for (url, cond) in [
            (&same, "body.items.all(i, !'a'.matches(body.p))"),
            (&many, "body.items.all(i, !'a'.matches(i.p))"),
        ] {
            let spec = json!({
                "target": {"url": url},
                "success_condition": cond,
                "timeout": "3s",
                "poll": {"initial": "100ms", "factor": 1, "jitter": 0},
                "retry": {"delay": "100ms", "max_delay": "100ms", "max_retries": null}
            });
            let (status, body, _) = post(r, TOKEN_A, &spec).await;
            assert_eq!(status, 201, "{body}");
            ids.push(body["id"].as_str().unwrap().to_string());
        }
        // Tenant B, meanwhile, on a healthy target.
        let spec =
            json!({"target": {"url": healthy}, "state": "/data/attributes/status", "want": ["on"]});
        let (status, b, _) = post(r, TOKEN_B, &spec).await;
        assert_eq!(status, 201, "{b}");
        let b = ended(r, TOKEN_B, b["id"].as_str().unwrap()).await;
        assert_eq!(b["status"], "succeeded", "{b}");
        let took = seconds_between(&b, "created_at", "finished_at");
        eprintln!(
            "{}: tenant B's wait ended {took:.3} s after it was created",
            r.name
        );
        assert!(took < 2.0, "{}: B took {took} s", r.name);

        for id in ids {
            let a = ended(r, TOKEN_A, &id).await;
            let took = seconds_between(&a, "created_at", "finished_at");
            eprintln!(
                "{}: tenant A's wait ended {} after {took:.3} s: {}",
                r.name, a["status"], a["reason"]
            );
            assert!(took <= 4.0, "{}: past its deadline: {a}", r.name);
            assert!(a["reason"].as_str().is_some_and(|s| !s.is_empty()), "{a}");
        }
    }

    stop.store(true, Relaxed);
    let slowest = slowest.load(Relaxed);
    eprintln!("slowest /healthz answer throughout: {slowest} ms");
    assert!(all_ok.load(Relaxed), "a /healthz answer failed");
    assert!(slowest < 2_000, "/healthz took {slowest} ms");
    for r in &mut replicas {
        assert!(r.running(), "{} died:\n{}", r.name, r.log_tail(30));
        assert!(r.panics().is_empty(), "{}: {:?}", r.name, r.panics());
        let rss = support::replica::peak_rss_kib(r.pid);
        eprintln!("{}: peak RSS {} MiB", r.name, rss / 1024);
        assert!(rss < RSS_BOUND_KIB, "{}: peak RSS {rss} KiB", r.name);
    }
    for r in &mut replicas {
        r.signal("TERM");
        assert!(
            r.wait_exit(Duration::from_secs(15)).await.is_some(),
            "{} did not stop on SIGTERM",
            r.name
        );
    }
    db.drop_db().await;
}
