//! The store's conformance suite, one file per job of the store (as
//! `src/store/` is laid out), each test run against both databases: every test
//! body takes a `Store` and must hold for Postgres and for the embedded SQLite
//! file alike. This file is the harness they share.

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
    Sqlite(support::TempDir),
}

impl Backend {
    fn url(&self) -> String {
        match self {
            Backend::Postgres(db) => db.url.clone(),
            Backend::Sqlite(dir) => dir.sqlite_url(),
        }
    }

    async fn open(&self) -> Store {
        let store = Store::open(&self.url(), 4, Bus::new()).unwrap();
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

async fn backends() -> Vec<Backend> {
    vec![
        Backend::Postgres(TestDb::new().await),
        Backend::Sqlite(support::TempDir::new("waitd-test")),
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

mod callbacks;
mod events;
mod leases;
mod open;
mod outbox;
mod progress;
mod sources;
mod waits;
