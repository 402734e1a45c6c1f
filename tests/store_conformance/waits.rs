//! Waits, against both databases: creates and their keys, reads, lists and
//! cancels, each tenant's apart.

use super::*;

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
