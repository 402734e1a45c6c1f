//! The worker runs on one clock, tokio's: under paused time, an hour of polling at
//! ten-minute intervals, its deadline and the lease renewals that keep the wait held
//! take milliseconds, and the wait's times are the paused clock's.
//!
//! In-process: waitd's router on embedded SQLite in memory, called without a socket
//! (`Router::oneshot`); the target is a server on this runtime. The test moves the
//! paused clock itself, five seconds at a time, and lets real time pass between steps:
//! SQLite answers from its own thread, which tokio's automatic advance would not
//! wait for (it would fire the pool's timeouts instead).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tower::ServiceExt;
use waitd::worker::Signal;

/// A target that answers `{"status": "deploying"}` and notes, by tokio's clock, when
/// each poll came.
async fn target() -> (String, Arc<Mutex<Vec<tokio::time::Instant>>>) {
    let hits = Arc::new(Mutex::new(Vec::new()));
    let seen = hits.clone();
    let app = axum::Router::new().route(
        "/status",
        axum::routing::get(move || {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(tokio::time::Instant::now());
                axum::Json(json!({"status": "deploying"}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/status", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, hits)
}

async fn call(router: &axum::Router, req: Request<Body>) -> (StatusCode, Value) {
    let res = router
        .clone()
        .oneshot(req)
        .await
        .expect("the router answers");
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn time(w: &Value, field: &str) -> DateTime<Utc> {
    w[field]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{field} is a time: {w}"))
}

/// Moves the paused clock five seconds at a time until `done`, letting the runtime's
/// tasks and the store's thread catch up after each step; gives up after `limit`.
const STEP: Duration = Duration::from_secs(5);

async fn drive(
    done: &tokio::task::JoinHandle<(StatusCode, Value)>,
    store: &waitd::store::Store,
    limit: Duration,
) {
    let mut moved = Duration::ZERO;
    while !done.is_finished() {
        assert!(moved < limit, "not done after {moved:?} of paused time");
        tokio::time::advance(STEP).await;
        moved += STEP;
        for _ in 0..10 {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_micros(20));
        }
        // Never while a statement is on SQLite's thread: on a loaded machine it can
        // take longer than a few steps' real time, and the paused clock would fire
        // the pool's timeout on whoever waits for the connection. (Bounded: a
        // connection held across a timer would otherwise stop the test.)
        let real = std::time::Instant::now();
        while store.connections_in_use() > 0 && real.elapsed() < Duration::from_secs(5) {
            tokio::task::yield_now().await;
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

#[tokio::test]
async fn an_hour_of_polling_runs_on_paused_time_and_ends_at_its_deadline() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("waitd=warn")
        .with_test_writer()
        .try_init();
    let real = std::time::Instant::now();
    let (url, hits) = target().await;
    let config = waitd::Config::from_args([
        "--database-url",
        "sqlite::memory:",
        "--allow-targets",
        "127.0.0.1",
        // Three renewals a minute: an hour takes 180 of them to stay held.
        "--lease-ttl",
        "60s",
    ])
    .expect("valid settings");
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let app = waitd::App::start(config, addr).await.expect("waitd starts");
    let mut signals = app
        .signals
        .subscribe()
        .expect("tests have the signal channel");
    let spec = json!({
        "target": {"url": url},
        "state": "/status",
        "want": ["on"],
        "timeout": "1h",
        "poll": {"initial": "10m", "max": "10m", "jitter": 0},
    });
    let create = Request::post("/waits")
        .header("content-type", "application/json")
        .body(Body::from(spec.to_string()))
        .unwrap();
    let (status, wait) = call(&app.router, create).await;
    assert_eq!(status, StatusCode::CREATED, "{wait}");
    let id = wait["id"].as_str().unwrap().to_string();
    // Claimed and polled once in real time, and that poll written; from then on,
    // the paused clock.
    let first_poll = async {
        loop {
            match signals.recv().await.expect("the worker runs") {
                Signal::Recorded { id: w, .. } if w.to_string() == id => break,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), first_poll)
        .await
        .expect("the first poll is written within seconds");
    assert_eq!(hits.lock().unwrap().len(), 1, "the first poll came");
    tokio::time::pause();
    let paused_at = tokio::time::Instant::now();
    let left = (time(&wait, "deadline") - Utc::now()).to_std().unwrap();
    // Never idle, so tokio never moves the clock by itself: only `drive` does.
    let keeper = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });

    // Held until the wait ends, while the worker's timers, its deadline and its
    // lease renewals run on the paused clock.
    let router = app.router.clone();
    let hold = tokio::spawn(async move {
        let hold = Request::get(format!("/waits/{id}?wait=true"))
            .body(Body::empty())
            .unwrap();
        call(&router, hold).await
    });
    drive(&hold, &app.store, Duration::from_secs(2 * 3600)).await;
    let (status, ended) = hold.await.unwrap();
    assert_eq!(ended["status"], "timed_out", "{ended}");
    assert_eq!(status, StatusCode::PRECONDITION_FAILED, "{ended}");

    // Polled at 0, 10, …, 50 minutes, and once more at the deadline: seven polls,
    // ten minutes of the paused clock apart but for the last. (Each is late by at
    // most the step the test moves the clock by.)
    let hits = hits.lock().unwrap().clone();
    let gaps: Vec<Duration> = hits.windows(2).map(|p| p[1] - p[0]).collect();
    assert_eq!(hits.len(), 7, "{gaps:?} {ended}");
    let near = |d: Duration, want: Duration| d.abs_diff(want) <= STEP * 2;
    let ten_minutes = Duration::from_secs(600);
    assert!(gaps[..5].iter().all(|g| near(*g, ten_minutes)), "{gaps:?}");
    assert!(
        near(hits[6] - paused_at, left),
        "last poll {:?} after the pause, the deadline {left:?}",
        hits[6] - paused_at
    );
    assert_eq!(ended["polls"], 7, "{ended}");
    // The wait's own times are the paused clock's: it lasted its hour.
    let lasted = time(&ended, "finished_at") - time(&ended, "created_at");
    assert!(
        lasted >= chrono::TimeDelta::minutes(60) && lasted <= chrono::TimeDelta::minutes(61),
        "lasted {lasted}"
    );
    keeper.abort();
    tokio::time::resume();
    app.stop().await;
    // About 2 s alone, 3-4 s with two busy loops beside it on two cores. The
    // point is that it is not the hour.
    assert!(
        real.elapsed() < Duration::from_secs(60),
        "an hour of paused time took {:?} of real time",
        real.elapsed()
    );
}
