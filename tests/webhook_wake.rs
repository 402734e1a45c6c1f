//! When a delivery falls due, the deliverers hear of it at once: from the
//! statement that inserts deliveries or queues one again (Postgres: a notice on
//! `waitd_deliveries` that goes out with its commit, to every replica), or from the
//! store's in-process wake (SQLite). A redelivery queued through a replica that
//! runs no deliverer reaches the receiver without waiting for the deliverer's
//! idle look ([`waitd::notify::IDLE`]), and so does a first delivery.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::receiver::Receiver;
use support::signals::DeliveryStatus;
use support::*;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw3aYQ6EHrZ5k=";

/// Redeliveries timed per store.
const ROUNDS: usize = 8;

/// A wait that succeeds at once, announcing its end to `hook`.
fn announcing(up: &Upstream, path: &str, hook: &str) -> Value {
    let mut s = spec(&up.script(path, vec![Reply::status("on")]));
    s["notify"] = json!([{"url": hook, "secret": SECRET, "events": ["ended"]}]);
    s
}

/// Flags for a replica that redelivers as often as it is asked.
fn args(url: &str) -> Vec<String> {
    let mut a = set_flag(test_args(url), "--webhook-redelivery-interval", "1ms");
    a.extend(["--rate-limit", "0"].map(String::from));
    a
}

/// From each `POST …/retry` to `api` until the receiver has the redelivery: the
/// slowest but one of [`ROUNDS`], so that one round a busy host stalls does not
/// count. A deliverer that waited for its idle look would take between nothing and
/// a second each time: all but one of eight under [`PROMPT`] by chance less than
/// once in a hundred. `worker` runs the deliverer (it may be `api` itself).
async fn redelivery_latency(api: &App, worker: &App, label: &str) -> Duration {
    let up = Upstream::start().await;
    let rx = Receiver::start().await;
    let hook = rx.url("/hook");
    let mut heard = worker.heard();
    let (status, w) = api.create(announcing(&up, "/s", &hook)).await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let delivery = heard.attempted(&id, DeliveryStatus::Delivered).await;
    let retry = api.url(&format!("/waits/{id}/deliveries/{delivery}/retry"));
    let mut took = Vec::new();
    for round in 1..=ROUNDS {
        let t0 = Instant::now();
        let r = api.client.post(&retry).send().await.unwrap();
        assert_eq!(r.status(), 202, "{label}: {}", r.text().await.unwrap());
        assert!(
            rx.until_got("/hook", 1 + round, Duration::from_secs(10))
                .await,
            "{label}: redelivery {round} never arrived"
        );
        took.push(rx.got("/hook")[round].at.duration_since(t0));
        // The outcome is written before the next one is queued (a 409 otherwise).
        heard.attempted(&id, DeliveryStatus::Delivered).await;
    }
    println!("{label}: from the retry POST to the receiver: {took:?}");
    took.sort();
    took[ROUNDS - 2]
}

/// Well under the deliverer's idle look, which a redelivery that nothing
/// announced would wait for.
const PROMPT: Duration = Duration::from_millis(400);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_is_attempted_at_once_on_sqlite() {
    let dir = TempDir::new("waitd-webhook-wake");
    let app = App::start_args(args(&dir.sqlite_url())).await;
    let latency = redelivery_latency(&app, &app, "sqlite").await;
    assert!(
        latency < PROMPT,
        "sqlite: all redeliveries but one took up to {latency:?}"
    );
    app.stop().await.0.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_is_attempted_at_once_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start_args(args(&db.url)).await;
    let latency = redelivery_latency(&app, &app, "postgres").await;
    assert!(
        latency < PROMPT,
        "postgres: all redeliveries but one took up to {latency:?}"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// The retry goes to a replica without a worker: only the notice that goes out
/// with its commit can tell the other replica's deliverer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivery_queued_through_another_replica_is_attempted_at_once() {
    let db = TestDb::new().await;
    let worker = App::start_args(args(&db.url)).await;
    let mut api_only = args(&db.url);
    api_only.push("--no-worker".into());
    let api = App::start_args(api_only).await;
    let latency = redelivery_latency(&api, &worker, "postgres, two replicas").await;
    assert!(
        latency < PROMPT,
        "postgres, two replicas: all redeliveries but one took up to {latency:?}"
    );
    api.stop().await.0.unwrap();
    worker.stop().await.0.unwrap();
    db.drop_db().await;
}
