//! The load benchmark: waitd's polling rate against the physical limit of the same
//! upstream, database writes per poll, schedule lag, memory per wait, and create
//! throughput — in one run, printed as a table.
//!
//!     cargo bench --bench load -- [--waits 10000] [--seconds 10] [--runs 3] [--smoke]
//!
//! Needs Postgres (WAITD_TEST_DATABASE_URL, default the local server); it creates and
//! drops its own databases. Everything runs on 127.0.0.1.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;
use tokio::net::TcpListener;

struct Args {
    waits: usize,
    seconds: u64,
    runs: usize,
    concurrency: usize,
    rss_waits: Vec<usize>,
    /// The fixed poll interval of the schedule-lag phase.
    interval: String,
}

fn args() -> Args {
    let mut a = Args {
        waits: 10_000,
        seconds: 10,
        runs: 3,
        concurrency: 256,
        rss_waits: vec![10_000, 100_000],
        interval: "1s".into(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--waits" => a.waits = v.parse().expect("--waits N"),
            "--seconds" => a.seconds = v.parse().expect("--seconds N"),
            "--runs" => a.runs = v.parse().expect("--runs N"),
            "--concurrency" => a.concurrency = v.parse().expect("--concurrency N"),
            "--rss-waits" => {
                a.rss_waits = v
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(|x| x.parse().expect("--rss-waits N,M"))
                    .collect()
            }
            "--interval" => a.interval = v,
            "--smoke" => {
                a.waits = 200;
                a.seconds = 2;
                a.runs = 1;
                a.concurrency = 32;
                a.rss_waits = vec![500];
                i += 1;
                continue;
            }
            "--bench" => {
                i += 1;
                continue;
            }
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    a
}

fn admin_url() -> String {
    std::env::var("WAITD_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

struct Db {
    name: String,
    url: String,
}

async fn new_db() -> Db {
    let admin = admin_url();
    let name = format!("waitd_bench_{}", uuid::Uuid::now_v7().simple());
    let mut c = sqlx::PgConnection::connect(&admin)
        .await
        .expect("the benchmark needs Postgres");
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut c)
        .await
        .unwrap();
    let base = admin.rsplit_once('/').map(|(b, _)| b.to_string()).unwrap();
    Db {
        url: format!("{base}/{name}"),
        name,
    }
}

async fn drop_db(db: &Db) {
    if let Ok(mut c) = sqlx::PgConnection::connect(&admin_url()).await {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            db.name
        )))
        .execute(&mut c)
        .await;
    }
}

/// Rows written in the database so far (inserted + updated + deleted).
async fn rows_written(db: &Db) -> i64 {
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as(
        "SELECT (tup_inserted + tup_updated + tup_deleted)::bigint FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    n
}

/// An upstream that always answers a healthy in-progress state, counting hits.
async fn upstream() -> (String, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    let app = axum::Router::new().route(
        "/{*p}",
        axum::routing::get(move || {
            let h = h.clone();
            async move {
                h.fetch_add(1, Relaxed);
                (
                    [("content-type", "application/json")],
                    r#"{"data":{"attributes":{"status":"deploying"}}}"#,
                )
            }
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (base, hits)
}

fn client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .build()
        .unwrap()
}

/// (1) The limit: a plain reqwest loop at the given concurrency → requests/s.
async fn limit(base: &str, concurrency: usize, seconds: u64) -> f64 {
    let c = client();
    let n = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (c, n, url) = (c.clone(), n.clone(), format!("{base}/servers/{i}"));
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                if let Ok(r) = c.get(&url).send().await {
                    let _ = r.bytes().await;
                    n.fetch_add(1, Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    n.load(Relaxed) as f64 / seconds as f64
}

struct Waitd {
    base: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

async fn start_waitd(db: &Db, concurrency: usize) -> Waitd {
    let config = waitd::Config::from_args([
        "--database-url",
        &db.url,
        "--min-poll-interval",
        "1ms",
        "--allow-targets",
        "127.0.0.1",
        "--concurrency",
        &concurrency.to_string(),
        // Every wait here polls the same upstream: let the per-host bound match.
        "--per-host-concurrency",
        &concurrency.to_string(),
        "--db-connections",
        "16",
    ])
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(waitd::serve(l, config, async move {
        let _ = rx.await;
    }));
    let c = client();
    for _ in 0..500 {
        if c.get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Waitd { base, stop, task }
}

async fn stop_waitd(w: Waitd) {
    let _ = w.stop.send(());
    let _ = w.task.await;
}

/// (6) Creates `n` waits with 32 concurrent clients → creates/s.
async fn create_waits(waitd: &str, upstream: &str, n: usize, interval: &str) -> f64 {
    let c = client();
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, next, waitd, upstream, interval) = (
            c.clone(),
            next.clone(),
            waitd.to_string(),
            upstream.to_string(),
            interval.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Relaxed) as usize;
                if i >= n {
                    break;
                }
                let spec = json!({
                    "target": {"url": format!("{upstream}/servers/{i}")},
                    "state": "/data/attributes/status",
                    "want": ["on"],
                    "timeout": "1h",
                    "poll": {"initial": interval, "factor": 1, "max": interval, "jitter": 0,
                             "delay": if interval == "1h" { "30m" } else { "0s" }},
                });
                let r = c
                    .post(format!("{waitd}/waits"))
                    .json(&spec)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    n as f64 / started.elapsed().as_secs_f64()
}

/// The metrics of a waitd, parsed: name{labels} → value.
async fn metrics(waitd: &str) -> std::collections::HashMap<String, f64> {
    let text = client()
        .get(format!("{waitd}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            l.rsplit_once(' ')
                .and_then(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
        })
        .collect()
}

fn polls(m: &std::collections::HashMap<String, f64>) -> f64 {
    m.iter()
        .filter(|(k, _)| k.starts_with("waitd_polls_total"))
        .map(|(_, v)| v)
        .sum()
}

/// A percentile of the schedule-lag histogram between two scrapes, interpolated
/// within its bucket (seconds).
fn lag_percentile(
    a: &std::collections::HashMap<String, f64>,
    b: &std::collections::HashMap<String, f64>,
    q: f64,
) -> f64 {
    let mut buckets: Vec<(f64, f64)> = b
        .iter()
        .filter_map(|(k, v)| {
            let le = k
                .strip_prefix("waitd_schedule_lag_seconds_bucket{le=\"")?
                .strip_suffix("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, v - a.get(k).copied().unwrap_or(0.0)))
        })
        .collect();
    buckets.sort_by(|x, y| x.0.partial_cmp(&y.0).unwrap());
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total == 0.0 {
        return f64::NAN;
    }
    let target = total * q;
    let (mut prev_le, mut prev_n) = (0.0, 0.0);
    for (le, n) in buckets {
        if n >= target {
            if le.is_infinite() {
                return prev_le;
            }
            let frac = if n > prev_n {
                (target - prev_n) / (n - prev_n)
            } else {
                1.0
            };
            return prev_le + (le - prev_le) * frac;
        }
        prev_le = le;
        prev_n = n;
    }
    prev_le
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Waits until waitd holds `n` waits (all claimed).
async fn until_held(waitd: &str, n: usize) {
    for _ in 0..6000 {
        let m = metrics(waitd).await;
        if m.get("waitd_held_waits").copied().unwrap_or(0.0) as usize >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("waitd never held {n} waits");
}

struct Run {
    limit: f64,
    steady: f64,
    stmts_per_poll: f64,
    rows_per_poll: f64,
    lag_p50: f64,
    lag_p99: f64,
    lag_at_rate: f64,
    lag_stmts: f64,
    create: f64,
}

async fn one_run(a: &Args) -> Run {
    let (up, _hits) = upstream().await;
    let limit = limit(&up, a.concurrency, a.seconds).await;

    // (2), (3): saturated — waits due as fast as the floor allows.
    let db = new_db().await;
    let w = start_waitd(&db, a.concurrency).await;
    create_waits(&w.base, &up, a.waits, "1ms").await;
    until_held(&w.base, a.waits).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (m0, r0) = (metrics(&w.base).await, rows_written(&db).await);
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let (m1, r1) = (metrics(&w.base).await, rows_written(&db).await);
    let p = polls(&m1) - polls(&m0);
    let steady = p / a.seconds as f64;
    let stmts = m1["waitd_db_writes_total"] - m0["waitd_db_writes_total"];
    let stmts_per_poll = stmts / p;
    // Subtract the benchmark's own reads? pg_stat counts only written tuples.
    let rows_per_poll = (r1 - r0) as f64 / p;
    stop_waitd(w).await;
    drop_db(&db).await;

    // (6): create throughput alone: waits whose first poll is half an hour away.
    let db = new_db().await;
    let w = start_waitd(&db, a.concurrency).await;
    let create = create_waits(&w.base, &up, a.waits, "1h").await;
    stop_waitd(w).await;
    drop_db(&db).await;

    // (4): schedule lag at a fixed rate: every wait polled once an interval.
    let db = new_db().await;
    let w = start_waitd(&db, a.concurrency).await;
    create_waits(&w.base, &up, a.waits, &a.interval).await;
    until_held(&w.base, a.waits).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m0 = metrics(&w.base).await;
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let m1 = metrics(&w.base).await;
    let lag_at_rate = (polls(&m1) - polls(&m0)) / a.seconds as f64;
    let lag_stmts =
        (m1["waitd_db_writes_total"] - m0["waitd_db_writes_total"]) / (polls(&m1) - polls(&m0));
    let lag_p50 = lag_percentile(&m0, &m1, 0.5);
    let lag_p99 = lag_percentile(&m0, &m1, 0.99);
    stop_waitd(w).await;
    drop_db(&db).await;

    Run {
        limit,
        steady,
        stmts_per_poll,
        rows_per_poll,
        lag_p50,
        lag_p99,
        lag_at_rate,
        lag_stmts,
        create,
    }
}

/// (5) RSS per held wait: memory growth from no waits to `n` held, divided by n.
async fn rss_per_wait(n: usize) -> f64 {
    let (up, _) = upstream().await;
    let db = new_db().await;
    let w = start_waitd(&db, 256).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib();
    // One wait through the API, then n - 1 copies of its rows straight into the
    // database: the figure is memory per held wait, not create speed.
    create_waits(&w.base, &up, 1, "59m").await;
    clone_waits(&db, n - 1).await;
    // Each is polled once when claimed, then idle for an hour: all held, none in flight.
    until_held(&w.base, n).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib();
    stop_waitd(w).await;
    drop_db(&db).await;
    (after.saturating_sub(before)) as f64 * 1024.0 / n as f64
}

/// Copies the one wait in the database `n` times (new ids, due now).
async fn clone_waits(db: &Db, n: usize) {
    if n == 0 {
        return;
    }
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query(
        "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
         SELECT gen_random_uuid(), w.tenant, 'running', w.created_at, w.updated_at, w.deadline, now(), w.labels, w.engine, 1
         FROM waits w, generate_series(1, $1) WHERE w.status = 'running'",
    )
    .bind(n as i64)
    .execute(&mut c)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO wait_specs (wait_id, spec, headers)
         SELECT w.id, s.spec, s.headers FROM waits w, (SELECT spec, headers FROM wait_specs LIMIT 1) s
         WHERE NOT EXISTS (SELECT 1 FROM wait_specs x WHERE x.wait_id = w.id)",
    )
    .execute(&mut c)
    .await
    .unwrap();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let a = args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut runs = Vec::new();
        for i in 0..a.runs {
            eprintln!("run {}/{} …", i + 1, a.runs);
            runs.push(one_run(&a).await);
        }
        let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let limit = m(|r| r.limit);
        let steady = m(|r| r.steady);
        println!("waitd load benchmark: {} waits, {} s per phase, median of {} run(s), probe concurrency {}", a.waits, a.seconds, a.runs, a.concurrency);
        println!();
        println!("| # | figure | value | target |");
        println!("|---|---|---|---|");
        println!("| 1 | limit: plain reqwest loop, same upstream and concurrency | {limit:.0} req/s | |");
        println!("| 2 | waitd steady state, {} waits due at the 1 ms floor | {steady:.0} polls/s ({:.2} of the limit) | ≥ 0.8 |", a.waits, steady / limit);
        println!("| 3 | database write statements per poll (waitd's counter) | {:.4} | ≤ 0.02 |", m(|r| r.stmts_per_poll));
        println!("| 3b | database rows written per poll (pg_stat_database) | {:.4} | |", m(|r| r.rows_per_poll));
        println!("| 4 | schedule lag at {:.0} polls/s: p50 / p99 (histogram-interpolated) | {:.1} ms / {:.1} ms | p99 ≤ 20 ms |", m(|r| r.lag_at_rate), m(|r| r.lag_p50) * 1e3, m(|r| r.lag_p99) * 1e3);
        println!("| 4b | write statements per poll at {:.0} polls/s ({} waits every {}) | {:.4} | |", m(|r| r.lag_at_rate), a.waits, a.interval, m(|r| r.lag_stmts));
        println!("| 6 | create throughput, 32 concurrent clients | {:.0} waits/s | ≥ 2000 |", m(|r| r.create));
        for n in &a.rss_waits {
            let per = rss_per_wait(*n).await;
            println!("| 5 | RSS per held wait at {n} waits | {:.2} KiB | ≤ 4 KiB |", per / 1024.0);
        }
        let _ = Value::Null;
    });
}
