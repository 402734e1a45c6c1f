//! (18) Event sources: N waits, each polling its own URL every ten minutes and
//! listening to one `bearer` source for its own key. For a sample of them, spread
//! over the waits and sent in an open loop: the upstream flips, an event for the
//! wait's key is POSTed to the hook, the nudged poll sees the flip, the wait
//! ends. From the upstream's answer to that poll to the terminal event at the
//! wait's SSE follower, and from the POST's send to its `202` and to the
//! terminal event, p50 and p99. Then what an event costs to take in when its key
//! matches no wait: CPU over a burst of them with 1,000 waits listening, and
//! with all N (the listener index should make the two equal).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::TestDb;

/// The source's secret (a bearer token: the cheapest signature to check).
const SECRET: &str = "bench-bearer-secret-0123456789";
/// Events sent from one loopback address: hook URLs take a burst of
/// `BURST` requests from one address, and these stay under it.
const PER_ADDRESS: usize = 100;
/// Senders at once in a CPU burst.
const BURST_CONCURRENCY: usize = 32;
/// The waits listening in the CPU burst set against the one with all of them.
const FEW: usize = 1000;
/// How long the idle CPU is measured before each burst (subtracted from it).
const IDLE: Duration = Duration::from_secs(2);
/// The source's lookback: an event's keep counts the tenant's kept events (its
/// caps), so the two bursts compared begin with none kept, the first burst's
/// expired and swept before the second.
const LOOKBACK: &str = "15s";

/// What the phase is given.
pub struct Config {
    /// Waits listening.
    pub waits: usize,
    /// Waits sampled: an event each, spread evenly over `window`.
    pub sampled: usize,
    pub window: Duration,
    /// Events in each CPU burst.
    pub burst: usize,
}

/// The phase's figures: ms, and µs for CPU; NaN where it was not run.
#[derive(Clone, Copy)]
pub struct Events {
    /// The upstream's answer to the nudged poll → the terminal event.
    pub end_p50: f64,
    pub end_p99: f64,
    /// The hook POST sent → the terminal event.
    pub total_p50: f64,
    pub total_p99: f64,
    /// The hook POST sent → its `202`.
    pub post_p50: f64,
    pub post_p99: f64,
    /// The hook POST sent → the upstream's answer to the nudged poll.
    pub poll_p50: f64,
    pub poll_p99: f64,
    /// CPU an ingested event matching no wait, idle CPU subtracted: this process
    /// (waitd and the senders), then Postgres (the backends of this database and
    /// the server's writers); with `few` waits listening, then with all of them.
    pub few: usize,
    pub burst: usize,
    /// Waits sampled.
    pub sampled: usize,
    pub cpu_few: (f64, f64),
    pub cpu_all: (f64, f64),
    /// Events a second each burst took in (32 senders, closed loop).
    pub rate_few: f64,
    pub rate_all: f64,
    /// The same as `cpu_all` with the events of the bursts before still kept,
    /// and how many were kept as it began.
    pub cpu_kept: (f64, f64),
    pub kept: usize,
}

impl Events {
    pub const NONE: Events = Events {
        end_p50: f64::NAN,
        end_p99: f64::NAN,
        total_p50: f64::NAN,
        total_p99: f64::NAN,
        post_p50: f64::NAN,
        post_p99: f64::NAN,
        poll_p50: f64::NAN,
        poll_p99: f64::NAN,
        few: 0,
        burst: 0,
        sampled: 0,
        cpu_few: (f64::NAN, f64::NAN),
        cpu_all: (f64::NAN, f64::NAN),
        rate_few: f64::NAN,
        rate_all: f64::NAN,
        cpu_kept: (f64::NAN, f64::NAN),
        kept: 0,
    };
}

/// When the upstream first answered `on`: its clock, and the wall clock (set
/// against the terminal event's `at`).
type Answer = (Instant, chrono::DateTime<chrono::Utc>);

/// An upstream with a URL per wait, `/ev/{i}`, answering `deploying` until `i`
/// is flipped, then `on`; it notes when it first answered `on` for each.
struct Upstream {
    base: String,
    flipped: Arc<Vec<AtomicBool>>,
    answered: Arc<Vec<OnceLock<Answer>>>,
}

async fn upstream(n: usize) -> Upstream {
    let flipped: Arc<Vec<AtomicBool>> = Arc::new((0..n).map(|_| AtomicBool::new(false)).collect());
    let answered: Arc<Vec<OnceLock<Answer>>> = Arc::new((0..n).map(|_| OnceLock::new()).collect());
    let (f, a) = (flipped.clone(), answered.clone());
    let app = axum::Router::new().route(
        "/ev/{i}",
        axum::routing::get(move |axum::extract::Path(i): axum::extract::Path<usize>| {
            let (f, a) = (f.clone(), a.clone());
            async move {
                let on = f.get(i).is_some_and(|x| x.load(Relaxed));
                if on {
                    a[i].get_or_init(|| (Instant::now(), chrono::Utc::now()));
                }
                (
                    [("content-type", "application/json")],
                    if on {
                        r#"{"status":"on"}"#
                    } else {
                        r#"{"status":"deploying"}"#
                    },
                )
            }
        }),
    );
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Upstream {
        base,
        flipped,
        answered,
    }
}

/// Clients sending from `count` loopback addresses of their own, 127.`block`.x.y.
fn senders(count: usize, block: u8) -> Vec<reqwest::Client> {
    (0..count)
        .map(|k| {
            let ip = Ipv4Addr::new(127, block, (k / 250) as u8, (k % 250 + 1) as u8);
            crate::support::client_builder()
                .local_address(IpAddr::V4(ip))
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap()
        })
        .collect()
}

/// An event for `key`, signed as a bearer source's are.
fn event(c: &reqwest::Client, hook: &str, key: &str) -> reqwest::RequestBuilder {
    c.post(hook)
        .header("content-type", "application/json")
        .bearer_auth(SECRET)
        .body(json!({ "key": key }).to_string())
}

/// Creates waits `from..to` through the API, 32 at a time, each listening for
/// `k{i}`; their ids go into `ids`. Creates a second.
async fn create(
    base: &str,
    up: &str,
    ids: &Arc<Mutex<Vec<String>>>,
    from: usize,
    to: usize,
) -> f64 {
    let c = super::client();
    let next = Arc::new(AtomicU64::new(from as u64));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (c, next, base, up, ids) = (
            c.clone(),
            next.clone(),
            base.to_string(),
            up.to_string(),
            ids.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Relaxed) as usize;
                if i >= to {
                    break;
                }
                let spec = json!({
                    "target": {"url": format!("{up}/ev/{i}")},
                    "state": "/status",
                    "want": ["on"],
                    "timeout": "1h",
                    "poll": {"initial": "10m", "factor": 1, "max": "10m", "jitter": 0},
                    "on_event": {"source": "ci", "key": format!("k{i}"), "then": "poll"},
                });
                let r = c
                    .post(format!("{base}/waits"))
                    .json(&spec)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
                let w: Value = r.json().await.unwrap();
                ids.lock().unwrap()[i] = w["id"].as_str().unwrap().to_string();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    (to - from) as f64 / started.elapsed().as_secs_f64()
}

/// `k` events whose keys match no wait, 32 senders at once, from addresses of
/// block `block`: the CPU each cost, this process and Postgres (µs, the idle
/// rate measured just before subtracted), events a second, and the events kept
/// as it began. A quarter as many go first, unmeasured, from block
/// `block + 100`, so that no burst pays for the first use of a statement or a
/// code path.
async fn burst(
    hook: &str,
    db: &TestDb,
    tag: &str,
    k: usize,
    block: u8,
) -> ((f64, f64), f64, usize) {
    let warm = Arc::new(senders((k / 4).div_ceil(PER_ADDRESS), block + 100));
    send(&warm, hook, &format!("{tag} warm-up"), k / 4).await;
    let clients = Arc::new(senders(k.div_ceil(PER_ADDRESS), block));
    let kept = kept(db).await;
    let db = db.name.as_str();
    let (p0, g0) = (super::cpu_of("self"), postgres(db));
    tokio::time::sleep(IDLE).await;
    let (p1, g1) = (super::cpu_of("self"), postgres(db));
    let started = Instant::now();
    send(&clients, hook, tag, k).await;
    let took = started.elapsed().as_secs_f64();
    let (p2, g2) = (super::cpu_of("self"), postgres(db));
    let idle = IDLE.as_secs_f64();
    let (idle_p, idle_g) = ((p1 - p0) / idle, grew(&g0, &g1) / idle);
    let (busy_p, busy_g) = (p2 - p1, grew(&g1, &g2));
    let per = |busy: f64, rate: f64| (busy - rate * took).max(0.0) * 1e6 / k as f64;
    eprintln!(
        "events phase, {tag}: {k} events in {took:.2} s, {kept} kept as it began; CPU over the burst: the process {busy_p:.2} s, Postgres {busy_g:.2} s; idle before it: {idle_p:.3} / {idle_g:.3} s a second",
    );
    (
        (per(busy_p, idle_p), per(busy_g, idle_g)),
        k as f64 / took,
        kept,
    )
}

/// The events the phase's database keeps.
async fn kept(db: &TestDb) -> usize {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (n,): (i64,) = sqlx::query_as("SELECT count(*) FROM source_events")
        .fetch_one(&mut c)
        .await
        .unwrap();
    n as usize
}

/// CPU seconds so far of each Postgres process working for database `db`, and
/// of the server's own writers (WAL, buffers, checkpoints), by pid: the
/// server's other databases (other programs' tests) left out.
fn postgres(db: &str) -> std::collections::HashMap<String, f64> {
    let mut by_pid = std::collections::HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return by_pid;
    };
    for e in dir.flatten() {
        let pid = e.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit())
            || std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_or(true, |c| c.trim() != "postgres")
        {
            continue;
        }
        let title = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        if title.contains(db)
            || [": walwriter", ": background writer", ": checkpointer"]
                .iter()
                .any(|w| title.contains(w))
        {
            by_pid.insert(pid.clone(), super::cpu_of(&pid));
        }
    }
    by_pid
}

/// The CPU the processes of `after` used since `before` (a process that began
/// since, all of its own; one that ended meanwhile is not counted).
fn grew(
    before: &std::collections::HashMap<String, f64>,
    after: &std::collections::HashMap<String, f64>,
) -> f64 {
    after
        .iter()
        .map(|(pid, t)| t - before.get(pid).copied().unwrap_or(0.0))
        .sum()
}

/// `k` events for keys no wait listens for, `PER_ADDRESS` from each of
/// `clients`, 32 at once.
async fn send(clients: &Arc<Vec<reqwest::Client>>, hook: &str, tag: &str, k: usize) {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..BURST_CONCURRENCY {
        let (clients, next, hook, tag) = (
            clients.clone(),
            next.clone(),
            hook.to_string(),
            tag.to_string(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let j = next.fetch_add(1, Relaxed) as usize;
                if j >= k {
                    break;
                }
                let c = &clients[j / PER_ADDRESS];
                let r = event(c, &hook, &format!("miss-{tag}-{j}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202, "{}", r.text().await.unwrap_or_default());
                let a: Value = r.json().await.unwrap();
                assert_eq!(a["matched"], 0, "an event for no wait matched one");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

pub async fn run(cfg: &Config) -> Events {
    let n = cfg.waits;
    let few = FEW.min(n / 3).max(1);
    let up = upstream(n).await;
    let db = TestDb::new().await;
    // One tenant holds every wait: its limit of running waits set above them.
    let max = (n + 1000).to_string();
    let w = super::start_waitd(&db, 256, &["--max-active-waits", &max]).await;
    let c = super::client();

    let r = c
        .post(format!("{}/sources", w.base))
        .json(&json!({"name": "ci", "kind": "bearer", "secret": SECRET, "key": "/key", "lookback": LOOKBACK}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
    let s: Value = r.json().await.unwrap();
    let hook = s["hook_url"].as_str().unwrap().to_string();

    // The first `few` waits, their first polls written, then a burst; then the
    // rest, and the same burst again.
    let ids = Arc::new(Mutex::new(vec![String::new(); n]));
    let t = Instant::now();
    create(&w.base, &up.base, &ids, 0, few).await;
    super::until_held(&w.base, few).await;
    super::until_first_polls_written(&db).await;
    let (cpu_few, rate_few, _) = burst(&hook, &db, &format!("{few} listening"), cfg.burst, 2).await;
    let creates = create(&w.base, &up.base, &ids, few, n).await;
    super::until_held(&w.base, n).await;
    super::until_first_polls_written(&db).await;
    eprintln!(
        "events phase: {n} listening waits created ({creates:.0} a second, the last {} after {:.1} s), all held and polled once",
        n - few,
        t.elapsed().as_secs_f64()
    );
    // The first burst's events gone, so that this one begins as it did.
    let swept =
        crate::support::eventually(Duration::from_secs(120), || async { kept(&db).await == 0 });
    assert!(swept.await, "the first burst's events were never swept");
    let (cpu_all, rate_all, _) = burst(&hook, &db, &format!("{n} listening"), cfg.burst, 3).await;
    // Again at once, with the events of that burst still kept.
    let (cpu_kept, _, kept) = burst(
        &hook,
        &db,
        &format!("{n} listening, earlier events kept"),
        cfg.burst,
        5,
    )
    .await;

    // The sampled waits, each followed over SSE.
    let m = cfg.sampled.min(n);
    let picks: Vec<usize> = (0..m).map(|j| (j * n + n / 2) / m).collect();
    let ids = ids.lock().unwrap().clone();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(m);
    let mut followers = Vec::new();
    for &i in &picks {
        let (c, url, ready) = (
            c.clone(),
            format!("{}/waits/{}/events?follow=true", w.base, ids[i]),
            ready_tx.clone(),
        );
        followers.push(tokio::spawn(async move {
            let r = c.get(url).send().await.unwrap();
            assert_eq!(r.status(), 200, "a follower was refused");
            let _ = ready.send(()).await;
            let mut body = r.bytes_stream();
            let mut buf = String::new();
            let seen = async {
                while let Some(chunk) = body.next().await {
                    buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
                    if let Some(i) = buf.find("event: succeeded") {
                        let got = Instant::now();
                        // The event's `at`: when the end's write began.
                        let at = buf[i..]
                            .lines()
                            .find_map(|l| l.strip_prefix("data:"))
                            .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok())
                            .and_then(|v| v["at"].as_str().map(str::to_string))
                            .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
                            .map(|t| t.with_timezone(&chrono::Utc));
                        return Some((got, at));
                    }
                }
                None
            };
            tokio::time::timeout(Duration::from_secs(120), seen)
                .await
                .ok()
                .flatten()
        }));
    }
    for _ in 0..m {
        ready_rx.recv().await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The events, one every WINDOW / M, each sent at its tick whatever became of
    // the ones before it.
    let clients = senders(m.div_ceil(PER_ADDRESS), 4);
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let step = cfg.window / m as u32;
    let mut posts = Vec::new();
    for (j, &i) in picks.iter().enumerate() {
        let (c, hook, flipped) = (
            clients[j / PER_ADDRESS].clone(),
            hook.clone(),
            up.flipped.clone(),
        );
        let tick = start + step * j as u32;
        posts.push(tokio::spawn(async move {
            tokio::time::sleep_until(tick).await;
            flipped[i].store(true, Relaxed);
            let sent = Instant::now();
            let r = event(&c, &hook, &format!("k{i}")).send().await.unwrap();
            let answered = Instant::now();
            assert_eq!(r.status(), 202, "an event was refused");
            let a: Value = r.json().await.unwrap();
            assert_eq!(
                a["matched"], 1,
                "an event for one wait matched {}",
                a["matched"]
            );
            (sent, answered)
        }));
    }
    let (mut end, mut total, mut post, mut poll, mut began) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((p, f), &i) in posts.into_iter().zip(followers).zip(&picks) {
        let (sent, answered) = p.await.unwrap();
        let (got, at) = f
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("wait {i} did not end within 120 s of its event"));
        let (upstream_on, upstream_wall) = *up.answered[i]
            .get()
            .expect("the upstream answered `on` to the nudged poll");
        if let Some(at) = at {
            began.push((at - upstream_wall).num_microseconds().unwrap_or(0) as f64 / 1e3);
        }
        end.push(ms(got.saturating_duration_since(upstream_on)));
        total.push(ms(got - sent));
        post.push(ms(answered - sent));
        poll.push(ms(upstream_on.saturating_duration_since(sent)));
    }
    let p = |v: &[f64], q: f64| super::percentile(v.to_vec(), q);
    let figures = Events {
        end_p50: p(&end, 0.5),
        end_p99: p(&end, 0.99),
        total_p50: p(&total, 0.5),
        total_p99: p(&total, 0.99),
        post_p50: p(&post, 0.5),
        post_p99: p(&post, 0.99),
        poll_p50: p(&poll, 0.5),
        poll_p99: p(&poll, 0.99),
        few,
        burst: cfg.burst,
        sampled: m,
        cpu_few,
        cpu_all,
        rate_few,
        rate_all,
        cpu_kept,
        kept,
    };
    eprintln!(
        "events phase: {m} events over {} ms to {n} listening waits (p50 / p99): POST sent → its 202 {:.1} / {:.1} ms; → the nudged poll's answer {:.1} / {:.1} ms; that answer → the terminal event {:.1} / {:.1} ms; POST sent → the terminal event {:.1} / {:.1} ms",
        cfg.window.as_millis(),
        figures.post_p50,
        figures.post_p99,
        figures.poll_p50,
        figures.poll_p99,
        figures.end_p50,
        figures.end_p99,
        figures.total_p50,
        figures.total_p99,
    );
    eprintln!(
        "events phase: where the time after the nudged poll's answer goes (p50 / p99): → the end's write began (its event's `at`) {:.1} / {:.1} ms; the rest (the end's transaction, sequencing, NOTIFY, the follower's read) is 18's figure less that",
        p(&began, 0.5),
        p(&began, 0.99),
    );
    eprintln!(
        "events phase: CPU an event for no wait (the process + Postgres), {few} listening: {:.1} + {:.1} µs ({:.0} events/s); {n} listening: {:.1} + {:.1} µs ({:.0} events/s); the same with {kept} events kept: {:.1} + {:.1} µs; RSS {:.0} MiB",
        cpu_few.0,
        cpu_few.1,
        rate_few,
        cpu_all.0,
        cpu_all.1,
        rate_all,
        cpu_kept.0,
        cpu_kept.1,
        super::rss_kib(std::process::id()) as f64 / 1024.0,
    );
    w.stop().await.0.expect("waitd stops cleanly");
    db.drop_db().await;
    figures
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
