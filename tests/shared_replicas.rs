//! Shared polls across replicas (docs/replicas.md §6.2, placement): the waits of one
//! tenant on one URL are claimed by one replica, so two replicas still send about one
//! request a second per URL, and after `kill -9` of one the survivor holds them all
//! and still shares. Each replica is the real binary; the upstream records which
//! replica sent each request (`Waitd-Replica`, `--probe-identity`).

mod support;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use support::recorder::*;
use support::replica::*;
use support::{TempDir, TestDb, client, until};

const URLS: usize = 10;
const PER_URL: usize = 100;
/// The window each rate is counted over.
const WINDOW: Duration = Duration::from_secs(10);

fn every_second(url: &str) -> Value {
    json!({
        "target": {"url": url},
        "state": "/data/attributes/status",
        "want": ["on"],
        "timeout": "5m",
        "poll": {"initial": "1s", "factor": 1, "max": "1s", "jitter": 0},
    })
}

/// Requests a second per path over `WINDOW` from `since`, and which replicas sent
/// them.
fn rates(up: &Recorder, paths: &[String], since: Instant) -> Vec<(f64, HashSet<String>)> {
    let hits = up.hits();
    paths
        .iter()
        .map(|p| {
            let mine: Vec<&Hit> = hits
                .iter()
                .filter(|h| {
                    h.path == p.trim_start_matches('/') && h.at >= since && h.at < since + WINDOW
                })
                .collect();
            let senders = mine.iter().filter_map(|h| h.replica.clone()).collect();
            (mine.len() as f64 / WINDOW.as_secs_f64(), senders)
        })
        .collect()
}

/// Awaits, hit by hit, every path's last two requests coming at least 0.8 s after
/// the one before (polls every 1 s, shared), counted from now.
async fn settled(up: &Recorder, paths: &[String]) -> bool {
    let from = Instant::now();
    up.hit_when(Duration::from_secs(15), |hits| {
        each_steady(hits, paths, from, Duration::from_millis(800), 2)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_send_one_request_a_second_per_url_and_still_after_a_kill_9() {
    let dir = TempDir::new("waitd-placement");
    let db = TestDb::new().await;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&db.url)
        .await
        .unwrap();
    let up = Recorder::start().await;
    let paths: Vec<String> = (0..URLS).map(|i| format!("/placed/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let mut rs = vec![
        Replica::start("a", &dir.path, &db.url, "3s", &[]).await,
        Replica::start("b", &dir.path, &db.url, "3s", &[]).await,
    ];
    // A replica's first claim takes any wait, whatever its placement: both have
    // made their first claim (and their slots) before the first create.
    let enlisted = until(Duration::from_secs(30), || async {
        let holders: i64 = sqlx::query_scalar("SELECT count(DISTINCT holder) FROM slots")
            .fetch_one(&pool)
            .await
            .unwrap_or(0);
        holders == 2
    })
    .await;
    assert!(enlisted.is_some(), "both replicas made their slots");
    // Created through both replicas in turn, 20 at a time.
    let http = client();
    let specs: Vec<(String, Value)> = (0..URLS * PER_URL)
        .map(|i| (rs[i % 2].url("/waits"), every_second(&urls[i % URLS])))
        .collect();
    for chunk in specs.chunks(20) {
        let made = join_all(chunk.iter().map(|(to, s)| http.post(to).json(s).send())).await;
        for r in made {
            assert_eq!(r.unwrap().status(), 201);
        }
    }
    let held = until(Duration::from_secs(60), || async {
        let unowned: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM waits w LEFT JOIN slots s ON s.id = w.owner
             WHERE w.status = 'running' AND s.holder IS NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap_or(1);
        unowned == 0
    })
    .await;
    assert!(held.is_some(), "every wait is held");
    // Each URL's waits on one replica, and both replicas hold some.
    let owners: Vec<(String, i64)> = sqlx::query_as(
        "SELECT s.spec->'target'->>'url', count(DISTINCT l.holder)
         FROM waits w JOIN wait_specs s ON s.wait_id = w.id JOIN slots l ON l.id = w.owner
         WHERE w.status = 'running' GROUP BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(owners.len(), URLS);
    assert!(owners.iter().all(|(_, n)| *n == 1), "{owners:?}");
    let replicas: i64 = sqlx::query_scalar(
        "SELECT count(DISTINCT s.holder) FROM waits w JOIN slots s ON s.id = w.owner
             WHERE w.status = 'running'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(replicas, 2, "both replicas hold waits");

    // The steady state: every URL polled about a second apart again, its waits'
    // first polls behind it.
    assert!(
        settled(&up, &paths).await,
        "the URLs' polls did not settle a second apart"
    );
    let since = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let two = rates(&up, &paths, since);
    let worst = two.iter().map(|(r, _)| *r).fold(0.0, f64::max);
    println!(
        "two replicas, {} waits on {URLS} URLs at 1 s: requests a second per URL {:?}",
        URLS * PER_URL,
        two.iter()
            .map(|(r, _)| format!("{r:.1}"))
            .collect::<Vec<_>>()
    );
    assert!(worst <= 1.2, "{two:?}");
    assert!(
        two.iter().all(|(_, senders)| senders.len() == 1),
        "each URL is polled by one replica: {two:?}"
    );

    // kill -9 the replica holding more; the survivor takes every wait over.
    let by_owner: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT s.holder::text, count(*) FROM waits w JOIN slots s ON s.id = w.owner
         WHERE w.status = 'running' GROUP BY 1",
    )
    .fetch_all(&pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let victim = if rs[0]
        .owner()
        .map(|o| o.to_string())
        .and_then(|o| by_owner.get(&o).copied())
        >= rs[1]
            .owner()
            .map(|o| o.to_string())
            .and_then(|o| by_owner.get(&o).copied())
    {
        0
    } else {
        1
    };
    let survivor = rs[1 - victim]
        .owner()
        .expect("the survivor names its owner id");
    rs[victim].kill9();
    let killed = Instant::now();
    let taken = until(Duration::from_secs(60), || async {
        let others: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM waits w LEFT JOIN slots s ON s.id = w.owner
             WHERE w.status = 'running' AND s.holder IS DISTINCT FROM $1",
        )
        .bind(survivor)
        .fetch_one(&pool)
        .await
        .unwrap_or(1);
        others == 0
    })
    .await;
    assert!(taken.is_some(), "the survivor holds every wait");
    println!(
        "the survivor held every wait {:?} after the kill",
        killed.elapsed()
    );
    assert!(
        settled(&up, &paths).await,
        "the URLs' polls did not settle a second apart after the kill"
    );
    let since = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let one = rates(&up, &paths, since);
    let worst = one.iter().map(|(r, _)| *r).fold(0.0, f64::max);
    println!(
        "after the kill: requests a second per URL {:?}",
        one.iter()
            .map(|(r, _)| format!("{r:.1}"))
            .collect::<Vec<_>>()
    );
    assert!(worst <= 1.2, "{one:?}");
    assert!(one.iter().all(|(r, _)| *r > 0.0), "every URL is polled");
    let survivor_name = &rs[1 - victim].name;
    assert!(
        one.iter()
            .all(|(_, s)| s.len() == 1 && s.contains(survivor_name.as_str())),
        "{one:?}"
    );
    drop(rs);
    pool.close().await;
    db.drop_db().await;
}
