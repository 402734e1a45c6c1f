//! Fault tolerance of several waitd replicas sharing one Postgres, black-box: every
//! replica is the real `waitd` binary in its own process, killed with SIGKILL or
//! stopped with SIGTERM; Postgres is stopped, restarted or frozen (a throwaway
//! cluster each such test starts itself). The upstream records each probe with the
//! replica that sent it (see `support/recorder.rs`), so double polling is measured, not
//! guessed.
//!
//! The tests run one at a time (they measure timings on a small machine) and print
//! their figures: `cargo test --test replicas -- --nocapture`. The `#[ignore]`d ones
//! reproduce known bugs (`-- --ignored` runs them). A failing test keeps the replicas'
//! logs and prints where; `WAITD_TEST_KEEP_LOGS=1` keeps them always,
//! `WAITD_TEST_RUST_LOG` sets the replicas' `RUST_LOG`, and `WAITD_PG_BIN` points at
//! the Postgres server binaries (default `/usr/lib/postgresql/15/bin`).

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use serde_json::{Value, json};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use support::follower::*;
use support::pg::*;
use support::recorder::*;
use support::replica::*;
use support::{TempDir, TestDb, client, until};
use uuid::Uuid;

/// One test at a time: they time things, and each runs several processes.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The longest a replica goes between sweeps for claimable waits when no notice
/// wakes it (`WorkerConfig::claim_interval`: a tenth of the lease TTL, between 100 ms
/// and 1 s). After a lease runs out nothing notifies, so a takeover may wait up to
/// one sweep.
const CLAIM_SWEEP: Duration = Duration::from_secs(1);

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// A wait polling `url` at a fixed `interval` until the status is "on".
fn wait_spec(url: &str, interval: Duration, label: &str) -> Value {
    let i = format!("{}ms", interval.as_millis());
    json!({
        "target": {"url": url},
        "state": "/data/attributes/status",
        "want": ["on"],
        "fail": ["failed_deployment"],
        "timeout": "2m",
        "poll": {"initial": i, "factor": 1, "max": i, "jitter": 0},
        "retry": {"delay": i, "max_delay": i, "max_retries": null},
        "labels": {"test": label}
    })
}

/// Creates one wait per URL, spread round-robin over `via`, 16 requests at a time.
async fn create_all(
    via: &[&Replica],
    urls: &[String],
    interval: Duration,
    label: &str,
) -> Vec<Uuid> {
    create_n_at_once(via, urls, interval, label, 16).await
}

/// Creates one wait per URL, spread round-robin over `via`, `at_once` requests at a
/// time; the ids in the order of `urls`.
async fn create_n_at_once(
    via: &[&Replica],
    urls: &[String],
    interval: Duration,
    label: &str,
    at_once: usize,
) -> Vec<Uuid> {
    use futures_util::StreamExt;
    let client = client();
    let answers: Vec<Answer> = futures_util::stream::iter(urls.iter().enumerate().map(|(i, u)| {
        let r = via[i % via.len()];
        send(
            client
                .post(r.url("/waits"))
                .json(&wait_spec(u, interval, label)),
        )
    }))
    .buffered(at_once)
    .collect()
    .await;
    answers
        .into_iter()
        .map(|a| {
            assert_eq!(a.status, 201, "create: {}", a.body);
            a.body["id"].as_str().unwrap().parse().unwrap()
        })
        .collect()
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .expect("connect to the test database")
}

#[derive(Clone, Debug)]
struct Row {
    id: Uuid,
    status: String,
    state: Option<String>,
    owner: Option<Uuid>,
    epoch: i64,
    polls: i32,
    seq: i32,
    /// The owner's lease (a replica holds one lease for all its waits).
    lease_until: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

async fn rows(db: &PgPool) -> HashMap<Uuid, Row> {
    type Columns = (
        Uuid,
        String,
        Option<String>,
        Option<Uuid>,
        i64,
        i32,
        i32,
        Option<DateTime<Utc>>,
        Option<DateTime<Utc>>,
    );
    let v: Vec<Columns> = sqlx::query_as(
        // The owner is the replica holding the wait's slot; the epoch counts the
        // claims of the row and the takeovers of its slot.
        "SELECT w.id, w.status, w.state, s.holder, w.epoch + coalesce(s.gen, 0), w.polls, w.seq,
                r.lease_until, w.finished_at
         FROM waits w LEFT JOIN slots s ON s.id = w.owner LEFT JOIN replicas r ON r.id = s.holder",
    )
    .fetch_all(db)
    .await
    .expect("read waits");
    v.into_iter()
        .map(
            |(id, status, state, owner, epoch, polls, seq, lease_until, finished_at)| {
                let row = Row {
                    id,
                    status,
                    state,
                    owner,
                    epoch,
                    polls,
                    seq,
                    lease_until,
                    finished_at,
                };
                (id, row)
            },
        )
        .collect()
}

async fn running(db: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM waits WHERE status = 'running'")
        .fetch_one(db)
        .await
        .unwrap_or(-1)
}

/// Whether every wait running now ends within `within`; how long it took, if so.
/// Asked of `r` with the blocking GET (`?wait=`), the API's own notice that a wait
/// ended, 64 waits at a time, rather than by polling the table; then the
/// table is read once, so that it says the same.
async fn all_end(r: &Replica, db: &PgPool, within: Duration) -> Option<Duration> {
    use futures_util::StreamExt;
    let started = Instant::now();
    let ids: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM waits WHERE status = 'running'")
        .fetch_all(db)
        .await
        .unwrap();
    let c = client();
    let ended: Vec<bool> = futures_util::stream::iter(ids)
        .map(|id| {
            let left = within.saturating_sub(started.elapsed()).as_millis().max(1);
            let req = c.get(r.url(&format!("/waits/{id}?wait={left}ms")));
            async move {
                let a = send(req).await;
                a.status == 200 && a.body["status"] != "running"
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    (ended.iter().all(|e| *e) && running(db).await == 0).then(|| started.elapsed())
}

#[derive(Clone, Debug, PartialEq)]
struct Ev {
    /// The global cursor (`gid`); negative (minus the row id) while unsequenced.
    id: i64,
    seq: i32,
    kind: String,
    data: Value,
}

async fn histories(db: &PgPool) -> HashMap<Uuid, Vec<Ev>> {
    let v: Vec<(i64, Uuid, i32, String, Value)> = sqlx::query_as(
        "SELECT COALESCE(gid, -id) AS id, wait_id, seq, kind, data FROM wait_events ORDER BY wait_id, seq",
    )
    .fetch_all(db)
    .await
    .expect("read events");
    let mut m: HashMap<Uuid, Vec<Ev>> = HashMap::new();
    for (id, w, seq, kind, data) in v {
        m.entry(w).or_default().push(Ev {
            id,
            seq,
            kind,
            data,
        });
    }
    m
}

/// Every wait's history is 1..=seq with no gap, starts with `created`, and holds
/// exactly one terminal event, last, named like the status (none while running).
fn check_histories(rows: &HashMap<Uuid, Row>, hist: &HashMap<Uuid, Vec<Ev>>) {
    for (id, r) in rows {
        let h = hist.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let kinds: Vec<&str> = h.iter().map(|e| e.kind.as_str()).collect();
        let seqs: Vec<i32> = h.iter().map(|e| e.seq).collect();
        let want: Vec<i32> = (1..=r.seq).collect();
        assert_eq!(
            seqs, want,
            "wait {id}: event seqs are not 1..={}: {kinds:?}",
            r.seq
        );
        assert_eq!(kinds.first(), Some(&"created"), "wait {id}: {kinds:?}");
        let terminals = kinds.iter().filter(|k| TERMINAL.contains(k)).count();
        if r.status == "running" {
            assert_eq!(
                terminals, 0,
                "running wait {id} has a terminal event: {kinds:?}"
            );
        } else {
            assert_eq!(
                terminals, 1,
                "wait {id} ({}) ended {terminals} times: {kinds:?}",
                r.status
            );
            assert_eq!(
                kinds.last(),
                Some(&r.status.as_str()),
                "wait {id}: {kinds:?}"
            );
        }
    }
}

/// Waits whose `state` events do not chain (an event starting from a state other than
/// the one the previous event ended in): an observed change lost or replayed, as when
/// a wait resumes from an engine checkpoint older than its history.
fn state_chain_breaks(hist: &HashMap<Uuid, Vec<Ev>>) -> Vec<(Uuid, Vec<(Value, Value)>)> {
    let mut broken = Vec::new();
    for (id, h) in hist {
        let states: Vec<(Value, Value)> = h
            .iter()
            .filter(|e| e.kind == "state")
            .map(|e| (e.data["from"].clone(), e.data["to"].clone()))
            .collect();
        let mut at = Value::Null;
        for (from, to) in &states {
            if *from != at {
                broken.push((*id, states.clone()));
                break;
            }
            at = to.clone();
        }
    }
    broken
}

/// Starts replicas side by side and waits until each is ready.
async fn start_all(
    names: &[&str],
    dir: &TempDir,
    db_url: &str,
    ttl: &str,
    extra: &[&str],
) -> Vec<Replica> {
    let mut rs: Vec<Replica> = names
        .iter()
        .map(|n| {
            let port = free_port();
            Replica::spawn(n, &dir.path, port, replica_args(db_url, port, ttl, extra))
        })
        .collect();
    for r in rs.iter_mut() {
        r.ready(Duration::from_secs(20)).await;
    }
    rs
}

/// Running waits no replica holds (in no slot, or in a slot nobody holds).
const UNHELD: &str = "SELECT count(*) FROM waits w LEFT JOIN slots s ON s.id = w.owner
                      WHERE w.status = 'running' AND s.holder IS NULL";

/// Whether every path is polled at least `n` times within 10 s (awaited hit by
/// hit) and then every running wait has an owner (a wait is polled only once
/// claimed, so one read of the table tells).
async fn all_owned_and_polled(db: &PgPool, up: &Recorder, paths: &[String], n: usize) -> bool {
    let polled = up
        .hit_when(Duration::from_secs(10), |hits| {
            each_hit(hits, paths, n, up.started())
        })
        .await;
    let unowned: i64 = sqlx::query_scalar(UNHELD).fetch_one(db).await.unwrap_or(1);
    polled && unowned == 0
}

fn assert_no_panics(rs: &[&Replica]) {
    for r in rs {
        let p = r.panics();
        assert!(
            p.is_empty(),
            "replica {} panicked:\n{}",
            r.name,
            p.join("\n")
        );
    }
}

/// Every hit the upstream recorded, with the index in `rs` of the replica that sent
/// it (each names itself in its probes' `Waitd-Replica` header); None for a hit that
/// names none of them.
fn attribute<'a>(
    up: &Recorder,
    rs: impl IntoIterator<Item = &'a Replica>,
) -> Vec<(Hit, Option<usize>)> {
    let names: Vec<&str> = rs.into_iter().map(|r| r.name.as_str()).collect();
    up.hits()
        .into_iter()
        .map(|h| {
            let r = h
                .replica
                .as_deref()
                .and_then(|n| names.iter().position(|x| *x == n));
            (h, r)
        })
        .collect()
}

/// The longest double-polling stretch over all paths, and on which path (with its
/// timeline: ms since the path's first hit, and the replica), plus how many hits could
/// not be attributed, of how many.
fn double_polling(
    up: &Recorder,
    rs: &[Replica],
    interval: Duration,
) -> (Duration, String, usize, usize) {
    let att = attribute(up, rs);
    let unattributed = att.iter().filter(|(_, r)| r.is_none()).count();
    let mut worst = (Duration::ZERO, String::new());
    for (path, hits) in by_path(&att) {
        let d = longest_double_poll(&hits, 4 * interval);
        if d > worst.0 {
            let t0 = hits[0].0;
            let line: Vec<String> = hits
                .iter()
                .map(|(t, r)| {
                    format!(
                        "{}:{}",
                        (*t - t0).as_millis(),
                        r.map_or("?".into(), |r| r.to_string())
                    )
                })
                .collect();
            worst = (d, format!("{path} [{}]", line.join(" ")));
        }
    }
    (worst.0, worst.1, unattributed, att.len())
}

/// A problem+json 503, as the API must answer while the database is away.
fn assert_503(what: &str, a: &Answer) {
    assert_eq!(a.status, 503, "{what} answered {} {}", a.status, a.body);
    assert!(
        a.content_type.starts_with("application/problem+json"),
        "{what}: content type {:?}",
        a.content_type
    );
    assert_eq!(a.body["status"], 503, "{what}: {}", a.body);
    assert!(
        a.body["title"].is_string() && a.body["detail"].is_string(),
        "{what}: {}",
        a.body
    );
}

// ---------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_one_of_three_replicas_mid_flight_ends_every_wait_exactly_once_after_one_lease() {
    let _serial = SERIAL.lock().await;
    const TTL: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(100);
    const N: usize = 120;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut rs = start_all(&["k0", "k1", "k2"], &dir, &db.url, "2s", &[]).await;
    let pg = pool(&db.url).await;

    let paths: Vec<String> = (0..N).map(|i| format!("/kill/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let t_created = Instant::now();
    let ids = create_all(&rs.iter().collect::<Vec<_>>(), &urls, INTERVAL, "kill").await;
    let path_of: HashMap<Uuid, String> = ids.iter().copied().zip(paths.iter().cloned()).collect();
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 2).await,
        "the waits were not all claimed and polled"
    );

    // The victim: the replica holding the most waits.
    let owners: Vec<Uuid> = rs
        .iter()
        .map(|r| r.owner().expect("owner id in the log"))
        .collect();
    let before = rows(&pg).await;
    let held = |o: Uuid| before.values().filter(|r| r.owner == Some(o)).count();
    let victim = (0..3).max_by_key(|i| held(owners[*i])).unwrap();
    let orphans: Vec<Uuid> = before
        .values()
        .filter(|r| r.owner == Some(owners[victim]))
        .map(|r| r.id)
        .collect();
    let spread: Vec<usize> = owners.iter().map(|o| held(*o)).collect();
    assert!(
        orphans.len() >= 10,
        "the victim holds only {} waits ({spread:?})",
        orphans.len()
    );
    // The attribution agrees with the database: a wait claimed once (epoch 1) was
    // polled by its owner only.
    let att = attribute(&up, &rs);
    let timelines = by_path(&att);
    let mut handovers = 0;
    for (id, p) in &path_of {
        let owner = before[id]
            .owner
            .and_then(|o| owners.iter().position(|x| *x == o));
        let hits = &timelines[p.trim_start_matches('/')];
        let polled: HashSet<usize> = hits.iter().filter_map(|(_, r)| *r).collect();
        if before[id].epoch > 1 {
            handovers += 1;
        } else if polled.iter().any(|r| Some(*r) != owner) {
            let line: Vec<String> = hits
                .iter()
                .map(|(t, r)| format!("{}:{r:?}", (*t - t_created).as_millis()))
                .collect();
            panic!(
                "{p}, claimed once, by replica {owner:?}, was polled by {polled:?}; \
                 hits (ms since creation: replica): {}",
                line.join(" ")
            );
        }
    }
    let earliest_lease_end = orphans
        .iter()
        .filter_map(|id| before[id].lease_until)
        .min()
        .unwrap();

    let kill_at = Utc::now();
    let t_kill = Instant::now();
    rs[victim].kill9();
    // Every target reaches its state at the moment of the crash.
    up.set_all(&paths, "on");

    let bound = TTL + CLAIM_SWEEP + 4 * INTERVAL + Duration::from_secs(1);
    let survivor = (victim + 1) % 3;
    let ended = all_end(&rs[survivor], &pg, bound + Duration::from_secs(5)).await;
    let after = rows(&pg).await;
    let hist = histories(&pg).await;
    let still: Vec<&Row> = after.values().filter(|r| r.status == "running").collect();
    assert!(
        ended.is_some(),
        "{} waits still running: {still:?}",
        still.len()
    );

    // Takeover: from the kill to the first poll of each orphan by a survivor.
    let att = attribute(&up, &rs);
    let mut takeovers = Vec::new();
    for id in &orphans {
        let p = path_of[id].trim_start_matches('/').to_string();
        let first = att
            .iter()
            .filter(|(h, r)| h.path == p && h.at > t_kill && *r != Some(victim))
            .map(|(h, _)| h.at)
            .min()
            .unwrap_or_else(|| panic!("orphan {id} was never polled by a survivor"));
        takeovers.push(first - t_kill);
    }
    takeovers.sort();
    let last_end = after.values().filter_map(|r| r.finished_at).max().unwrap();
    let all_ended_after = (last_end - kill_at).to_std().unwrap_or_default();
    let lease_left = (earliest_lease_end - kill_at).to_std().unwrap_or_default();
    let (dp, dp_path, unattributed, total) = double_polling(&up, &rs, INTERVAL);
    eprintln!(
        "kill -9 of 1 of 3 replicas holding {} of {N} waits (spread {spread:?}); lease TTL {}, poll {}:\n  \
         waits claimed again before the kill (lease let go under load): {handovers}\n  \
         lease left at the kill: {}\n  takeover (kill -> first survivor poll of an orphan): min {}, median {}, max {}\n  \
         kill -> all {N} waits ended: {}\n  longest double polling: {} (path {dp_path}); {unattributed} of {total} hits unattributed",
        orphans.len(),
        ms(TTL),
        ms(INTERVAL),
        ms(lease_left),
        ms(takeovers[0]),
        ms(takeovers[takeovers.len() / 2]),
        ms(*takeovers.last().unwrap()),
        ms(all_ended_after),
        ms(dp),
    );

    assert_eq!(after.len(), N, "waits went missing");
    for r in after.values() {
        assert_eq!(r.status, "succeeded", "{r:?}");
    }
    check_histories(&after, &hist);
    assert!(
        all_ended_after <= bound,
        "the last wait ended {} after the kill; expected within the lease TTL + one claim sweep + a few polls ({})",
        ms(all_ended_after),
        ms(bound)
    );
    // The victim's leases were honoured until they ran out (no early steal).
    assert!(
        takeovers[0] + Duration::from_millis(50) >= lease_left,
        "an orphan was polled by a survivor {} after the kill, before its lease ran out ({})",
        ms(takeovers[0]),
        ms(lease_left)
    );
    assert!(
        dp <= TTL,
        "two replicas polled {dp_path} together for {}",
        ms(dp)
    );
    assert!(
        unattributed == 0,
        "{unattributed} of {total} hits named no replica"
    );
    for (i, r) in rs.iter_mut().enumerate() {
        if i != victim {
            assert!(r.running(), "survivor {} died", r.name);
        }
    }
    assert_no_panics(&rs.iter().collect::<Vec<_>>());
    drop(rs);
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_killed_and_restarted_loses_nothing() {
    let _serial = SERIAL.lock().await;
    const TTL: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(100);
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut r = Replica::start("solo", &dir.path, &db.url, "2s", &[]).await;
    let pg = pool(&db.url).await;

    let paths: Vec<String> = (0..40).map(|i| format!("/solo/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let ids = create_all(&[&r], &urls, INTERVAL, "solo").await;
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 2).await,
        "the waits were not all claimed and polled"
    );
    // Half of them move on mid-flight; the change is recorded at once.
    let moved: Vec<String> = paths[..20].to_vec();
    up.set_all(&moved, "building");
    assert!(
        until(Duration::from_secs(5), || async {
            let rs = rows(&pg).await;
            ids[..20]
                .iter()
                .all(|id| rs[id].state.as_deref() == Some("building"))
        })
        .await
        .is_some(),
        "the state change was not recorded"
    );
    // One canceled, and a few acknowledged just before the crash.
    let client = client();
    let c = send(client.post(r.url(&format!("/waits/{}/cancel", ids[39])))).await;
    assert_eq!(c.body["status"], "canceled");
    let late_paths: Vec<String> = (0..5).map(|i| format!("/solo/late{i}")).collect();
    let late_urls: Vec<String> = late_paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let late = create_all(&[&r], &late_urls, INTERVAL, "solo").await;

    let before = rows(&pg).await;
    let before_hist = histories(&pg).await;
    r.kill9();
    assert!(!r.running());
    let t_restart = Instant::now();
    r.respawn();
    r.ready(Duration::from_secs(10)).await;
    let ready_after = t_restart.elapsed();
    let all_paths: Vec<String> = paths.iter().chain(&late_paths).cloned().collect();
    up.set_all(&all_paths, "on");

    let ended = all_end(&r, &pg, TTL + CLAIM_SWEEP + Duration::from_secs(6)).await;
    let all_ended_after = t_restart.elapsed();
    let after = rows(&pg).await;
    let hist = histories(&pg).await;
    assert!(
        ended.is_some(),
        "waits still running after the restart: {:?}",
        after
            .values()
            .filter(|r| r.status == "running")
            .collect::<Vec<_>>()
    );
    let first_poll = all_paths
        .iter()
        .filter_map(|p| up.hits_of(p, t_restart).first().copied())
        .min()
        .map(|t| t - t_restart)
        .unwrap_or_default();
    eprintln!(
        "kill -9 and restart of a single node (lease TTL {}): ready {} after the restart, \
         first poll {} after it, all {} waits ended {} after it",
        ms(TTL),
        ms(ready_after),
        ms(first_poll),
        after.len(),
        ms(all_ended_after)
    );

    assert_eq!(after.len(), 45, "waits went missing");
    assert!(late.iter().all(|id| after.contains_key(id)));
    for (id, a) in &after {
        let b = &before[id];
        let want = if *id == ids[39] {
            "canceled"
        } else {
            "succeeded"
        };
        assert_eq!(a.status, want, "{a:?}");
        assert!(
            a.polls >= b.polls,
            "wait {id} lost polls: {} -> {}",
            b.polls,
            a.polls
        );
        // What was written before the crash is still there, unchanged, in front.
        let bh = before_hist.get(id).cloned().unwrap_or_default();
        assert!(
            hist[id].len() >= bh.len(),
            "wait {id} lost events: {bh:?} -> {:?}",
            hist[id]
        );
        // Compared without the global cursor: an event the crash left unsequenced
        // gets its cursor afterwards (from the next sequencer run), and that is
        // the only thing about it that may change.
        let content = |h: &[Ev]| {
            h.iter()
                .map(|e| (e.seq, e.kind.clone(), e.data.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            content(&hist[id][..bh.len()]),
            content(&bh),
            "wait {id}: history changed"
        );
        // And an event that had its cursor keeps it.
        for (a, b) in hist[id].iter().zip(bh.iter()) {
            if b.id > 0 {
                assert_eq!(
                    a.id, b.id,
                    "wait {id}: event seq {} changed its global cursor",
                    b.seq
                );
            }
        }
    }
    check_histories(&after, &hist);
    // The observed states, in order (the `from` side is checked by the dedicated test
    // of checkpoints below; a stale one shows here only as a report).
    for id in &ids[..20] {
        let seen: Vec<Value> = hist[id]
            .iter()
            .filter(|e| e.kind == "state")
            .map(|e| e.data["to"].clone())
            .collect();
        assert_eq!(seen, ["deploying", "building", "on"], "wait {id}");
    }
    let breaks = state_chain_breaks(&hist);
    if !breaks.is_empty() {
        eprintln!(
            "  NOTE: {} waits resumed from a stale engine checkpoint after the restart: {:?}",
            breaks.len(),
            breaks[0]
        );
    }
    assert_no_panics(&[&r]);
    drop(r);
    pg.close().await;
    db.drop_db().await;
}

/// Two replicas holding `n` waits of their own (paths `/{tag}/{i}`, polled every
/// `interval`), each claimed and polled twice, and which of them is to die: the
/// one holding more.
struct Held {
    rs: Vec<Replica>,
    pg: PgPool,
    paths: Vec<String>,
    path_of: HashMap<Uuid, String>,
    owners: Vec<Uuid>,
    /// The rows once all were claimed and polled.
    before: HashMap<Uuid, Row>,
    victim: usize,
    survivor: usize,
    /// The victim's waits.
    orphans: Vec<Uuid>,
}

#[allow(clippy::too_many_arguments)]
async fn two_holding(
    names: [&str; 2],
    ttl: &str,
    tag: &str,
    n: usize,
    interval: Duration,
    dir: &TempDir,
    db: &TestDb,
    up: &Recorder,
) -> Held {
    let rs = start_all(&names, dir, &db.url, ttl, &[]).await;
    let pg = pool(&db.url).await;
    let paths: Vec<String> = (0..n).map(|i| format!("/{tag}/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let ids = create_all(&rs.iter().collect::<Vec<_>>(), &urls, interval, tag).await;
    let path_of: HashMap<Uuid, String> = ids.iter().copied().zip(paths.iter().cloned()).collect();
    assert!(
        all_owned_and_polled(&pg, up, &paths, 2).await,
        "the waits were not all claimed and polled"
    );
    let owners: Vec<Uuid> = rs
        .iter()
        .map(|r| r.owner().expect("owner id in the log"))
        .collect();
    let before = rows(&pg).await;
    let held = |o: Uuid| before.values().filter(|r| r.owner == Some(o)).count();
    let victim = (0..2).max_by_key(|i| held(owners[*i])).unwrap();
    let orphans: Vec<Uuid> = before
        .values()
        .filter(|r| r.owner == Some(owners[victim]))
        .map(|r| r.id)
        .collect();
    assert!(!orphans.is_empty());
    Held {
        rs,
        pg,
        paths,
        path_of,
        owners,
        before,
        victim,
        survivor: 1 - victim,
        orphans,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_polls_every_orphan_again_without_writing_its_row() {
    let _serial = SERIAL.lock().await;
    const INTERVAL: Duration = Duration::from_millis(200);
    const N: usize = 40;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let Held {
        mut rs,
        pg,
        path_of,
        owners,
        victim,
        survivor,
        orphans,
        ..
    } = two_holding(["s0", "s1"], "1s", "slot", N, INTERVAL, &dir, &db, &up).await;
    // Each row's version: a write of any kind gives the row a new one.
    let versions = || async {
        let v: Vec<(Uuid, String)> =
            sqlx::query_as("SELECT id, xmin::text FROM waits WHERE id = ANY($1)")
                .bind(&orphans)
                .fetch_all(&pg)
                .await
                .unwrap();
        v.into_iter().collect::<HashMap<Uuid, String>>()
    };
    rs[victim].kill9();
    let killed = Instant::now();
    // The dead replica's writes are over: these are the versions the survivor finds.
    let at_kill = versions().await;
    let orphan_paths: Vec<String> = orphans.iter().map(|id| path_of[id].clone()).collect();
    let polled = up
        .hit_when(Duration::from_secs(15), |hits| {
            each_hit(hits, &orphan_paths, 3, killed)
        })
        .await;
    assert!(polled, "the orphans were not polled again");
    let after = rows(&pg).await;
    for id in &orphans {
        assert_eq!(after[id].owner, Some(owners[survivor]), "{:?}", after[id]);
        assert_eq!(after[id].status, "running");
    }
    // Taken over, and each polled three times since, with nothing written on its row.
    assert_eq!(
        versions().await,
        at_kill,
        "a takeover wrote the waits it took"
    );
    // Ending them still works under the survivor's hold.
    up.set_all(&orphan_paths, "on");
    let ended = until(Duration::from_secs(15), || async {
        let running: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM waits WHERE id = ANY($1) AND status = 'running'",
        )
        .bind(&orphans)
        .fetch_one(&pg)
        .await
        .unwrap_or(1);
        running == 0
    })
    .await;
    assert!(ended.is_some(), "the orphans did not end");
    let done = rows(&pg).await;
    assert!(orphans.iter().all(|id| done[id].status == "succeeded"));
    assert_no_panics(&[&rs[survivor]]);
    drop(rs);
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_zero_within_seconds_and_hands_its_waits_over_at_once() {
    let _serial = SERIAL.lock().await;
    // A long lease: a takeover that waited for it would show.
    const TTL: Duration = Duration::from_secs(10);
    const INTERVAL: Duration = Duration::from_millis(100);
    const N: usize = 60;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let Held {
        mut rs,
        pg,
        paths,
        path_of,
        owners,
        before,
        victim,
        survivor,
        orphans,
    } = two_holding(["t0", "t1"], "10s", "term", N, INTERVAL, &dir, &db, &up).await;

    // Open a blocked read and two streams on the victim: SIGTERM must close them.
    let w = orphans[0];
    let client = client();
    let blocked = tokio::spawn(send(
        client.get(rs[victim].url(&format!("/waits/{w}?wait=true"))),
    ));
    let f_wait = Follower::start(rs[victim].url(&format!("/waits/{w}/events")), false);
    let f_all = Follower::start(rs[victim].url("/events"), false);
    assert!(
        f_wait
            .seen_when(Duration::from_secs(5), |s| s.len() >= 2)
            .await
    );
    assert!(
        f_all
            .seen_when(Duration::from_secs(5), |s| s.len() >= 2 * N)
            .await
    );

    let t_term = Instant::now();
    rs[victim].signal("TERM");
    let exit = rs[victim].wait_exit(Duration::from_secs(15)).await;
    let exit_took = t_term.elapsed();
    let exit = exit
        .unwrap_or_else(|| panic!("{} did not exit within 15 s after SIGTERM", rs[victim].name));
    let blocked = tokio::time::timeout(Duration::from_secs(2), blocked)
        .await
        .expect("the blocked read ended with the server")
        .unwrap();
    let streams_closed = f_wait.done() && f_all.done();

    // Takeover: each orphan's first poll by the survivor.
    let got_all = up
        .hit_when(Duration::from_secs(8), |hits| {
            let by = Some(rs[survivor].name.as_str());
            let polled: HashSet<&str> = hits
                .iter()
                .filter(|h| h.at > t_term && h.replica.as_deref() == by)
                .map(|h| h.path.as_str())
                .collect();
            orphans
                .iter()
                .all(|id| polled.contains(path_of[id].trim_start_matches('/')))
        })
        .await;
    let att = attribute(&up, &rs);
    let mut takeovers: Vec<Duration> = orphans
        .iter()
        .filter_map(|id| {
            let p = path_of[id].trim_start_matches('/').to_string();
            att.iter()
                .filter(|(h, r)| h.path == p && h.at > t_term && *r == Some(survivor))
                .map(|(h, _)| h.at - t_term)
                .min()
        })
        .collect();
    takeovers.sort();
    let released: Vec<u64> = rs[victim]
        .log_events("leases released")
        .iter()
        .filter_map(|v| v["fields"]["released"].as_u64())
        .collect();
    let mid = rows(&pg).await;
    up.set_all(&paths, "on");
    let ended = all_end(&rs[survivor], &pg, Duration::from_secs(5)).await;
    let after = rows(&pg).await;
    let hist = histories(&pg).await;
    let (dp, dp_path, unattributed, total) = double_polling(&up, &rs, INTERVAL);
    eprintln!(
        "SIGTERM of 1 of 2 replicas holding {} of {N} waits (lease TTL {}): exited {exit} after {}; \
         leases released: {released:?}; takeover (SIGTERM -> first survivor poll): min {}, max {}; \
         longest double polling {} (path {dp_path}); {unattributed} of {total} hits unattributed",
        orphans.len(),
        ms(TTL),
        ms(exit_took),
        takeovers.first().map(|d| ms(*d)).unwrap_or_default(),
        takeovers.last().map(|d| ms(*d)).unwrap_or_default(),
        ms(dp),
    );

    assert!(
        exit.success(),
        "exit status after SIGTERM: {exit}\n{}",
        rs[victim].log_tail(20)
    );
    assert!(
        exit_took <= Duration::from_secs(5),
        "SIGTERM took {} to exit",
        ms(exit_took)
    );
    assert_eq!(blocked.status, 503, "the blocked read: {}", blocked.body);
    assert!(
        blocked.body["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&w.to_string())),
        "the blocked read: {}",
        blocked.body
    );
    assert!(
        streams_closed,
        "SSE streams stayed open on a stopped server"
    );
    assert_eq!(
        released,
        [orphans.len() as u64],
        "the victim released {released:?} leases"
    );
    assert!(got_all, "not every orphan was polled again");
    assert_eq!(
        takeovers.len(),
        orphans.len(),
        "orphans polled by someone other than the survivor"
    );
    let max_takeover = *takeovers.last().unwrap();
    assert!(
        max_takeover <= Duration::from_secs(2),
        "an orphan waited {} for the survivor (lease TTL {}): leases were not released",
        ms(max_takeover),
        ms(TTL)
    );
    for id in &orphans {
        assert_eq!(
            mid[id].owner,
            Some(owners[survivor]),
            "orphan {id} not taken over: {:?}",
            mid[id]
        );
        assert_eq!(mid[id].epoch, before[id].epoch + 1, "orphan {id}");
    }
    assert!(ended.is_some(), "waits still running");
    assert!(after.values().all(|r| r.status == "succeeded"));
    check_histories(&after, &hist);
    assert!(
        dp <= TTL,
        "two replicas polled {dp_path} together for {}",
        ms(dp)
    );
    assert!(rs[survivor].running());
    assert_no_panics(&rs.iter().collect::<Vec<_>>());
    drop(rs);
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_flight_answers_503_then_resumes_every_replica_and_sse_exactly_once()
{
    let _serial = SERIAL.lock().await;
    const TTL: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(100);
    const N: usize = 30;
    let cluster = tokio::task::spawn_blocking(PgCluster::start).await.unwrap();
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut rs = start_all(&["p0", "p1"], &dir, &cluster.url, "2s", &[]).await;
    let pg = pool(&cluster.url).await;
    let paths: Vec<String> = (0..N).map(|i| format!("/pg/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let ids = create_all(&rs.iter().collect::<Vec<_>>(), &urls, INTERVAL, "pg").await;
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 2).await,
        "the waits were not all claimed and polled"
    );
    let w0 = ids[0];
    let f1 = Follower::start(rs[1].url(&format!("/waits/{w0}/events")), true);
    let f2 = Follower::start(rs[0].url("/events"), true);
    assert!(f1.seen_when(Duration::from_secs(5), |s| s.len() >= 2).await);
    assert!(
        f2.seen_when(Duration::from_secs(5), |s| s.len() >= 2 * N)
            .await
    );
    pg.close().await;

    // Down.
    let t_down = Instant::now();
    let c = std::sync::Arc::new(cluster);
    let c2 = c.clone();
    tokio::task::spawn_blocking(move || c2.stop_immediate())
        .await
        .unwrap();
    let moved: Vec<String> = paths[..N / 2].to_vec();
    up.set_all(&moved, "building");
    f1.kick();
    f2.kick();
    let client = client();
    let checks = join_all(rs.iter().flat_map(|r| {
        let spec = wait_spec(&urls[1], INTERVAL, "pg");
        [
            ("POST /waits", client.post(r.url("/waits")).json(&spec)),
            (
                "GET /waits/{id}",
                client.get(r.url(&format!("/waits/{w0}"))),
            ),
            (
                "GET /waits/{id}/events",
                client.get(r.url(&format!("/waits/{w0}/events"))),
            ),
            ("GET /waits", client.get(r.url("/waits"))),
            (
                "POST /waits/{id}/cancel",
                client.post(r.url(&format!("/waits/{}/cancel", ids[N - 1]))),
            ),
            ("GET /readyz", client.get(r.url("/readyz"))),
        ]
        .into_iter()
        .map(|(what, req)| async move { (what, send(req).await) })
    }))
    .await;
    let healthz = join_all(rs.iter().map(|r| send(client.get(r.url("/healthz"))))).await;
    let alive_during = rs.iter_mut().all(|r| r.running());
    // Keep it down past the lease.
    tokio::time::sleep((TTL + Duration::from_millis(500)).saturating_sub(t_down.elapsed())).await;
    let c2 = c.clone();
    tokio::task::spawn_blocking(move || c2.pg_start())
        .await
        .unwrap();
    let t_up = Instant::now();
    let outage = t_up - t_down;

    for (what, a) in &checks {
        assert_503(what, a);
    }
    for h in &healthz {
        assert_eq!(h.status, 200, "/healthz while the database is down");
    }
    assert!(alive_during, "a replica exited while the database was down");
    let client2 = client.clone();
    let ready = until(Duration::from_secs(15), || {
        let rs = &rs;
        let client = client2.clone();
        async move {
            for r in rs {
                match client.get(r.url("/readyz")).send().await {
                    Ok(a) if a.status().is_success() => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await
    .expect("replicas not ready again after the database came back");
    let pg = pool(&c.url).await;
    let resumed = until(TTL + CLAIM_SWEEP + Duration::from_secs(8), || async {
        let rs = rows(&pg).await;
        ids[..N / 2]
            .iter()
            .all(|id| rs[id].state.as_deref() == Some("building"))
    })
    .await;
    up.set_all(&paths, "on");
    let ended = all_end(&rs[0], &pg, Duration::from_secs(8)).await;
    let after = rows(&pg).await;
    let hist = histories(&pg).await;
    let total_events: usize = hist.values().map(Vec::len).sum();
    let f2_all = f2
        .seen_when(Duration::from_secs(5), |s| s.len() >= total_events)
        .await;
    let f1_done = f1
        .seen_when(Duration::from_secs(5), |s| {
            s.iter().any(|e| e.kind == "succeeded")
        })
        .await;
    eprintln!(
        "Postgres restart: down {}; 503s took {}..{}; replicas ready {} after it was back, \
         waits resumed {} after; per-wait follower attempts {:?}; global follower attempts {:?}",
        ms(outage),
        ms(checks.iter().map(|(_, a)| a.took).min().unwrap()),
        ms(checks.iter().map(|(_, a)| a.took).max().unwrap()),
        ms(ready),
        resumed.map(|d| ms(d + ready)).unwrap_or("never".into()),
        f1.attempts(),
        f2.attempts(),
    );

    assert!(
        resumed.is_some(),
        "polling did not resume after the database came back"
    );
    assert!(
        ended.is_some(),
        "waits still running: {:?}",
        after
            .values()
            .filter(|r| r.status == "running")
            .collect::<Vec<_>>()
    );
    assert_eq!(
        after.len(),
        N,
        "waits lost (or one created while the database was down)"
    );
    assert!(after.values().all(|r| r.status == "succeeded"), "{after:?}");
    check_histories(&after, &hist);
    // The per-wait follower: every seq exactly once, in order, across reconnects.
    assert!(
        f1_done,
        "the per-wait follower never saw the end: {:?}",
        f1.seen()
    );
    let seqs: Vec<String> = f1.seen().iter().map(|e| e.id.clone()).collect();
    let want: Vec<String> = (1..=after[&w0].seq).map(|s| s.to_string()).collect();
    assert_eq!(seqs, want, "the per-wait follower's seqs");
    assert!(
        f1.attempts().iter().filter(|s| **s == 200).count() >= 2,
        "{:?}",
        f1.attempts()
    );
    // The global follower: every event exactly once.
    if !f2_all {
        let seen: std::collections::HashSet<String> =
            f2.seen().iter().map(|e| e.id.clone()).collect();
        let missing: Vec<(i64, String)> = histories(&pg)
            .await
            .values()
            .flatten()
            .filter(|e| !seen.contains(&e.id.to_string()))
            .map(|e| (e.id, e.kind.clone()))
            .collect();
        panic!(
            "the global follower saw {} of {total_events} events; missing {missing:?}; last seen {:?}",
            f2.seen().len(),
            f2.seen().last().map(|e| (&e.id, &e.kind))
        );
    }
    let got: Vec<i64> = f2.seen().iter().map(|e| e.id.parse().unwrap()).collect();
    // Read again: an event gets its global cursor a moment after its commit, and the
    // follower has now seen them all.
    let mut want: Vec<i64> = histories(&pg)
        .await
        .values()
        .flatten()
        .map(|e| e.id)
        .collect();
    want.sort();
    assert_eq!(got, want, "the global follower's ids");
    for r in rs.iter_mut() {
        assert!(r.running(), "replica {} exited", r.name);
    }
    assert_no_panics(&rs.iter().collect::<Vec<_>>());
    drop(rs);
    pg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_follower_on_replica_b_sees_live_events_of_a_wait_polled_by_replica_a() {
    let _serial = SERIAL.lock().await;
    const INTERVAL: Duration = Duration::from_millis(50);
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let a = Replica::start("a", &dir.path, &db.url, "3s", &[]).await;
    let b = Replica::start("b", &dir.path, &db.url, "3s", &["--no-worker"]).await;

    let f_all = Follower::start(b.url("/events?label=test:sse"), false);
    assert!(
        f_all.opened(Duration::from_secs(5)).await,
        "the global stream did not open"
    );
    let url = up.set_status("/sse/1", "deploying");
    let id = create_all(&[&b], &[url], INTERVAL, "sse").await[0];
    let f = Follower::start(b.url(&format!("/waits/{id}/events")), false);
    assert!(
        f.seen_when(Duration::from_secs(5), |s| s.len() >= 2).await,
        "no state event: {:?}",
        f.seen()
    );
    // Each change, from the target to a stream on the other replica.
    let t1 = Instant::now();
    up.set_status("/sse/1", "building");
    let got1 = f.seen_when(Duration::from_secs(15), |s| s.len() >= 3).await;
    let lat1 = f.seen().get(2).map(|e| e.at - t1);
    let t2 = Instant::now();
    up.set_status("/sse/1", "on");
    let got2 = f.seen_when(Duration::from_secs(15), |s| s.len() >= 5).await;
    let lat2 = f.seen().get(4).map(|e| e.at - t2);
    let all_got = f_all
        .seen_when(Duration::from_secs(15), |s| s.len() >= 5)
        .await;
    let g = f_all.seen();
    let glat = g.get(2).map(|e| e.at - t1);
    eprintln!(
        "SSE across replicas: poll {}; event on replica B after the target changed: building {:?}, on {:?}; \
         global feed {:?}",
        ms(INTERVAL),
        lat1,
        lat2,
        glat
    );

    assert!(got1 && got2, "events: {:?}", f.seen());
    let kinds: Vec<String> = f.seen().iter().map(|e| e.kind.clone()).collect();
    assert_eq!(kinds, ["created", "state", "state", "state", "succeeded"]);
    let ids: Vec<String> = f.seen().iter().map(|e| e.id.clone()).collect();
    assert_eq!(ids, ["1", "2", "3", "4", "5"]);
    assert_eq!(f.seen()[2].data["to"], "building");
    // Live: well under the streams' 10 s safety re-read, so through NOTIFY.
    for l in [lat1, lat2, glat] {
        assert!(
            l.unwrap() < Duration::from_secs(2),
            "an event took {l:?} to reach replica B"
        );
    }
    assert!(
        f.done(),
        "the wait's stream did not end after its terminal event"
    );
    assert!(all_got, "global feed on B: {:?}", f_all.seen());
    let gkinds: Vec<String> = g.iter().map(|e| e.kind.clone()).collect();
    assert_eq!(gkinds, kinds, "the global feed");
    assert!(g.iter().all(|e| e.data["wait_id"] == id.to_string()));
    let gids: Vec<i64> = g.iter().map(|e| e.id.parse().unwrap()).collect();
    assert!(gids.windows(2).all(|w| w[0] < w[1]), "global ids {gids:?}");
    // Only A polled it.
    let who = pollers(&attribute(&up, [&a, &b]));
    assert_eq!(who.get("sse/1"), Some(&HashSet::from([0])), "pollers");
    assert_no_panics(&[&a, &b]);
    drop((a, b));
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_replica_b_stops_replica_a_polling_within_one_poll_interval() {
    let _serial = SERIAL.lock().await;
    // A long lease: renewal (every TTL/3 = 10 s) also drops a canceled wait, so it
    // must not run during the test, or a stop that waited for it would pass.
    const INTERVAL: Duration = Duration::from_millis(300);
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let a = Replica::start("a", &dir.path, &db.url, "30s", &[]).await;
    let b = Replica::start("b", &dir.path, &db.url, "30s", &["--no-worker"]).await;
    let pg = pool(&db.url).await;
    let paths: Vec<String> = (0..10).map(|i| format!("/cancel/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let ids = create_all(&[&a], &urls, INTERVAL, "cancel").await;
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 3).await,
        "the waits were not all polled"
    );
    // Still being polled right before the cancel (or the test proves nothing).
    let since = Instant::now() - 2 * INTERVAL;
    for p in &paths {
        assert!(
            !up.hits_of(p, since).is_empty(),
            "{p} was not being polled before the cancel"
        );
    }
    let client = client();
    let canceled = join_all(ids.iter().map(|id| {
        let req = client.post(b.url(&format!("/waits/{id}/cancel")));
        async move { (Instant::now(), send(req).await) }
    }))
    .await;
    // The point: no poll lands in the intervals after the cancels.
    tokio::time::sleep(6 * INTERVAL).await;
    let mut latest = Duration::ZERO;
    let mut late = Vec::new();
    for (i, (t, ans)) in canceled.iter().enumerate() {
        assert_eq!(ans.status, 200);
        assert_eq!(ans.body["status"], "canceled", "{}", ans.body);
        for h in up.hits_of(&paths[i], *t) {
            latest = latest.max(h - *t);
            if h - *t > INTERVAL {
                late.push((paths[i].clone(), h - *t));
            }
        }
    }
    eprintln!(
        "cancel through B of waits polled by A (poll {}): last poll by A {} after the cancel",
        ms(INTERVAL),
        ms(latest)
    );
    assert!(late.is_empty(), "A kept polling after the cancel: {late:?}");
    let after = rows(&pg).await;
    check_histories(&after, &histories(&pg).await);
    assert!(after.values().all(|r| r.status == "canceled"));
    assert_no_panics(&[&a, &b]);
    drop((a, b));
    pg.close().await;
    db.drop_db().await;
}

/// Cut every replica off from Postgres (`cut` stops or freezes the cluster) for
/// longer than the lease; polling must stop before the leases run out, the API
/// answers 503, nobody crashes; afterwards everything resumes.
async fn cut_off(cut: fn(&PgCluster), heal: fn(&PgCluster), how: &str) {
    const TTL: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(50);
    const N: usize = 20;
    let cluster = std::sync::Arc::new(tokio::task::spawn_blocking(PgCluster::start).await.unwrap());
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut rs = start_all(&["c0", "c1"], &dir, &cluster.url, "2s", &[]).await;
    let pg = pool(&cluster.url).await;
    let paths: Vec<String> = (0..N).map(|i| format!("/cut/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let ids = create_all(&rs.iter().collect::<Vec<_>>(), &urls, INTERVAL, "cut").await;
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 3).await,
        "the waits were not all claimed and polled"
    );
    pg.close().await;

    let t_cut = Instant::now();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || cut(&c)).await.unwrap();
    let client = client();
    let checks = join_all(rs.iter().flat_map(|r| {
        [
            (
                "POST /waits",
                client
                    .post(r.url("/waits"))
                    .json(&wait_spec(&urls[0], INTERVAL, "cut")),
            ),
            (
                "GET /waits/{id}",
                client.get(r.url(&format!("/waits/{}", ids[0]))),
            ),
        ]
        .into_iter()
        .map(|(what, req)| async move { (what, send(req).await) })
    }))
    .await;
    let healthz = join_all(rs.iter().map(|r| send(client.get(r.url("/healthz"))))).await;
    // Stay cut off for the lease and then as long again.
    tokio::time::sleep((2 * TTL + Duration::from_millis(500)).saturating_sub(t_cut.elapsed()))
        .await;
    let window_end = Instant::now();
    let last_poll = paths
        .iter()
        .flat_map(|p| up.hits_of(p, t_cut))
        .max()
        .map(|t| t - t_cut);
    let after_lease: usize = paths.iter().map(|p| up.hits_of(p, t_cut + TTL).len()).sum();
    let alive = rs.iter_mut().all(|r| r.running());
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || heal(&c)).await.unwrap();
    let t_heal = Instant::now();
    eprintln!(
        "cut off from Postgres ({how}) for {} (lease TTL {}, poll {}): last poll {} after the cut; \
         {after_lease} polls after the lease ran out; 503 took {}..{}",
        ms(window_end - t_cut),
        ms(TTL),
        ms(INTERVAL),
        last_poll.map(ms).unwrap_or("none".into()),
        ms(checks.iter().map(|(_, a)| a.took).min().unwrap()),
        ms(checks.iter().map(|(_, a)| a.took).max().unwrap()),
    );
    assert!(alive, "a replica exited while cut off");
    for (what, a) in &checks {
        assert_503(what, a);
    }
    for h in &healthz {
        assert_eq!(h.status, 200, "/healthz while cut off");
    }
    assert_eq!(
        after_lease, 0,
        "replicas kept polling after their leases ran out (split brain)"
    );

    // Afterwards: everything resumes and ends once.
    let pg = pool(&cluster.url).await;
    let looking = Instant::now();
    let resumed = up
        .hit_when(TTL + CLAIM_SWEEP + Duration::from_secs(8), |hits| {
            each_hit(hits, &paths, 1, t_heal)
        })
        .await
        .then(|| looking.elapsed());
    up.set_all(&paths, "on");
    let ended = all_end(&rs[0], &pg, Duration::from_secs(8)).await;
    eprintln!(
        "  after healing ({how}): every wait polled again within {}",
        resumed.map(ms).unwrap_or("never".into())
    );
    assert!(resumed.is_some(), "polling did not resume");
    assert!(ended.is_some(), "waits still running");
    let after = rows(&pg).await;
    assert_eq!(after.len(), N);
    assert!(after.values().all(|r| r.status == "succeeded"));
    check_histories(&after, &histories(&pg).await);
    for r in rs.iter_mut() {
        assert!(r.running(), "replica {} exited", r.name);
    }
    assert_no_panics(&rs.iter().collect::<Vec<_>>());
    drop(rs);
    pg.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_cut_off_from_a_stopped_postgres_stop_polling_before_their_leases_run_out() {
    let _serial = SERIAL.lock().await;
    cut_off(PgCluster::stop_immediate, PgCluster::pg_start, "stopped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_cut_off_from_a_frozen_postgres_stop_polling_before_their_leases_run_out() {
    let _serial = SERIAL.lock().await;
    cut_off(PgCluster::freeze, PgCluster::thaw, "frozen: SIGSTOP").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_database_stall_longer_than_the_lease_waits_resume_within_one_claim_sweep() {
    let _serial = SERIAL.lock().await;
    // A stall, not an outage: connections stay up, statements on `waits` queue behind
    // a lock (as behind a migration, or on a database that hangs) and complete late.
    const TTL: Duration = Duration::from_secs(3);
    const INTERVAL: Duration = Duration::from_millis(100);
    const N: usize = 30;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut rs = start_all(&["s0", "s1"], &dir, &db.url, "3s", &[]).await;
    let pg = pool(&db.url).await;
    let paths: Vec<String> = (0..N).map(|i| format!("/stall/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    create_all(&rs.iter().collect::<Vec<_>>(), &urls, INTERVAL, "stall").await;
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 2).await,
        "the waits were not all claimed and polled"
    );
    let owners: Vec<Uuid> = rs
        .iter()
        .map(|r| r.owner().expect("owner in the log"))
        .collect();

    let mut locker = pg.begin().await.unwrap();
    // Every table a replica writes to keep its waits: a lease renewal stalls too.
    sqlx::query("LOCK TABLE waits, replicas, slots IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let t_stall = Instant::now();
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    let polls_after_lease: usize = paths
        .iter()
        .map(|p| up.hits_of(p, t_stall + TTL).len())
        .sum();
    let last_poll = paths
        .iter()
        .flat_map(|p| up.hits_of(p, t_stall))
        .max()
        .map(|t| t - t_stall);
    locker.commit().await.unwrap();
    let t_free = Instant::now();
    // The figure printed: how much is polled again 300 ms after the stall.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Who holds what right after the stall, and who polls it.
    let mid = rows(&pg).await;
    let now = Utc::now();
    let polled_since: HashSet<String> = up
        .hits()
        .iter()
        .filter(|h| h.at > t_free)
        .map(|h| h.path.clone())
        .collect();
    let stuck: BTreeMap<String, usize> = mid
        .values()
        .filter(|r| r.lease_until.is_some_and(|l| l > now))
        .fold(BTreeMap::new(), |mut m, r| {
            let who = r
                .owner
                .and_then(|o| owners.iter().position(|x| *x == o))
                .map(|i| rs[i].name.clone())
                .unwrap_or_default();
            *m.entry(who).or_default() += 1;
            m
        });
    let resumed = up
        .hit_when(TTL + CLAIM_SWEEP + Duration::from_secs(5), |hits| {
            each_hit(hits, &paths, 1, t_free)
        })
        .await
        .then(|| t_free.elapsed());
    let (dp, dp_path, _, _) = double_polling(&up, &rs, INTERVAL);
    eprintln!(
        "database stall of {} (lease TTL {}): last poll {} into it, {polls_after_lease} polls after the lease ran out; \
         300 ms after it ended, {} of {N} paths polled again, leases held in the database by {stuck:?}; \
         every wait polled again {} after it ended; longest double polling {} ({dp_path})",
        ms(t_free - t_stall),
        ms(TTL),
        last_poll.map(ms).unwrap_or("none".into()),
        polled_since.len(),
        resumed.map(ms).unwrap_or("never".into()),
        ms(dp),
    );
    up.set_all(&paths, "on");
    let ended = all_end(&rs[0], &pg, Duration::from_secs(8)).await;
    let after = rows(&pg).await;
    check_histories(&after, &histories(&pg).await);
    assert!(ended.is_some() && after.values().all(|r| r.status == "succeeded"));
    assert_eq!(
        polls_after_lease, 0,
        "polled after the lease ran out (split brain)"
    );
    assert!(
        dp <= TTL,
        "two replicas polled {dp_path} together for {}",
        ms(dp)
    );
    for r in rs.iter_mut() {
        assert!(r.running(), "replica {} exited", r.name);
    }
    let bound = CLAIM_SWEEP + 4 * INTERVAL + Duration::from_millis(500);
    let resumed = resumed.expect("polling never resumed after the stall");
    assert!(
        resumed <= bound,
        "after the stall the waits sat unpolled for {} (bound: one claim sweep + a few polls, {}): \
         leases renewed or claimed late by a replica that had already let the waits go ({stuck:?})",
        ms(resumed),
        ms(bound)
    );
    drop(rs);
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_creations_and_state_changes_does_not_cost_a_healthy_replica_its_leases() {
    let _serial = SERIAL.lock().await;
    // No fault at all: 120 waits created at once through three replicas, a third of
    // them on targets that change state on every poll. A replica that lets its waits
    // go here leaves them unpolled until its leases run out.
    const TTL: Duration = Duration::from_secs(2);
    const INTERVAL: Duration = Duration::from_millis(100);
    const N: usize = 120;
    const FOR: Duration = Duration::from_secs(4);
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut rs = start_all(&["b0", "b1", "b2"], &dir, &db.url, "2s", &[]).await;
    let pg = pool(&db.url).await;
    let paths: Vec<String> = (0..N).map(|i| format!("/burst/{i}")).collect();
    let urls: Vec<String> = paths
        .iter()
        .enumerate()
        .map(|(i, p)| match i % 3 {
            0 => up.set(
                p,
                Behavior::Cycle(vec!["deploying".into(), "building".into()]),
            ),
            _ => up.set_status(p, "deploying"),
        })
        .collect();
    let t0 = Instant::now();
    create_n_at_once(&rs.iter().collect::<Vec<_>>(), &urls, INTERVAL, "burst", N).await;
    // The point: the replicas run under this load for FOR.
    tokio::time::sleep(FOR).await;
    let mid = rows(&pg).await;
    up.set_all(&paths, "on");
    let ended = all_end(&rs[0], &pg, TTL + CLAIM_SWEEP + Duration::from_secs(5)).await;
    let took = t0.elapsed();
    let hist = histories(&pg).await;
    let events: usize = hist.values().map(Vec::len).sum();
    let dropped: Vec<usize> = rs
        .iter()
        .map(|r| {
            r.log_events("lease not renewed in time; polling paused until it is")
                .len()
        })
        .collect();
    let reclaimed = mid.values().filter(|r| r.epoch > 1).count();
    let att = attribute(&up, &rs);
    // The longest pause in any target's polling before the end.
    let mut pause = (Duration::ZERO, String::new());
    for (p, hits) in by_path(&att) {
        for w in hits.windows(2) {
            if w[1].0 - w[0].0 > pause.0 {
                pause = (w[1].0 - w[0].0, p.clone());
            }
        }
    }
    eprintln!(
        "{N} waits created at once, a third changing state on every {} poll, for {}: {events} events \
         ({:.0}/s); waits let go for want of renewal: {dropped:?}; claimed more than once: {reclaimed}; \
         longest pause in a target's polling: {} ({})",
        ms(INTERVAL),
        ms(FOR),
        events as f64 / took.as_secs_f64(),
        ms(pause.0),
        pause.1
    );
    assert!(ended.is_some(), "waits still running");
    let after = rows(&pg).await;
    check_histories(&after, &hist);
    assert_no_panics(&rs.iter().collect::<Vec<_>>());
    for r in rs.iter_mut() {
        assert!(r.running());
    }
    assert_eq!(
        dropped,
        [0, 0, 0],
        "healthy replicas let {reclaimed} waits go because their claims or renewals came back late \
         (longest pause in polling {})",
        ms(pause.0)
    );
    assert!(pause.0 < TTL, "a target went unpolled for {}", ms(pause.0));
    drop(rs);
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_renewal_in_flight_never_overwrites_a_newer_checkpoint() {
    let _serial = SERIAL.lock().await;
    // The renewal statement is held up on three rows the test locks; meanwhile the
    // other waits observe a new state and record it. When the renewal then goes
    // through, the checkpoints it carries (taken before) must not replace the newer
    // ones: a replica that dies next would hand the waits over from the older state.
    const INTERVAL: Duration = Duration::from_millis(50);
    const N: usize = 60;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let mut a = Replica::start("a", &dir.path, &db.url, "3s", &[]).await;
    let pg = pool(&db.url).await;
    let paths: Vec<String> = (0..N).map(|i| format!("/ckpt/{i}")).collect();
    let anchors: Vec<String> = (0..3).map(|i| format!("/ckpt/anchor{i}")).collect();
    let all: Vec<String> = paths.iter().chain(&anchors).cloned().collect();
    let urls: Vec<String> = all.iter().map(|p| up.set_status(p, "deploying")).collect();
    // Every wait backs off a little (its interval grows with each poll, up to 1 s),
    // so each renewal that checkpoints has a new engine state of each to write:
    // unchanged polls of a fixed interval would not be checkpointed at all.
    let client = client();
    let mut ids: Vec<Uuid> = Vec::new();
    for u in &urls {
        let mut spec = wait_spec(u, INTERVAL, "ckpt");
        spec["poll"]["factor"] = json!(1.1);
        spec["poll"]["max"] = json!("1s");
        let r = send(client.post(a.url("/waits")).json(&spec)).await;
        assert_eq!(r.status, 201, "create: {}", r.body);
        ids.push(r.body["id"].as_str().unwrap().parse().unwrap());
    }
    let anchor_ids: Vec<Uuid> = ids[N..].to_vec();
    assert!(
        all_owned_and_polled(&pg, &up, &all, 3).await,
        "the waits were not all claimed and polled"
    );

    let mut lock = pg.begin().await.unwrap();
    sqlx::query("SELECT id FROM waits WHERE id = ANY($1) FOR UPDATE")
        .bind(&anchor_ids)
        .execute(&mut *lock)
        .await
        .unwrap();
    // Checkpoints go with every third renewal: once a lease TTL.
    let blocked = until(Duration::from_secs(5), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%GREATEST(w.polls%'",
        )
        .fetch_one(&pg)
        .await
        .unwrap_or(0)
            > 0
    })
    .await;
    assert!(
        blocked.is_some(),
        "no renewal got held up on the locked rows"
    );
    up.set_all(&paths, "building");
    let since = Instant::now();
    // Polls see "building" while the rows are locked: each path is asked again.
    assert!(
        up.hit_when(Duration::from_secs(5), |h| each_hit(h, &paths, 1, since))
            .await,
        "the waits were not polled while the rows were locked"
    );
    lock.commit().await.unwrap();
    // The writes queued behind the lock land before they are counted: the held
    // renewal's transaction ends and every wait's new state is in the store.
    let landed = until(Duration::from_secs(5), || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT (SELECT count(*) FROM waits WHERE state = 'building') >= $1
                AND NOT EXISTS (SELECT FROM pg_stat_activity
                                WHERE state <> 'idle' AND query LIKE '%GREATEST(w.polls%'
                                  AND pid <> pg_backend_pid())",
        )
        .bind(paths.len() as i64)
        .fetch_one(&pg)
        .await
        .unwrap_or(false)
    })
    .await;
    assert!(landed.is_some(), "the held writes did not land");
    let (recorded, stale): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE state = 'building'),
                count(*) FILTER (WHERE state = 'building' AND engine->>'state' IS DISTINCT FROM 'building')
         FROM waits",
    )
    .fetch_one(&pg)
    .await
    .unwrap();
    // Crash now, before a later write repairs the checkpoints; another node resumes.
    a.kill9();
    up.set_all(&all, "on");
    let b = Replica::start("b", &dir.path, &db.url, "3s", &[]).await;
    let ended = all_end(&b, &pg, Duration::from_secs(10)).await;
    let after = rows(&pg).await;
    let hist = histories(&pg).await;
    let breaks = state_chain_breaks(&hist);
    eprintln!(
        "renewal held up while {recorded} waits recorded a new state: {stale} engine checkpoints \
         went back to the older state; after a crash, {} waits resumed from it, e.g. {:?}",
        breaks.len(),
        breaks.first()
    );
    assert!(ended.is_some(), "waits still running");
    check_histories(&after, &hist);
    assert!(
        recorded > 0,
        "no state change was recorded while the renewal was held up"
    );
    assert_eq!(stale, 0, "engine checkpoints older than the recorded state");
    assert!(
        breaks.is_empty(),
        "histories after the takeover: {breaks:?}"
    );
    assert_no_panics(&[&a, &b]);
    drop((a, b));
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_success_at_the_same_instant_ends_the_wait_once() {
    let _serial = SERIAL.lock().await;
    // The prober lets 8 probes per target host be in flight, so rounds of 8 held probes.
    const ROUNDS: usize = 5;
    const PER_ROUND: usize = 8;
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let a = Replica::start("a", &dir.path, &db.url, "3s", &[]).await;
    let b = Replica::start("b", &dir.path, &db.url, "3s", &["--no-worker"]).await;
    let pg = pool(&db.url).await;
    let client = client();
    // cancel time minus release time, from -20 ms to +20 ms.
    let n = ROUNDS * PER_ROUND;
    let offsets: Vec<i64> = (0..n)
        .map(|i| -20_000 + (i as i64) * 40_000 / (n as i64 - 1))
        .collect();
    let mut outcomes: Vec<(i64, Uuid, Answer)> = Vec::new();
    for round in 0..ROUNDS {
        let idx: Vec<usize> = (0..PER_ROUND).map(|k| k * ROUNDS + round).collect();
        let paths: Vec<String> = idx.iter().map(|i| format!("/race/{i}")).collect();
        let urls: Vec<String> = paths.iter().map(|p| up.set(p, Behavior::Hold)).collect();
        let ids = create_all(&[&a], &urls, Duration::from_millis(50), "race").await;
        assert!(
            up.hit_when(Duration::from_secs(5), |hits| {
                each_hit(hits, &paths, 1, up.started())
            })
            .await,
            "the held probes did not all arrive"
        );
        let base = tokio::time::Instant::now() + Duration::from_millis(50);
        let tasks = idx.iter().zip(&paths).zip(&ids).map(|((i, p), id)| {
            let d = offsets[*i];
            let release_at = base + Duration::from_micros(20_000);
            let cancel_at = if d >= 0 {
                release_at + Duration::from_micros(d as u64)
            } else {
                release_at - Duration::from_micros(d.unsigned_abs())
            };
            let up = up.clone();
            let p = p.clone();
            let req = client.post(b.url(&format!("/waits/{id}/cancel")));
            let id = *id;
            async move {
                let release = async {
                    // Pacing: the release and the cancel race at chosen instants.
                    tokio::time::sleep_until(release_at).await;
                    up.set_status(&p, "on");
                };
                let cancel = async {
                    tokio::time::sleep_until(cancel_at).await;
                    send(req).await
                };
                let ((), ans) = tokio::join!(release, cancel);
                (d, id, ans)
            }
        });
        outcomes.extend(join_all(tasks).await);
    }
    let ended = all_end(&b, &pg, Duration::from_secs(5)).await;
    let t_end = Instant::now();
    // The point: no poll lands in the interval after every wait ended.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let polls_after: usize = up.hits().iter().filter(|h| h.at > t_end).count();
    let after = rows(&pg).await;
    let hist = histories(&pg).await;
    outcomes.sort_by_key(|(d, _, _)| *d);
    let line: String = outcomes
        .iter()
        .map(|(_, id, _)| {
            if after[id].status == "canceled" {
                'C'
            } else {
                'S'
            }
        })
        .collect();
    let won = |s: &str| after.values().filter(|r| r.status == s).count();
    eprintln!(
        "cancel vs success, cancel sent -20..+20 ms from the target's answer: {} canceled, {} succeeded; \
         by offset: {line}",
        won("canceled"),
        won("succeeded")
    );
    assert!(ended.is_some(), "waits still running");
    check_histories(&after, &hist);
    for (d, id, ans) in &outcomes {
        let r = &after[id];
        assert!(r.status == "canceled" || r.status == "succeeded", "{r:?}");
        assert_eq!(ans.status, 200, "cancel at {d} us: {}", ans.body);
        // The cancel answers with the wait as it ended, whoever won.
        assert_eq!(
            ans.body["status"],
            r.status.as_str(),
            "cancel at {d} us: {}",
            ans.body
        );
    }
    assert!(
        won("canceled") > 0 && won("succeeded") > 0,
        "the race was never close: {line}"
    );
    assert_eq!(
        polls_after, 0,
        "targets still polled after every wait ended"
    );
    assert_no_panics(&[&a, &b]);
    drop((a, b));
    pg.close().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claimers_never_claim_the_same_wait() {
    let _serial = SERIAL.lock().await;
    const INTERVAL: Duration = Duration::from_millis(300);
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let up = Recorder::start().await;
    let api = Replica::start("api", &dir.path, &db.url, "10s", &["--no-worker"]).await;
    let pg = pool(&db.url).await;
    // 150 due waits before any worker runs...
    let first: Vec<String> = (0..150).map(|i| format!("/claim/{i}")).collect();
    let first_urls: Vec<String> = first
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    create_all(&[&api], &first_urls, INTERVAL, "claim").await;
    // ...then three workers start at once, while 150 more arrive through all replicas.
    let names = ["w0", "w1", "w2"];
    let mut ws: Vec<Replica> = names
        .iter()
        .map(|n| {
            let port = free_port();
            Replica::spawn(n, &dir.path, port, replica_args(&db.url, port, "10s", &[]))
        })
        .collect();
    for w in ws.iter_mut() {
        w.ready(Duration::from_secs(20)).await;
    }
    let second: Vec<String> = (150..300).map(|i| format!("/claim/{i}")).collect();
    let second_urls: Vec<String> = second
        .iter()
        .map(|p| up.set_status(p, "deploying"))
        .collect();
    let mut via: Vec<&Replica> = ws.iter().collect();
    via.push(&api);
    create_all(&via, &second_urls, INTERVAL, "claim").await;
    let paths: Vec<String> = first.iter().chain(&second).cloned().collect();
    assert!(
        all_owned_and_polled(&pg, &up, &paths, 2).await,
        "the waits were not all claimed and polled"
    );
    let before = rows(&pg).await;
    let owners: Vec<Uuid> = ws
        .iter()
        .map(|w| w.owner().expect("owner in the log"))
        .collect();
    let spread: Vec<usize> = owners
        .iter()
        .map(|o| before.values().filter(|r| r.owner == Some(*o)).count())
        .collect();
    let epochs: BTreeMap<i64, usize> = before.values().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.epoch).or_default() += 1;
        m
    });
    let att = attribute(&up, &ws);
    let who = pollers(&att);
    let shared: Vec<(&String, &HashSet<usize>)> = who.iter().filter(|(_, s)| s.len() > 1).collect();
    let unattributed = att.iter().filter(|(_, r)| r.is_none()).count();
    eprintln!(
        "3 claimers racing over 300 waits: held {spread:?}; epochs {epochs:?}; paths polled by 2+ replicas: {}; \
         {unattributed} of {} hits unattributed",
        shared.len(),
        att.len()
    );
    assert_eq!(
        epochs,
        BTreeMap::from([(1, 300)]),
        "a wait was claimed more than once"
    );
    assert!(
        shared.is_empty(),
        "paths polled by several replicas: {shared:?}"
    );
    assert_eq!(unattributed, 0, "hits that named no replica");
    assert_eq!(spread.iter().sum::<usize>(), 300);
    up.set_all(&paths, "on");
    assert!(all_end(&api, &pg, Duration::from_secs(8)).await.is_some());
    let after = rows(&pg).await;
    assert!(after.values().all(|r| r.status == "succeeded"));
    check_histories(&after, &histories(&pg).await);
    let mut all: Vec<&Replica> = ws.iter().collect();
    all.push(&api);
    assert_no_panics(&all);
    drop(ws);
    drop(api);
    pg.close().await;
    db.drop_db().await;
}

#[test]
fn the_double_polling_measure_sees_two_replicas_polling_one_path_together() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    // A polls 0..=1000 every 100 ms; B takes over at 700 and polls to 1500.
    let mut hits: Vec<(Instant, Option<usize>)> =
        (0..=10).map(|i| (at(i * 100), Some(0))).collect();
    hits.extend((7..=15).map(|i| (at(i * 100 + 5), Some(1))));
    hits.sort_by_key(|(t, _)| *t);
    let d = longest_double_poll(&hits, Duration::from_millis(400));
    assert_eq!(d, Duration::from_millis(295));
    // A clean handover is no double polling; nor is one replica alone.
    let clean: Vec<(Instant, Option<usize>)> = (0..20)
        .map(|i| (at(i * 100), Some(usize::from(i >= 10))))
        .collect();
    assert_eq!(
        longest_double_poll(&clean, Duration::from_millis(400)),
        Duration::ZERO
    );
    // A pause longer than the gap splits a replica's polling into two runs.
    let back: Vec<(Instant, Option<usize>)> = vec![
        (at(0), Some(0)),
        (at(100), Some(0)),
        (at(1000), Some(1)),
        (at(1100), Some(1)),
        (at(1500), Some(0)),
    ];
    assert_eq!(
        longest_double_poll(&back, Duration::from_millis(400)),
        Duration::ZERO
    );
}

/// A wait that polls with OAuth 2.0 tokens survives its replica's `kill -9`: the
/// survivor opens the sealed client secret and mints a token of its own (tokens
/// live only in a replica's memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_kill_9_the_new_owner_mints_its_own_token_from_the_sealed_secret() {
    use support::issuer::{CLIENT_ID, Issuer};
    let _serial = SERIAL.lock().await;
    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let db = TestDb::new().await;
    let dir = TempDir::new("waitd-replicas");
    let issuer = Issuer::start("sealed-client-secret").await;
    let extra = ["--secret-key", KEY];
    let mut a = Replica::start("a", &dir.path, &db.url, "2s", &extra).await;
    let spec = json!({
        "target": {"url": issuer.target_url, "auth": {"oauth2": {
            "token_url": issuer.token_url, "client_id": CLIENT_ID,
            "client_secret": "sealed-client-secret"}}},
        "state": "/data/attributes/status", "want": ["on"], "timeout": "60s",
        "poll": {"initial": "100ms", "factor": 1, "max": "100ms", "jitter": 0}
    });
    let created = send(client().post(a.url("/waits")).json(&spec)).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let id = created.body["id"].as_str().unwrap().to_string();
    assert!(
        issuer
            .until(Duration::from_secs(10), |i| i.target_ok() >= 1)
            .await,
        "replica a polls with its token"
    );
    let mut b = Replica::start("b", &dir.path, &db.url, "2s", &extra).await;
    // The target says "on" only to the second token: the one b mints.
    issuer.on_after(2);
    a.kill9();
    let done = send(client().get(b.url(&format!("/waits/{id}?wait=30s")))).await;
    assert_eq!(done.body["status"], "succeeded", "{:?}", done.body);
    assert_eq!(issuer.token_requests(), 2, "b minted one token of its own");
    assert_eq!(issuer.unauthorized(), 0);
    assert_no_panics(&[&b]);
    b.signal("TERM");
    b.wait_exit(Duration::from_secs(20)).await;
    db.drop_db().await;
}
