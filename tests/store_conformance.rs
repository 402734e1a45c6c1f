//! One conformance suite, run against both stores: every test body takes an
//! `Store` and must hold for Postgres and for the embedded SQLite file alike.

use crate::support;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use support::TestDb;
use uuid::Uuid;
use waitd::bus::Bus;
use waitd::engine::{EngineState, Limits, Spec};
use waitd::store::{
    Checkpoint, Ended, EventBody, ListFilter, Progress, Status, Store, StoreError, WaitEpoch,
};

/// A store of each kind, migrated, and what is needed to reopen it.
enum Backend {
    Postgres(TestDb),
    Sqlite(tempdir::Dir),
}

mod tempdir {
    /// A directory under the system temp dir, removed on drop.
    pub struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            let p =
                std::env::temp_dir().join(format!("waitd-test-{}", uuid::Uuid::now_v7().simple()));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Backend {
    fn url(&self) -> String {
        match self {
            Backend::Postgres(db) => db.url.clone(),
            Backend::Sqlite(dir) => format!("sqlite://{}", dir.0.join("waitd.db").display()),
        }
    }

    async fn open(&self) -> Store {
        let store = Store::open(&self.url(), 4, Bus::new()).unwrap();
        store.migrate().await.unwrap();
        store
    }

    async fn finish(self) {
        if let Backend::Postgres(db) = self {
            db.drop_db().await;
        }
    }
}

async fn backends() -> Vec<Backend> {
    vec![
        Backend::Postgres(TestDb::new().await),
        Backend::Sqlite(tempdir::Dir::new()),
    ]
}

fn spec_with(labels: serde_json::Value) -> Spec {
    Spec::from_request(
        &json!({
            "target": {"url": "https://api.example.com/servers/1", "headers": {"Authorization": "Bearer secret-token-value"}},
            "state": "/status",
            "want": ["on"],
            "timeout": "5m",
            "poll": {"initial": "10ms", "max": "10ms"},
            "labels": labels,
        }),
        &Limits {
            min_poll_interval: Duration::from_millis(1),
            ..Limits::default()
        },
    )
    .unwrap()
}

fn spec() -> Spec {
    spec_with(json!({}))
}

/// Runs `body` against each backend, naming the backend when it fails.
macro_rules! for_each_store {
    (|$store:ident, $backend:ident| $body:block) => {{
        for $backend in backends().await {
            let $store = $backend.open().await;
            $body
            $store.close().await;
            $backend.finish().await;
        }
    }};
}

#[tokio::test]
async fn a_created_wait_reads_back_with_its_created_event_and_redacted_headers() {
    for_each_store!(|store, backend| {
        let created = store
            .waits()
            .create("t1", &spec(), Utc::now(), None)
            .await
            .unwrap();
        assert!(!created.existing);
        let w = store
            .waits()
            .get("t1", created.wait.id)
            .await
            .unwrap()
            .expect("the wait exists");
        assert_eq!(w.status, Status::Running, "{}", backend.url());
        assert_eq!(w.spec["target"]["headers"]["Authorization"], "<redacted>");
        assert!(!w.spec.to_string().contains("secret-token-value"));
        let events = store.events().of_wait("t1", w.id, 0, 100).await.unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].kind(), "created");
        assert_eq!(events[0].seq, 1);
    });
}

#[tokio::test]
async fn another_tenant_sees_nothing_of_a_wait() {
    for_each_store!(|store, _backend| {
        let w = store
            .waits()
            .create("t1", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        assert!(store.waits().get("t2", w.id).await.unwrap().is_none());
        assert!(
            store
                .waits()
                .cancel("t2", w.id, Utc::now())
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            store
                .events()
                .of_wait("t2", w.id, 0, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store
                .events()
                .of_tenant("t2", 0, &BTreeMap::new(), 10)
                .await
                .unwrap()
                .is_empty()
        );
        let page = store
            .waits()
            .list(
                "t2",
                &ListFilter {
                    limit: 10,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert!(page.is_empty());
        assert_eq!(
            store.waits().get("t1", w.id).await.unwrap().unwrap().status,
            Status::Running
        );
    });
}

#[tokio::test]
async fn the_list_is_newest_first_filtered_and_paged_without_overlap() {
    for_each_store!(|store, backend| {
        let mut ids = Vec::new();
        for i in 0..7 {
            let labels = json!({"team": if i % 2 == 0 { "a" } else { "b" }});
            ids.push(
                store
                    .waits()
                    .create("t", &spec_with(labels), Utc::now(), None)
                    .await
                    .unwrap()
                    .wait
                    .id,
            );
        }
        store.waits().cancel("t", ids[0], Utc::now()).await.unwrap();
        let mut seen = Vec::new();
        let mut filter = ListFilter {
            limit: 3,
            ..Default::default()
        };
        loop {
            let page = store.waits().list("t", &filter).await.unwrap();
            seen.extend(page.iter().map(|w| w.id));
            if page.len() < 3 {
                break;
            }
            filter.before = page.last().map(|w| w.id);
        }
        let mut newest_first = ids.clone();
        newest_first.reverse();
        assert_eq!(seen, newest_first, "{}", backend.url());

        let mut labels = BTreeMap::new();
        labels.insert("team".to_string(), "a".to_string());
        let team_a = store
            .waits()
            .list(
                "t",
                &ListFilter {
                    limit: 50,
                    labels,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(team_a.len(), 4);
        let canceled = store
            .waits()
            .list(
                "t",
                &ListFilter {
                    limit: 50,
                    status: Some(Status::Canceled),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            canceled.iter().map(|w| w.id).collect::<Vec<_>>(),
            vec![ids[0]]
        );
    });
}

#[tokio::test]
async fn an_idempotency_key_returns_the_first_wait_and_refuses_another_body() {
    for_each_store!(|store, _backend| {
        let first = store
            .waits()
            .create("t", &spec(), Utc::now(), Some(("k1", "hash-a")))
            .await
            .unwrap();
        let again = store
            .waits()
            .create("t", &spec(), Utc::now(), Some(("k1", "hash-a")))
            .await
            .unwrap();
        assert!(again.existing);
        assert_eq!(first.wait.id, again.wait.id);
        let other = store
            .waits()
            .create("t", &spec(), Utc::now(), Some(("k1", "hash-b")))
            .await;
        assert!(matches!(other, Err(StoreError::IdempotencyConflict)));
        // Keys are per tenant.
        let elsewhere = store
            .waits()
            .create("u", &spec(), Utc::now(), Some(("k1", "hash-b")))
            .await
            .unwrap();
        assert!(!elsewhere.existing);
        let all = store
            .waits()
            .list(
                "t",
                &ListFilter {
                    limit: 50,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(all.len(), 1);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_make_one_wait_a_key_and_one_each_without() {
    for_each_store!(|store, backend| {
        // Forty keys asked for five times each, among sixty creates without a
        // key, all at once: on Postgres they share batches, keys repeated in one.
        let mut asks = Vec::new();
        for i in 0..260 {
            let key = (i < 200).then(|| format!("k{}", i % 40));
            let store = store.clone();
            asks.push(tokio::spawn(async move {
                let idem = key.as_deref().map(|k| (k, "same-body"));
                let created = store.waits().create("t", &spec(), Utc::now(), idem).await;
                (key, created.expect("every create is answered").wait.id)
            }));
        }
        let mut by_key: BTreeMap<String, std::collections::HashSet<Uuid>> = BTreeMap::new();
        let mut unkeyed = std::collections::HashSet::new();
        for ask in asks {
            let (key, id) = ask.await.unwrap();
            match key {
                Some(k) => {
                    by_key.entry(k).or_default().insert(id);
                }
                None => {
                    assert!(unkeyed.insert(id), "two creates answered with one wait");
                }
            }
        }
        assert_eq!(by_key.len(), 40);
        assert!(
            by_key.values().all(|ids| ids.len() == 1),
            "a key answered with two waits on {}",
            backend.url()
        );
        let all = store
            .waits()
            .list(
                "t",
                &ListFilter {
                    limit: 500,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(all.len(), 100, "40 keyed and 60 unkeyed waits");
        for w in &all {
            let events = store.events().of_wait("t", w.id, 0, 10).await.unwrap();
            assert_eq!(events.len(), 1, "one created event each");
            assert_eq!(events[0].kind(), "created");
        }
    });
}

#[tokio::test]
async fn a_poll_begun_counts_until_a_completed_one_is_confirmed_and_both_are_fenced() {
    for_each_store!(|store, backend| {
        let w = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let ttl = Duration::from_secs(30);
        let checkpoint = |epoch| Checkpoint {
            id: w.id,
            epoch,
            engine: None,
            next_poll_at: None,
        };
        // Claimed, its poll begun, given back: the next claimer sees one begun.
        let a = Uuid::now_v7();
        let c = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(c[0].claims, 0, "{}", backend.url());
        let marked = store
            .leases()
            .mark_polling(a, &[WaitEpoch::from((w.id, c[0].epoch))])
            .await
            .unwrap();
        assert_eq!(marked, vec![w.id], "{}", backend.url());
        store
            .leases()
            .release(a, &[checkpoint(c[0].epoch)])
            .await
            .unwrap();
        let b = Uuid::now_v7();
        let c = store
            .leases()
            .claim(b, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(c[0].claims, 1, "{}", backend.url());
        // A confirmation under an old epoch or by another owner lands nowhere.
        assert!(
            store
                .leases()
                .confirm_polled(b, &[WaitEpoch::from((w.id, c[0].epoch - 1))])
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            store
                .leases()
                .confirm_polled(a, &[WaitEpoch::from((w.id, c[0].epoch))])
                .await
                .unwrap()
                .is_empty()
        );
        // Begun and completed under this claim: the count is back to 0.
        store
            .leases()
            .mark_polling(b, &[WaitEpoch::from((w.id, c[0].epoch))])
            .await
            .unwrap();
        let confirmed = store
            .leases()
            .confirm_polled(b, &[WaitEpoch::from((w.id, c[0].epoch))])
            .await
            .unwrap();
        assert_eq!(confirmed, vec![w.id], "{}", backend.url());
        store
            .leases()
            .release(b, &[checkpoint(c[0].epoch)])
            .await
            .unwrap();
        let c = store
            .leases()
            .claim(Uuid::now_v7(), ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(c[0].claims, 0, "{}", backend.url());
    });
}

#[tokio::test]
async fn a_claim_takes_a_lease_that_a_second_claimer_cannot_take_until_it_runs_out() {
    for_each_store!(|store, backend| {
        let w = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ttl = Duration::from_secs(30);
        let claimed = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1, "{}", backend.url());
        assert_eq!(
            claimed[0].spec.target.headers["Authorization"],
            "Bearer secret-token-value"
        );
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .is_empty()
        );
        // The lease runs out: a renewal for no time at all leaves it ending now,
        // on the store's clock.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        let taken = store
            .leases()
            .claim(b, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(taken.len(), 1);
        assert!(taken[0].epoch > claimed[0].epoch);
        // The old owner is fenced off: its writes and renewals no longer land.
        let stale = Progress {
            id: w.id,
            epoch: claimed[0].epoch,
            engine: claimed[0].engine.clone(),
            next_poll_at: Some(Utc::now()),
            events: vec![EventBody::State {
                from: None,
                to: "x".into(),
            }],
            end: None,
        };
        assert!(!store.leases().record(a, Utc::now(), &stale).await.unwrap());
        let renew = [WaitEpoch::from((w.id, claimed[0].epoch))];
        assert_eq!(
            store
                .leases()
                .renew(a, ttl, &renew, &[])
                .await
                .unwrap()
                .lost,
            renew.to_vec()
        );
        let renew_b = [WaitEpoch::from((w.id, taken[0].epoch))];
        let renewal = store.leases().renew(b, ttl, &renew_b, &[]).await.unwrap();
        assert!(renewal.lost.is_empty() && renewal.strays.is_empty());
        assert_eq!(
            store
                .events()
                .of_wait("t", w.id, 0, 10)
                .await
                .unwrap()
                .len(),
            1,
            "the fenced write left no event"
        );
    });
}

#[tokio::test]
async fn concurrent_claimers_never_claim_the_same_wait() {
    for_each_store!(|store, backend| {
        for _ in 0..40 {
            store
                .waits()
                .create("t", &spec(), Utc::now(), None)
                .await
                .unwrap();
        }
        // The waits share one placement: one claimer's to take, until they are
        // overdue (§6.2) and the others race it for what is left.
        let claimed = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let until = std::time::Instant::now() + Duration::from_secs(20);
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let s = store.clone();
            let claimed = claimed.clone();
            tasks.push(tokio::spawn(async move {
                use std::sync::atomic::Ordering::SeqCst;
                let me = Uuid::now_v7();
                let mut mine = Vec::new();
                while claimed.load(SeqCst) < 40 && std::time::Instant::now() < until {
                    let got: Vec<Uuid> = s
                        .leases()
                        .claim(me, Duration::from_secs(30), Duration::ZERO, 4)
                        .await
                        .unwrap()
                        .into_iter()
                        .map(|c| c.id)
                        .collect();
                    claimed.fetch_add(got.len(), SeqCst);
                    if got.is_empty() {
                        // Pacing: a claimer that got nothing claims again shortly.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    mine.extend(got);
                }
                mine
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(
            all.len(),
            n,
            "a wait was claimed twice on {}",
            backend.url()
        );
        assert_eq!(n, 40);
    });
}

#[tokio::test]
async fn a_wait_ends_exactly_once_when_cancel_and_success_race() {
    for_each_store!(|store, backend| {
        for _ in 0..10 {
            let w = store
                .waits()
                .create("t", &spec(), Utc::now(), None)
                .await
                .unwrap()
                .wait;
            let me = Uuid::now_v7();
            let c = store
                .leases()
                .claim(me, Duration::from_secs(30), Duration::ZERO, 1)
                .await
                .unwrap()
                .remove(0);
            let mut engine: EngineState = c.engine.clone();
            engine.state = Some("on".into());
            let success = Progress {
                id: w.id,
                epoch: c.epoch,
                engine,
                next_poll_at: None,
                events: vec![],
                end: Some(Ended {
                    status: Status::Succeeded,
                    reason: "the target reached \"on\"".into(),
                    error_detail: None,
                }),
            };
            let (s1, s2) = (store.clone(), store.clone());
            let (a, b) = tokio::join!(
                async move { s1.leases().record(me, Utc::now(), &success).await.unwrap() },
                async move { s2.waits().cancel("t", w.id, Utc::now()).await.unwrap() }
            );
            let events = store.events().of_wait("t", w.id, 0, 10).await.unwrap();
            let terminal: Vec<_> = events.iter().filter(|e| e.is_terminal()).collect();
            assert_eq!(
                terminal.len(),
                1,
                "{} on {}",
                serde_json::to_string(&events).unwrap(),
                backend.url()
            );
            let end = store.waits().get("t", w.id).await.unwrap().unwrap();
            assert_eq!(end.status.as_str(), terminal[0].kind());
            assert_eq!(a, end.status == Status::Succeeded);
            let b = b.expect("the wait exists");
            assert_eq!(
                b.ended,
                end.status == Status::Canceled,
                "exactly one of the two ended it"
            );
            assert_ne!(a, b.ended);
        }
    });
}

#[tokio::test]
async fn events_replay_by_seq_and_by_global_cursor_in_order() {
    for_each_store!(|store, backend| {
        let w1 = store
            .waits()
            .create("t", &spec_with(json!({"k": "1"})), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let w2 = store
            .waits()
            .create("t", &spec_with(json!({"k": "2"})), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let me = Uuid::now_v7();
        let claimed = store
            .leases()
            .claim(me, Duration::from_secs(30), Duration::ZERO, 10)
            .await
            .unwrap();
        for c in &claimed {
            let p = Progress {
                id: c.id,
                epoch: c.epoch,
                engine: c.engine.clone(),
                next_poll_at: Some(Utc::now()),
                events: vec![
                    EventBody::State {
                        from: None,
                        to: "deploying".into(),
                    },
                    EventBody::Retry {
                        error: "503".into(),
                        attempt: 1,
                        delay: "1s".into(),
                    },
                ],
                end: None,
            };
            assert!(store.leases().record(me, Utc::now(), &p).await.unwrap());
        }
        let e1 = store.events().of_wait("t", w1.id, 0, 100).await.unwrap();
        assert_eq!(
            e1.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2, 3],
            "{}",
            backend.url()
        );
        assert_eq!(
            e1.iter().map(|e| e.kind()).collect::<Vec<_>>(),
            ["created", "state", "retry"]
        );
        assert_eq!(
            store
                .events()
                .of_wait("t", w1.id, 1, 100)
                .await
                .unwrap()
                .len(),
            2
        );
        assert!(matches!(&e1[1].body, EventBody::State { to, .. } if to == "deploying"));

        let all = store
            .events()
            .of_tenant("t", 0, &BTreeMap::new(), 100)
            .await
            .unwrap();
        assert_eq!(all.len(), 6);
        assert!(all.windows(2).all(|w| w[0].id < w[1].id));
        let after = store
            .events()
            .of_tenant("t", all[2].id.unwrap(), &BTreeMap::new(), 100)
            .await
            .unwrap();
        assert_eq!(after.len(), 3);
        let mut only2 = BTreeMap::new();
        only2.insert("k".to_string(), "2".to_string());
        let labelled = store.events().of_tenant("t", 0, &only2, 100).await.unwrap();
        assert!(labelled.iter().all(|e| e.wait_id == w2.id));
        assert_eq!(labelled.len(), 3);
    });
}

#[tokio::test]
async fn canceling_an_ended_wait_returns_it_unchanged_and_adds_no_event() {
    for_each_store!(|store, _backend| {
        let w = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let first = store
            .waits()
            .cancel("t", w.id, Utc::now())
            .await
            .unwrap()
            .unwrap();
        assert!(first.ended, "the first cancel ends it");
        let first = first.wait;
        assert_eq!(first.status, Status::Canceled);
        let second = store
            .waits()
            .cancel("t", w.id, Utc::now())
            .await
            .unwrap()
            .unwrap();
        assert!(!second.ended, "the second finds it ended");
        let second = second.wait;
        assert_eq!(second.finished_at, first.finished_at);
        let events = store.events().of_wait("t", w.id, 0, 10).await.unwrap();
        assert_eq!(
            events.iter().map(|e| e.kind()).collect::<Vec<_>>(),
            ["created", "canceled"]
        );
        // A canceled wait is no longer claimable.
        assert!(
            store
                .leases()
                .claim(Uuid::now_v7(), Duration::from_secs(1), Duration::ZERO, 10)
                .await
                .unwrap()
                .is_empty()
        );
    });
}

#[tokio::test]
async fn a_renewal_keeps_every_wait_the_owner_holds_named_or_not() {
    for_each_store!(|store, backend| {
        let ttl = Duration::from_secs(30);
        let first = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let held = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 10)
            .await
            .unwrap();
        assert_eq!(held.len(), 1, "{}", backend.url());
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        assert_eq!(
            store
                .leases()
                .claim(a, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .len(),
            1
        );
        // The lease is at its end (a renewal for no time leaves it ending now, on
        // the store's clock) when a renewal that names only the first wait comes
        // (the second claim may still be on its way back to the worker): it keeps
        // both.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        let renew = [WaitEpoch::from((first.id, held[0].epoch))];
        let renewal = store.leases().renew(a, ttl, &renew, &[]).await.unwrap();
        assert!(renewal.lost.is_empty());
        // The one it does not name is reported: owned, and not in the renewal (a
        // claim whose answer the worker never got would stay so).
        assert_eq!(renewal.strays.len(), 1, "{}", backend.url());
        assert_ne!(renewal.strays[0].id, first.id);
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .is_empty(),
            "{}: a wait of a live owner was taken",
            backend.url()
        );
        // Without another renewal both go to the next claimer once the lease runs
        // out, and the old owner learns it.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        assert_eq!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 10)
                .await
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            store
                .leases()
                .renew(a, ttl, &renew, &[])
                .await
                .unwrap()
                .lost,
            renew.to_vec()
        );
    });
}

#[tokio::test]
async fn a_batch_of_progress_writes_each_wait_it_still_owns_and_only_those() {
    for_each_store!(|store, backend| {
        for _ in 0..3 {
            store
                .waits()
                .create("t", &spec(), Utc::now(), None)
                .await
                .unwrap();
        }
        let a = Uuid::now_v7();
        let mut held = store
            .leases()
            .claim(a, Duration::from_secs(60), Duration::ZERO, 10)
            .await
            .unwrap();
        held.sort_by_key(|c| c.id);
        assert_eq!(held.len(), 3, "{}", backend.url());
        // The third is canceled through the API while its owner still polls it.
        store
            .waits()
            .cancel("t", held[2].id, Utc::now())
            .await
            .unwrap()
            .unwrap();
        let progress = |c: &waitd::store::Claimed, epoch: i64, to: &str| Progress {
            id: c.id,
            epoch,
            engine: c.engine.clone(),
            next_poll_at: Some(Utc::now()),
            events: vec![EventBody::State {
                from: None,
                to: to.into(),
            }],
            end: None,
        };
        let batch = [
            progress(&held[0], held[0].epoch, "x"),
            // A stale epoch: this one is no longer the writer's.
            progress(&held[1], held[1].epoch - 1, "y"),
            // Ended meanwhile: a running owner's write does not revive it.
            progress(&held[2], held[2].epoch, "z"),
        ];
        // Another replica's write of the same batch lands nowhere.
        assert_eq!(
            store
                .leases()
                .record_many(Uuid::now_v7(), Utc::now(), &batch)
                .await
                .unwrap(),
            vec![false, false, false]
        );
        assert_eq!(
            store
                .leases()
                .record_many(a, Utc::now(), &batch)
                .await
                .unwrap(),
            vec![true, false, false]
        );
        let kinds = |id| {
            let store = store.clone();
            async move {
                store
                    .events()
                    .of_wait("t", id, 0, 10)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|e| e.kind())
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(kinds(held[0].id).await, ["created", "state"]);
        assert_eq!(kinds(held[1].id).await, ["created"]);
        assert_eq!(kinds(held[2].id).await, ["created", "canceled"]);
        assert_eq!(
            store
                .leases()
                .record_many(a, Utc::now(), &[])
                .await
                .unwrap(),
            Vec::<bool>::new()
        );
    });
}

#[tokio::test]
async fn released_leases_are_claimable_at_once_with_their_checkpoint() {
    for_each_store!(|store, backend| {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        let a = Uuid::now_v7();
        let c = store
            .leases()
            .claim(a, Duration::from_secs(60), Duration::ZERO, 1)
            .await
            .unwrap()
            .remove(0);
        let mut engine = c.engine.clone();
        engine.polls = 42;
        let next = Utc::now();
        let n = store
            .leases()
            .release(
                a,
                &[Checkpoint {
                    id: c.id,
                    epoch: c.epoch,
                    engine: Some(engine),
                    next_poll_at: Some(next),
                }],
            )
            .await
            .unwrap();
        assert_eq!(n, 1, "{}", backend.url());
        let again = store
            .leases()
            .claim(Uuid::now_v7(), Duration::from_secs(60), Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].engine.polls, 42);
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            42
        );
    });
}

#[tokio::test]
async fn a_checkpoint_renews_the_lease_and_lands_only_for_its_owner_and_when_newer() {
    for_each_store!(|store, backend| {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ttl = Duration::from_secs(30);
        let c = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 1)
            .await
            .unwrap()
            .remove(0);
        let at = |polls| {
            let mut engine = c.engine.clone();
            engine.polls = polls;
            Checkpoint {
                id: c.id,
                epoch: c.epoch,
                engine: Some(engine),
                next_poll_at: Some(Utc::now()),
            }
        };
        // Another replica's checkpoint lands nowhere.
        store.leases().checkpoint(b, ttl, &[at(9)]).await.unwrap();
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            0
        );
        store.leases().checkpoint(a, ttl, &[at(5)]).await.unwrap();
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            5,
            "{}",
            backend.url()
        );
        // An older one (a progress write got there first) does not go back.
        store.leases().checkpoint(a, ttl, &[at(3)]).await.unwrap();
        assert_eq!(
            store.waits().get("t", c.id).await.unwrap().unwrap().polls,
            5
        );
        // A checkpoint renews the lease: one with nothing in it, written when the
        // lease is at its end (a renewal for no time leaves it ending now, on the
        // store's clock), keeps the wait from the next claimer.
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        store.leases().checkpoint(a, ttl, &[]).await.unwrap();
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 1)
                .await
                .unwrap()
                .is_empty(),
            "{}: the lease ran out",
            backend.url()
        );
        store.leases().renew_lease(a, Duration::ZERO).await.unwrap();
        assert_eq!(
            store
                .leases()
                .claim(b, ttl, Duration::ZERO, 1)
                .await
                .unwrap()
                .len(),
            1,
            "{}: the lease did not run out",
            backend.url()
        );
    });
}

#[tokio::test]
async fn waits_and_events_persist_across_a_reopen() {
    for backend in backends().await {
        let store = backend.open().await;
        let w = store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        store.close().await;
        drop(store);
        let reopened = backend.open().await;
        let back = reopened
            .waits()
            .get("t", w.id)
            .await
            .unwrap()
            .expect("persisted");
        assert_eq!(back.id, w.id, "{}", backend.url());
        assert_eq!(
            reopened
                .events()
                .of_wait("t", w.id, 0, 10)
                .await
                .unwrap()
                .len(),
            1
        );
        reopened.close().await;
        drop(reopened);
        backend.finish().await;
    }
}

#[tokio::test]
async fn a_second_process_on_the_same_sqlite_file_is_refused_with_a_clear_message() {
    let dir = tempdir::Dir::new();
    let url = format!("sqlite://{}", dir.0.join("waitd.db").display());
    let first = Store::open(&url, 1, Bus::new()).unwrap();
    first.migrate().await.unwrap();
    let second = Store::open(&url, 1, Bus::new());
    let err = second.expect_err("the file is locked").to_string();
    assert!(err.contains("another waitd is already using"), "{err}");
    first.close().await;
    drop(first);
    // Once the first has gone, the file can be opened again.
    assert!(Store::open(&url, 1, Bus::new()).is_ok());
}

#[tokio::test]
async fn a_bad_database_url_is_refused_naming_the_problem() {
    let err = Store::open("mysql://x", 1, Bus::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("mysql"), "{err}");
    let err = Store::open("sqlite:///no/such/dir/waitd.db", 1, Bus::new())
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
}

#[tokio::test]
async fn a_wait_given_back_is_claimed_when_its_checkpointed_poll_comes_not_before() {
    for_each_store!(|store, backend| {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let ttl = Duration::from_secs(30);
        let c = store
            .leases()
            .claim(a, ttl, Duration::ZERO, 1)
            .await
            .unwrap()
            .remove(0);
        let mut engine = c.engine.clone();
        engine.polls = 1;
        let later = Utc::now() + chrono::Duration::seconds(3600);
        let given_back = Checkpoint {
            id: c.id,
            epoch: c.epoch,
            engine: Some(engine),
            next_poll_at: Some(later),
        };
        assert_eq!(store.leases().release(a, &[given_back]).await.unwrap(), 1);
        // Due in an hour: not within a minute's lookahead, whatever order the
        // store claims by.
        assert!(
            store
                .leases()
                .claim(b, ttl, Duration::from_secs(60), 1)
                .await
                .unwrap()
                .is_empty(),
            "{}: claimed an hour before its next poll",
            backend.url()
        );
        let taken = store
            .leases()
            .claim(b, ttl, Duration::from_secs(7200), 1)
            .await
            .unwrap();
        assert_eq!(taken.len(), 1, "{}", backend.url());
        assert_eq!(taken[0].engine.polls, 1);
    });
}

/// On Postgres, a checkpoint of a held wait changes no indexed column, so it is a
/// HOT update: no index entries, a fraction of the WAL (design §5.1). Adding an
/// index on a column a checkpoint writes would make every quiet poll cost about
/// three times as much, and fails this.
///
/// Postgres writes an update as HOT when no indexed column changes and the new
/// version fits on the old one's page. The second depends on pruning, which any
/// snapshot open in the database (an autovacuum ANALYZE, say) holds back; so the
/// table is rewritten first with a row a page, room for every version this writes,
/// and then every checkpoint is HOT exactly when it changes no indexed column.
#[tokio::test]
async fn on_postgres_a_checkpoint_of_a_held_wait_writes_no_index_entry() {
    let db = TestDb::new().await;
    let store = Store::open(&db.url, 4, Bus::new()).unwrap();
    store.migrate().await.unwrap();
    const N: usize = 40;
    const ROUNDS: u32 = 3;
    for _ in 0..N {
        store
            .waits()
            .create("t", &spec(), Utc::now(), None)
            .await
            .unwrap();
    }
    let a = Uuid::now_v7();
    let ttl = Duration::from_secs(30);
    let held = store
        .leases()
        .claim(a, ttl, Duration::ZERO, N as i64)
        .await
        .unwrap();
    assert_eq!(held.len(), N);
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    for sql in [
        "ALTER TABLE waits SET (fillfactor = 10, autovacuum_enabled = off)",
        "VACUUM FULL waits",
    ] {
        sqlx::query(sql).execute(&mut c).await.unwrap();
    }
    // A snapshot held open throughout, so nothing is pruned: the room is all there is.
    let mut snapshot = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    for sql in ["BEGIN ISOLATION LEVEL REPEATABLE READ", "SELECT 1"] {
        sqlx::query(sql).execute(&mut snapshot).await.unwrap();
    }
    for round in 1..=ROUNDS {
        for c in &held {
            let mut engine = c.engine.clone();
            engine.polls = round;
            let one = Checkpoint {
                id: c.id,
                epoch: c.epoch,
                engine: Some(engine),
                next_poll_at: Some(Utc::now() + chrono::Duration::seconds(60 * round as i64)),
            };
            store.leases().checkpoint(a, ttl, &[one]).await.unwrap();
        }
    }
    drop(snapshot);
    // A backend reports its table statistics when it exits at the latest.
    store.close().await;
    drop(store);
    let checkpoints = N as i64 * ROUNDS as i64;
    let c = tokio::sync::Mutex::new(c);
    let read = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'waits'",
        )
        .fetch_one(&mut *c.lock().await)
        .await
        .unwrap()
    };
    // Read until they are in: the statistics give no signal of their own.
    let counted = support::poll_for(Duration::from_secs(10), || async {
        let seen = read().await;
        (seen.0 >= N as i64 + checkpoints).then_some(seen)
    })
    .await;
    let (updates, hot) = match counted {
        Some(seen) => seen,
        None => read().await,
    };
    assert_eq!(
        updates,
        N as i64 + checkpoints,
        "the claims and the checkpoints"
    );
    // Each claim changes `owner` (indexed), so it is not HOT; every checkpoint is.
    assert_eq!(
        hot, checkpoints,
        "{hot} of {updates} updates were HOT: each of the {checkpoints} checkpoints should be"
    );
    drop(c);
    db.drop_db().await;
}

/// A replica of the version before `claim_at` existed inserts waits without it. In a
/// rolling upgrade those must still be claimed once only current replicas run
/// (migration 0008).
#[tokio::test]
async fn on_postgres_a_wait_inserted_without_a_claim_order_is_claimed() {
    let db = TestDb::new().await;
    let store = Store::open(&db.url, 4, Bus::new()).unwrap();
    store.migrate().await.unwrap();
    let made = store
        .waits()
        .create("t", &spec(), Utc::now(), None)
        .await
        .unwrap();
    let old = made.wait.id;
    let new = Uuid::now_v7();
    let mut c = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    // The previous version's insert, column for column, of a copy of the wait.
    for sql in [
        "INSERT INTO waits (id, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq)
         SELECT $2, tenant, status, created_at, updated_at, deadline, next_poll_at, labels, engine, seq
         FROM waits WHERE id = $1",
        "INSERT INTO wait_specs (wait_id, spec, headers) SELECT $2, spec, headers FROM wait_specs WHERE wait_id = $1",
    ] {
        sqlx::query(sql).bind(old).bind(new).execute(&mut c).await.unwrap();
    }
    let (claim_at, next_poll_at): (Option<DateTime<Utc>>, DateTime<Utc>) =
        sqlx::query_as("SELECT claim_at, next_poll_at FROM waits WHERE id = $1")
            .bind(new)
            .fetch_one(&mut c)
            .await
            .unwrap();
    assert_eq!(
        claim_at,
        Some(next_poll_at),
        "its claim order is its next poll"
    );
    let a = Uuid::now_v7();
    let taken = store
        .leases()
        .claim(a, Duration::from_secs(30), Duration::ZERO, 10)
        .await
        .unwrap();
    let mut ids: Vec<Uuid> = taken.iter().map(|t| t.id).collect();
    ids.sort();
    let mut want = vec![old, new];
    want.sort();
    assert_eq!(
        ids, want,
        "both the wait and its copy inserted the old way are claimed"
    );
    store.close().await;
    drop(c);
    db.drop_db().await;
}
