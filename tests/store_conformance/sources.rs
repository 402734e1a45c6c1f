//! Event sources, against both databases: a source's secret is sealed and
//! opens only through its hook id; an event is kept once per delivery id and
//! within the tenant's caps; a listener finds its running wait by key; kept
//! events are seen until they expire, and the sweep deletes them then.

use super::*;
use waitd::store::secrets::Cipher;
use waitd::store::sources::{EventCaps, Kept, Kind, NewEvent, NewSource, Source};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const SECRET: &str = "a-signing-secret-0123456789";
const CAPS: EventCaps = EventCaps {
    events: 3,
    bytes: 1 << 20,
};

async fn made(store: &Store, lookback: Duration) -> Source {
    let new = NewSource {
        tenant: "t1",
        name: "gh",
        kind: Kind::Github,
        key_from: "/workflow_run/id",
        lookback,
        secret: SECRET,
    };
    store
        .sources()
        .create(&new, Utc::now())
        .await
        .unwrap()
        .expect("a new name")
}

fn event<'a>(
    source: &'a Source,
    delivery: &'a str,
    key: &'a str,
    at: DateTime<Utc>,
) -> NewEvent<'a> {
    NewEvent {
        source,
        delivery,
        key: Some(key),
        body: "{\"workflow_run\":{\"id\":1}}",
        headers: "{}",
        received: at,
    }
}

#[tokio::test]
async fn a_source_keeps_its_secret_sealed_and_its_name_once_per_tenant() {
    for_each_store!(|store, backend| {
        let store = store
            .clone()
            .with_cipher(Cipher::new(Some(KEY), None).unwrap());
        let s = made(&store, Duration::from_secs(300)).await;
        assert_eq!(s.id.len(), 32, "{}", backend.name());
        let listed = store.sources().list("t1").await.unwrap();
        assert_eq!(listed, vec![s.clone()]);
        assert!(store.sources().list("t2").await.unwrap().is_empty());
        assert!(store.sources().get("t2", "gh").await.unwrap().is_none());
        let (found, secret) = store.sources().by_id(&s.id).await.unwrap().unwrap();
        assert_eq!((found, secret.as_str()), (s.clone(), SECRET));
        let again = NewSource {
            tenant: "t1",
            name: "gh",
            kind: Kind::Bearer,
            key_from: "/x",
            lookback: Duration::from_secs(1),
            secret: SECRET,
        };
        assert!(
            store
                .sources()
                .create(&again, Utc::now())
                .await
                .unwrap()
                .is_none()
        );
        assert!(store.sources().delete("t1", "gh").await.unwrap());
        assert!(store.sources().by_id(&s.id).await.unwrap().is_none());
        assert!(!store.sources().delete("t1", "gh").await.unwrap());
    });
}

#[tokio::test]
async fn an_event_is_kept_once_within_the_caps_and_until_it_expires() {
    for_each_store!(|store, backend| {
        let s = made(&store, Duration::from_secs(60)).await;
        let now = Utc::now();
        let keep = |d: &'static str| {
            let store = store.clone();
            let s = s.clone();
            async move {
                store
                    .sources()
                    .keep(&event(&s, d, "1", now), CAPS)
                    .await
                    .unwrap()
            }
        };
        assert_eq!(keep("a").await, Kept::New, "{}", backend.name());
        assert_eq!(keep("a").await, Kept::Replayed);
        assert_eq!(keep("b").await, Kept::New);
        assert_eq!(keep("c").await, Kept::New);
        assert_eq!(keep("d").await, Kept::Full);
        assert_eq!(keep("a").await, Kept::Replayed, "a replay is not a refusal");
        let kept = store.sources().kept(&s.id, "1", now, 100).await.unwrap();
        let deliveries: Vec<_> = kept.iter().map(|e| e.delivery.as_str()).collect();
        assert_eq!(deliveries, ["a", "b", "c"]);
        assert!(
            store
                .sources()
                .kept(&s.id, "2", now, 100)
                .await
                .unwrap()
                .is_empty()
        );
        // A minute on, they have expired: no read sees them, and the sweep deletes them.
        let later = now + chrono::Duration::seconds(61);
        assert!(
            store
                .sources()
                .kept(&s.id, "1", later, 100)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(store.sources().sweep(now, 100).await.unwrap(), 0);
        assert_eq!(store.sources().sweep(later, 100).await.unwrap(), 3);
        // The caps count what is kept, so there is room again.
        let fresh = event(&s, "d", "1", later);
        assert_eq!(store.sources().keep(&fresh, CAPS).await.unwrap(), Kept::New);
    });
}

#[tokio::test]
async fn a_listener_finds_its_wait_while_it_runs() {
    for_each_store!(|store, backend| {
        let s = made(&store, Duration::from_secs(60)).await;
        let w = store
            .waits()
            .create("t1", &spec(), Utc::now(), None)
            .await
            .unwrap()
            .wait;
        store.sources().listen(&s.id, "42", w.id).await.unwrap();
        store.sources().listen(&s.id, "42", w.id).await.unwrap();
        let found = store.sources().listeners(&s.id, "42", 10).await.unwrap();
        assert_eq!(found.len(), 1, "{}", backend.name());
        assert_eq!((found[0].wait_id, found[0].tenant.as_str()), (w.id, "t1"));
        let spec: serde_json::Value = serde_json::from_str(&found[0].spec).unwrap();
        assert!(spec.is_object());
        assert!(
            store
                .sources()
                .listeners(&s.id, "43", 10)
                .await
                .unwrap()
                .is_empty()
        );
        store.waits().cancel("t1", w.id, Utc::now()).await.unwrap();
        assert!(
            store
                .sources()
                .listeners(&s.id, "42", 10)
                .await
                .unwrap()
                .is_empty()
        );
    });
}
