//! Webhooks across replicas of the `waitd` binary on one Postgres: a replica killed
//! (SIGKILL) in the middle of a delivery, and two replicas delivering the ends of
//! 500 waits at once. Run one at a time; they print their figures
//! (`cargo test --test webhook_replicas -- --nocapture`).

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use support::follower::send;
use support::receiver::{Answer, Receiver};
use support::recorder::Recorder;
use support::replica::Replica;
use support::{TempDir, TestDb, client, poll_for};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn notifying(target: &str, hook: &str, interval: &str) -> Value {
    json!({
        "target": {"url": target},
        "state": "/data/attributes/status",
        "want": ["on"],
        "timeout": "2m",
        "poll": {"initial": interval, "factor": 1, "max": interval, "jitter": 0},
        "notify": [{"url": hook, "secret": SECRET}]
    })
}

async fn deliveries(r: &Replica, id: &str) -> Vec<Value> {
    let a = send(client().get(r.url(&format!("/waits/{id}/deliveries")))).await;
    a.body["items"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn a_delivery_cut_by_kill_9_is_sent_again_by_another_replica_with_the_same_webhook_id() {
    let _serial = SERIAL.lock().await;
    let dir = TempDir::new("waitd-webhook-kill");
    let db = TestDb::new().await;
    let up = Recorder::start().await;
    let rx = Receiver::start().await;
    // The first attempt is held: the receiver has it, and never answers.
    let hook = rx.script("/hook", vec![Answer::Hold, Answer::code(200)]);
    let target = up.set_status("/s/1", "on");
    let extra = ["--rate-limit", "0", "--webhook-retry-base", "20ms"];
    let mut a = Replica::start("a", &dir.path, &db.url, "2s", &extra).await;
    let created = send(
        client()
            .post(a.url("/waits"))
            .json(&notifying(&target, &hook, "10ms")),
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    let id = created.body["id"].as_str().unwrap().to_string();
    assert!(
        rx.until_got("/hook", 1, Duration::from_secs(10)).await,
        "replica a never sent the delivery"
    );
    let sent_first = Instant::now();
    a.kill9();
    let b = Replica::start("b", &dir.path, &db.url, "2s", &extra).await;
    assert!(
        rx.until_got("/hook", 2, Duration::from_secs(15)).await,
        "no replica sent the delivery again; b's log:\n{}",
        b.log_tail(30)
    );
    let again = sent_first.elapsed();
    let got = rx.got("/hook");
    assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
    assert_eq!(got[0].body.len(), got[1].body.len(), "the same message");
    let d = poll_for(Duration::from_secs(5), || async {
        let d = deliveries(&b, &id).await;
        (d.len() == 1 && d[0]["status"] == "delivered").then_some(d)
    })
    .await
    .expect("delivered");
    // Replica a never wrote its attempt; b's is the one on record.
    assert_eq!(d[0]["attempts_total"], 1, "{d:?}");
    println!(
        "kill -9 mid-delivery (delivery lease 2 s): sent again {} ms after the first attempt, same webhook-id",
        again.as_millis()
    );
    assert!(again < Duration::from_secs(6), "took {again:?}");
    assert!(b.panics().is_empty());
    drop(b);
    db.drop_db().await;
}

#[tokio::test]
async fn two_replicas_deliver_the_ends_of_500_waits_that_end_at_once_each_exactly_once() {
    let _serial = SERIAL.lock().await;
    const N: usize = 500;
    let dir = TempDir::new("waitd-webhook-two");
    let db = TestDb::new().await;
    let up = Recorder::start().await;
    let rx = Receiver::start().await;
    let hook = rx.url("/ends");
    let extra = ["--rate-limit", "0", "--webhook-retry-base", "20ms"];
    let a = Replica::start("a", &dir.path, &db.url, "5s", &extra).await;
    let b = Replica::start("b", &dir.path, &db.url, "5s", &extra).await;
    let paths: Vec<String> = (0..N).map(|i| format!("/flip/{i}")).collect();
    for p in &paths {
        up.set_status(p, "deploying");
    }
    let c = client();
    let replicas = [&a, &b];
    let answers: Vec<support::follower::Answer> =
        futures_util::stream::iter(paths.iter().enumerate().map(|(i, p)| {
            let r = replicas[i % 2];
            send(c.post(r.url("/waits")).json(&notifying(
                &format!("{}{p}", up.base),
                &hook,
                "200ms",
            )))
        }))
        .buffered(16)
        .collect()
        .await;
    let ids: HashSet<String> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 201, "{}", a.body);
            a.body["id"].as_str().unwrap().to_string()
        })
        .collect();
    up.set_all(&paths, "on");
    let flipped = Instant::now();
    let arrived = rx
        .received(Duration::from_secs(30), |got| {
            let distinct: HashSet<String> = got
                .iter()
                .filter(|r| r.path == "ends")
                .map(|r| r.header("webhook-id"))
                .collect();
            distinct.len() >= N
        })
        .await;
    assert!(
        arrived,
        "only {} of {N} deliveries arrived",
        rx.got("/ends").len()
    );
    let got = rx.got("/ends");
    let all = flipped.elapsed();
    let mut per_id: HashMap<String, usize> = HashMap::new();
    for r in &got {
        *per_id.entry(r.header("webhook-id")).or_default() += 1;
        let body = r.json();
        assert_eq!(body["type"], "wait.succeeded");
        assert!(ids.contains(body["data"]["id"].as_str().unwrap()));
    }
    assert_eq!(per_id.len(), N);
    let dups: usize = per_id.values().map(|n| n - 1).sum();
    assert_eq!(dups, 0, "no crash, no duplicates");
    let delivered = |r: &Replica| {
        let r = r.url("/metrics");
        async move {
            let text = client().get(r).send().await.unwrap().text().await.unwrap();
            text.lines()
                .find_map(|l| {
                    l.strip_prefix("waitd_webhook_attempts_total{outcome=\"delivered\"} ")
                })
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        }
    };
    let (da, dbb) = (delivered(&a).await, delivered(&b).await);
    assert_eq!(da + dbb, N as u64);
    println!(
        "two replicas, {N} waits flipped at once (polled every 200 ms): all {N} delivered {} ms after the flip, replica a sent {da}, b {dbb}, 0 duplicates",
        all.as_millis()
    );
    assert!(a.panics().is_empty() && b.panics().is_empty());
    drop((a, b));
    db.drop_db().await;
}
