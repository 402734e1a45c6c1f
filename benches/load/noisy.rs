//! (13) The noisy neighbour: tenant B's create, read, poll-lag and webhook latencies
//! on one waitd process, alone and then while tenant A sends every hostile input at
//! once (C1, C2, H1, H2, M1, M2, M4 below); whether the process lives through it, how
//! far past their deadlines A's waits end, and the process's peak RSS.
//!
//! B's load is open-loop (a request goes out at each tick, however long the ones
//! before it take), so a slow answer cannot lower the rate it is measured at. A's
//! loops are paced too, each bounded in count and in time, well under A's rate
//! limit: the figure is what the inputs cost, not what the rate limit turns away.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};

use crate::support::replica::{Replica, free_port, peak_rss_kib, replica_args};
use crate::support::{self, TempDir, TestDb};

const TOKEN_A: &str = "noisy-tenant-a-0123456789";
const TOKEN_B: &str = "noisy-tenant-b-0123456789";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Per-token requests a second: above B's 70 (20 creates and 50 reads), and above
/// A's paced loops, so that neither tenant is measured against a 429.
const RATE_LIMIT: &str = "100";

/// B's load: creates and reads a second, and the interval its waits poll at.
const B_CREATE_EVERY: Duration = Duration::from_millis(50);
const B_READ_EVERY: Duration = Duration::from_millis(20);
const B_INTERVAL: Duration = Duration::from_secs(1);
/// B's target answers "deploying" this many times, then "on": four gaps a wait.
const B_POLLS_BEFORE_ON: usize = 4;

/// A's paces, and how many of each it sends at most in one attack.
const C1_EVERY: Duration = Duration::from_millis(50);
const C2_EVERY: Duration = Duration::from_millis(100);
const H1_EVERY: Duration = Duration::from_millis(500);
const M4_EVERY: Duration = Duration::from_millis(50);
const CAP: usize = 2_000;
const H2_WAITS: usize = 100;
const M2_CONNECTIONS: usize = 64;

/// How long a client waits for an answer: B's requests, then A's (C2 may be slow to
/// refuse; the phase goes on and counts it).
const B_TIMEOUT: Duration = Duration::from_secs(10);
const A_TIMEOUT: Duration = Duration::from_secs(5);

/// The phase's settings.
pub struct Config {
    /// The length of each of the two windows, B alone and under attack.
    pub window: Duration,
    /// The longest the phase waits after the attack for B's last deliveries and A's
    /// last deadlines.
    pub drain: Duration,
    pub sqlite: bool,
    /// What tenant A sends, some of [`INPUTS`] (all of them for the figure; fewer
    /// to tell which one costs B what).
    pub inputs: Vec<String>,
}

/// Tenant A's hostile inputs.
pub const INPUTS: [&str; 7] = ["C1", "C2", "H1", "H2", "M1", "M2", "M4"];

/// B's figures over one window: p50 / p99 in ms, and counts.
#[derive(Clone, Copy)]
pub struct Window {
    pub create: [f64; 2],
    pub read: [f64; 2],
    pub lag: [f64; 2],
    pub hook: [f64; 2],
    pub creates: usize,
    pub reads: usize,
    pub lags: usize,
    pub hooks: usize,
    /// B's requests that got no 2xx (or no answer at all).
    pub failed: usize,
    /// B's waits that ended in the window and whose webhook had not arrived by the
    /// end of the phase (their latency is counted as the time waited, a lower bound).
    pub undelivered: usize,
    /// Cores the waitd process used over the window.
    pub cores: f64,
}

impl Window {
    pub const NONE: Window = Window {
        create: [f64::NAN; 2],
        read: [f64::NAN; 2],
        lag: [f64::NAN; 2],
        hook: [f64::NAN; 2],
        creates: 0,
        reads: 0,
        lags: 0,
        hooks: 0,
        failed: 0,
        undelivered: 0,
        cores: f64::NAN,
    };
}

/// The phase's figures.
#[derive(Clone)]
pub struct Noisy {
    pub alone: Window,
    pub attacked: Window,
    /// The process still ran at the end, and logged no panic.
    pub alive: bool,
    /// A's H1 waits: how many, the latest end past its deadline (s), and how many
    /// ended more than 1 s past it.
    pub a_waits: usize,
    pub overrun_s: f64,
    pub a_late: usize,
    /// Peak resident memory of the process: at the end of B alone, at the end (MiB).
    pub rss_alone_mib: f64,
    pub rss_peak_mib: f64,
}

impl Noisy {
    pub const NONE: Noisy = Noisy {
        alone: Window::NONE,
        attacked: Window::NONE,
        alive: false,
        a_waits: 0,
        overrun_s: f64::NAN,
        a_late: 0,
        rss_alone_mib: f64::NAN,
        rss_peak_mib: f64::NAN,
    };
}

/// A request's start, its duration (ms) and whether it got a 2xx.
type Timed = Arc<Mutex<Vec<(DateTime<Utc>, f64, bool)>>>;

/// What B's upstream and receiver saw.
#[derive(Default)]
struct Seen {
    /// Per B target: when each poll arrived.
    polls: Mutex<HashMap<u64, Vec<DateTime<Utc>>>>,
    /// Per B wait id: its end's event time and the webhook's latency from it (ms).
    hooks: Mutex<HashMap<String, (DateTime<Utc>, f64)>>,
}

/// B's target: "deploying", then "on" from poll `B_POLLS_BEFORE_ON + 1` on, and
/// every poll's arrival recorded.
async fn b_upstream(seen: Arc<Seen>) -> String {
    let app = axum::Router::new().route(
        "/b/{n}",
        axum::routing::get(move |Path(n): Path<u64>| {
            let seen = seen.clone();
            async move {
                let polls = {
                    let mut p = seen.polls.lock().unwrap();
                    let v = p.entry(n).or_default();
                    v.push(Utc::now());
                    v.len()
                };
                let status = if polls > B_POLLS_BEFORE_ON {
                    "on"
                } else {
                    "deploying"
                };
                (
                    [("content-type", "application/json")],
                    format!(r#"{{"data":{{"attributes":{{"status":"{status}"}}}}}}"#),
                )
            }
        }),
    );
    serve(app).await
}

/// The webhook receiver both tenants send to, one host and port: B's healthy path,
/// H2's that never answers and M1's that fails.
async fn receiver(seen: Arc<Seen>) -> String {
    let app = axum::Router::new()
        .route(
            "/ok",
            axum::routing::post(move |body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                    if let (Some(id), Some(at)) =
                        (v["data"]["id"].as_str(), v["event"]["at"].as_str())
                        && let Ok(at) = DateTime::parse_from_rfc3339(at)
                    {
                        let at = at.with_timezone(&Utc);
                        let ms = (Utc::now() - at).num_microseconds().unwrap_or(0) as f64 / 1e3;
                        seen.hooks
                            .lock()
                            .unwrap()
                            .entry(id.to_string())
                            .or_insert((at, ms));
                    }
                    StatusCode::NO_CONTENT
                }
            }),
        )
        .route(
            "/hold/{k}",
            // Accepts the request and never answers: the sender's timeout ends it.
            axum::routing::post(std::future::pending::<StatusCode>),
        )
        .route(
            "/fail/{k}",
            axum::routing::post(|| async { StatusCode::INTERNAL_SERVER_ERROR }),
        );
    serve(app).await
}

/// A's targets and the receiver of M4's webhook, on a host and port of their own
/// (so that H2 does not hold M4's redeliveries up), and on a thread of their own: the
/// 100 KB bodies it serves H1 do not delay B's upstream and receiver in the
/// benchmark's runtime, whose timestamps are the figures.
fn a_upstream() -> String {
    let items: Vec<Value> = (0..3000).map(|i| json!({"n": i})).collect();
    let same = json!({"p": r"(?:\w{50}){50}", "items": items}).to_string();
    // Every item its own pattern: nothing to reuse between items.
    let distinct: Vec<Value> = (0..3000)
        .map(|i| json!({"p": format!(r"(?:\w{{{}}}){{50}}", 40 + i % 500)}))
        .collect();
    let many = json!({ "items": distinct }).to_string();
    let flips = Arc::new(AtomicU64::new(0));
    let json_of = |body: String| {
        move || {
            let body = body.clone();
            async move { ([("content-type", "application/json")], body) }
        }
    };
    let app = axum::Router::new()
        .route(
            "/a-ok",
            axum::routing::post(|| async { StatusCode::NO_CONTENT }),
        )
        .route("/same", axum::routing::get(json_of(same)))
        .route("/many", axum::routing::get(json_of(many)))
        .route(
            "/on",
            axum::routing::get(json_of(
                r#"{"data":{"attributes":{"status":"on"}}}"#.to_string(),
            )),
        )
        .route(
            "/c2",
            axum::routing::get(json_of(r#"[{"v":[1,2,3]}]"#.to_string())),
        )
        .route(
            "/flip",
            // A new state at every poll: every poll is an event.
            axum::routing::get(move || {
                let n = flips.fetch_add(1, Relaxed);
                async move {
                    (
                        [("content-type", "application/json")],
                        format!(r#"{{"data":{{"attributes":{{"status":"s{n}"}}}}}}"#),
                    )
                }
            }),
        );
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let _ = axum::serve(TcpListener::from_std(l).unwrap(), app).await;
        });
    });
    base
}

async fn serve(app: axum::Router) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    base
}

/// One answer: status (0: none within the client's timeout), body, ms.
async fn send(req: reqwest::RequestBuilder) -> (u16, Value, f64) {
    let t = Instant::now();
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            let body = r.json().await.unwrap_or(Value::Null);
            (status, body, t.elapsed().as_secs_f64() * 1e3)
        }
        Err(_) => (0, Value::Null, t.elapsed().as_secs_f64() * 1e3),
    }
}

/// Calls `f(i)` at every tick of `every` until `until` or `cap` calls, each call in a
/// task of its own (open loop).
async fn open_loop<F, Fut>(every: Duration, until: Instant, cap: usize, f: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tick = tokio::time::interval(every);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..cap {
        tick.tick().await;
        if Instant::now() >= until {
            break;
        }
        tasks.spawn(f(i));
    }
    while tasks.join_next().await.is_some() {}
}

/// Calls `f(i)` at most once a tick of `every`, one call after the other, until
/// `until` or `cap` calls (a hostile client's loop).
async fn paced_loop<F, Fut>(every: Duration, until: Instant, cap: usize, mut f: F)
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..cap {
        tick.tick().await;
        if Instant::now() >= until {
            break;
        }
        f(i).await;
    }
}

/// Tenant B: creates and reads at a steady rate until `until`.
async fn b_load(
    base: String,
    up: String,
    hook: String,
    until: Instant,
) -> (Timed, Timed, Vec<(u64, String)>) {
    let c = support::client_builder()
        .timeout(B_TIMEOUT)
        .build()
        .unwrap();
    let (creates, reads): (Timed, Timed) = Default::default();
    let ids: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let create = {
        let (c, base, creates, ids) = (c.clone(), base.clone(), creates.clone(), ids.clone());
        open_loop(B_CREATE_EVERY, until, usize::MAX, move |i| {
            let (c, base, creates, ids) = (c.clone(), base.clone(), creates.clone(), ids.clone());
            let spec = json!({
                "target": {"url": format!("{up}/b/{i}")},
                "state": "/data/attributes/status",
                "want": ["on"],
                "timeout": "1m",
                "poll": {"initial": "1s", "factor": 1, "max": "1s", "jitter": 0},
                "notify": [{"url": hook, "secret": SECRET}],
            });
            async move {
                let at = Utc::now();
                let (status, body, ms) = send(
                    c.post(format!("{base}/waits"))
                        .bearer_auth(TOKEN_B)
                        .json(&spec),
                )
                .await;
                creates.lock().unwrap().push((at, ms, status == 201));
                if let Some(id) = body["id"].as_str() {
                    ids.lock().unwrap().push((i as u64, id.to_string()));
                }
            }
        })
    };
    let read = {
        let (reads, ids) = (reads.clone(), ids.clone());
        open_loop(B_READ_EVERY, until, usize::MAX, move |i| {
            let (c, base, reads) = (c.clone(), base.clone(), reads.clone());
            // One of the 64 latest waits, in turn.
            let id = {
                let ids = ids.lock().unwrap();
                let back = i % ids.len().clamp(1, 64);
                ids.len().checked_sub(back + 1).map(|k| ids[k].1.clone())
            };
            async move {
                let Some(id) = id else { return };
                let at = Utc::now();
                let (status, _, ms) =
                    send(c.get(format!("{base}/waits/{id}")).bearer_auth(TOKEN_B)).await;
                reads.lock().unwrap().push((at, ms, status == 200));
            }
        })
    };
    tokio::join!(create, read);
    let ids = ids.lock().unwrap().clone();
    (creates, reads, ids)
}

/// What A's requests got, per input: status (0: no answer) → count, and the slowest
/// answer (ms).
#[derive(Default)]
struct Outcomes(Mutex<PerInput>);

type PerInput = HashMap<&'static str, (HashMap<u16, usize>, f64)>;

impl Outcomes {
    fn add(&self, input: &'static str, status: u16, ms: f64) {
        let mut o = self.0.lock().unwrap();
        let e = o.entry(input).or_default();
        *e.0.entry(status).or_default() += 1;
        e.1 = e.1.max(ms);
    }

    fn summary(&self) -> String {
        let o = self.0.lock().unwrap();
        let mut keys: Vec<_> = o.keys().copied().collect();
        keys.sort();
        keys.iter()
            .map(|k| {
                let (by, max) = &o[k];
                let mut s: Vec<_> = by.iter().collect();
                s.sort();
                let s: Vec<String> = s
                    .iter()
                    .map(|(st, n)| match **st {
                        0 => format!("{n} no answer"),
                        1 => format!("{n} closed by waitd"),
                        2 => format!("{n} held open to the end"),
                        _ => format!("{n}×{st}"),
                    })
                    .collect();
                format!("{k}: {} (slowest {max:.0} ms)", s.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// A's requests: one answer, counted, and a pause of 500 ms after a 429. A's loops
/// stay under its token's rate, so a 429 comes from elsewhere (M4's redelivery
/// interval); the pause keeps such a loop from spinning on refusals.
async fn a_send(out: &Outcomes, input: &'static str, req: reqwest::RequestBuilder) -> (u16, Value) {
    let (status, body, ms) = send(req.bearer_auth(TOKEN_A)).await;
    out.add(input, status, ms);
    if status == 429 {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (status, body)
}

/// C2: a JSONPath filter of `length` nested 31 deep.
fn nested_length() -> String {
    let mut e = "@.v".to_string();
    for _ in 0..31 {
        e = format!("length({e})");
    }
    format!("$[?{e}>0]")
}

/// Tenant A: the hostile `inputs` at once until `until`; its H1 waits (which
/// body, and the id).
async fn attack(
    base: String,
    up: String,
    hooks: String,
    until: Instant,
    out: Arc<Outcomes>,
    inputs: Vec<String>,
) -> Vec<(&'static str, String)> {
    let c = support::client_builder()
        .timeout(A_TIMEOUT)
        .build()
        .unwrap();
    let url = format!("{base}/waits");
    // C1: 640 comparisons in a row.
    let c1 = {
        let spec = json!({"target": {"url": format!("{up}/on")}, "success_condition": format!("1{}", "<1".repeat(640))});
        let (c, url, out) = (c.clone(), url.clone(), out.clone());
        async move {
            paced_loop(C1_EVERY, until, CAP, |_| {
                let req = c.post(&url).json(&spec);
                let out = out.clone();
                async move {
                    a_send(&out, "C1", req).await;
                }
            })
            .await
        }
    };
    // C2: nested function calls in a JSONPath filter.
    let c2 = {
        let spec =
            json!({"target": {"url": format!("{up}/c2")}, "state": nested_length(), "want": ["x"]});
        let (c, url, out) = (c.clone(), url.clone(), out.clone());
        async move {
            paced_loop(C2_EVERY, until, CAP, |_| {
                let req = c.post(&url).json(&spec);
                let out = out.clone();
                async move {
                    a_send(&out, "C2", req).await;
                }
            })
            .await
        }
    };
    // H1: a heavy pattern from the body over 3,000 items, and 3,000 distinct ones.
    let h1_ids: Arc<Mutex<Vec<(&'static str, String)>>> = Arc::default();
    let h1 = {
        let (c, url, out, ids, up) = (
            c.clone(),
            url.clone(),
            out.clone(),
            h1_ids.clone(),
            up.clone(),
        );
        async move {
            paced_loop(H1_EVERY, until, CAP, |_| {
                let (c, url, out, ids, up) =
                    (c.clone(), url.clone(), out.clone(), ids.clone(), up.clone());
                async move {
                    for (path, cond) in [
                        ("same", "body.items.all(i, !'a'.matches(body.p))"),
                        ("many", "body.items.all(i, !'a'.matches(i.p))"),
                    ] {
                        let spec = json!({
                            "target": {"url": format!("{up}/{path}")},
                            "success_condition": cond,
                            "timeout": "3s",
                            "poll": {"initial": "100ms", "factor": 1, "jitter": 0},
                            "retry": {"delay": "100ms", "max_delay": "100ms", "max_retries": null},
                        });
                        let (_, body) = a_send(&out, "H1", c.post(&url).json(&spec)).await;
                        if let Some(id) = body["id"].as_str() {
                            ids.lock().unwrap().push((path, id.to_string()));
                        }
                    }
                }
            })
            .await
        }
    };
    // H2: waits that end at once, each with 4 webhooks to a path that never answers.
    let h2 = {
        let notify: Vec<Value> = (0..4)
            .map(|k| json!({"url": format!("{hooks}/hold/{k}"), "secret": SECRET}))
            .collect();
        let spec = json!({"target": {"url": format!("{up}/on")}, "state": "/data/attributes/status",
            "want": ["on"], "notify": notify});
        let (c, url, out) = (c.clone(), url.clone(), out.clone());
        async move {
            paced_loop(Duration::from_millis(20), until, H2_WAITS, |_| {
                let req = c.post(&url).json(&spec);
                let out = out.clone();
                async move {
                    a_send(&out, "H2", req).await;
                }
            })
            .await
        }
    };
    // M1: a new state at every 100 ms poll, each announced to 4 webhooks that fail.
    let m1 = {
        let notify: Vec<Value> = (0..4)
            .map(|k| json!({"url": format!("{hooks}/fail/{k}"), "secret": SECRET, "events": ["state"]}))
            .collect();
        let left = until.saturating_duration_since(Instant::now());
        let spec = json!({"target": {"url": format!("{up}/flip")}, "state": "/data/attributes/status",
            "want": ["never"], "timeout": format!("{}ms", left.as_millis().max(1)),
            "poll": {"initial": "100ms", "factor": 1, "jitter": 0}, "notify": notify});
        let (c, url, out) = (c.clone(), url.clone(), out.clone());
        async move {
            a_send(&out, "M1", c.post(&url).json(&spec)).await;
        }
    };
    // M2: idle connections that send nothing, opened again when waitd closes them.
    let m2 = {
        let addr = base.trim_start_matches("http://").to_string();
        let out = out.clone();
        async move {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..M2_CONNECTIONS {
                let (addr, out) = (addr.clone(), out.clone());
                tasks.spawn(async move {
                    while Instant::now() < until {
                        let t = Instant::now();
                        let Ok(mut s) = TcpStream::connect(&addr).await else {
                            out.add("M2", 0, t.elapsed().as_secs_f64() * 1e3);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        };
                        // Held until waitd closes it ("status" 1), or to the
                        // attack's end (2), with how long it stayed open.
                        let left = until.saturating_duration_since(Instant::now());
                        let closed = support::closes_within(&mut s, left).await;
                        out.add(
                            "M2",
                            if closed { 1 } else { 2 },
                            t.elapsed().as_secs_f64() * 1e3,
                        );
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
        }
    };
    // M4: redelivery of one of A's delivered webhooks, again and again.
    let m4 = {
        let spec = json!({"target": {"url": format!("{up}/on")}, "state": "/data/attributes/status",
            "want": ["on"], "notify": [{"url": format!("{up}/a-ok"), "secret": SECRET}]});
        let (c, out) = (c.clone(), out.clone());
        async move {
            let (_, w) = a_send(&out, "M4", c.post(&url).json(&spec)).await;
            let Some(id) = w["id"].as_str().map(str::to_string) else {
                return;
            };
            let list = format!("{base}/waits/{id}/deliveries");
            let delivery = support::poll_for(Duration::from_secs(5), || {
                let (c, list) = (c.clone(), list.clone());
                async move {
                    let (_, page, _) = send(c.get(&list).bearer_auth(TOKEN_A)).await;
                    page["items"][0]["id"].as_i64()
                }
            })
            .await;
            let Some(d) = delivery else {
                eprintln!("noisy phase: M4's wait had no delivery within 5 s");
                return;
            };
            let retry = format!("{list}/{d}/retry");
            paced_loop(M4_EVERY, until, CAP, |_| {
                let req = c.post(&retry);
                let out = out.clone();
                async move {
                    a_send(&out, "M4", req).await;
                }
            })
            .await
        }
    };
    let on = |input: &str| inputs.iter().any(|i| i == input);
    let only = |input: &str, f: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>| {
        let on = on(input);
        async move {
            if on {
                f.await
            }
        }
    };
    tokio::join!(
        only("C1", Box::pin(c1)),
        only("C2", Box::pin(c2)),
        only("H1", Box::pin(h1)),
        only("H2", Box::pin(h2)),
        only("M1", Box::pin(m1)),
        only("M2", Box::pin(m2)),
        only("M4", Box::pin(m4)),
    );
    h1_ids.lock().unwrap().clone()
}

/// Peak resident memory of a process so far, MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    peak_rss_kib(pid) as f64 / 1024.0
}

fn p50_p99(v: Vec<f64>) -> [f64; 2] {
    [
        super::percentile(v.clone(), 0.5),
        super::percentile(v, 0.99),
    ]
}

/// B's figures over [from, to): requests started, polls arrived and ends announced
/// in it. A poll or a webhook that had not come by `end` counts as late as `end`.
#[allow(clippy::too_many_arguments)]
fn window(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    end: DateTime<Utc>,
    creates: &Timed,
    reads: &Timed,
    ids: &[(u64, String)],
    seen: &Seen,
    cores: f64,
) -> Window {
    let inside = |t: &DateTime<Utc>| *t >= from && *t < to;
    let ms = |d: chrono::TimeDelta| d.num_microseconds().unwrap_or(0) as f64 / 1e3;
    let timed = |t: &Timed| -> (Vec<f64>, usize) {
        let t = t.lock().unwrap();
        let v: Vec<_> = t.iter().filter(|s| inside(&s.0)).collect();
        (
            v.iter().map(|s| s.1).collect(),
            v.iter().filter(|s| !s.2).count(),
        )
    };
    let (create, create_failed) = timed(creates);
    let (read, read_failed) = timed(reads);
    let interval = chrono::TimeDelta::from_std(B_INTERVAL).unwrap();
    let polls = seen.polls.lock().unwrap();
    let hooks = seen.hooks.lock().unwrap();
    let mut lag = Vec::new();
    let mut hook = Vec::new();
    let mut undelivered = 0;
    for (n, id) in ids {
        let Some(p) = polls.get(n) else { continue };
        for pair in p.windows(2) {
            if inside(&pair[1]) {
                lag.push(ms(pair[1] - pair[0] - interval));
            }
        }
        let ended = p.len() > B_POLLS_BEFORE_ON;
        if !ended {
            // A poll still to come: as late as the end already.
            let last = *p.last().unwrap();
            if end - last > interval && inside(&(last + interval)) {
                lag.push(ms(end - last - interval));
            }
            continue;
        }
        match hooks.get(id) {
            Some((at, latency)) if inside(at) => hook.push(*latency),
            Some(_) => {}
            None => {
                // Ended at its last poll (give or take the write): not announced yet.
                let at = p[B_POLLS_BEFORE_ON];
                if inside(&at) {
                    hook.push(ms(end - at));
                    undelivered += 1;
                }
            }
        }
    }
    Window {
        creates: create.len(),
        reads: read.len(),
        lags: lag.len(),
        hooks: hook.len(),
        create: p50_p99(create),
        read: p50_p99(read),
        lag: p50_p99(lag),
        hook: p50_p99(hook),
        failed: create_failed + read_failed,
        undelivered,
        cores,
    }
}

/// The phase: one waitd process, B alone for a window, then B while A attacks for
/// a window, then up to `drain` for B's last webhooks and A's last deadlines.
pub async fn run(cfg: &Config) -> Noisy {
    let seen = Arc::new(Seen::default());
    let b_up = b_upstream(seen.clone()).await;
    let hooks = receiver(seen.clone()).await;
    let a_up = a_upstream();

    let dir = TempDir::new("waitd-noisy");
    let db = if cfg.sqlite {
        None
    } else {
        Some(TestDb::new().await)
    };
    let url = db
        .as_ref()
        .map_or_else(|| dir.sqlite_url(), |d| d.url.clone());
    let tokens = format!("a:{TOKEN_A},b:{TOKEN_B}");
    let port = free_port();
    // The default lease TTL, so the default webhook timeout (10 s, at most half of it)
    // holds; waitd's own pool size.
    let args = replica_args(
        &url,
        port,
        "30s",
        &["--tokens", &tokens, "--rate-limit", RATE_LIMIT],
    );
    let mut r = Replica::spawn(
        "noisy",
        &dir.path,
        port,
        support::set_flag(args, "--db-connections", "16"),
    );
    r.ready(Duration::from_secs(20)).await;
    let pid = r.pid.to_string();

    let warm = Duration::from_secs(2);
    let start = Instant::now();
    let b_until = start + warm + cfg.window * 2;
    let b = tokio::spawn(b_load(r.base.clone(), b_up, format!("{hooks}/ok"), b_until));
    tokio::time::sleep(warm).await;
    let (t0, cpu0) = (Utc::now(), super::process_cpu(&pid));
    eprintln!("noisy phase: tenant B alone for {:?}", cfg.window);
    tokio::time::sleep_until((start + warm + cfg.window).into()).await;
    let (t1, cpu1) = (Utc::now(), super::process_cpu(&pid));
    let rss_alone_mib = peak_rss_mib(r.pid);
    eprintln!("noisy phase: tenant A attacks for {:?}", cfg.window);
    let out = Arc::new(Outcomes::default());
    let a = tokio::spawn(attack(
        r.base.clone(),
        a_up,
        hooks.clone(),
        b_until,
        out.clone(),
        cfg.inputs.clone(),
    ));
    let (creates, reads, ids) = b.await.unwrap();
    let (t2, cpu2) = (Utc::now(), super::process_cpu(&pid));
    let h1_ids = a.await.unwrap();
    eprintln!("noisy phase: tenant A's requests: {}", out.summary());

    // B's last waits end about B_POLLS_BEFORE_ON intervals after their create, then
    // announce it; A's last H1 waits end by their 3 s deadlines.
    let drain_until = Instant::now() + cfg.drain;
    let all_in = support::poll_for(cfg.drain, || {
        let (seen, n) = (seen.clone(), ids.len());
        async move { (seen.hooks.lock().unwrap().len() >= n).then_some(()) }
    })
    .await;
    if all_in.is_none() {
        eprintln!(
            "noisy phase: {} of B's {} webhooks arrived within {:?} of the attack's end",
            seen.hooks.lock().unwrap().len(),
            ids.len(),
            cfg.drain
        );
    }
    let end = Utc::now();
    // A's last H1 deadlines are 3 s after their creates, before the attack's end.
    tokio::time::sleep_until(drain_until.min(b_until + Duration::from_secs(5)).into()).await;

    // A's H1 waits, read back: how far past its deadline each ended.
    let c = support::client_builder()
        .timeout(A_TIMEOUT)
        .build()
        .unwrap();
    let (mut overrun, mut late, mut read) = (f64::NEG_INFINITY, 0, 0);
    let at = |w: &Value, k: &str| {
        w[k].as_str()
            .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
            .map(|t| t.with_timezone(&Utc))
    };
    // Per body and end: how long the waits lived (ms), and one reason.
    let mut lives: HashMap<(&str, String), (Vec<f64>, String)> = HashMap::new();
    for (body, id) in &h1_ids {
        let w = loop {
            let (status, w, _) =
                send(c.get(format!("{}/waits/{id}", r.base)).bearer_auth(TOKEN_A)).await;
            if status != 429 {
                break w;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let (Some(deadline), now) = (at(&w, "deadline"), Utc::now()) else {
            continue;
        };
        let finished = at(&w, "finished_at").unwrap_or(now);
        if let Some(created) = at(&w, "created_at") {
            let e = lives
                .entry((body, w["status"].as_str().unwrap_or("?").to_string()))
                .or_default();
            e.0.push((finished - created).num_milliseconds() as f64);
            e.1 = w["reason"]
                .as_str()
                .unwrap_or("")
                .chars()
                .take(160)
                .collect();
        }
        let past = (finished - deadline).num_milliseconds() as f64 / 1e3;
        overrun = overrun.max(past);
        read += 1;
        if past > 1.0 {
            late += 1;
        }
    }
    for ((body, status), (v, reason)) in lives {
        eprintln!(
            "noisy phase: A's H1 waits on /{body}: {} {status}, {:.0} / {:.0} ms after their create (p50 / max): {reason}",
            v.len(),
            super::percentile(v.clone(), 0.5),
            super::percentile(v, 1.0)
        );
    }

    let alive = r.running() && r.panics().is_empty();
    if !alive {
        eprintln!(
            "noisy phase: waitd died or panicked; log:\n{}",
            r.log_tail(30)
        );
    }
    let rss_peak_mib = peak_rss_mib(r.pid);
    let cores = |a: f64, b: f64, from: DateTime<Utc>, to: DateTime<Utc>| {
        (b - a) / ((to - from).num_milliseconds() as f64 / 1e3)
    };
    let result = Noisy {
        alone: window(
            t0,
            t1,
            end,
            &creates,
            &reads,
            &ids,
            &seen,
            cores(cpu0, cpu1, t0, t1),
        ),
        attacked: window(
            t1,
            t2,
            end,
            &creates,
            &reads,
            &ids,
            &seen,
            cores(cpu1, cpu2, t1, t2),
        ),
        alive,
        a_waits: read,
        overrun_s: if read == 0 { f64::NAN } else { overrun },
        a_late: late,
        rss_alone_mib,
        rss_peak_mib,
    };
    for (name, w) in [("alone", &result.alone), ("attacked", &result.attacked)] {
        eprintln!(
            "noisy phase, B {name}: create {:.1} / {:.1} ms ({} creates), read {:.1} / {:.1} ms ({}), \
             lag {:.1} / {:.1} ms ({} gaps), webhook {:.1} / {:.1} ms ({}, {} undelivered), \
             {} without a 2xx, waitd on {:.2} cores",
            w.create[0],
            w.create[1],
            w.creates,
            w.read[0],
            w.read[1],
            w.reads,
            w.lag[0],
            w.lag[1],
            w.lags,
            w.hook[0],
            w.hook[1],
            w.hooks,
            w.undelivered,
            w.failed,
            w.cores
        );
    }
    drop(r);
    if let Some(db) = db {
        db.drop_db().await;
    }
    result
}

/// A row of B's: its number, what it shows, and which figure of a window.
type Row = (&'static str, &'static str, fn(&Window) -> [f64; 2]);

/// The phase's rows of the table: medians of the runs, and the ratio of B's p99
/// under attack to its p99 alone (of the medians; the runs' own, median).
pub fn table(runs: &[&Noisy], window: Duration, sqlite: bool, inputs: &[String]) -> String {
    use std::fmt::Write;
    let m = |f: &dyn Fn(&Noisy) -> f64| super::median(runs.iter().map(|r| f(r)).collect());
    let store = if sqlite { "SQLite" } else { "Postgres" };
    let mut t = String::new();
    let rows: [Row; 4] = [
        (
            "13",
            "tenant B's create latency, p50 / p99: alone → while tenant A sends {inputs} at once",
            |w| w.create,
        ),
        ("13b", "B's read latency (`GET /waits/{id}`)", |w| w.read),
        (
            "13c",
            "B's poll lag (the gap between two polls at its target, less the 1 s interval)",
            |w| w.lag,
        ),
        (
            "13d",
            "B's webhook delivery (its end's event → the receiver's 204, on the host and port of H2's receiver)",
            |w| w.hook,
        ),
    ];
    for (i, (row, what, get)) in rows.into_iter().enumerate() {
        let (a50, a99) = (m(&|r| get(&r.alone)[0]), m(&|r| get(&r.alone)[1]));
        let (b50, b99) = (m(&|r| get(&r.attacked)[0]), m(&|r| get(&r.attacked)[1]));
        let own = m(&|r| get(&r.attacked)[1] / get(&r.alone)[1]);
        let what = what.replace("{inputs}", &inputs.join(", "));
        let setting = if i == 0 {
            format!(
                " (one waitd, {store}, {} s each, medians of {})",
                window.as_secs(),
                runs.len()
            )
        } else {
            String::new()
        };
        let undelivered = if i == 3 {
            format!(
                "; undelivered at the end: {:.0} / {:.0} (counted at the time waited)",
                m(&|r| r.alone.undelivered as f64),
                m(&|r| r.attacked.undelivered as f64)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "| {row} | {what}{setting} | {a50:.1} / {a99:.1} ms → {b50:.1} / {b99:.1} ms: p99 ×{:.2} (the runs' own, median ×{own:.2}){undelivered} | p99 ≤ 2× alone |",
            b99 / a99
        );
    }
    let alive = runs.iter().filter(|r| r.alive).count();
    let _ = writeln!(
        t,
        "| 13e | waitd alive at the end with no panic logged; A's H1 waits (3 s timeouts): the latest end past its deadline, and how many ended more than 1 s past it | {alive} of {} runs; {:.2} s ({:.0} of {:.0}) | alive; ≤ 1 s |",
        runs.len(),
        m(&|r| r.overrun_s),
        m(&|r| r.a_late as f64),
        m(&|r| r.a_waits as f64)
    );
    let _ = writeln!(
        t,
        "| 13f | waitd's peak RSS: after B alone / after the attack; cores it used: alone / under attack; B's requests without a 2xx: alone / under attack | {:.0} / {:.0} MiB; {:.2} / {:.2}; {:.0} / {:.0} | |",
        m(&|r| r.rss_alone_mib),
        m(&|r| r.rss_peak_mib),
        m(&|r| r.alone.cores),
        m(&|r| r.attacked.cores),
        m(&|r| r.alone.failed as f64),
        m(&|r| r.attacked.failed as f64)
    );
    t
}
