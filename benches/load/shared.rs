//! (15) Shared polls: 10,000 waits over 100 URLs of one tenant at a 1 s interval,
//! on one replica: the requests a second the target sees (one careful client would
//! send 100), the CPU a wait's poll costs (set against a request of the limit
//! loop, which sends a request for every poll), and the process's RSS.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde_json::json;

use crate::support::TestDb;

/// The phase's figures; NaN where it was not run.
#[derive(Clone, Copy)]
pub struct Shared {
    /// Requests a second the target saw.
    pub requests: f64,
    /// Polls a second the waits made.
    pub polls: f64,
    /// CPU of the whole process (waitd and the target) a poll, µs.
    pub cpu_per_poll: f64,
    /// The process's RSS at the end, MiB.
    pub rss_mib: f64,
}

impl Shared {
    pub const NONE: Shared = Shared {
        requests: f64::NAN,
        polls: f64::NAN,
        cpu_per_poll: f64::NAN,
        rss_mib: f64::NAN,
    };
}

pub async fn run(waits: usize, urls: usize, concurrency: usize, seconds: u64) -> Shared {
    let (up, hits) = super::upstream().await;
    let db = TestDb::new().await;
    let w = super::start_waitd(&db, concurrency, &[]).await;
    let base = up.clone();
    super::create_specs(&w.base, waits, move |i| {
        json!({
            "target": {"url": format!("{base}/servers/{}", i % urls)},
            "state": "/data/attributes/status",
            "want": ["on"],
            "timeout": "1h",
            "poll": {"initial": "1s", "factor": 1, "max": "1s", "jitter": 0.1},
        })
    })
    .await;
    super::until_held(&w.base, waits).await;
    super::until_first_polls_written(&db).await;
    // Warm-up: the first polls came at once, the rest spread by their jitter.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (m0, h0, cpu0) = (
        super::metrics(&w.base).await,
        hits.load(Relaxed),
        super::cpu_seconds(),
    );
    eprintln!("shared phase: {waits} waits over {urls} URLs at 1 s, measuring for {seconds} s");
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (m1, h1, cpu1) = (
        super::metrics(&w.base).await,
        hits.load(Relaxed),
        super::cpu_seconds(),
    );
    let p = super::polls(&m1) - super::polls(&m0);
    let figures = Shared {
        requests: (h1 - h0) as f64 / seconds as f64,
        polls: p / seconds as f64,
        cpu_per_poll: (cpu1 - cpu0) * 1e6 / p,
        rss_mib: super::rss_kib(std::process::id()) as f64 / 1024.0,
    };
    eprintln!(
        "shared phase: {:.1} requests/s for {:.0} polls/s, {:.1} µs of CPU a poll, RSS {:.0} MiB",
        figures.requests, figures.polls, figures.cpu_per_poll, figures.rss_mib
    );
    w.stop().await.0.expect("waitd stops cleanly");
    db.drop_db().await;
    figures
}
