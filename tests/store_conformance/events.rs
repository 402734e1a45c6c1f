//! Events, against both databases: a wait's history by `seq`, a tenant's by
//! the global cursor.

use super::*;

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
