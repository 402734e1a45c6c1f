//! Nudges: the URLs whose POST schedules a poll of a running wait now
//! (docs/design.md §2.17), through the [`Nudges`] handle.
//!
//! As for callback URLs, the secret is never stored: only its SHA-256, which is
//! how a nudge finds its wait, compared in constant time. A nudge writes
//! nothing: on Postgres it is a `NOTIFY` that every replica's LISTEN adapter
//! hears, so the replica holding the wait polls it; on SQLite, one process, it
//! goes on the bus at once.

mod postgres;
mod sqlite;

use std::sync::Arc;

use uuid::Uuid;

use super::callbacks::SecretHash;
use super::{Core, Dialect, StoreError};
use crate::bus::BusMsg;

/// A nudged wait as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nudged {
    pub wait_id: Uuid,
    pub tenant: String,
    /// The wait is still running (a nudge of an ended wait does nothing).
    pub running: bool,
}

/// The stored row, as both databases read it.
#[derive(Debug)]
pub(in crate::store) struct NudgeRow {
    pub wait_id: Uuid,
    pub tenant: String,
    pub secret_hash: Vec<u8>,
    pub running: bool,
}

/// Nudges: registering a wait's nudge secret, finding a wait by it, and
/// announcing a nudge to the replica that holds the wait. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Nudges {
    pub(super) core: Arc<Core>,
}

impl Nudges {
    /// Keeps the hash of `wait_id`'s nudge secret.
    pub async fn register(
        &self,
        wait_id: Uuid,
        tenant: &str,
        hash: &SecretHash,
    ) -> Result<(), StoreError> {
        sql!(self.register_nudge(wait_id, tenant, &hash.0))
    }

    /// The wait a presented nudge secret names, if any; the stored hash is
    /// compared in constant time.
    pub async fn find(&self, hash: &SecretHash) -> Result<Option<Nudged>, StoreError> {
        let row = sql!(self.find_nudge(&hash.0))?;
        Ok(row
            .filter(|r| hash.matches(&r.secret_hash))
            .map(|r| Nudged {
                wait_id: r.wait_id,
                tenant: r.tenant,
                running: r.running,
            }))
    }

    /// Tells whichever replica holds `wait_id` to poll it now (as its pacing
    /// allows); a wait nobody holds at this moment is polled when it is due.
    pub async fn announce(&self, wait_id: Uuid) -> Result<(), StoreError> {
        match &self.core.db {
            Dialect::Postgres(d) => d.announce_nudge(wait_id).await,
            Dialect::Sqlite(d) => {
                d.bus.publish(BusMsg::Nudge(wait_id));
                Ok(())
            }
        }
    }
}
