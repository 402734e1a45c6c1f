//! The outbox's claim turns and bounds, against both databases: what the deliverer
//! relies on so that one tenant cannot take another's attempts, and the caps on
//! pending deliveries and redeliveries that `tests/webhooks.rs` checks from the
//! outside.

use super::*;
use waitd::model::{Delivery, DeliveryStatus, DropReason};
use waitd::store::{DeliveryLimits, Due, Outcome, Redeliver, Turns};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// A wait announcing its `created` event to one webhook.
fn announcing() -> Spec {
    announcing_events(&["created"])
}

/// A wait announcing `events` to one webhook.
fn announcing_events(events: &[&str]) -> Spec {
    Spec::from_request(
        &json!({
            "target": {"url": "https://api.example.com/servers/1"},
            "state": "/status",
            "want": ["on"],
            "timeout": "5m",
            "notify": [{"url": "https://hooks.example.com/in", "secret": SECRET, "events": events}],
        }),
        &Limits::default(),
    )
    .unwrap()
}

/// Creates a wait of `tenant` at `at`; its id.
async fn wait_of(store: &Store, tenant: &str, at: DateTime<Utc>) -> Uuid {
    store
        .waits()
        .create(tenant, &announcing(), at, None)
        .await
        .unwrap()
        .wait
        .id
}

async fn only_delivery(store: &Store, tenant: &str, wait: Uuid) -> Delivery {
    let mut d = store.outbox().of_wait(tenant, wait, 0, 10).await.unwrap();
    assert_eq!(d.len(), 1, "{d:?}");
    d.remove(0)
}

async fn claim(
    store: &Store,
    owner: Uuid,
    now: DateTime<Utc>,
    limit: i64,
    flying: &[(&str, i64)],
) -> Vec<Due> {
    let taken: Vec<(String, i64)> = flying.iter().map(|(t, n)| (t.to_string(), *n)).collect();
    let turns = Turns {
        per_tenant: 16,
        taken: &taken,
        stalled: &[],
        stalled_until: now,
    };
    store
        .outbox()
        .claim(owner, now, Duration::from_secs(30), limit, &turns)
        .await
        .unwrap()
}

fn tenants(due: &[Due]) -> Vec<&str> {
    due.iter().map(|d| d.tenant.as_str()).collect()
}

/// Its attempt answered 2xx: delivered. Whether another delivery of its webhook
/// is behind it.
async fn deliver(store: &Store, owner: Uuid, due: &Due, now: DateTime<Utc>) -> bool {
    let finished = store
        .outbox()
        .finish(
            owner,
            now,
            &[Outcome {
                id: due.delivery.id,
                epoch: due.epoch,
                wait_id: due.wait_id,
                endpoint: due.delivery.endpoint,
                status: DeliveryStatus::Delivered,
                next_attempt_at: None,
                tries: 1,
                attempts: Vec::new(),
                attempted: true,
            }],
        )
        .await
        .unwrap();
    assert_eq!(finished.written, [true]);
    finished.next_in_line
}

#[tokio::test]
async fn a_delivered_outcome_says_when_another_delivery_of_its_webhook_is_behind_it() {
    for backend in backends().await {
        let store = backend.open().await;
        let name = backend.name();
        let t0 = Utc::now() - chrono::Duration::seconds(60);
        let spec = announcing_events(&["created", "canceled"]);
        let wait = store
            .waits()
            .create("a", &spec, t0, None)
            .await
            .unwrap()
            .wait
            .id;
        let lone = wait_of(&store, "a", t0).await;
        store
            .waits()
            .cancel("a", wait, t0 + chrono::Duration::seconds(1))
            .await
            .unwrap()
            .expect("canceled");
        let owner = Uuid::now_v7();
        let now = Utc::now();
        // One delivery of each webhook at a time: `created` first, `canceled` behind.
        let due = claim(&store, owner, now, 10, &[]).await;
        assert_eq!(due.len(), 2, "{name}: {due:?}");
        let first = due.iter().find(|d| d.wait_id == wait).unwrap();
        assert_eq!(first.event.seq, 1, "{name}");
        assert!(
            deliver(&store, owner, first, now).await,
            "{name}: canceled is behind"
        );
        let alone = due.iter().find(|d| d.wait_id == lone).unwrap();
        assert!(
            !deliver(&store, owner, alone, now).await,
            "{name}: nothing behind"
        );
        // Now first in line; nothing behind it.
        let due = claim(&store, owner, now, 10, &[]).await;
        assert_eq!(due.len(), 1, "{name}");
        assert_eq!(due[0].wait_id, wait, "{name}");
        assert!(
            !deliver(&store, owner, &due[0], now).await,
            "{name}: the last"
        );
        store.close().await;
        backend.finish().await;
    }
}

#[tokio::test]
async fn a_claim_gives_every_tenant_with_a_due_delivery_a_turn_before_any_gets_a_second() {
    for backend in backends().await {
        let store = backend.open().await;
        let name = backend.name();
        let t0 = Utc::now() - chrono::Duration::seconds(60);
        // Tenant a's twenty deliveries are all due before tenant b's one.
        for i in 0..20 {
            wait_of(&store, "a", t0 + chrono::Duration::milliseconds(i)).await;
        }
        wait_of(&store, "b", t0 + chrono::Duration::seconds(10)).await;
        let now = Utc::now();
        let owner = Uuid::now_v7();
        let due = claim(&store, owner, now, 3, &[]).await;
        let mut got = tenants(&due);
        got.sort();
        assert_eq!(got, ["a", "a", "b"], "{name}: b has its turn at once");

        // A tenant at its share gets nothing more; another tenant's due delivery goes.
        wait_of(&store, "b", t0 + chrono::Duration::seconds(20)).await;
        let due = claim(&store, owner, now, 10, &[("a", 16)]).await;
        assert_eq!(tenants(&due), ["b"], "{name}");
        // A tenant with 13 in flight gets at most 3 more, however many are due.
        let due = claim(&store, owner, now, 10, &[("a", 13)]).await;
        assert_eq!(tenants(&due), ["a", "a", "a"], "{name}");
        // And a tenant that holds nothing, its share.
        let due = claim(&store, owner, now, 64, &[]).await;
        assert_eq!(due.len(), 15, "{name}: the rest of a's twenty");
        let due = claim(&store, Uuid::now_v7(), now, 64, &[]).await;
        assert!(due.is_empty(), "{name}: all leased");
        store.close().await;
        backend.finish().await;
    }
}

#[tokio::test]
async fn a_stalled_receivers_due_deliveries_are_left_and_put_off_until_the_time_given() {
    for backend in backends().await {
        let store = backend.open().await;
        let name = backend.name();
        let t0 = Utc::now() - chrono::Duration::seconds(60);
        let stuck = wait_of(&store, "a", t0).await;
        let other = wait_of(&store, "b", t0).await;
        let now = Utc::now();
        let until = now + chrono::Duration::seconds(1);
        // Tenant a's receiver is stalled; the same URL for tenant b is not.
        let stalled = [("a".to_string(), "https://hooks.example.com/in".to_string())];
        let turns = Turns {
            per_tenant: 16,
            taken: &[],
            stalled: &stalled,
            stalled_until: until,
        };
        let owner = Uuid::now_v7();
        let due = store
            .outbox()
            .claim(owner, now, Duration::from_secs(30), 10, &turns)
            .await
            .unwrap();
        assert_eq!(tenants(&due), ["b"], "{name}");
        assert_eq!(due[0].wait_id, other, "{name}");
        let left = only_delivery(&store, "a", stuck).await;
        assert_eq!(left.status, DeliveryStatus::Pending, "{name}");
        assert_eq!(
            left.next_attempt_at.map(|t| t.timestamp_millis()),
            Some(until.timestamp_millis()),
            "{name}: put off"
        );
        // Not due before then, even once the receiver is no longer stalled; due after.
        assert!(
            claim(&store, owner, now, 10, &[]).await.is_empty(),
            "{name}"
        );
        let later = until + chrono::Duration::milliseconds(1);
        let due = claim(&store, owner, later, 10, &[]).await;
        assert_eq!(due.len(), 1, "{name}");
        assert_eq!(due[0].wait_id, stuck, "{name}");
        store.close().await;
        backend.finish().await;
    }
}

#[tokio::test]
async fn past_a_tenants_bound_its_oldest_pending_deliveries_are_dropped_and_counted_but_never_one_in_flight()
 {
    for backend in backends().await {
        let store = backend.open().await;
        let name = backend.name();
        store
            .outbox()
            .set_limits(DeliveryLimits {
                per_tenant: 5,
                ..DeliveryLimits::default()
            })
            .await
            .unwrap();
        assert_eq!(store.outbox().limits().await.unwrap().per_tenant, 5);
        let t0 = Utc::now() - chrono::Duration::seconds(60);
        let mut waits = Vec::new();
        for i in 0..8 {
            waits.push(wait_of(&store, "t", t0 + chrono::Duration::seconds(i)).await);
        }
        for i in 0..2 {
            wait_of(&store, "u", t0 + chrono::Duration::seconds(i)).await;
        }
        let mut statuses = Vec::new();
        for w in &waits {
            let d = only_delivery(&store, "t", *w).await;
            statuses.push((d.status, d.drop_reason));
        }
        let dropped = (DeliveryStatus::Dropped, Some(DropReason::TenantCap));
        let pending = (DeliveryStatus::Pending, None);
        assert_eq!(
            statuses,
            [
                dropped, dropped, dropped, pending, pending, pending, pending, pending
            ],
            "{name}: the oldest three of eight go, at a bound of five"
        );
        let d = only_delivery(&store, "t", waits[0]).await;
        assert!(
            d.finished_at.is_some() && d.next_attempt_at.is_none(),
            "{d:?}"
        );
        assert_eq!(store.outbox().dropped().await.unwrap(), [0, 0, 3], "{name}");

        // The oldest pending one is in flight: the next oldest goes in its stead.
        let owner = Uuid::now_v7();
        let due = claim(&store, owner, Utc::now(), 1, &[("u", 16)]).await;
        assert_eq!(due[0].wait_id, waits[3], "{name}");
        waits.push(wait_of(&store, "t", Utc::now()).await);
        let d = only_delivery(&store, "t", waits[3]).await;
        assert_eq!(d.status, DeliveryStatus::Pending, "{name}: in flight");
        let d = only_delivery(&store, "t", waits[4]).await;
        assert_eq!(d.status, DeliveryStatus::Dropped, "{name}");
        assert_eq!(store.outbox().dropped().await.unwrap(), [0, 0, 4], "{name}");
        store.close().await;
        backend.finish().await;
    }
}

#[tokio::test]
async fn a_redelivery_waits_for_its_interval_and_for_room_under_the_bounds() {
    for backend in backends().await {
        let store = backend.open().await;
        let name = backend.name();
        store
            .outbox()
            .set_limits(DeliveryLimits {
                per_tenant: 2,
                redelivery_interval: Duration::from_secs(10),
                ..DeliveryLimits::default()
            })
            .await
            .unwrap();
        let owner = Uuid::now_v7();
        let t0 = Utc::now();
        let w = wait_of(&store, "t", t0).await;
        let due = claim(&store, owner, t0, 10, &[]).await;
        let id = due[0].delivery.id;
        // Pending, and then in flight: nothing changes.
        assert!(matches!(
            store.outbox().redeliver("t", w, id, t0).await.unwrap(),
            Redeliver::Pending(_)
        ));
        deliver(&store, owner, &due[0], t0).await;
        assert!(matches!(
            store.outbox().redeliver("t", w, id, t0).await.unwrap(),
            Redeliver::Queued(_)
        ));
        let due = claim(&store, owner, t0, 10, &[]).await;
        deliver(&store, owner, &due[0], t0).await;
        // Within the interval of the last redelivery: when it can be.
        match store
            .outbox()
            .redeliver("t", w, id, t0 + chrono::Duration::seconds(4))
            .await
            .unwrap()
        {
            Redeliver::TooSoon {
                retry_after,
                interval,
                ..
            } => {
                assert_eq!(interval, Duration::from_secs(10));
                assert!(
                    retry_after > Duration::from_millis(5900)
                        && retry_after <= Duration::from_secs(6),
                    "{name}: {retry_after:?}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
        // Two other deliveries of the tenant pending: at its bound of two.
        wait_of(&store, "t", t0).await;
        wait_of(&store, "t", t0).await;
        match store
            .outbox()
            .redeliver("t", w, id, t0 + chrono::Duration::seconds(11))
            .await
            .unwrap()
        {
            Redeliver::Full { bound, limit, .. } => {
                assert_eq!((bound, limit), (DropReason::TenantCap, 2), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
        let d = only_delivery(&store, "t", w).await;
        assert_eq!(d.status, DeliveryStatus::Delivered, "{name}: unchanged");
        // Another tenant's delivery is no such delivery.
        assert!(matches!(
            store.outbox().redeliver("u", w, id, t0).await.unwrap(),
            Redeliver::NotFound
        ));
        store.close().await;
        backend.finish().await;
    }
}
