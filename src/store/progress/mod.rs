//! What a poll writes: that the first poll since a claim begins and completes
//! (the count that ends a wait whose polls keep taking replicas down), and a
//! poll's progress with its events. These are the [`Leases`] handle's: each write
//! is fenced by the lease the worker holds the wait under.
//!
//! On SQLite a batch is one transaction that numbers its events as it writes them
//! and publishes their notices after the commit; Postgres writes a batch in a few
//! statements over arrays, fenced through the waits' slots, and sequences its
//! events in the same transaction when no sequencer holds the lock.

mod postgres;
mod sqlite;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::{Dialect, EngineState, EventBody, Leases, Status, StoreError, WaitEpoch};

/// A wait whose poll began this many times in a row without completing (each
/// replica that polled it died meanwhile) is ended by its next claimer instead of
/// polled, so that it cannot take down one replica after another. The count is kept
/// in the store: [`Leases::mark_polling`] adds to it as the first poll after a claim
/// begins (or the claim itself, on Postgres, for a wait claimed on its own that is
/// already due), and the write of a completed poll ([`Leases::confirm_polled`] when
/// it changed nothing) clears it.
pub const MAX_CLAIMS: i32 = 3;

/// How a wait ended, as its progress records it.
#[derive(Clone, Debug, PartialEq)]
pub struct Ended {
    pub status: Status,
    pub reason: String,
    pub error_detail: Option<Value>,
    /// What the wait ended with (its `output`), when it has one.
    pub output: Option<Value>,
}

/// What one poll changed, written at once (a new state, a retry, or the end).
#[derive(Clone, Debug)]
pub struct Progress {
    pub id: Uuid,
    pub epoch: i64,
    pub engine: EngineState,
    pub next_poll_at: Option<DateTime<Utc>>,
    /// The events the poll observed (`state`, `retry`); the terminal one follows
    /// from `end`.
    pub events: Vec<EventBody>,
    pub end: Option<Ended>,
}

impl Leases {
    /// Records that a poll of each of these waits (id, epoch) begins, the first
    /// since its claim: it adds one to the wait's `claims`, which a completed poll's
    /// write sets back to 0 ([`MAX_CLAIMS`]). Fenced by owner and epoch; returns
    /// the ids still the owner's.
    pub async fn mark_polling(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.count_polls(owner, ids, true).await
    }

    /// Records that the first poll since the claim of each of these waits (id,
    /// epoch) completed and changed nothing worth an event: their `claims` goes back
    /// to 0, and nothing else is written (the poll count and schedule follow in a
    /// checkpoint). One statement for all of them; a claim of a million waits
    /// writes each row a third time otherwise, with every progress column.
    /// Fenced by owner and epoch; returns the ids still the owner's.
    pub async fn confirm_polled(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
    ) -> Result<Vec<Uuid>, StoreError> {
        self.count_polls(owner, ids, false).await
    }

    async fn count_polls(
        &self,
        owner: Uuid,
        ids: &[WaitEpoch],
        begun: bool,
    ) -> Result<Vec<Uuid>, StoreError> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        sql!(self.count_polls(owner, ids, begun))
    }

    /// Writes what one poll changed, fenced by owner and epoch; false when the wait is
    /// no longer this owner's. `now` (the writer's clock) is when it is written: the
    /// wait's `updated_at`, and `finished_at` when it ends.
    pub async fn record(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        progress: &Progress,
    ) -> Result<bool, StoreError> {
        Ok(self
            .record_many(owner, now, std::slice::from_ref(progress))
            .await?
            .first()
            .copied()
            .unwrap_or(false))
    }

    /// [`Leases::record`] for many waits in one transaction: one answer per entry, in
    /// order. A wait may appear once. The written rows' polls-begun counts go back
    /// to 0.
    pub async fn record_many(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        progress: &[Progress],
    ) -> Result<Vec<bool>, StoreError> {
        if progress.is_empty() {
            return Ok(Vec::new());
        }
        let rows = progress
            .iter()
            .map(Progress::row)
            .collect::<Result<Vec<_>, _>>()?;
        let written = sql!(self.record(owner, now, &rows))?;
        if matches!(self.core.db, Dialect::Postgres(_)) && self.core.ends.receiver_count() > 0 {
            let ended: Arc<[Uuid]> = progress
                .iter()
                .zip(&written)
                .filter(|(p, w)| **w && p.end.is_some())
                .map(|(p, _)| p.id)
                .collect();
            if !ended.is_empty() {
                let _ = self.core.ends.send(ended);
            }
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_that_ends_writes_its_terminal_event_last_and_no_next_poll() {
        let engine = EngineState {
            deadline: Utc::now(),
            polls: 4,
            retries: 1,
            budget_used: 0,
            poll_interval_ms: 1000,
            retry_delay_ms: 1000,
            transition_seen: true,
            hits: 1,
            state: Some("on".into()),
            last_error: Some("e".into()),
            paused: None,
        };
        let p = Progress {
            id: Uuid::now_v7(),
            epoch: 2,
            engine,
            next_poll_at: Some(Utc::now()),
            events: vec![EventBody::State {
                from: Some("off".into()),
                to: "on".into(),
            }],
            end: Some(Ended {
                status: Status::Succeeded,
                reason: "the target reached \"on\"".into(),
                error_detail: None,
                output: None,
            }),
        };
        let row = p.row().unwrap();
        assert_eq!(row.status, "succeeded");
        assert!(row.ended && row.next_poll_at.is_none());
        let kinds: Vec<&str> = row.events.iter().map(|(k, _)| *k).collect();
        assert_eq!(kinds, ["state", "succeeded"]);
        assert_eq!(row.events[1].1["state"], "on");
        assert_eq!(row.events[1].1["last_error"], "e");
    }
}
