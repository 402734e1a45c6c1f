//! (17) Callback waits: N waits ended by a POST to their callback URLs, each
//! followed over SSE and blocked on by `GET /waits/{id}?wait=true`. From each
//! POST's send to the terminal event at its follower, and to the release of its
//! blocked read, p50 and p99; on one replica, and on two, with the waits created,
//! followed and blocked on at replica A and the POSTs sent to replica B.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{TempDir, TestDb};

/// POSTs sent from one loopback address: callback URLs take a burst of
/// `BURST` requests from one address, and these few stay under it.
const PER_ADDRESS: usize = 10;

/// One case's figures, ms; NaN where it was not run.
#[derive(Clone, Copy)]
pub struct Case {
    /// POST sent → the terminal event at the wait's SSE follower.
    pub event_p50: f64,
    pub event_p99: f64,
    /// POST sent → the blocked read's answer.
    pub held_p50: f64,
    pub held_p99: f64,
    /// POST sent → its own 200 (the end committed and the wait read back).
    pub post_p50: f64,
    pub post_p99: f64,
}

impl Case {
    pub const NONE: Case = Case {
        event_p50: f64::NAN,
        event_p99: f64::NAN,
        held_p50: f64::NAN,
        held_p99: f64::NAN,
        post_p50: f64::NAN,
        post_p99: f64::NAN,
    };
}

/// The phase's figures: one replica, then two.
#[derive(Clone, Copy)]
pub struct Callbacks {
    pub one: Case,
    pub two: Case,
}

impl Callbacks {
    pub const NONE: Callbacks = Callbacks {
        one: Case::NONE,
        two: Case::NONE,
    };
}

/// `n` waits; the POSTs spread evenly over `window`, each sent at its tick
/// whatever became of the ones before it (an open loop).
pub async fn run(n: usize, window: Duration) -> Callbacks {
    const {
        assert!(PER_ADDRESS <= waitd::api::callbacks::BURST as usize);
    }
    Callbacks {
        one: case(n, window, false).await,
        two: case(n, window, true).await,
    }
}

/// What one wait saw: the POST's send and answer, its follower's terminal
/// event, its blocked read's answer.
struct Timing {
    sent: Instant,
    sent_wall: chrono::DateTime<chrono::Utc>,
    answered: Instant,
}

async fn case(n: usize, window: Duration, two: bool) -> Case {
    let label = if two { "two replicas" } else { "one replica" };
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-bench-callbacks");
    // Every follower and blocked read takes a place among the tenant's streams:
    // with exactly 2N places, one more blocked read is refused only once all of
    // them are open (see below).
    let places = (2 * n).to_string();
    // waitd gives streams at most half its connections, and a tenant a quarter.
    let connections = (8 * n).max(4096).to_string();
    let extra = [
        "--max-connections",
        connections.as_str(),
        "--max-streams",
        places.as_str(),
        "--max-streams-per-tenant",
        places.as_str(),
        // 2N connections from the benchmark's one address.
        "--max-connections-per-address",
        "0",
    ];
    let a = super::spawn_replica(&db, &dir, "a", "10s", &extra).await;
    let b = if two {
        Some(super::spawn_replica(&db, &dir, "b", "10s", &extra).await)
    } else {
        None
    };
    let c = super::client();

    // The waits, created at A, 32 at a time.
    let created: Vec<(String, String)> = futures_util::stream::iter(0..n)
        .map(|_| {
            let (c, base) = (c.clone(), a.base.clone());
            async move {
                let r = c
                    .post(format!("{base}/waits"))
                    .json(&json!({"callback": {}, "timeout": "10m"}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 201);
                let w: Value = r.json().await.unwrap();
                (
                    w["id"].as_str().unwrap().to_string(),
                    w["callback_url"].as_str().unwrap().to_string(),
                )
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    // The POSTs go to B's address where there is one.
    let post_base = b.as_ref().map_or(a.base.clone(), |b| b.base.clone());
    let urls: Vec<String> = created
        .iter()
        .map(|(_, url)| {
            let secret = url.strip_prefix(&a.base).expect("a callback URL on A");
            format!("{post_base}{secret}")
        })
        .collect();

    // A follower for each wait at A; each counts as open once its answer began.
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(n);
    let mut followers = Vec::new();
    for (id, _) in &created {
        let (c, url, ready) = (
            c.clone(),
            format!("{}/waits/{id}/events?follow=true", a.base),
            ready_tx.clone(),
        );
        followers.push(tokio::spawn(async move {
            let r = c.get(url).send().await.unwrap();
            assert_eq!(r.status(), 200, "a follower was refused");
            let _ = ready.send(()).await;
            let mut body = r.bytes_stream();
            let mut buf = String::new();
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
        }));
    }
    for _ in 0..n {
        ready_rx.recv().await;
    }
    // A blocked read of each wait at A.
    let mut held = Vec::new();
    for (id, _) in &created {
        let (c, url) = (c.clone(), format!("{}/waits/{id}?wait=true", a.base));
        held.push(tokio::spawn(async move {
            // The probe below may take the last place just before this arrives:
            // then it asks again.
            let r = loop {
                let r = c.get(&url).send().await.unwrap();
                if r.status() != 429 {
                    break r;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            };
            let got = Instant::now();
            let status = r.status().as_u16();
            let w: Value = r.json().await.unwrap_or(Value::Null);
            (got, status, w["status"].as_str().map(str::to_string))
        }));
    }
    // Every blocked read holds its place once one more is refused at the cap (a
    // blocked read refused because this one held the last place asks again).
    let probe = format!("{}/waits/{}?wait=1ms", a.base, created[0].0);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let r = c.get(&probe).send().await.unwrap();
        if r.status() == 429 {
            break;
        }
        assert!(
            Instant::now() < until,
            "{label}: the blocked reads were not all open within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The last of them read their wait just after taking their place.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The POSTs, one every WINDOW / N, each from a loopback address that sends
    // PER_ADDRESS of them at most.
    let clients: Vec<reqwest::Client> = (0..n.div_ceil(PER_ADDRESS))
        .map(|k| {
            let ip = Ipv4Addr::new(127, 1, (k / 250) as u8, (k % 250 + 1) as u8);
            crate::support::client_builder()
                .local_address(IpAddr::V4(ip))
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap()
        })
        .collect();
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let step = window / n as u32;
    let mut posts = Vec::new();
    for (i, url) in urls.into_iter().enumerate() {
        let c = clients[i % clients.len()].clone();
        let tick = start + step * i as u32;
        posts.push(tokio::spawn(async move {
            tokio::time::sleep_until(tick).await;
            let (sent, sent_wall) = (Instant::now(), chrono::Utc::now());
            let r = c.post(url).json(&json!({"build": i})).send().await.unwrap();
            let answered = Instant::now();
            assert_eq!(r.status(), 200, "a callback was refused");
            Timing {
                sent,
                sent_wall,
                answered,
            }
        }));
    }
    // Meanwhile, how many of its 16 database connections the replica taking the
    // POSTs has in use, every 10 ms.
    let sampled = {
        let base = post_base.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(start).await;
            let mut v = Vec::new();
            while v.len() < 10_000 {
                let m = super::metrics(&base).await;
                v.push(
                    m.get("waitd_db_connections_in_use")
                        .copied()
                        .unwrap_or(f64::NAN),
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
                if start.elapsed() > window * 2 {
                    break;
                }
            }
            v
        })
    };
    let mut timings = Vec::new();
    for p in posts {
        timings.push(p.await.unwrap());
    }
    let in_use = sampled.await.unwrap();
    let first = timings.iter().map(|t| t.sent).min().unwrap();
    let last = timings.iter().map(|t| t.answered).max().unwrap();
    eprintln!(
        "callbacks phase, {label}: {n} POSTs sent over {} ms, the last answered {} ms after the first was sent; \
         database connections in use at the replica taking them, every 10 ms over twice the window: mean {:.1}, all 16 in {:.0}% of the samples",
        window.as_millis(),
        (last - first).as_millis(),
        in_use.iter().sum::<f64>() / in_use.len() as f64,
        100.0 * in_use.iter().filter(|x| **x >= 16.0).count() as f64 / in_use.len() as f64,
    );
    let (mut event, mut release, mut post, mut write_began, mut after_answer) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ((f, h), t) in followers.into_iter().zip(held).zip(&timings) {
        let (got, at) = f.await.unwrap().expect("the follower saw the end");
        event.push(ms(got - t.sent));
        after_answer.push(ms(got.saturating_duration_since(t.answered)));
        if let Some(at) = at {
            write_began.push((at - t.sent_wall).num_microseconds().unwrap_or(0) as f64 / 1e3);
        }
        let (released, status, w) = h.await.unwrap();
        assert_eq!(
            (status, w.as_deref()),
            (200, Some("succeeded")),
            "a blocked read"
        );
        release.push(ms(released - t.sent));
        post.push(ms(t.answered - t.sent));
    }
    let p = |v: &[f64], q: f64| super::percentile(v.to_vec(), q);
    eprintln!(
        "callbacks phase, {label}: POST sent → terminal event {:.1} / {:.1} ms, → blocked read released {:.1} / {:.1} ms (p50 / p99)",
        p(&event, 0.5),
        p(&event, 0.99),
        p(&release, 0.5),
        p(&release, 0.99),
    );
    eprintln!(
        "callbacks phase, {label}: where the time goes (p50 / p99): POST sent → the end's write began (its event's `at`) {:.1} / {:.1} ms; → the POST's 200 {:.1} / {:.1} ms; the POST's 200 → the event {:.1} / {:.1} ms",
        p(&write_began, 0.5),
        p(&write_began, 0.99),
        p(&post, 0.5),
        p(&post, 0.99),
        p(&after_answer, 0.5),
        p(&after_answer, 0.99),
    );
    drop(a);
    drop(b);
    db.drop_db().await;
    Case {
        event_p50: p(&event, 0.5),
        event_p99: p(&event, 0.99),
        held_p50: p(&release, 0.5),
        held_p99: p(&release, 0.99),
        post_p50: p(&post, 0.5),
        post_p99: p(&post, 0.99),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
