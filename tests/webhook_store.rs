//! The outbox's claim turns, against both stores: what the deliverer relies on so
//! that one tenant cannot take another's attempts.

use crate::support;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::json;
use support::TestDb;
use uuid::Uuid;
use waitd::bus::Bus;
use waitd::engine::{Limits, Spec};

use waitd::store::{Due, Store, Turns};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

enum Backend {
    Postgres(TestDb),
    Sqlite(support::TempDir),
}

impl Backend {
    async fn all() -> Vec<Backend> {
        vec![
            Backend::Postgres(TestDb::new().await),
            Backend::Sqlite(support::TempDir::new("waitd-webhook-store")),
        ]
    }

    async fn open(&self) -> Store {
        let url = match self {
            Backend::Postgres(db) => db.url.clone(),
            Backend::Sqlite(dir) => dir.sqlite_url(),
        };
        let store = Store::open(&url, 4, Bus::new()).unwrap();
        store.migrate().await.unwrap();
        store
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Postgres(_) => "postgres",
            Backend::Sqlite(_) => "sqlite",
        }
    }

    async fn finish(self) {
        if let Backend::Postgres(db) = self {
            db.drop_db().await;
        }
    }
}

/// A wait announcing its `created` event to one webhook.
fn announcing() -> Spec {
    Spec::from_request(
        &json!({
            "target": {"url": "https://api.example.com/servers/1"},
            "state": "/status",
            "want": ["on"],
            "timeout": "5m",
            "notify": [{"url": "https://hooks.example.com/in", "secret": SECRET, "events": ["created"]}],
        }),
        &Limits::default(),
    )
    .unwrap()
}

/// Creates a wait of `tenant` at `at`; its id.
async fn wait_of(store: &Store, tenant: &str, at: DateTime<Utc>) -> Uuid {
    store
        .create(tenant, &announcing(), at, None)
        .await
        .unwrap()
        .wait
        .id
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
    };
    store
        .claim_deliveries(owner, now, Duration::from_secs(30), limit, &turns)
        .await
        .unwrap()
}

fn tenants(due: &[Due]) -> Vec<&str> {
    due.iter().map(|d| d.tenant.as_str()).collect()
}

#[tokio::test]
async fn a_claim_gives_every_tenant_with_a_due_delivery_a_turn_before_any_gets_a_second() {
    for backend in Backend::all().await {
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
