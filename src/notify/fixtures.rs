//! What the deliverer's unit tests share: a store in memory, a spec with one
//! webhook, and a claim of what is due.

use std::time::Duration;

use chrono::Utc;
use uuid::Uuid;

use crate::bus::Bus;
use crate::engine::{Limits, Spec};
use crate::store::{Due, Store, Turns};

/// A migrated SQLite store in memory.
pub async fn store() -> Store {
    let store = Store::open("sqlite::memory:", 1, Bus::new()).unwrap();
    store.migrate().await.unwrap();
    store
}

/// A wait's spec with one webhook to `https://hooks.example.com/in`, on `events`.
pub fn spec(events: &[&str]) -> Spec {
    Spec::from_request(
        &serde_json::json!({
            "target": {"url": "https://api.example.com/servers/1"},
            "state": "/status",
            "want": ["on"],
            "timeout": "5m",
            "notify": [{"url": "https://hooks.example.com/in",
                        "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                        "events": events}],
        }),
        &Limits::default(),
    )
    .unwrap()
}

/// Claims up to `n` deliveries due now for `owner`: the first in line of each
/// webhook.
pub async fn due(store: &Store, owner: Uuid, n: i64) -> Vec<Due> {
    let turns = Turns {
        per_tenant: 16,
        taken: &[],
        stalled: &[],
        stalled_until: Utc::now(),
    };
    store
        .outbox()
        .claim(owner, Utc::now(), Duration::from_secs(30), n, &turns)
        .await
        .unwrap()
}
