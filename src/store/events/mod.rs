//! Events: a wait's history, a tenant's events by global cursor, and the feed of
//! every tenant's that a replica's `/events` followers share.
//!
//! On SQLite the one writer numbers events (`id`, the global cursor) as it
//! writes them, which is already commit order, and publishes their notice on the
//! in-process bus after the commit ([`sqlite::append_events`]). Postgres numbers
//! them after commit, one sequencer at a time ([`crate::store::PgDialect::sequence`],
//! run by [`crate::events`]), so that a cursor never sees a smaller id appear
//! later; until then an event reads back without its id.

pub(super) mod postgres;
pub(super) mod sqlite;

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Core, Event, EventRow, StoreError};

/// An event of any tenant, as the replica's feed reads them for every follower of
/// `GET /events` at once: with the tenant and the labels of its wait, by which each
/// follower filters.
#[derive(Clone, Debug)]
pub struct FeedEvent {
    pub event: Event,
    pub tenant: String,
    pub labels: BTreeMap<String, String>,
}

/// The reads of events. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Events {
    pub(super) core: Arc<Core>,
}

impl Events {
    /// A wait's events with `seq > after`, oldest first. Every committed event is
    /// there; on Postgres one committed a moment ago may not have its global cursor
    /// yet (`id` is `None` until the sequencer gives it one).
    pub async fn of_wait(
        &self,
        tenant: &str,
        wait_id: uuid::Uuid,
        after: i32,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        sql!(self.events(tenant, wait_id, after, limit))?
            .into_iter()
            .map(EventRow::into_event)
            .collect()
    }

    /// The tenant's sequenced events with global `id > after`, of waits carrying all
    /// `labels`.
    pub async fn of_tenant(
        &self,
        tenant: &str,
        after: i64,
        labels: &BTreeMap<String, String>,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        sql!(self.global_events(tenant, after, labels, limit))?
            .into_iter()
            .map(EventRow::into_event)
            .collect()
    }

    /// Events of every tenant with global id `> after`, oldest first (the replica's
    /// feed; see [`FeedEvent`]).
    pub async fn feed(&self, after: i64, limit: i64) -> Result<Vec<FeedEvent>, StoreError> {
        sql!(self.feed(after, limit))?
            .into_iter()
            .map(|r| {
                Ok(FeedEvent {
                    event: r.event.into_event()?,
                    tenant: r.tenant,
                    labels: serde_json::from_value(r.labels.0).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// The newest global event id given out so far (0 before the first event); with
    /// a tenant, the newest of that tenant's events.
    pub async fn last_id(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        sql!(self.last_event_id(tenant))
    }
}
