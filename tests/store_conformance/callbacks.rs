//! Callbacks, against both databases: a secret finds its wait only by its hash,
//! heartbeats move the clock of a running wait, silence is found, and a wait
//! ends from a callback exactly once.

use super::*;
use waitd::store::CallbackEnd;
use waitd::store::callbacks::{Secret, SecretHash};

/// A running wait of tenant `t1` with a callback secret registered for it.
async fn registered(store: &Store, heartbeat: Duration) -> (Uuid, Secret, DateTime<Utc>) {
    let now = Utc::now();
    let w = store
        .waits()
        .create("t1", &spec(), now, None)
        .await
        .unwrap()
        .wait;
    let secret = Secret::generate();
    store
        .callbacks()
        .register(w.id, "t1", &secret.hash(), Some(heartbeat), false, now)
        .await
        .unwrap();
    (w.id, secret, now)
}

#[tokio::test]
async fn a_secret_finds_its_wait_and_no_other_text_does() {
    for_each_store!(|store, backend| {
        let (id, secret, _) = registered(&store, Duration::from_secs(60)).await;
        let found = store
            .callbacks()
            .find(&SecretHash::of(secret.expose()))
            .await
            .unwrap()
            .expect("the secret names its wait");
        assert_eq!(found.wait_id, id, "{}", backend.name());
        assert_eq!(found.tenant, "t1");
        assert_eq!(found.heartbeat, Some(Duration::from_secs(60)));
        let other = Secret::generate();
        assert!(
            store
                .callbacks()
                .find(&other.hash())
                .await
                .unwrap()
                .is_none()
        );
    });
}

#[tokio::test]
async fn silence_past_the_heartbeat_is_found_and_a_beat_resets_it() {
    for_each_store!(|store, backend| {
        let (id, _secret, now) = registered(&store, Duration::from_secs(10)).await;
        let later = now + chrono::Duration::seconds(11);
        let silent = store.callbacks().silent(later, 10).await.unwrap();
        assert_eq!(silent.len(), 1, "{}", backend.name());
        assert!(store.callbacks().beat(id, later).await.unwrap());
        assert!(
            store
                .callbacks()
                .silent(later, 10)
                .await
                .unwrap()
                .is_empty()
        );
    });
}

#[tokio::test]
async fn a_callback_ends_its_wait_once_and_the_second_end_finds_it_ended() {
    for_each_store!(|store, backend| {
        let now = Utc::now();
        let w = store
            .waits()
            .create("t1", &spec(), now, None)
            .await
            .unwrap()
            .wait;
        let failed = CallbackEnd {
            status: Status::Failed,
            reason: "the callback reported a failure".into(),
            error_detail: Some(json!({"why": "disk full"})),
            output: None,
        };
        let succeeded = CallbackEnd {
            status: Status::Succeeded,
            reason: "the callback reported success".into(),
            error_detail: None,
            output: None,
        };
        let (a, b) = tokio::join!(
            store.callbacks().end("t1", w.id, &failed, now),
            store.callbacks().end("t1", w.id, &succeeded, now),
        );
        assert!(
            a.unwrap() ^ b.unwrap(),
            "{}: exactly one end",
            backend.name()
        );
        let ended = store.waits().get("t1", w.id).await.unwrap().unwrap();
        assert_ne!(ended.status, Status::Running);
        let events = store.events().of_wait("t1", w.id, 0, 100).await.unwrap();
        assert_eq!(events.len(), 2, "created and one end");
        assert!(!store.callbacks().beat(w.id, now).await.unwrap());
        // Another tenant cannot end it.
        let w2 = store
            .waits()
            .create("t1", &spec(), now, None)
            .await
            .unwrap()
            .wait;
        assert!(
            !store
                .callbacks()
                .end("t2", w2.id, &succeeded, now)
                .await
                .unwrap()
        );
    });
}
