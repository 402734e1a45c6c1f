//! What a poll writes, against both databases: the count of polls begun, fenced
//! progress batches, and an end written once however writers race.

use super::*;

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
        // Its count is 0: the claim counts nothing, even though it is due.
        assert!(!c[0].counted, "{}", backend.url());
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
        // Its count is not 0 and it is due: on Postgres the claim counts its first
        // poll in its own write.
        assert_eq!(c[0].counted, backend.name() == "postgres");
        assert!(c[0].count_first_poll, "{}", backend.url());
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
        if !c[0].counted {
            store
                .leases()
                .mark_polling(b, &[WaitEpoch::from((w.id, c[0].epoch))])
                .await
                .unwrap();
        }
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
async fn a_claim_counts_a_first_poll_only_when_the_wait_is_due_and_its_count_is_kept() {
    for_each_store!(|store, backend| {
        let leases = store.leases().clone();
        let claim = |owner: Uuid, ahead: u64| {
            let leases = leases.clone();
            async move {
                let ttl = Duration::from_secs(30);
                let ahead = Duration::from_secs(ahead);
                leases.claim(owner, ttl, ahead, 10).await.unwrap()
            }
        };
        let back = |c: &waitd::store::Claimed| Checkpoint {
            id: c.id,
            epoch: c.epoch,
            engine: None,
            next_poll_at: None,
        };
        let begun = |c: &waitd::store::Claimed| WaitEpoch::from((c.id, c.epoch));
        let postgres = backend.name() == "postgres";
        // A wait whose count is 0. On Postgres the slot it enters guards its first
        // poll (docs/replicas.md §6.6): neither the claim nor the worker counts it,
        // due or not. On SQLite, which has no slots, the worker records the poll.
        let in_30s = Utc::now() + chrono::TimeDelta::seconds(30);
        let later = store.waits().create("t", &spec(), in_30s, None).await;
        let later = later.unwrap().wait;
        let a = Uuid::now_v7();
        let c = claim(a, 60).await;
        assert_eq!(c.len(), 1, "{}", backend.url());
        assert!(!c[0].counted, "{}", backend.url());
        assert_eq!(c[0].count_first_poll, !postgres, "{}", backend.url());
        leases.release(a, &[back(&c[0])]).await.unwrap();
        let b = Uuid::now_v7();
        let c = claim(b, 60).await;
        assert_eq!((c[0].id, c[0].claims), (later.id, 0), "{}", backend.url());
        leases.release(b, &[back(&c[0])]).await.unwrap();
        let now = store.waits().create("t", &spec(), Utc::now(), None).await;
        let now = now.unwrap().wait;
        let a = Uuid::now_v7();
        let c = claim(a, 0).await;
        assert_eq!(c.len(), 1, "{}", backend.url());
        assert_eq!((c[0].id, c[0].claims), (now.id, 0));
        assert!(!c[0].counted, "due, but its count is 0 ({})", backend.url());
        assert_eq!(c[0].count_first_poll, !postgres, "{}", backend.url());
        // Its poll begun and never completed (the replica stopped): its count is
        // kept from now on, on both stores.
        leases.mark_polling(a, &[begun(&c[0])]).await.unwrap();
        leases.release(a, &[back(&c[0])]).await.unwrap();
        // Due already: Postgres counts the first poll in the claim's own write, so
        // a claimer that stops before polling leaves one more poll counted, as one
        // that stops between the record and the poll does.
        let b = Uuid::now_v7();
        let c = claim(b, 0).await;
        assert_eq!((c[0].id, c[0].claims), (now.id, 1), "{}", backend.url());
        assert!(c[0].count_first_poll, "{}", backend.url());
        assert_eq!(c[0].counted, postgres, "{}", backend.url());
        leases.release(b, &[back(&c[0])]).await.unwrap();
        let c = claim(Uuid::now_v7(), 0).await;
        assert_eq!(c[0].claims, 1 + i32::from(postgres), "{}", backend.url());
        // Due in under a second is not due: a claim counts a first poll only once
        // the wait is due, so one counted here was due before the claim answered.
        let at = Utc::now() + chrono::TimeDelta::milliseconds(800);
        let soon = store.waits().create("t", &spec(), at, None).await;
        let soon = soon.unwrap().wait;
        let a = Uuid::now_v7();
        let c = claim(a, 60).await;
        let s = c.iter().find(|c| c.id == soon.id).expect("claimed");
        leases.mark_polling(a, &[begun(s)]).await.unwrap();
        let all: Vec<Checkpoint> = c.iter().map(back).collect();
        leases.release(a, &all).await.unwrap();
        let c = claim(Uuid::now_v7(), 60).await;
        let answered = Utc::now();
        let s = c.iter().find(|c| c.id == soon.id).expect("claimed again");
        assert_eq!(s.claims, 1, "{}", backend.url());
        assert!(
            !s.counted || s.next_poll_at <= answered,
            "counted {} ms before it was due ({})",
            (s.next_poll_at - answered).num_milliseconds(),
            backend.url()
        );
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
                    output: None,
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
