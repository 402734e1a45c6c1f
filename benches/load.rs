//! The load benchmark: waitd's polling rate against the physical limit of the same
//! upstream, database writes per poll, schedule lag, memory per wait, and create
//! throughput — in one run, printed as a table.
//!
//!     cargo bench --bench load -- [--waits 10000] [--seconds 10] [--runs 3] [--smoke]
//!         [--only events --events-waits 100000 --events-window 2s]
//!
//! Needs Postgres (WAITD_TEST_DATABASE_URL, default the local server); it creates and
//! drops its own databases. Everything runs on 127.0.0.1.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::Connection;
use tokio::net::TcpListener;

// The tests' harness: their databases, waitd in-process and as replicas.
#[path = "../tests/support/mod.rs"]
mod support;

use support::replica::Replica;
use support::{App, TempDir, TestDb};

// (13), the noisy neighbour: a phase of its own, in a file of its own.
#[path = "load/noisy.rs"]
mod noisy;
// (15), shared polls: a phase in a file of its own.
#[path = "load/shared.rs"]
mod shared;

#[path = "load/cel_budget.rs"]
mod cel_budget;

#[path = "load/scale_kill.rs"]
mod scale_kill;

// (17), callback waits: a phase in a file of its own.
#[path = "load/callbacks.rs"]
mod callbacks;

// (18), event sources: a phase in a file of its own.
#[path = "load/events.rs"]
mod events;

/// The allocator the waitd binary ships with, so that the in-process phases measure
/// what runs (the limit loop gets it too).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How the scale phase's waits reach the replicas: in slots a fleet that stopped
/// released (each replica takes whole slots), or unowned, as creates are until
/// their first claim and as an import leaves them (each claimed on its own).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
enum ScaleFrom {
    #[default]
    Released,
    Unowned,
}

impl ScaleFrom {
    fn name(self) -> &'static str {
        match self {
            ScaleFrom::Released => "in released slots",
            ScaleFrom::Unowned => "unowned",
        }
    }
}

struct Args {
    waits: usize,
    seconds: u64,
    runs: usize,
    concurrency: usize,
    rss_waits: Vec<usize>,
    /// The fixed poll interval of the schedule-lag phase.
    interval: String,
    /// SSE followers in the flip-to-terminal latency phase.
    followers: usize,
    /// The phases to run (all by default): limit, steady, lag, create, rss, flip,
    /// takeover, fanout, cel, webhooks, scale, noisy, shared, callbacks, events.
    only: Vec<String>,
    /// Waits and their poll interval in the scale phase.
    scale_waits: usize,
    scale_interval: Duration,
    /// Replicas sharing the scale phase's waits.
    scale_replicas: usize,
    /// Whether the scale phase ends with `kill -9` of a replica and times the
    /// takeover of its waits (`--scale-kill`).
    scale_kill: bool,
    /// Where the scale phase's waits come from, each case in turn
    /// (`--scale-from released,unowned`, both by default).
    scale_from: Vec<ScaleFrom>,
    /// How long the scale phase measures (one interval unless given): ten lease
    /// TTLs or more (300 s) take in a round of the checkpoints of unchanged polls.
    scale_measure: Option<Duration>,
    /// The noisy-neighbour phase's store: Postgres (like every other phase), or a
    /// SQLite file.
    noisy_sqlite: bool,
    /// What tenant A sends in the noisy-neighbour phase (all of it by default).
    noisy_inputs: Vec<String>,
    /// The window the callback phase's POSTs are spread over.
    callbacks_window: Duration,
    /// Waits listening in the event-source phase.
    events_waits: usize,
    /// The window the event-source phase's sampled events are spread over.
    events_window: Duration,
    smoke: bool,
}

impl Args {
    fn runs(&self, phase: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == phase)
    }
}

fn args() -> Args {
    let mut a = Args {
        waits: 10_000,
        seconds: 10,
        runs: 3,
        concurrency: 256,
        rss_waits: vec![10_000, 100_000],
        interval: "1s".into(),
        followers: 1000,
        only: Vec::new(),
        scale_waits: 1_000_000,
        scale_measure: None,
        scale_interval: Duration::from_secs(60),
        scale_replicas: 1,
        scale_kill: false,
        scale_from: vec![ScaleFrom::Released, ScaleFrom::Unowned],
        noisy_sqlite: false,
        noisy_inputs: noisy::INPUTS.map(String::from).to_vec(),
        callbacks_window: Duration::from_secs(1),
        events_waits: 100_000,
        events_window: Duration::from_secs(2),
        smoke: false,
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
            "--followers" => a.followers = v.parse().expect("--followers N"),
            "--scale-waits" => a.scale_waits = v.parse().expect("--scale-waits N"),
            "--scale-interval" => {
                a.scale_interval =
                    waitd::engine::duration::parse(&v).expect("--scale-interval DURATION")
            }
            "--scale-replicas" => a.scale_replicas = v.parse().expect("--scale-replicas N"),
            "--scale-from" => {
                a.scale_from = v
                    .split(',')
                    .map(|f| match f {
                        "released" => ScaleFrom::Released,
                        "unowned" => ScaleFrom::Unowned,
                        _ => panic!("--scale-from takes released and unowned, not {f}"),
                    })
                    .collect()
            }
            "--scale-measure" => {
                a.scale_measure =
                    Some(waitd::engine::duration::parse(&v).expect("--scale-measure DURATION"))
            }
            "--noisy-store" => {
                a.noisy_sqlite = match v.as_str() {
                    "postgres" => false,
                    "sqlite" => true,
                    _ => panic!("--noisy-store takes postgres or sqlite, not {v}"),
                }
            }
            "--callbacks-window" => {
                a.callbacks_window =
                    waitd::engine::duration::parse(&v).expect("--callbacks-window DURATION")
            }
            "--events-waits" => a.events_waits = v.parse().expect("--events-waits N"),
            "--events-window" => {
                a.events_window =
                    waitd::engine::duration::parse(&v).expect("--events-window DURATION")
            }
            "--noisy-inputs" => {
                a.noisy_inputs = v.split(',').map(str::to_string).collect();
                for i in &a.noisy_inputs {
                    assert!(
                        noisy::INPUTS.contains(&i.as_str()),
                        "--noisy-inputs takes inputs from {:?}, not {i}",
                        noisy::INPUTS
                    );
                }
            }
            "--only" => {
                a.only = v.split(',').map(str::to_string).collect();
                for p in &a.only {
                    assert!(
                        PHASES.contains(&p.as_str()),
                        "--only takes phases from {PHASES:?}, not {p}"
                    );
                }
            }
            "--smoke" => {
                a.waits = 200;
                a.seconds = 2;
                a.runs = 1;
                a.concurrency = 32;
                a.rss_waits = vec![500];
                a.followers = 20;
                a.scale_waits = 2_000;
                a.scale_interval = Duration::from_secs(2);
                a.events_waits = 300;
                a.smoke = true;
                i += 1;
                continue;
            }
            "--scale-kill" => {
                a.scale_kill = true;
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

const PHASES: [&str; 15] = [
    "limit",
    "steady",
    "lag",
    "create",
    "rss",
    "flip",
    "takeover",
    "fanout",
    "cel",
    "webhooks",
    "scale",
    "noisy",
    "shared",
    "callbacks",
    "events",
];

/// What the database has written so far: rows (inserted + updated + deleted, from
/// `pg_stat_database`, which backends report up to seconds late) and WAL bytes (the
/// server's WAL position, exact at once; the server is the benchmark's own here).
async fn rows_written(db: &TestDb) -> (i64, i64) {
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query_as(
        "SELECT (tup_inserted + tup_updated + tup_deleted)::bigint,
                (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint
         FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(&mut c)
    .await
    .unwrap()
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

/// No timeout: a follower's stream lasts the whole phase.
fn client() -> reqwest::Client {
    support::client_builder()
        .pool_max_idle_per_host(1024)
        .build()
        .unwrap()
}

/// CPU seconds used so far by process `pid` ("self" for this one).
fn cpu_of(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        // Linux reports in clock ticks of 1/100 s.
        .map_or(0.0, |ticks| ticks / 100.0)
}

/// CPU seconds used so far by this process and by every `postgres` process: what a
/// poll or a request costs, whatever the machine's speed at the moment.
fn cpu_seconds() -> f64 {
    let mut total = cpu_of("self");
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let pid = e.file_name().to_string_lossy().to_string();
            if pid.bytes().all(|b| b.is_ascii_digit())
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "postgres")
            {
                total += cpu_of(&pid);
            }
        }
    }
    total
}

/// (1) The limit: a plain reqwest loop at the given concurrency → requests/s, and
/// the CPU each request cost (µs).
async fn limit(base: &str, concurrency: usize, seconds: u64) -> (f64, f64) {
    let cpu0 = cpu_seconds();
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
    let n = n.load(Relaxed) as f64;
    (n / seconds as f64, (cpu_seconds() - cpu0) * 1e6 / n)
}

/// (1b) The same limit through a bare hyper client (one client, a pooled
/// connection per task): what a poll's request costs without reqwest's layers,
/// which waitd's probes do without too → requests/s, and the CPU a request (µs).
async fn limit_hyper(base: &str, concurrency: usize, seconds: u64) -> (f64, f64) {
    use http_body_util::{BodyExt, Empty};
    let cpu0 = cpu_seconds();
    let c: hyper_util::client::legacy::Client<_, Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let n = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (c, n) = (c.clone(), n.clone());
        let uri: http::Uri = format!("{base}/servers/{i}").parse().unwrap();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                if let Ok(r) = c.get(uri.clone()).await
                    && r.into_body().collect().await.is_ok()
                {
                    n.fetch_add(1, Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let n = n.load(Relaxed) as f64;
    (n / seconds as f64, (cpu_seconds() - cpu0) * 1e6 / n)
}

/// waitd in this process, with the tests' flags and the benchmark's concurrency.
async fn start_waitd(db: &TestDb, concurrency: usize, extra: &[&str]) -> App {
    let conc = concurrency.to_string();
    let mut args = support::test_args(&db.url);
    // Every wait here polls the same upstream: let the per-host bound match.
    for (flag, value) in [
        ("--concurrency", conc.as_str()),
        ("--per-host-concurrency", &conc),
        ("--db-connections", "16"),
        // Unchanged polls are checkpointed once a TTL: with 10 s, a 10 s phase
        // holds one round of checkpoints (the default TTL, 30 s, writes a third as
        // often).
        ("--lease-ttl", "10s"),
    ] {
        args = support::set_flag(args, flag, value);
    }
    args.extend(extra.iter().map(|s| s.to_string()));
    App::start_args(args).await
}

/// (6) Creates `n` waits with 32 concurrent clients → creates/s.
async fn create_waits(waitd: &str, upstream: &str, n: usize, interval: &str) -> f64 {
    let (upstream, interval) = (upstream.to_string(), interval.to_string());
    create_specs(waitd, n, move |i| {
        json!({
            "target": {"url": format!("{upstream}/servers/{i}")},
            "state": "/data/attributes/status",
            "want": ["on"],
            "timeout": "1h",
            "poll": {"initial": interval, "factor": 1, "max": interval, "jitter": 0,
                     "delay": if interval == "1h" { "30m" } else { "0s" }},
        })
    })
    .await
}

/// Creates the `n` waits `spec` describes with 32 concurrent clients → creates/s.
async fn create_specs<F>(waitd: &str, n: usize, spec: F) -> f64
where
    F: Fn(usize) -> Value + Send + Sync + 'static,
{
    let c = client();
    let next = Arc::new(AtomicU64::new(0));
    let spec = Arc::new(spec);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, next, waitd, spec) = (c.clone(), next.clone(), waitd.to_string(), spec.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Relaxed) as usize;
                if i >= n {
                    break;
                }
                let r = c
                    .post(format!("{waitd}/waits"))
                    .json(&spec(i))
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

/// A Deployment of about 2 KB, as the Kubernetes API serves it, mid-rollout.
fn deployment_body() -> String {
    let containers: Vec<Value> = (0..3)
        .map(|i| json!({"name": format!("app-{i}"), "image": format!("registry.example.com/team/app-{i}:1.4.{i}"),
            "ports": [{"containerPort": 8080 + i, "protocol": "TCP"}],
            "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}}}))
        .collect();
    let body = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default", "generation": 4,
            "uid": "8764ae47-9092-11e4-8393-42010af018ff", "resourceVersion": "123456",
            "labels": {"app": "web", "tier": "frontend"},
            "annotations": {"deployment.kubernetes.io/revision": "4"}},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": containers}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}},
        "status": {"observedGeneration": 4, "replicas": 4, "updatedReplicas": 2, "readyReplicas": 3,
            "availableReplicas": 3, "unavailableReplicas": 1,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability.", "lastUpdateTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T10:00:00Z"},
                {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated",
                 "message": "ReplicaSet \"web-5d4f8c7b9\" is progressing.", "lastUpdateTime": "2026-12-01T10:05:00Z", "lastTransitionTime": "2026-12-01T10:00:00Z"}
            ]}
    });
    body.to_string()
}

/// An upstream that answers [`deployment_body`] on every path; with `?vary`, a
/// body whose `resourceVersion` differs at every answer (of the same length).
async fn deployment_upstream() -> String {
    let body: &'static str = Box::leak(deployment_body().into_boxed_str());
    let n = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/{*p}",
        axum::routing::get(move |q: axum::extract::RawQuery| async move {
            // The same work either way, so the two upstreams cost alike.
            let v = if q.0.is_some() {
                format!("{:06}", n.fetch_add(1, Relaxed) % 1_000_000)
            } else {
                "123456".to_string()
            };
            let text = body.replace("\"123456\"", &format!("\"{v}\""));
            ([("content-type", "application/json")], text)
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    base
}

/// The conditions of the `cel` phase: the kubernetes.rollout preset's (false on
/// [`deployment_body`]: the rollout is under way, so every poll evaluates both).
fn rollout_conditions() -> (Value, Value) {
    let p = waitd::presets::Registry::builtin();
    let request = &p
        .get("kubernetes.rollout")
        .expect("a built-in preset")
        .request;
    (
        request["success_condition"].clone(),
        request["failure_condition"].clone(),
    )
}

/// (10) CPU per poll of waits polling a 2 KB Deployment at the 1 ms floor, by the
/// state path alone, with the rollout conditions besides on an unchanged body, and
/// with them on a body that changes at every answer: µs each.
async fn cel_service(a: &Args) -> [f64; 3] {
    let up = deployment_upstream().await;
    let (success, failure) = rollout_conditions();
    let mut cpu = [0.0; 3];
    // The state path alone is taken before and after the others, and averaged:
    // the machine's speed drifts within a run.
    let variants = [
        (0, false, false),
        (1, true, false),
        (2, true, true),
        (0, false, false),
    ];
    for (k, with, vary) in variants {
        let db = TestDb::new().await;
        let w = start_waitd(&db, a.concurrency, &[]).await;
        let (up, success, failure) = (up.clone(), success.clone(), failure.clone());
        create_specs(&w.base, a.waits, move |i| {
            let mut spec = json!({
                "target": {"url": format!("{up}/apis/apps/v1/namespaces/default/deployments/web-{i}{}", if vary { "?vary" } else { "" })},
                "state": "/status/conditions/1/reason",
                "want": ["NewReplicaSetAvailable"],
                "timeout": "1h",
                "poll": {"initial": "1ms", "factor": 1, "max": "1ms", "jitter": 0},
            });
            if with {
                spec["success_condition"] = success.clone();
                spec["failure_condition"] = failure.clone();
            }
            spec
        })
        .await;
        until_held(&w.base, a.waits).await;
        until_first_polls_written(&db).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let m0 = metrics(&w.base).await;
        // This process only (waitd and the upstream): the conditions cost Postgres
        // nothing, and its background work (autovacuum on the fresh rows) would
        // only add noise.
        let cpu0 = cpu_of("self");
        tokio::time::sleep(Duration::from_secs(a.seconds)).await;
        let cpu1 = cpu_of("self");
        let m1 = metrics(&w.base).await;
        let p = polls(&m1) - polls(&m0);
        let this = (cpu1 - cpu0) * 1e6 / p;
        cpu[k] = if k == 0 && cpu[0] > 0.0 {
            (cpu[0] + this) / 2.0
        } else {
            this
        };
        let writes = m1["waitd_db_writes_total"] - m0["waitd_db_writes_total"];
        let decided = |d: &str| {
            let k = format!("waitd_condition_responses_total{{decided=\"{d}\"}}");
            m1.get(&k).copied().unwrap_or(0.0) - m0.get(&k).copied().unwrap_or(0.0)
        };
        eprintln!(
            "cel phase, {}: {:.0} polls/s, {:.1} µs of CPU a poll, {:.4} write statements a poll, conditions evaluated on {:.0} responses and decided as before on {:.0}",
            match (with, vary) {
                (false, _) => "state path alone",
                (true, false) => "with the conditions, unchanged body",
                (true, true) => "with the conditions, changing body",
            },
            p / a.seconds as f64,
            this,
            writes / p,
            decided("evaluated"),
            decided("as_before")
        );
        w.stop().await.0.expect("waitd stops cleanly");
        db.drop_db().await;
    }
    cpu
}

/// (10b) The same work without the service around it, on one thread: parsing the
/// 2 KB body and reading its state path; that and evaluating both conditions
/// (`probe::judge`); that and the key of a response decided before
/// (`probe::Memo::key_of`); alternating blocks, µs per poll each, and µs to compile
/// both.
fn cel_micro() -> (f64, f64, f64, f64) {
    use waitd::engine::{Budget, Limits, Observation, Spec};
    let body = deployment_body();
    let (success, failure) = rollout_conditions();
    let spec = |with: bool| {
        let mut r = json!({"target": {"url": "http://127.0.0.1:9/"}, "state": "/status/conditions/1/reason", "want": ["NewReplicaSetAvailable"]});
        if with {
            r["success_condition"] = success.clone();
            r["failure_condition"] = failure.clone();
        }
        Spec::from_request(&r, &Limits::default()).unwrap()
    };
    let (plain, judged) = (spec(false), spec(true));
    let headers = std::collections::BTreeMap::from([(
        "content-type".to_string(),
        "application/json".to_string(),
    )]);
    let poll = |s: &Spec| {
        let json: Value = serde_json::from_slice(body.as_bytes()).unwrap();
        let values = s
            .state
            .as_ref()
            .unwrap()
            .state_values(&json, &mut Budget::default())
            .unwrap();
        let base = match values {
            waitd::engine::Selected::Values(values) => Observation::State {
                values,
                detail: None,
            },
            _ => unreachable!("the body has the state"),
        };
        if s.success_condition.is_some() {
            std::hint::black_box(waitd::probe::judge(s, 200, &headers, Some(&json), base));
        } else {
            std::hint::black_box(base);
        }
    };
    // A response the conditions decided before: its key, and the same path.
    let hit = |s: &Spec| {
        std::hint::black_box(waitd::probe::Memo::key_of(200, body.as_bytes(), &headers));
        poll(s);
    };
    let n = 2_000;
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..15 {
        for (k, out) in [&mut a, &mut b, &mut c].into_iter().enumerate() {
            let t = Instant::now();
            for _ in 0..n {
                match k {
                    0 => poll(&plain),
                    1 => poll(&judged),
                    _ => hit(&plain),
                }
            }
            out.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        }
    }
    let t = Instant::now();
    for _ in 0..200 {
        std::hint::black_box(spec(true));
    }
    let with_compile = t.elapsed().as_secs_f64() * 1e6 / 200.0;
    let t = Instant::now();
    for _ in 0..200 {
        std::hint::black_box(spec(false));
    }
    let compile = with_compile - t.elapsed().as_secs_f64() * 1e6 / 200.0;
    (median(a), median(b), median(c), compile)
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

/// The metrics of several waitd processes, summed by name.
async fn metrics_of(bases: &[String]) -> std::collections::HashMap<String, f64> {
    let mut ms = Vec::new();
    for b in bases {
        ms.push(metrics(b).await);
    }
    merged(ms)
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

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Waits until every wait's first poll is written (its state is known), so that a
/// measurement sees the steady state, not the first writes.
async fn until_first_polls_written(db: &TestDb) {
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let c = tokio::sync::Mutex::new(&mut c);
    let written = support::eventually(Duration::from_secs(300), || async {
        let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM waits WHERE state IS NULL")
            .fetch_one(&mut **c.lock().await)
            .await
            .unwrap();
        n == 0
    });
    assert!(written.await, "the first polls were never all written");
}

/// Waits until waitd holds `n` waits (all claimed).
async fn until_held(waitd: &str, n: usize) {
    let held = support::eventually(Duration::from_secs(300), || async {
        metrics(waitd)
            .await
            .get("waitd_held_waits")
            .copied()
            .unwrap_or(0.0) as usize
            >= n
    });
    assert!(held.await, "waitd never held {n} waits");
}

/// One run's figures; NaN where the phase was not run.
struct Run {
    limit: f64,
    /// (1b) the bare hyper loop, and its CPU a request.
    limit_hyper: f64,
    cpu_per_request_hyper: f64,
    steady: f64,
    cpu_per_poll: f64,
    cpu_per_request: f64,
    stmts_per_poll: f64,
    rows_per_poll: f64,
    wal_per_poll: f64,
    lag_p50: f64,
    lag_p99: f64,
    lag_at_rate: f64,
    lag_stmts: f64,
    lag_rows: f64,
    lag_wal: f64,
    create: f64,
    create_near: f64,
    /// What a create costs Postgres: rows written, WAL bytes, CPU µs.
    create_cost: (f64, f64, f64),
    rss: Vec<f64>,
    flip_p50: f64,
    flip_p99: f64,
    takeover: f64,
    fanout: Fanout,
    /// (10) CPU per poll by the state path, with the conditions too on an
    /// unchanged body, and on a changing one, µs.
    cel_cpu: [f64; 3],
    /// (10c): the slowest hostile condition's time to its budget, ms, and which.
    cel_budget: (f64, &'static str),
    /// (10b) the same without the service: path, evaluated, decided before, and
    /// compiling both conditions, µs.
    cel_micro: (f64, f64, f64, f64),
    /// (11) waits ending at once, each announcing it to a webhook.
    hooks: Hooks,
    /// (12) many waits on one replica.
    scale: Vec<Scale>,
    /// (13) one tenant's figures, alone and while another attacks.
    noisy: noisy::Noisy,
    /// (15) waits sharing their polls.
    shared: shared::Shared,
    /// (17) callback waits ended by their POSTs.
    callbacks: callbacks::Callbacks,
    /// (18) waits listening to an event source.
    events: events::Events,
}

/// (12) The scale phase's figures.
#[derive(Clone, Default)]
struct Scale {
    /// Where the waits came from.
    from: ScaleFrom,
    /// The SQL insert of the rows, s.
    insert_s: f64,
    /// From the insert's commit until every wait is held, s.
    hold_s: f64,
    /// CPU meanwhile a wait held, waitd's replicas and Postgres (µs): its slot
    /// taken and read, and the polls of the waits held already.
    hold_waitd_us: f64,
    hold_pg_us: f64,
    /// Resident memory of the replicas at the end, GiB, and per wait, KiB.
    rss_gib: f64,
    rss_per_wait_kib: f64,
    /// Polls a second over the window, and the schedule's.
    polls_per_s: f64,
    schedule_per_s: f64,
    /// Schedule lag per sub-window: p50, p99 (s).
    windows: Vec<(f64, f64)>,
    /// CPU a poll: waitd's replicas, Postgres (µs); cores used by both.
    waitd_us: f64,
    pg_us: f64,
    cores: f64,
    /// With `--scale-kill`: the takeover of a killed replica's waits.
    takeover: Option<scale_kill::Takeover>,
    /// Postgres over the window: rows written and WAL bytes per poll.
    rows_per_poll: f64,
    wal_per_poll: f64,
    /// Postgres's `shared_buffers`, which decides whether the waits stay in its
    /// cache, and `max_wal_size`, which decides how often a checkpoint comes (and
    /// with it a full-page image of every page written next): "shared_buffers 3GB,
    /// max_wal_size 16GB".
    pg_settings: String,
    /// Connections to Postgres a replica holds, at the end of the window.
    connections: f64,
    /// The window's length, s.
    measured_s: f64,
}

/// (11) The webhook phase's figures.
#[derive(Clone, Copy)]
struct Hooks {
    /// From the end's event to the receiver's 2xx: p50 / p99, ms.
    p50: f64,
    p99: f64,
    /// From the flip to the last delivery, ms.
    all: f64,
    /// What a delivery adds to the same ends without webhooks: rows written and WAL
    /// bytes, per delivery.
    rows: f64,
    wal: f64,
    /// What an end costs Postgres without webhooks (its polls over the window
    /// included): rows written, WAL bytes and CPU µs, per end.
    end: (f64, f64, f64),
}

impl Hooks {
    const NONE: Hooks = Hooks {
        p50: f64::NAN,
        p99: f64::NAN,
        all: f64::NAN,
        rows: f64::NAN,
        wal: f64::NAN,
        end: (f64::NAN, f64::NAN, f64::NAN),
    };
}

/// (9) The fan-out phase's figures.
#[derive(Clone, Copy)]
struct Fanout {
    /// Events a second each follower received.
    events_per_s: f64,
    /// waitd's CPU per event delivered to one follower, µs.
    cpu_per_delivery: f64,
    /// Postgres's CPU per event (once, whatever the followers), µs.
    pg_cpu_per_event: f64,
    /// Create latency before the storm, p50 / p99, ms.
    create_p50: f64,
    create_p99: f64,
    /// Create latency while 1,000 more followers connect and replay, p50 / p99, ms.
    storm_p50: f64,
    storm_p99: f64,
    /// Time until every storm follower has its stream open, s.
    storm_open: f64,
}

impl Fanout {
    const NONE: Fanout = Fanout {
        events_per_s: f64::NAN,
        cpu_per_delivery: f64::NAN,
        pg_cpu_per_event: f64::NAN,
        create_p50: f64::NAN,
        create_p99: f64::NAN,
        storm_p50: f64::NAN,
        storm_p99: f64::NAN,
        storm_open: f64::NAN,
    };
}

async fn one_run(a: &Args) -> Run {
    let mut run = Run {
        limit: f64::NAN,
        steady: f64::NAN,
        cpu_per_poll: f64::NAN,
        cpu_per_request: f64::NAN,
        limit_hyper: f64::NAN,
        cpu_per_request_hyper: f64::NAN,
        stmts_per_poll: f64::NAN,
        rows_per_poll: f64::NAN,
        wal_per_poll: f64::NAN,
        lag_p50: f64::NAN,
        lag_p99: f64::NAN,
        lag_at_rate: f64::NAN,
        lag_stmts: f64::NAN,
        lag_rows: f64::NAN,
        lag_wal: f64::NAN,
        create: f64::NAN,
        create_near: f64::NAN,
        create_cost: (f64::NAN, f64::NAN, f64::NAN),
        rss: Vec::new(),
        flip_p50: f64::NAN,
        flip_p99: f64::NAN,
        takeover: f64::NAN,
        fanout: Fanout::NONE,
        cel_cpu: [f64::NAN; 3],
        cel_budget: (f64::NAN, ""),
        cel_micro: (f64::NAN, f64::NAN, f64::NAN, f64::NAN),
        hooks: Hooks::NONE,
        scale: Vec::new(),
        noisy: noisy::Noisy::NONE,
        shared: shared::Shared::NONE,
        callbacks: callbacks::Callbacks::NONE,
        events: events::Events::NONE,
    };
    if a.runs("cel") {
        run.cel_micro = cel_micro();
        run.cel_budget = cel_budget::slowest();
        run.cel_cpu = cel_service(a).await;
    }
    let (up, _hits) = upstream().await;
    // The limit is taken twice, around the steady phase, and averaged: the machine's
    // speed drifts, and the ratio should compare like with like.
    let mut limits = Vec::new();
    let mut hyper_limits: Vec<(f64, f64)> = Vec::new();
    if a.runs("limit") {
        limits.push(limit(&up, a.concurrency, a.seconds).await);
        hyper_limits.push(limit_hyper(&up, a.concurrency, a.seconds).await);
    }

    // (2), (3): saturated — waits due as fast as the floor allows.
    if a.runs("steady") {
        let db = TestDb::new().await;
        let w = start_waitd(&db, a.concurrency, &[]).await;
        create_waits(&w.base, &up, a.waits, "1ms").await;
        until_held(&w.base, a.waits).await;
        until_first_polls_written(&db).await;
        // Warm-up before the measured window.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (m0, r0) = (metrics(&w.base).await, rows_written(&db).await);
        let cpu0 = cpu_seconds();
        eprintln!("saturated phase: measuring for {} s", a.seconds);
        // The measured window.
        tokio::time::sleep(Duration::from_secs(a.seconds)).await;
        let cpu1 = cpu_seconds();
        let (m1, r1) = (metrics(&w.base).await, rows_written(&db).await);
        let p = polls(&m1) - polls(&m0);
        run.steady = p / a.seconds as f64;
        run.cpu_per_poll = (cpu1 - cpu0) * 1e6 / p;
        let outcomes: Vec<String> = ["state", "missing", "not_found", "transient", "permanent"]
            .iter()
            .map(|o| {
                let k = format!("waitd_polls_total{{outcome=\"{o}\"}}");
                format!(
                    "{o} {:.0}",
                    m1.get(&k).copied().unwrap_or(0.0) - m0.get(&k).copied().unwrap_or(0.0)
                )
            })
            .collect();
        eprintln!("saturated phase, polls by outcome: {}", outcomes.join(", "));
        let stmts = m1["waitd_db_writes_total"] - m0["waitd_db_writes_total"];
        run.stmts_per_poll = stmts / p;
        // pg_stat_database counts only written tuples, not the benchmark's reads.
        run.rows_per_poll = (r1.0 - r0.0) as f64 / p;
        run.wal_per_poll = (r1.1 - r0.1) as f64 / p;
        w.stop().await.0.expect("waitd stops cleanly");
        db.drop_db().await;
        if a.runs("limit") {
            limits.push(limit(&up, a.concurrency, a.seconds).await);
            hyper_limits.push(limit_hyper(&up, a.concurrency, a.seconds).await);
        }
    }
    if !limits.is_empty() {
        let rates: Vec<f64> = limits.iter().map(|l| l.0).collect();
        let cpu: Vec<f64> = limits.iter().map(|l| l.1).collect();
        eprintln!(
            "limit before and after the steady phase: {rates:.0?} req/s, {cpu:.1?} µs of CPU a request; \
             steady phase: {:.0} polls/s, {:.1} µs of CPU a poll",
            run.steady, run.cpu_per_poll
        );
        run.limit = rates.iter().sum::<f64>() / rates.len() as f64;
        run.cpu_per_request = cpu.iter().sum::<f64>() / cpu.len() as f64;
        let n = hyper_limits.len() as f64;
        run.limit_hyper = hyper_limits.iter().map(|l| l.0).sum::<f64>() / n;
        run.cpu_per_request_hyper = hyper_limits.iter().map(|l| l.1).sum::<f64>() / n;
        eprintln!(
            "hyper limit before and after the steady phase: {:.0?} req/s, {:.1?} µs of CPU a request",
            hyper_limits.iter().map(|l| l.0).collect::<Vec<_>>(),
            hyper_limits.iter().map(|l| l.1).collect::<Vec<_>>()
        );
    }

    // (6): create throughput alone: waits whose first poll is half an hour away, for
    // a tenant far under its limit of running waits.
    if a.runs("create") {
        let db = TestDb::new().await;
        let far = (a.waits * 10).to_string();
        let w = start_waitd(&db, a.concurrency, &["--max-active-waits", &far]).await;
        let (r0, pg0) = (rows_written(&db).await, postgres_cpu());
        run.create = create_waits(&w.base, &up, a.waits, "1h").await;
        // (6c) what a create costs Postgres. Its first poll is 30 minutes away, so
        // nothing else writes meanwhile; the rows are read once Postgres has
        // reported an idle backend's writes (up to 10 s late).
        let pg1 = postgres_cpu();
        tokio::time::sleep(Duration::from_secs(if a.smoke { 1 } else { 11 })).await;
        let r1 = rows_written(&db).await;
        let n = a.waits as f64;
        run.create_cost = (
            (r1.0 - r0.0) as f64 / n,
            (r1.1 - r0.1) as f64 / n,
            (pg1 - pg0) * 1e6 / n,
        );
        w.stop().await.0.expect("waitd stops cleanly");
        db.drop_db().await;
        // (6b): within 1,024 of the limit every create counts the tenant's running
        // waits, and the last 256 do so one at a time under the tenant's lock.
        let db = TestDb::new().await;
        let n = a.waits.min(1024);
        let max = n.to_string();
        let w = start_waitd(&db, a.concurrency, &["--max-active-waits", &max]).await;
        run.create_near = create_waits(&w.base, &up, n, "1h").await;
        w.stop().await.0.expect("waitd stops cleanly");
        db.drop_db().await;
    }

    // (4): schedule lag at a fixed rate: every wait polled once an interval.
    if a.runs("lag") {
        let db = TestDb::new().await;
        let w = start_waitd(&db, a.concurrency, &[]).await;
        create_waits(&w.base, &up, a.waits, &a.interval).await;
        until_held(&w.base, a.waits).await;
        until_first_polls_written(&db).await;
        // Warm-up before the measured window.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (m0, r0) = (metrics(&w.base).await, rows_written(&db).await);
        // The measured window.
        tokio::time::sleep(Duration::from_secs(a.seconds)).await;
        let (m1, r1) = (metrics(&w.base).await, rows_written(&db).await);
        let p = polls(&m1) - polls(&m0);
        run.lag_at_rate = p / a.seconds as f64;
        run.lag_stmts = (m1["waitd_db_writes_total"] - m0["waitd_db_writes_total"]) / p;
        run.lag_rows = (r1.0 - r0.0) as f64 / p;
        run.lag_wal = (r1.1 - r0.1) as f64 / p;
        run.lag_p50 = lag_percentile(&m0, &m1, 0.5);
        run.lag_p99 = lag_percentile(&m0, &m1, 0.99);
        w.stop().await.0.expect("waitd stops cleanly");
        db.drop_db().await;
    }

    if a.runs("rss") {
        for n in &a.rss_waits {
            run.rss.push(rss_per_wait(*n).await);
        }
    }
    if a.runs("flip") {
        (run.flip_p50, run.flip_p99) = flip_latency(a.followers).await;
    }
    if a.runs("takeover") {
        run.takeover = takeover(if a.waits <= 200 { 20 } else { 200 }, takeover_ttl(a)).await;
    }
    if a.runs("fanout") {
        run.fanout = fanout(a.followers, a.seconds).await;
    }
    if a.runs("webhooks") {
        run.hooks = webhooks(a.followers).await;
    }
    if a.runs("scale") {
        for from in &a.scale_from {
            run.scale.push(scale(a, *from).await);
        }
    }
    if a.runs("shared") {
        let (waits, urls) = if a.smoke { (200, 10) } else { (10_000, 100) };
        run.shared = shared::run(waits, urls, a.concurrency, a.seconds.max(5)).await;
    }
    if a.runs("callbacks") {
        run.callbacks = callbacks::run(a.followers, a.callbacks_window).await;
    }
    if a.runs("events") {
        run.events = events::run(&events::Config {
            waits: a.events_waits,
            sampled: if a.smoke { 50 } else { 200 },
            window: a.events_window,
            burst: if a.smoke { 200 } else { 2000 },
        })
        .await;
    }
    if a.runs("noisy") {
        run.noisy = noisy::run(&noisy::Config {
            window: Duration::from_secs(a.seconds * 2),
            drain: Duration::from_secs(if a.smoke { 6 } else { 15 }),
            sqlite: a.noisy_sqlite,
            inputs: a.noisy_inputs.clone(),
        })
        .await;
    }
    run
}

/// The scale phase's target: nginx answering one static in-progress state, in a
/// process of its own (so that it shares no runtime with waitd), or, without nginx,
/// the benchmark's own upstream. Its URL, and the nginx process to stop.
async fn static_upstream(dir: &TempDir) -> (String, Option<std::process::Child>) {
    let port = support::replica::free_port();
    let conf = dir.path.join("nginx.conf");
    let text = format!(
        "worker_processes 1;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/nginx-error.log warn;\n\
         events {{ worker_connections 8192; }}\n\
         http {{ access_log off; keepalive_requests 100000000; keepalive_timeout 300s;\n\
           server {{ listen 127.0.0.1:{port}; location / {{ default_type application/json;\n\
             return 200 '{{\"data\":{{\"attributes\":{{\"status\":\"deploying\"}}}}}}'; }} }} }}\n",
        dir = dir.path.display()
    );
    std::fs::write(&conf, text).unwrap();
    let nginx = ["nginx", "/usr/sbin/nginx"].into_iter().find_map(|bin| {
        std::process::Command::new(bin)
            .args(["-c"])
            .arg(&conf)
            .args(["-p"])
            .arg(&dir.path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()
    });
    if let Some(child) = nginx {
        let base = format!("http://127.0.0.1:{port}");
        let up = support::eventually(Duration::from_secs(5), || async {
            client().get(format!("{base}/x")).send().await.is_ok()
        })
        .await;
        if up {
            eprintln!("scale phase: nginx serves the target on port {port}");
            return (base, Some(child));
        }
    }
    eprintln!("scale phase: no nginx; the benchmark's own upstream serves the target");
    (upstream().await.0, None)
}

/// Sums the replicas' metrics (counters and histogram buckets add up).
fn merged(
    maps: Vec<std::collections::HashMap<String, f64>>,
) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    for m in maps {
        for (k, v) in m {
            *out.entry(k).or_insert(0.0) += v;
        }
    }
    out
}

/// (12) `--scale-waits` waits (1,000,000) polled every `--scale-interval` (60 s, 10%
/// jitter) by `--scale-replicas` waitd processes (1): the rows inserted by SQL with
/// their first polls spread over one interval; the time until all are held; then,
/// one interval after that, one interval measured in windows of 10 s (a fifth of the
/// interval when shorter): polls a second against the schedule, lag per window, CPU
/// a poll of waitd and Postgres, RSS; with `--scale-kill`, the takeover of the
/// waits of a replica killed with SIGKILL ([`scale_kill`]).
async fn scale(a: &Args, from: ScaleFrom) -> Scale {
    let n = a.scale_waits;
    let interval = a.scale_interval;
    let dir = TempDir::new("waitd-scale");
    let (up, mut nginx) = static_upstream(&dir).await;
    let db = TestDb::new().await;
    let cap = (n + 1000).to_string();
    let extra = [
        "--capacity",
        cap.as_str(),
        "--max-active-waits",
        cap.as_str(),
        "--concurrency",
        "512",
        "--per-host-concurrency",
        "512",
        "--rate-limit",
        "0",
    ];
    // The takeover run uses the lease TTL a deployment would (10 s), so that a
    // takeover starts as soon as it would there.
    let ttl = if a.scale_kill { "10s" } else { "30s" };
    let mut replicas = Vec::new();
    for i in 0..a.scale_replicas.max(1) {
        replicas.push(spawn_replica(&db, &dir, &format!("scale{i}"), ttl, &extra).await);
    }
    let bases: Vec<String> = replicas.iter().map(|r| r.base.clone()).collect();
    let every = engine_duration(interval);
    let spec = json!({
        "target": {"url": format!("{up}/servers/0")},
        "state": "/data/attributes/status",
        "want": ["on"],
        "timeout": "4h",
        "poll": {"initial": every, "factor": 1, "max": every, "jitter": 0.1},
    });
    let r = client()
        .post(format!("{}/waits", bases[0]))
        .json(&spec)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let created: Value = r.json().await.unwrap();
    let one = format!("{}/waits/{}", bases[0], created["id"].as_str().unwrap());
    let held_all = |want: usize| {
        let bases = bases.clone();
        async move {
            let mut held = 0.0;
            for b in &bases {
                held += metrics(b)
                    .await
                    .get("waitd_held_waits")
                    .copied()
                    .unwrap_or(0.0);
            }
            held as usize >= want
        }
    };
    assert!(support::eventually(Duration::from_secs(30), || held_all(1)).await);
    // Copied only once its first poll is written: the copies then carry the state
    // it saw, so their first polls change nothing, as after a restart or a
    // takeover. (Copied before, every copy's first poll wrote a state event, and
    // the run measured a million events' writes and sequencing besides the
    // claims: 145 s against 90-100 s, whichever the race gave.)
    let polled = || {
        let one = one.clone();
        async move {
            let w: Value = client()
                .get(&one)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            !w["state"].is_null()
        }
    };
    assert!(support::eventually(Duration::from_secs(30), polled).await);
    // The other n - 1 as copies of its rows, due over one interval from now.
    let t0 = Instant::now();
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (pg_settings,): (String,) = sqlx::query_as(
        "SELECT 'shared_buffers ' || current_setting('shared_buffers') || ', max_wal_size ' || current_setting('max_wal_size')",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    // In slots nobody holds, as a fleet that stopped leaves its waits; or unowned.
    let slots = match from {
        ScaleFrom::Released => SCALE_SLOTS,
        ScaleFrom::Unowned => 0,
    };
    clone_waits(&db, n - 1, interval, slots).await;
    sqlx::query("ANALYZE waits").execute(&mut c).await.unwrap();
    let insert_s = t0.elapsed().as_secs_f64();
    let pids: Vec<String> = replicas.iter().map(|r| r.pid.to_string()).collect();
    let waitd_cpu = || pids.iter().map(|p| cpu_of(p)).sum::<f64>();
    let pg_cpu = || cpu_seconds() - cpu_of("self");
    let (hw0, hp0) = (waitd_cpu(), pg_cpu());
    let inserted = Instant::now();
    eprintln!(
        "scale phase: {n} waits inserted {} in {insert_s:.1} s; waiting until all are held",
        from.name()
    );
    // Claims are woken by NOTIFY on creates; rows inserted by SQL are found by the
    // claim sweep.
    // Looked at every 100 ms (sooner would make the scrapes themselves load).
    let t = Instant::now();
    while !held_all(n).await {
        assert!(
            t.elapsed() < Duration::from_secs(1800),
            "the replicas never held all {n} waits"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hold_s = inserted.elapsed().as_secs_f64();
    let (hw1, hp1) = (waitd_cpu(), pg_cpu());
    eprintln!("scale phase: all held {hold_s:.1} s after the insert; one interval to settle");
    tokio::time::sleep(interval).await;
    let window = (interval / 5)
        .min(Duration::from_secs(10))
        .max(Duration::from_secs(1));
    let measure = a.scale_measure.unwrap_or(interval);
    let windows_n = (measure.as_secs_f64() / window.as_secs_f64())
        .round()
        .max(1.0) as usize;
    let snapshot = || metrics_of(&bases);
    let (first, r0, w0, p0) = (
        snapshot().await,
        rows_written(&db).await,
        waitd_cpu(),
        pg_cpu(),
    );
    let started = Instant::now();
    let mut prev = first.clone();
    let mut windows = Vec::new();
    for i in 0..windows_n {
        tokio::time::sleep_until((started + window * (i as u32 + 1)).into()).await;
        let now = snapshot().await;
        windows.push((
            lag_percentile(&prev, &now, 0.5),
            lag_percentile(&prev, &now, 0.99),
        ));
        prev = now;
    }
    let took = started.elapsed().as_secs_f64();
    let (r1, w1, p1) = (rows_written(&db).await, waitd_cpu(), pg_cpu());
    // Connections the replicas hold open (the benchmark's own one excluded).
    let (conns,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut c)
    .await
    .unwrap();
    let polls_n = polls(&prev) - polls(&first);
    let rss_kib: u64 = replicas.iter().map(|r| rss_kib(r.pid)).sum();
    let takeover = if a.scale_kill {
        Some(
            scale_kill::run(
                &db,
                &mut replicas,
                n,
                Duration::from_secs(if a.smoke { 2 } else { 10 }),
            )
            .await,
        )
    } else {
        None
    };
    let out = Scale {
        from,
        insert_s,
        hold_s,
        hold_waitd_us: (hw1 - hw0) * 1e6 / n as f64,
        hold_pg_us: (hp1 - hp0) * 1e6 / n as f64,
        rss_gib: rss_kib as f64 / (1024.0 * 1024.0),
        rss_per_wait_kib: rss_kib as f64 / n as f64,
        polls_per_s: polls_n / took,
        schedule_per_s: n as f64 / interval.as_secs_f64(),
        windows,
        waitd_us: (w1 - w0) * 1e6 / polls_n,
        pg_us: (p1 - p0) * 1e6 / polls_n,
        cores: ((w1 - w0) + (p1 - p0)) / took,
        rows_per_poll: (r1.0 - r0.0) as f64 / polls_n,
        wal_per_poll: (r1.1 - r0.1) as f64 / polls_n,
        pg_settings,
        connections: conns as f64 / replicas.len() as f64,
        measured_s: took,
        takeover,
    };
    eprintln!(
        "scale phase: {:.0} polls/s of {:.0} scheduled; lag p99 by window: {:?} ms",
        out.polls_per_s,
        out.schedule_per_s,
        out.windows
            .iter()
            .map(|w| (w.1 * 1e3).round())
            .collect::<Vec<_>>()
    );
    drop(replicas);
    if let Some(n) = nginx.as_mut() {
        let _ = n.kill();
        let _ = n.wait();
    }
    db.drop_db().await;
    out
}

/// A duration as a request writes it (whole milliseconds).
fn engine_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// What one flip of `n` waits at once cost the database, and, with webhooks, the
/// latency from each end's event to the receiver's 2xx (ms).
struct Ends {
    latencies: Vec<f64>,
    all_ms: f64,
    rows: i64,
    wal: i64,
    /// Postgres's CPU seconds from the flip to the last end (and delivery).
    pg_cpu: f64,
}

/// `n` waits polling every 100 ms flip to `on` at once; with `notify`, each announces
/// its end to a local receiver that answers 204. Rows and WAL are read from the flip
/// until everything is over, plus the statistics collector's flush interval.
async fn ends_at_once(n: usize, notify: bool) -> Ends {
    let (up, flipped) = flipping_upstream().await;
    let got = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let g = got.clone();
    let receiver = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: axum::body::Bytes| {
            let g = g.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                if let Some(at) = v["event"]["at"].as_str()
                    && let Ok(at) = chrono::DateTime::parse_from_rfc3339(at)
                {
                    let d = chrono::Utc::now() - at.with_timezone(&chrono::Utc);
                    g.lock()
                        .unwrap()
                        .push(d.num_microseconds().unwrap_or(0) as f64 / 1e3);
                }
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, receiver).await;
    });
    let db = TestDb::new().await;
    let w = start_waitd(&db, 256, &[]).await;
    let c = client();
    let specs: Vec<Value> = (0..n)
        .map(|i| {
            let mut spec = json!({
                "target": {"url": format!("{up}/servers/{i}")},
                "state": "/data/attributes/status",
                "want": ["on"],
                "timeout": "10m",
                "poll": {"initial": "100ms", "factor": 1, "max": "100ms", "jitter": 0},
            });
            if notify {
                spec["notify"] =
                    json!([{"url": hook, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]);
            }
            spec
        })
        .collect();
    let created: Vec<u16> = futures_util::StreamExt::collect(futures_util::StreamExt::buffered(
        futures_util::stream::iter(specs.iter().map(|spec| {
            let (c, url) = (c.clone(), format!("{}/waits", w.base));
            async move {
                c.post(url)
                    .json(spec)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            }
        })),
        32,
    ))
    .await;
    assert!(created.iter().all(|s| *s == 201), "creates failed");
    until_held(&w.base, n).await;
    // Lets the first polls' writes settle before the window opens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r0 = rows_written(&db).await;
    let pg0 = postgres_cpu();
    let t0 = Instant::now();
    flipped.store(true, Relaxed);
    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
    let over = support::eventually(Duration::from_secs(60), || {
        let (got, pool) = (got.clone(), pool.clone());
        async move {
            let (running,): (i64,) =
                sqlx::query_as("SELECT count(*) FROM waits WHERE status = 'running'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            running == 0 && (!notify || got.lock().unwrap().len() >= n)
        }
    })
    .await;
    assert!(over, "the waits did not all end and deliver");
    let all_ms = t0.elapsed().as_secs_f64() * 1e3;
    let pg_cpu = postgres_cpu() - pg0;
    // pg_stat_database hears of an idle backend's writes up to 10 s late (Postgres
    // 15 flushes them at most once a second, and then after 10 s of idleness).
    tokio::time::sleep(Duration::from_millis(if n <= 100 { 1500 } else { 11_000 })).await;
    let r1 = rows_written(&db).await;
    pool.close().await;
    w.stop().await.0.expect("waitd stops cleanly");
    db.drop_db().await;
    let mut latencies = got.lock().unwrap().clone();
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ends {
        latencies,
        all_ms,
        rows: r1.0 - r0.0,
        wal: r1.1 - r0.1,
        pg_cpu,
    }
}

/// (11) `n` waits ending at once, each with a webhook: end → receiver's 2xx, and what
/// a delivery adds to the database's writes (against the same ends without webhooks).
async fn webhooks(n: usize) -> Hooks {
    let plain = ends_at_once(n, false).await;
    let hooked = ends_at_once(n, true).await;
    let l = &hooked.latencies;
    let at = |q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
    eprintln!(
        "webhook phase: {n} ends at once; without webhooks {} rows, {} WAL bytes; with, {} rows, {} WAL bytes, last delivery {:.0} ms after the flip",
        plain.rows, plain.wal, hooked.rows, hooked.wal, hooked.all_ms
    );
    Hooks {
        p50: at(0.5),
        p99: at(0.99),
        all: hooked.all_ms,
        rows: (hooked.rows - plain.rows) as f64 / n as f64,
        wal: (hooked.wal - plain.wal) as f64 / n as f64,
        end: (
            plain.rows as f64 / n as f64,
            plain.wal as f64 / n as f64,
            plain.pg_cpu * 1e6 / n as f64,
        ),
    }
}

fn takeover_ttl(a: &Args) -> &'static str {
    if a.runs == 1 && a.waits <= 200 {
        "1s"
    } else {
        "5s"
    }
}

/// (5) RSS per held wait: the growth of a fresh waitd process's resident memory from
/// no waits to `n` held, divided by n. (A process of its own: in this one, memory the
/// earlier phases freed would be reused and hide the growth.)
async fn rss_per_wait(n: usize) -> f64 {
    let (up, _) = upstream().await;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-bench");
    let r = spawn_replica(&db, &dir, "rss", "30s", &[]).await;
    // Lets the fresh process settle before its RSS is read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = rss_kib(r.pid);
    // One wait through the API, then n - 1 copies of its rows straight into the
    // database: the figure is memory per held wait, not create speed.
    create_waits(&r.base, &up, 1, "59m").await;
    clone_waits(&db, n - 1, Duration::ZERO, 0).await;
    // Each is polled once when claimed, then idle for an hour: all held, none in flight.
    until_held(&r.base, n).await;
    // Lets the claims settle before the RSS is read.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(r.pid);
    drop(r);
    db.drop_db().await;
    (after.saturating_sub(before)) as f64 * 1024.0 / n as f64
}

/// Slots the scale phase's copies are spread over: a few thousand waits each at a
/// million, as 64 slots each of a few replicas hold them.
const SCALE_SLOTS: usize = 128;

/// Copies the one wait in the database `n` times (new ids), due over `spread` from
/// now (at random, uniformly; `Duration::ZERO`: due now), spread at random over
/// `slots` new slots that nobody holds (none: unowned, each claimed on its own).
async fn clone_waits(db: &TestDb, n: usize, spread: Duration, slots: usize) {
    if n == 0 {
        return;
    }
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let slots: Vec<uuid::Uuid> = (0..slots).map(|_| uuid::Uuid::now_v7()).collect();
    // One transaction, as a create's rows are: a replica deletes a free slot it
    // finds empty, and reads a slot's waits with their specs.
    let mut tx = c.begin().await.unwrap();
    sqlx::query("INSERT INTO slots (id, released_at) SELECT unnest($1::uuid[]), now()")
        .bind(&slots)
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, claim_at, labels, engine, seq, owner)
         SELECT id, tenant, 'running', created_at, updated_at, deadline, due, due, labels, engine, 1,
                ($3::uuid[])[1 + floor(random() * cardinality($3::uuid[]))::int]
         FROM (SELECT gen_random_uuid() AS id, w.tenant, w.created_at, w.updated_at, w.deadline,
                      now() + random() * $2 * interval '1 millisecond' AS due, w.labels, w.engine
               FROM waits w, generate_series(1, $1) WHERE w.status = 'running') c",
    )
    .bind(n as i64)
    .bind(spread.as_millis() as f64)
    .bind(&slots)
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO wait_specs (wait_id, spec, headers)
         SELECT w.id, s.spec, s.headers FROM waits w, (SELECT spec, headers FROM wait_specs LIMIT 1) s
         WHERE NOT EXISTS (SELECT 1 FROM wait_specs x WHERE x.wait_id = w.id)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
}

/// An upstream whose answer flips from "deploying" to "on" when told to.
async fn flipping_upstream() -> (String, Arc<std::sync::atomic::AtomicBool>) {
    let flipped = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let f = flipped.clone();
    let app = axum::Router::new().route(
        "/{*p}",
        axum::routing::get(move || {
            let f = f.clone();
            async move {
                let status = if f.load(Relaxed) { "on" } else { "deploying" };
                (
                    [("content-type", "application/json")],
                    format!(r#"{{"data":{{"attributes":{{"status":"{status}"}}}}}}"#),
                )
            }
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (base, flipped)
}

/// (7) From the upstream flipping to the wanted state to the terminal event at each
/// of `n` SSE followers (one per wait, 100 ms polls): p50 and p99 in seconds.
async fn flip_latency(n: usize) -> (f64, f64) {
    let (up, flipped) = flipping_upstream().await;
    let db = TestDb::new().await;
    let w = start_waitd(&db, 256, &[]).await;
    let c = client();
    let mut ids = Vec::new();
    for i in 0..n {
        let spec = json!({
            "target": {"url": format!("{up}/servers/{i}")},
            "state": "/data/attributes/status",
            "want": ["on"],
            "timeout": "10m",
            "poll": {"initial": "100ms", "factor": 1, "max": "100ms", "jitter": 0},
        });
        let r: Value = c
            .post(format!("{}/waits", w.base))
            .json(&spec)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(r["id"].as_str().unwrap().to_string());
    }
    until_held(&w.base, n).await;
    let flip_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let deliveries = Arc::new(std::sync::Mutex::new(Vec::<f64>::new()));
    let mut tasks = Vec::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    for id in ids {
        let (c, url, flip_at, ready, deliveries) = (
            c.clone(),
            format!("{}/waits/{id}/events?follow=true", w.base),
            flip_at.clone(),
            ready_tx.clone(),
            deliveries.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let r = c.get(url).send().await.unwrap();
            let _ = ready.send(()).await;
            let mut body = r.bytes_stream();
            let mut buf = String::new();
            while let Some(chunk) = futures_util::StreamExt::next(&mut body).await {
                buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
                if let Some(i) = buf.find("event: succeeded") {
                    let at = flip_at.lock().unwrap().expect("flipped before the end");
                    let took = at.elapsed().as_secs_f64();
                    // The event's own time is when its write began: the rest is
                    // commit, sequencing, notice and delivery.
                    let tail = &buf[i..];
                    if let Some(line) = tail.lines().find_map(|l| l.strip_prefix("data:"))
                        && let Ok(v) = serde_json::from_str::<Value>(line.trim())
                        && let Some(t) = v["at"].as_str()
                        && let Ok(t) = chrono::DateTime::parse_from_rfc3339(t)
                    {
                        let d = chrono::Utc::now() - t.with_timezone(&chrono::Utc);
                        deliveries
                            .lock()
                            .unwrap()
                            .push(d.num_microseconds().unwrap_or(0) as f64 / 1e3);
                    }
                    return took;
                }
            }
            f64::NAN
        }));
    }
    for _ in 0..n {
        ready_rx.recv().await;
    }
    // Lets the followers settle before the flip is timed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    *flip_at.lock().unwrap() = Some(Instant::now());
    let flipped_at = chrono::Utc::now();
    flipped.store(true, Relaxed);
    let mut lat = Vec::new();
    for t in tasks {
        lat.push(t.await.unwrap());
    }
    // Where the time goes: the flip to the commit of each wait's end.
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (p50, p99): (f64, f64) = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x), percentile_cont(0.99) WITHIN GROUP (ORDER BY x)
         FROM (SELECT extract(epoch FROM finished_at - $1)::float8 AS x FROM waits) t",
    )
    .bind(flipped_at)
    .fetch_one(&mut c)
    .await
    .unwrap();
    let mut d = deliveries.lock().unwrap().clone();
    d.sort_by(|a, b| a.partial_cmp(b).unwrap());
    eprintln!(
        "flip phase: the end's commit came {:.0} ms (p50) / {:.0} ms (p99) after the flip; \
         from the start of its write to its follower: {:.0} ms / {:.0} ms",
        p50 * 1e3,
        p99 * 1e3,
        d.get(d.len() / 2).copied().unwrap_or(f64::NAN),
        d.get(d.len() * 99 / 100).copied().unwrap_or(f64::NAN),
    );
    w.stop().await.0.expect("waitd stops cleanly");
    db.drop_db().await;
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (
        lat[lat.len() / 2],
        lat[(lat.len() * 99 / 100).min(lat.len() - 1)],
    )
}

/// A waitd replica as its own process (so it can be killed with SIGKILL, and its
/// memory and CPU are its own), with waitd's own pool size.
async fn spawn_replica(
    db: &TestDb,
    dir: &TempDir,
    name: &str,
    ttl: &str,
    extra: &[&str],
) -> Replica {
    let port = support::replica::free_port();
    let args = support::replica::replica_args(&db.url, port, ttl, extra);
    let mut r = Replica::spawn(
        name,
        &dir.path,
        port,
        support::set_flag(args, "--db-connections", "16"),
    );
    r.ready(Duration::from_secs(10)).await;
    r
}

/// (8) kill -9 of one of two replicas (lease TTL `ttl`, 50 ms polls): seconds from
/// the kill to the first poll of each of its waits by the survivor; the maximum.
async fn takeover(n: usize, ttl: &str) -> f64 {
    // Per path: when it was last polled.
    let last: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>> =
        Default::default();
    let l2 = last.clone();
    let app = axum::Router::new().route(
        "/{*p}",
        axum::routing::get(move |axum::extract::Path(p): axum::extract::Path<String>| {
            let l2 = l2.clone();
            async move {
                l2.lock().unwrap().insert(p, Instant::now());
                (
                    [("content-type", "application/json")],
                    r#"{"data":{"attributes":{"status":"deploying"}}}"#,
                )
            }
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-bench");
    let mut a = spawn_replica(&db, &dir, "a", ttl, &[]).await;
    let mut b = spawn_replica(&db, &dir, "b", ttl, &[]).await;
    let c = client();
    for i in 0..n {
        let spec = json!({
            "target": {"url": format!("{up}/t/{i}")},
            "state": "/data/attributes/status",
            "want": ["on"],
            "timeout": "10m",
            "poll": {"initial": "50ms", "factor": 1, "max": "50ms", "jitter": 0},
        });
        let r = c
            .post(format!("{}/waits", a.base))
            .json(&spec)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The waits A holds, by the database.
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let owners: Vec<(Option<uuid::Uuid>, String)> =
        sqlx::query_as("SELECT w.owner, s.spec->'target'->>'url' FROM waits w JOIN wait_specs s ON s.wait_id = w.id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let mut by_owner: std::collections::HashMap<Option<uuid::Uuid>, Vec<String>> =
        Default::default();
    for (o, url) in owners {
        by_owner.entry(o).or_default().push(
            url.rsplit_once("/t/")
                .map(|(_, i)| format!("t/{i}"))
                .unwrap(),
        );
    }
    // Kill the replica holding the most waits: each names its owner id in /metrics.
    let owner_of = |base: String| async move {
        metrics(&base)
            .await
            .keys()
            .find_map(|k| {
                k.strip_prefix("waitd_replica_info{owner=\"")?
                    .strip_suffix("\"}")?
                    .parse::<uuid::Uuid>()
                    .ok()
            })
            .expect("a replica names its owner id in /metrics")
    };
    let (owner_a, owner_b) = (
        owner_of(a.base.clone()).await,
        owner_of(b.base.clone()).await,
    );
    let count = |o: uuid::Uuid| by_owner.get(&Some(o)).map_or(0, Vec::len);
    let victim_is_a = count(owner_a) >= count(owner_b);
    let victim_paths = by_owner
        .get(&Some(if victim_is_a { owner_a } else { owner_b }))
        .cloned()
        .unwrap_or_default();
    let killed_at = Instant::now();
    if victim_is_a {
        a.kill9();
    } else {
        b.kill9();
    }
    let deadline = killed_at + Duration::from_secs(120);
    let mut worst: f64;
    loop {
        // Polls, within the deadline below.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let l = last.lock().unwrap();
        let polled_since: Vec<f64> = victim_paths
            .iter()
            .map(|p| match l.get(p) {
                Some(t) if *t > killed_at + Duration::from_millis(100) => {
                    (*t - killed_at).as_secs_f64()
                }
                _ => f64::NAN,
            })
            .collect();
        worst = polled_since.iter().cloned().fold(0.0, f64::max);
        if polled_since.iter().all(|x| !x.is_nan()) || Instant::now() > deadline {
            break;
        }
    }
    drop(a);
    drop(b);
    db.drop_db().await;
    worst
}

/// CPU seconds a process has used (user + system).
fn process_cpu(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
        })
        .unwrap_or(0.0)
        / 100.0
}

/// CPU seconds every `postgres` process has used.
fn postgres_cpu() -> f64 {
    let mut total = 0.0;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let pid = e.file_name().to_string_lossy().to_string();
            if pid.bytes().all(|b| b.is_ascii_digit())
                && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "postgres")
            {
                total += process_cpu(&pid);
            }
        }
    }
    total
}

/// Opens a follower of `/events` that counts the events it receives; returns once
/// its stream is open.
async fn follow_all(c: &reqwest::Client, base: &str, seen: Arc<AtomicU64>) {
    use futures_util::StreamExt;
    let r = c
        .get(format!("{base}/events?follow=true"))
        .send()
        .await
        .expect("a follower connects");
    assert_eq!(r.status(), 200, "a follower was refused");
    tokio::spawn(async move {
        let mut body = r.bytes_stream();
        // Frames are counted by their `event:` lines; one may straddle two chunks.
        let mut tail: Vec<u8> = Vec::new();
        while let Some(Ok(chunk)) = body.next().await {
            tail.extend_from_slice(&chunk);
            let text = String::from_utf8_lossy(&tail);
            let n = text.matches("\nevent: ").count() + usize::from(text.starts_with("event: "));
            seen.fetch_add(n as u64, Relaxed);
            let keep = text.rfind('\n').map_or(0, |i| i + 1);
            tail.drain(..keep);
        }
    });
}

/// Creates one wait and returns how long the request took, in ms.
async fn timed_create(c: &reqwest::Client, base: &str, target: &str) -> f64 {
    let spec = json!({
        "target": {"url": target},
        "state": "/data/attributes/status",
        "want": ["on"],
        "timeout": "1h",
        "poll": {"initial": "30m"},
    });
    let started = Instant::now();
    let r = c
        .post(format!("{base}/waits"))
        .json(&spec)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    started.elapsed().as_secs_f64() * 1e3
}

fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// (9) Fan-out: `n` followers of `/events` on a waitd of its own (a separate process,
/// so its CPU is its own), while 20 waits change state five times a second each.
/// Then `n` more followers connect at once, each replaying the history from the
/// start, while creates are timed.
async fn fanout(n: usize, seconds: u64) -> Fanout {
    // An upstream whose state alternates at every poll of a path: every poll is an
    // event.
    let count: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>> = Arc::default();
    let c2 = count.clone();
    let app = axum::Router::new().route(
        "/{*p}",
        axum::routing::get(move |axum::extract::Path(p): axum::extract::Path<String>| {
            let c2 = c2.clone();
            async move {
                let n = {
                    let mut m = c2.lock().unwrap();
                    let n = m.entry(p).or_default();
                    *n += 1;
                    *n
                };
                let status = if n % 2 == 0 { "a" } else { "b" };
                (
                    [("content-type", "application/json")],
                    format!(r#"{{"data":{{"attributes":{{"status":"{status}"}}}}}}"#),
                )
            }
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    let db = TestDb::new().await;
    let streams = (3 * n + 16).to_string();
    let dir = TempDir::new("waitd-bench");
    let r = spawn_replica(
        &db,
        &dir,
        "fanout",
        "30s",
        &[
            "--max-streams",
            &streams,
            "--max-streams-per-tenant",
            &streams,
        ],
    )
    .await;
    let pid = r.pid.to_string();
    let c = client();
    let seen = Arc::new(AtomicU64::new(0));
    for _ in 0..n {
        follow_all(&c, &r.base, seen.clone()).await;
    }
    let mut before = Vec::new();
    for i in 0..50 {
        before.push(timed_create(&c, &r.base, &format!("{up}/idle/{i}")).await);
    }
    for i in 0..20 {
        let spec = json!({
            "target": {"url": format!("{up}/flip/{i}")},
            "state": "/data/attributes/status",
            "want": ["on"],
            "timeout": "1h",
            "poll": {"initial": "200ms", "factor": 1, "max": "200ms", "jitter": 0},
        });
        let resp = c
            .post(format!("{}/waits", r.base))
            .json(&spec)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
    }
    // Warm-up before the measured window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu0, pg0, seen0) = (process_cpu(&pid), postgres_cpu(), seen.load(Relaxed));
    let t0 = Instant::now();
    // The measured window.
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (cpu1, pg1, seen1) = (process_cpu(&pid), postgres_cpu(), seen.load(Relaxed));
    let took = t0.elapsed().as_secs_f64();
    let deliveries = (seen1 - seen0) as f64;
    let events = deliveries / n as f64;
    eprintln!(
        "fan-out phase: {n} followers received {deliveries:.0} events in {took:.1} s ({:.1} events/s each); waitd used {:.2} s of CPU, Postgres {:.2} s",
        events / took,
        cpu1 - cpu0,
        pg1 - pg0
    );
    // The storm: n more followers at once, each replaying everything so far, while
    // creates are timed.
    let storm_seen = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let storm: Vec<_> = (0..n)
        .map(|_| {
            let (c, base, seen) = (c.clone(), r.base.clone(), storm_seen.clone());
            tokio::spawn(async move { follow_all(&c, &base, seen).await })
        })
        .collect();
    let creating = {
        let (c, base, up) = (c.clone(), r.base.clone(), up.clone());
        tokio::spawn(async move {
            let mut during = Vec::new();
            for i in 0..50 {
                during.push(timed_create(&c, &base, &format!("{up}/storm/{i}")).await);
            }
            during
        })
    };
    for t in storm {
        let _ = t.await;
    }
    let storm_open = started.elapsed().as_secs_f64();
    let during = creating.await.unwrap();
    let f = Fanout {
        events_per_s: events / took,
        cpu_per_delivery: (cpu1 - cpu0) * 1e6 / deliveries,
        pg_cpu_per_event: (pg1 - pg0) * 1e6 / events,
        create_p50: percentile(before.clone(), 0.5),
        create_p99: percentile(before, 0.99),
        storm_p50: percentile(during.clone(), 0.5),
        storm_p99: percentile(during, 0.99),
        storm_open,
    };
    drop(r);
    db.drop_db().await;
    f
}

/// The median, ignoring phases that did not run (NaN when none did).
fn median(v: Vec<f64>) -> f64 {
    let mut v: Vec<f64> = v.into_iter().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// The scale phase's rows of the table (medians of the runs), then each run's lag
/// per window.
fn scale_table(a: &Args, runs: &[Run]) -> String {
    a.scale_from
        .iter()
        .map(|from| {
            let sc: Vec<&Scale> = runs
                .iter()
                .flat_map(|r| r.scale.iter())
                .filter(|s| s.from == *from)
                .collect();
            scale_rows(a, *from, &sc)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The scale phase's rows for the waits of one origin.
fn scale_rows(a: &Args, from: ScaleFrom, sc: &[&Scale]) -> String {
    use std::fmt::Write;
    let m = |f: &dyn Fn(&Scale) -> f64| median(sc.iter().map(|s| f(s)).collect());
    let mut t = String::new();
    let n = a.scale_waits;
    let every = engine_duration(a.scale_interval);
    let who = if a.scale_replicas > 1 {
        format!("{} replicas", a.scale_replicas)
    } else {
        "one replica".to_string()
    };
    let pg = sc
        .first()
        .map_or("?".to_string(), |s| s.pg_settings.clone());
    let _ = writeln!(
        t,
        "| 12 | {n} waits every {every} (±10%), {}, on {who}, Postgres {pg}: from the rows' insert ({:.0} s) to all held | {:.1} s | ≤ 30 s |",
        from.name(),
        m(&|s| s.insert_s),
        m(&|s| s.hold_s)
    );
    let _ = writeln!(
        t,
        "| 12g | CPU while holding, a wait held: waitd / Postgres (its slot taken and read, and the polls of the waits held already) | {:.1} / {:.1} µs | |",
        m(&|s| s.hold_waitd_us),
        m(&|s| s.hold_pg_us)
    );
    let _ = writeln!(
        t,
        "| 12b | RSS of waitd | {:.2} GiB ({:.2} KiB a wait) | ≤ 2 GiB |",
        m(&|s| s.rss_gib),
        m(&|s| s.rss_per_wait_kib)
    );
    let _ = writeln!(
        t,
        "| 12c | polls a second against the schedule's {:.0} | {:.0} ({:.3}) | ≥ 0.99 |",
        m(&|s| s.schedule_per_s),
        m(&|s| s.polls_per_s),
        m(&|s| s.polls_per_s / s.schedule_per_s)
    );
    let worst = m(&|s| s.windows.iter().map(|w| w.1).fold(0.0, f64::max));
    let _ = writeln!(
        t,
        "| 12d | schedule lag over one interval: the median window's p50 / p99, the worst window's p99 | {:.1} / {:.1} ms, worst {:.1} ms | p99 ≤ 100 ms in every window |",
        m(&|s| median(s.windows.iter().map(|w| w.0).collect())) * 1e3,
        m(&|s| median(s.windows.iter().map(|w| w.1).collect())) * 1e3,
        worst * 1e3
    );
    let _ = writeln!(
        t,
        "| 12e | CPU a poll: waitd / Postgres (cores used by both) | {:.1} / {:.1} µs ({:.2}) | ≤ 40 / ≤ 5 µs |",
        m(&|s| s.waitd_us),
        m(&|s| s.pg_us),
        m(&|s| s.cores)
    );
    let _ = writeln!(
        t,
        "| 12f | Postgres over the {:.0} s measured: rows written / WAL bytes a poll; connections a replica | {:.4} / {:.1}; {:.0} | |",
        m(&|s| s.measured_s),
        m(&|s| s.rows_per_poll),
        m(&|s| s.wal_per_poll),
        m(&|s| s.connections)
    );
    let tk: Vec<&scale_kill::Takeover> = sc.iter().filter_map(|s| s.takeover.as_ref()).collect();
    if !tk.is_empty() {
        let mk =
            |f: &dyn Fn(&scale_kill::Takeover) -> f64| median(tk.iter().map(|s| f(s)).collect());
        let _ = writeln!(
            t,
            "| 12h | `kill -9` of the replica holding {:.0} waits (lease TTL 10 s): from its lease's expiry until the survivor holds every wait | {:.1} s | ≤ 15 s |",
            mk(&|s| s.waits),
            mk(&|s| s.held_s)
        );
        let _ = writeln!(
            t,
            "| 12i | the survivor's lag p99 over {:.0} s windows: the worst until every wait is held again (the waits that fell due unowned are polled at once) / the worst of two windows beginning one window or more after | {:.0} / {:.0} ms | after ≤ 100 ms |",
            mk(&|s| s.window_s),
            mk(&|s| worst_p99(&s.windows, |began| began < s.held_s)) * 1e3,
            mk(&|s| worst_p99(&s.windows, |began| began >= s.held_s + s.window_s)) * 1e3
        );
        let _ = writeln!(
            t,
            "| 12j | Postgres a wait taken over: CPU / WAL | {:.1} µs / {:.0} bytes | |",
            mk(&|s| s.pg_us),
            mk(&|s| s.wal_bytes)
        );
    }
    for (i, s) in sc.iter().enumerate() {
        let _ = writeln!(
            t,
            "\nrun {} ({}): held after {:.1} s; {:.0} polls/s; lag p99 per window (ms): {}",
            i + 1,
            from.name(),
            s.hold_s,
            s.polls_per_s,
            s.windows
                .iter()
                .map(|w| format!("{:.0}", w.1 * 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
        if let Some(k) = &s.takeover {
            let _ = writeln!(
                t,
                "\nrun {} takeover: every wait held {:.1} s after the lease ran out; the survivor's lag p99 per {:.0} s window from the expiry (ms, * from the window in which all were held): {}",
                i + 1,
                k.held_s,
                k.window_s,
                k.windows
                    .iter()
                    .map(|w| {
                        let held = w.0 + k.window_s > k.held_s;
                        format!("{:.0}{}", w.2 * 1e3, if held { "*" } else { "" })
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    t
}

/// The worst p99 of the takeover's windows whose beginning `keep` accepts (0 when
/// none is).
fn worst_p99(windows: &[(f64, f64, f64)], keep: impl Fn(f64) -> bool) -> f64 {
    windows
        .iter()
        .filter(|w| keep(w.0))
        .map(|w| w.2)
        .fold(0.0, f64::max)
}

/// Puts the scale phase's table into BENCHMARKS.md, between its markers.
fn write_scale_section(a: &Args, table: &str) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/BENCHMARKS.md");
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    // A takeover run keeps a table of its own: its replicas and lease TTL differ
    // from the default run's.
    let (begin, end) = if a.scale_kill {
        ("<!-- scale-kill:begin -->", "<!-- scale-kill:end -->")
    } else {
        ("<!-- scale:begin -->", "<!-- scale:end -->")
    };
    let (Some(i), Some(j)) = (text.find(begin), text.find(end)) else {
        eprintln!("BENCHMARKS.md has no {begin} … {end} markers; the table is above");
        return;
    };
    // The command as given (cargo adds `--bench` for a harness-less bench), and
    // the scale settings it ran with, given or not.
    let given: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let body = format!(
        "{begin}\n`cargo bench --bench load -- {}` (the scale phase with `--scale-waits {} --scale-interval {} --scale-replicas {}{}`), {}:\n\n| # | figure | value | target |\n|---|---|---|---|\n{table}\n",
        given.join(" "),
        a.scale_waits,
        engine_duration(a.scale_interval),
        a.scale_replicas,
        if a.scale_kill { " --scale-kill" } else { "" },
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    let out = format!("{}{}{}", &text[..i], body, &text[j..]);
    if std::fs::write(path, out).is_ok() {
        eprintln!("scale phase: the table is written into BENCHMARKS.md");
    }
}

fn main() {
    // `RUST_LOG=waitd=warn` shows what waitd itself reports during the run.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let a = args();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut runs = Vec::new();
        for i in 0..a.runs {
            eprintln!("run {}/{} …", i + 1, a.runs);
            runs.push(one_run(&a).await);
        }
        let m = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let limit = m(&|r| r.limit);
        let steady = m(&|r| r.steady);
        println!("waitd load benchmark: {} waits, {} s per phase, median of {} run(s), probe concurrency {}", a.waits, a.seconds, a.runs, a.concurrency);
        println!();
        println!("| # | figure | value | target |");
        println!("|---|---|---|---|");
        let limit_hyper = m(&|r| r.limit_hyper);
        if a.runs("limit") {
            println!("| 1 | limit: plain reqwest loop, same upstream and concurrency | {limit:.0} req/s | |");
            println!("| 1b | limit: a bare hyper client loop, same upstream and concurrency | {limit_hyper:.0} req/s | |");
        }
        if a.runs("steady") {
            println!("| 2 | waitd steady state, {} waits due at the 1 ms floor | {steady:.0} polls/s ({:.2} of the reqwest loop, {:.2} of the hyper loop; the runs' own ratios, median {:.2}, {:.2}) | ≥ 0.9, ≥ 0.8 |", a.waits, steady / limit, steady / limit_hyper, m(&|r| r.steady / r.limit), m(&|r| r.steady / r.limit_hyper));
            if a.runs("limit") {
                let (poll, req) = (m(&|r| r.cpu_per_poll), m(&|r| r.cpu_per_request));
                println!("| 2b | CPU a poll (waitd, upstream, Postgres) against CPU a request of the limit loop | {poll:.1} µs / {req:.1} µs: {:.2} (the runs' own, median {:.2}) | |", req / poll, m(&|r| r.cpu_per_request / r.cpu_per_poll));
                let req = m(&|r| r.cpu_per_request_hyper);
                println!("| 2c | the same against CPU a request of the hyper loop | {poll:.1} µs / {req:.1} µs: {:.2} (the runs' own, median {:.2}) | |", req / poll, m(&|r| r.cpu_per_request_hyper / r.cpu_per_poll));
            }
            println!("| 3 | database write statements per poll (waitd's counter) | {:.4} | ≤ 0.02 |", m(&|r| r.stmts_per_poll));
            println!("| 3b | database rows written per poll (pg_stat_database) | {:.4} | |", m(&|r| r.rows_per_poll));
            println!("| 3c | WAL bytes per poll | {:.3} | |", m(&|r| r.wal_per_poll));
        }
        if a.runs("lag") {
            println!("| 4 | schedule lag at {:.0} polls/s: p50 / p99 (histogram-interpolated) | {:.1} ms / {:.1} ms | p99 ≤ 20 ms |", m(&|r| r.lag_at_rate), m(&|r| r.lag_p50) * 1e3, m(&|r| r.lag_p99) * 1e3);
            println!("| 4b | write statements per poll at {:.0} polls/s ({} waits every {}) | {:.4} | |", m(&|r| r.lag_at_rate), a.waits, a.interval, m(&|r| r.lag_stmts));
            println!("| 4c | rows written per poll at {:.0} polls/s ({} waits every {}) | {:.4} | |", m(&|r| r.lag_at_rate), a.waits, a.interval, m(&|r| r.lag_rows));
            println!("| 4d | WAL bytes per poll at {:.0} polls/s ({} waits every {}) | {:.3} | |", m(&|r| r.lag_at_rate), a.waits, a.interval, m(&|r| r.lag_wal));
        }
        if a.runs("rss") {
            for (i, n) in a.rss_waits.iter().enumerate() {
                let per = m(&|r| r.rss.get(i).copied().unwrap_or(f64::NAN));
                println!("| 5 | RSS per held wait at {n} waits | {:.2} KiB | ≤ 4 KiB |", per / 1024.0);
            }
        }
        if a.runs("create") {
            println!("| 6 | create throughput, 32 concurrent clients, tenant far under its limit | {:.0} waits/s | ≥ 2000 |", m(&|r| r.create));
            println!("| 6b | the same within 1,024 of the tenant's limit (each create counts; the last 256 under the tenant's lock) | {:.0} waits/s | |", m(&|r| r.create_near));
            println!("| 6c | what a create costs Postgres: rows written / WAL bytes / CPU | {:.2} / {:.0} / {:.0} µs | |", m(&|r| r.create_cost.0), m(&|r| r.create_cost.1), m(&|r| r.create_cost.2));
        }
        if a.runs("flip") {
            println!("| 7 | upstream flips to `want` → terminal event at {} SSE followers (100 ms polls): p50 / p99 | {:.0} ms / {:.0} ms | p99 ≤ 150 ms |", a.followers, m(&|r| r.flip_p50) * 1e3, m(&|r| r.flip_p99) * 1e3);
        }
        if a.runs("takeover") {
            println!("| 8 | kill -9 of one of two replicas → every orphaned wait polled again (lease TTL {}, 50 ms polls) | {:.2} s | ≤ TTL + one poll interval |", takeover_ttl(&a), m(&|r| r.takeover));
        }
        if a.runs("cel") {
            let (path, same, vary) = (m(&|r| r.cel_cpu[0]), m(&|r| r.cel_cpu[1]), m(&|r| r.cel_cpu[2]));
            println!("| 10 | CPU a poll of a 2 KB Deployment at the 1 ms floor (waitd and upstream, not Postgres): state path alone / with the kubernetes.rollout conditions, the body unchanged (decided as before) / the body changed at every answer (evaluated) | {path:.1} / {same:.1} / {vary:.1} µs: +{:.1} / +{:.1} µs (the runs' own, median +{:.1} / +{:.1}) | ≤ +5 µs |", same - path, vary - path, m(&|r| r.cel_cpu[1] - r.cel_cpu[0]), m(&|r| r.cel_cpu[2] - r.cel_cpu[0]));
            let (p, j, h, c) = (m(&|r| r.cel_micro.0), m(&|r| r.cel_micro.1), m(&|r| r.cel_micro.2), m(&|r| r.cel_micro.3));
            println!("| 10b | the body's share alone, one thread: parse + path / + both conditions evaluated / + a response decided before (compiling both, once per held wait: {c:.0} µs) | {p:.2} / {j:.2} / {h:.2} µs: +{:.2} / +{:.2} µs | ≤ +5 µs |", j - p, h - p);
            let slowest = runs.iter().max_by(|x, y| x.cel_budget.0.total_cmp(&y.cel_budget.0)).map_or("", |r| r.cel_budget.1);
            println!("| 10c | the slowest of {} conditions that grow with a 1 MiB body to end on the evaluation budget (`{slowest}`) | {:.0} ms | well under 1 s |", support::hostile_cel::CASES.len(), m(&|r| r.cel_budget.0));
        }
        if a.runs("scale") {
            let table = scale_table(&a, &runs);
            print!("{table}");
            if !a.smoke {
                write_scale_section(&a, &table);
            }
        }
        if a.runs("webhooks") {
            println!("| 11 | {} waits ending at once, each with a webhook: the end's event → the local receiver's 204, p50 / p99 (the last {:.0} ms after the flip) | {:.0} ms / {:.0} ms | p99 ≤ 1 s |", a.followers, m(&|r| r.hooks.all), m(&|r| r.hooks.p50), m(&|r| r.hooks.p99));
            println!("| 11b | database writes a delivery adds (against the same ends without webhooks): rows / WAL bytes | {:.2} / {:.0} | |", m(&|r| r.hooks.rows), m(&|r| r.hooks.wal));
            println!("| 11c | what an end costs Postgres without webhooks (from the flip to the last end, its polls included): rows written / WAL bytes / CPU | {:.2} / {:.0} / {:.0} µs | |", m(&|r| r.hooks.end.0), m(&|r| r.hooks.end.1), m(&|r| r.hooks.end.2));
        }
        if a.runs("fanout") {
            let (waitd_cpu, pg_cpu) = (m(&|r| r.fanout.cpu_per_delivery), m(&|r| r.fanout.pg_cpu_per_event));
            println!("| 9 | {} followers of /events, {:.0} events/s each: CPU per event per follower, waitd + Postgres | {:.1} µs + {:.1} µs (Postgres {:.0} µs per event, once for all) | ≪ 110 µs |", a.followers, m(&|r| r.fanout.events_per_s), waitd_cpu, pg_cpu / a.followers as f64, pg_cpu);
            println!("| 9b | create latency p50 / p99: alone, then while {} more followers connect and replay at once (all open after {:.1} s) | {:.1} / {:.1} ms, then {:.1} / {:.1} ms | |", a.followers, m(&|r| r.fanout.storm_open), m(&|r| r.fanout.create_p50), m(&|r| r.fanout.create_p99), m(&|r| r.fanout.storm_p50), m(&|r| r.fanout.storm_p99));
        }
        if a.runs("shared") {
            println!("| 15 | 10,000 waits over 100 URLs at 1 s (--smoke: 200 over 10), one replica: requests a second the target sees / polls a second | {:.1} / {:.0} | ≤ 105 requests/s |", m(&|r| r.shared.requests), m(&|r| r.shared.polls));
            println!("| 15b | CPU of a poll with shared requests, against a request of the limit loop (the process, waitd and target) | {:.1} µs against {:.1} µs | |", m(&|r| r.shared.cpu_per_poll), m(&|r| r.cpu_per_request));
            println!("| 15c | RSS of the process at the end | {:.0} MiB | |", m(&|r| r.shared.rss_mib));
        }
        if a.runs("callbacks") {
            let c = |f: &dyn Fn(&callbacks::Callbacks) -> f64| m(&|r| f(&r.callbacks));
            println!("| 17 | {} callback waits, one replica, each followed over SSE and blocked on (`?wait=true`), completed by POSTs spread over {} ms: POST sent → terminal event, p50 / p99; → blocked read released, p50 / p99 | {:.1} / {:.1} ms; {:.1} / {:.1} ms | p99 ≤ 50 ms |", a.followers, a.callbacks_window.as_millis(), c(&|x| x.one.event_p50), c(&|x| x.one.event_p99), c(&|x| x.one.held_p50), c(&|x| x.one.held_p99));
            println!("| 17b | the same on two replicas: waits created, followed and blocked on at A, POSTs sent to B | {:.1} / {:.1} ms; {:.1} / {:.1} ms | p99 ≤ 50 ms |", c(&|x| x.two.event_p50), c(&|x| x.two.event_p99), c(&|x| x.two.held_p50), c(&|x| x.two.held_p99));
            println!("| 17c | POST sent → its own 200 (the end committed), p50 / p99: one replica; two | {:.1} / {:.1} ms; {:.1} / {:.1} ms | |", c(&|x| x.one.post_p50), c(&|x| x.one.post_p99), c(&|x| x.two.post_p50), c(&|x| x.two.post_p99));
        }
        if a.runs("events") {
            let e = |f: &dyn Fn(&events::Events) -> f64| m(&|r| f(&r.events));
            let (few, burst, sampled) = runs.first().map_or((0, 0, 0), |r| (r.events.few, r.events.burst, r.events.sampled));
            println!("| 18 | {} waits listening to a `bearer` source, each polled every 10 min; {sampled} of them each sent an event for its key as its upstream flips, evenly over {} ms: the nudged poll's answer → terminal event at the wait's SSE follower, p50 / p99; hook POST sent → terminal event, p50 / p99 | {:.1} / {:.1} ms; {:.1} / {:.1} ms | p99 ≤ 50 ms after the answer |", a.events_waits, a.events_window.as_millis(), e(&|x| x.end_p50), e(&|x| x.end_p99), e(&|x| x.total_p50), e(&|x| x.total_p99));
            println!("| 18b | hook POST sent → its `202` (kept, listener found, poll announced); → the nudged poll's answer, p50 / p99 | {:.1} / {:.1} ms; {:.1} / {:.1} ms | |", e(&|x| x.post_p50), e(&|x| x.post_p99), e(&|x| x.poll_p50), e(&|x| x.poll_p99));
            println!("| 18c | CPU an ingested event matching no wait ({burst} events, 32 senders; the process, waitd and senders, + Postgres, idle subtracted): {few} waits listening / {} | {:.1} + {:.1} µs / {:.1} + {:.1} µs ({:.2}×; {:.0} / {:.0} events/s) | flat in the waits listening |", a.events_waits, e(&|x| x.cpu_few.0), e(&|x| x.cpu_few.1), e(&|x| x.cpu_all.0), e(&|x| x.cpu_all.1), e(&|x| (x.cpu_all.0 + x.cpu_all.1) / (x.cpu_few.0 + x.cpu_few.1)), e(&|x| x.rate_few), e(&|x| x.rate_all));
            println!("| 18d | the same as 18c's second burst begun with its events still kept (each keep counts the tenant's kept events, for its caps): {:.0} kept | {:.1} + {:.1} µs | |", e(&|x| x.kept as f64), e(&|x| x.cpu_kept.0), e(&|x| x.cpu_kept.1));
        }
        if a.runs("noisy") {
            let runs: Vec<&noisy::Noisy> = runs.iter().map(|r| &r.noisy).collect();
            print!("{}", noisy::table(&runs, Duration::from_secs(a.seconds * 2), a.noisy_sqlite, &a.noisy_inputs));
        }
    });
}
