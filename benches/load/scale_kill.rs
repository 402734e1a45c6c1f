//! The scale phase's takeover run (`--scale-kill`): once the replicas hold every
//! wait and the steady state is measured, `kill -9` of the replica holding the
//! most, and the survivors taking its waits over.

use std::time::{Duration, Instant};

use sqlx::Connection;

use super::support::TestDb;
use super::support::replica::Replica;
use super::{cpu_of, cpu_seconds, lag_percentile, metrics, metrics_of, rows_written};

/// Windows read that begin one window or more after every wait is held again.
const AFTER: usize = 2;
/// A takeover that takes longer fails the run.
const GIVE_UP: Duration = Duration::from_secs(1800);

/// What one takeover measured.
#[derive(Clone, Debug)]
pub struct Takeover {
    /// Waits the killed replica held.
    pub waits: f64,
    /// From its lease's expiry until the survivors hold every wait, s.
    pub held_s: f64,
    /// The survivors' schedule lag per window from the expiry on: when the window
    /// began (s after the expiry), p50, p99 (s).
    pub windows: Vec<(f64, f64, f64)>,
    /// The windows' length, s.
    pub window_s: f64,
    /// Postgres CPU (µs) and WAL (bytes) a wait taken over, from the expiry until
    /// every wait is held.
    pub pg_us: f64,
    pub wal_bytes: f64,
}

/// Waits a replica holds, by its metrics.
async fn held(base: &str) -> f64 {
    metrics(base)
        .await
        .get("waitd_held_waits")
        .copied()
        .unwrap_or(0.0)
}

/// Kills the replica of `replicas` holding the most of the `n` waits and times
/// the survivors' takeover of them, reading their schedule lag over windows of
/// `window` (10 s; 2 s in a smoke run).
pub async fn run(db: &TestDb, replicas: &mut [Replica], n: usize, window: Duration) -> Takeover {
    assert!(
        replicas.len() >= 2,
        "--scale-kill needs --scale-replicas 2 or more"
    );
    let mut holding = Vec::new();
    for r in replicas.iter() {
        holding.push(held(&r.base).await);
    }
    let victim = (0..replicas.len())
        .max_by(|a, b| holding[*a].total_cmp(&holding[*b]))
        .unwrap_or(0);
    let owner = replicas[victim]
        .owner()
        .expect("the replica logs its owner id");
    let survivors: Vec<String> = replicas
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, r)| r.base.clone())
        .collect();
    replicas[victim].kill9();
    let killed = Instant::now();
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (left,): (f64,) = sqlx::query_as(
        "SELECT extract(epoch FROM lease_until - now())::float8 FROM replicas WHERE id = $1",
    )
    .bind(owner)
    .fetch_one(&mut c)
    .await
    .unwrap();
    let expiry = killed + Duration::from_secs_f64(left.max(0.0));
    eprintln!(
        "scale phase: killed the replica holding {:.0} waits; its lease runs out in {left:.1} s",
        holding[victim]
    );
    tokio::time::sleep_until(expiry.into()).await;
    let pg_cpu = || cpu_seconds() - cpu_of("self");
    let snapshot = || metrics_of(&survivors);
    let all_held = || {
        let survivors = survivors.clone();
        async move {
            let mut sum = 0.0;
            for b in &survivors {
                sum += held(b).await;
            }
            sum as usize >= n
        }
    };
    let (p0, (_, wal0)) = (pg_cpu(), rows_written(db).await);
    let mut prev = snapshot().await;
    let mut windows = Vec::new();
    let mut done: Option<(f64, f64, i64)> = None;
    let mut after = 0;
    let mut next_window = expiry + window;
    while after < AFTER {
        assert!(
            expiry.elapsed() < GIVE_UP,
            "the survivors did not hold every wait within {GIVE_UP:?}"
        );
        if done.is_none() && all_held().await {
            let (_, wal) = rows_written(db).await;
            done = Some((expiry.elapsed().as_secs_f64(), pg_cpu(), wal));
            eprintln!(
                "scale phase: every wait held {:.1} s after the lease ran out",
                expiry.elapsed().as_secs_f64()
            );
        }
        if Instant::now() >= next_window {
            let now = snapshot().await;
            let began = (next_window - window - expiry).as_secs_f64();
            windows.push((
                began,
                lag_percentile(&prev, &now, 0.5),
                lag_percentile(&prev, &now, 0.99),
            ));
            prev = now;
            next_window += window;
            if done.is_some_and(|(at, _, _)| began >= at + window.as_secs_f64()) {
                after += 1;
            }
        }
        // Looked at every 100 ms (sooner would make the scrapes themselves load).
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (held_s, p1, wal1) = done.expect("every wait held");
    let taken = holding[victim].max(1.0);
    Takeover {
        waits: holding[victim],
        held_s,
        windows,
        window_s: window.as_secs_f64(),
        pg_us: (p1 - p0) * 1e6 / taken,
        wal_bytes: (wal1 - wal0) as f64 / taken,
    }
}
