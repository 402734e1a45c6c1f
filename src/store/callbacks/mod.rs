//! Callbacks: the waits that end when someone POSTs to their callback URL
//! (docs/design.md §2.15), through the [`Callbacks`] handle.
//!
//! On SQLite: timestamps are milliseconds and the single writer ends a wait and
//! appends its terminal event in one transaction, then publishes the notice to
//! the bus; Postgres leaves the event to the sequencer, as every other write does.
//!
//! The URL's secret is never stored: only its SHA-256, which is how a callback
//! finds its wait. The stored hash is compared with the presented one in constant
//! time. Ending a wait from a callback is the same conditional end as a cancel
//! (docs/store.md §5.3): whichever end commits first wins, on any replica, and
//! every later one finds no running row and writes nothing.

mod postgres;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use aes_gcm::aead::OsRng;
use aes_gcm::aead::rand_core::RngCore;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::{Core, StoreError};
use crate::model::{Ending, EventBody, Status};

/// The bytes of randomness in a callback URL's secret (256 bits).
pub const SECRET_BYTES: usize = 32;

/// A callback URL's secret: shown once, in the create's answer, and kept only as
/// its [`SecretHash`]. Its `Debug` never shows it.
pub struct Secret(String);

impl Secret {
    /// A fresh secret from the operating system's random source, as hex.
    pub fn generate() -> Secret {
        let mut bytes = [0u8; SECRET_BYTES];
        OsRng.fill_bytes(&mut bytes);
        Secret(hex::encode(bytes))
    }

    /// The secret's text, for the one answer that carries it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the store keeps in its place.
    pub fn hash(&self) -> SecretHash {
        SecretHash::of(&self.0)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The SHA-256 of a secret, as presented or as stored.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SecretHash(pub [u8; 32]);

impl SecretHash {
    /// The hash of whatever a caller presented as a secret (any text).
    pub fn of(presented: &str) -> SecretHash {
        SecretHash(Sha256::digest(presented.as_bytes()).into())
    }

    pub(in crate::store) fn matches(&self, stored: &[u8]) -> bool {
        stored.len() == self.0.len() && bool::from(self.0.as_slice().ct_eq(stored))
    }
}

impl std::fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretHash(..)")
    }
}

/// A callback wait as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callback {
    pub wait_id: Uuid,
    pub tenant: String,
    /// Silence longer than this ends the wait `failed`; `None` without a heartbeat.
    pub heartbeat: Option<Duration>,
    /// The wait's creation, then its latest heartbeat.
    pub beat_at: DateTime<Utc>,
    /// Its spec judges a callback's body (a state path or a condition), so a
    /// completion reads the spec first; otherwise any body ends it.
    pub judged: bool,
}

impl Callback {
    /// When silence ends the wait, if it has a heartbeat.
    pub fn silent_at(&self) -> Option<DateTime<Utc>> {
        let h = chrono::Duration::from_std(self.heartbeat?).ok()?;
        self.beat_at.checked_add_signed(h)
    }
}

/// The stored row, as both databases read it.
#[derive(Debug)]
pub(in crate::store) struct CallbackRow {
    pub wait_id: Uuid,
    pub tenant: String,
    pub secret_hash: Vec<u8>,
    pub heartbeat: Option<i64>,
    pub beat_at: DateTime<Utc>,
    pub judged: bool,
}

impl CallbackRow {
    fn into_callback(self) -> Callback {
        Callback {
            wait_id: self.wait_id,
            tenant: self.tenant,
            heartbeat: self
                .heartbeat
                .map(|ms| Duration::from_millis(ms.max(0) as u64)),
            beat_at: self.beat_at,
            judged: self.judged,
        }
    }
}

/// How a callback ends its wait.
#[derive(Clone, Debug, PartialEq)]
pub struct CallbackEnd {
    /// `succeeded` or `failed` from a callback, `failed` from silence.
    pub status: Status,
    /// One sentence.
    pub reason: String,
    /// The body of a `/fail` callback.
    pub error_detail: Option<Value>,
    /// The body of a callback that ends its wait `succeeded`.
    pub output: Option<Value>,
}

/// Callbacks: registering a wait's secret, finding a wait by secret, heartbeats,
/// and ending a wait from a callback. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Callbacks {
    pub(super) core: Arc<Core>,
}

impl Callbacks {
    /// Keeps the hash of `wait_id`'s callback secret, its heartbeat, and whether
    /// its spec judges a callback's body.
    pub async fn register(
        &self,
        wait_id: Uuid,
        tenant: &str,
        hash: &SecretHash,
        heartbeat: Option<Duration>,
        judged: bool,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        let heartbeat = heartbeat.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        sql!(self.register_callback(wait_id, tenant, &hash.0, heartbeat, judged, now))
    }

    /// The callback wait a presented secret names, if any; the stored hash is
    /// compared in constant time.
    pub async fn find(&self, hash: &SecretHash) -> Result<Option<Callback>, StoreError> {
        let row = sql!(self.find_callback(&hash.0))?;
        Ok(row
            .filter(|r| hash.matches(&r.secret_hash))
            .map(CallbackRow::into_callback))
    }

    /// Restarts `wait_id`'s heartbeat clock; false when the wait is no longer
    /// running.
    pub async fn beat(&self, wait_id: Uuid, now: DateTime<Utc>) -> Result<bool, StoreError> {
        sql!(self.beat_callback(wait_id, now))
    }

    /// Running callback waits whose heartbeat fell silent before `now`, at most
    /// `limit` of them.
    pub async fn silent(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<Callback>, StoreError> {
        Ok(sql!(self.silent_callbacks(now, limit))?
            .into_iter()
            .map(CallbackRow::into_callback)
            .collect())
    }

    /// Records what a callback that ended nothing said of its wait's progress:
    /// its `state`, with a `state` event when it changed; true when it did.
    pub async fn progress(
        &self,
        tenant: &str,
        wait_id: Uuid,
        state: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let to = crate::engine::bound::text(state, crate::engine::bound::MAX_STATE).into_owned();
        let event = |from: Option<String>| {
            EventBody::State {
                from,
                to: to.clone(),
            }
            .to_parts()
        };
        sql!(self.callback_state(tenant, wait_id, &to, now, &event))
    }

    /// Ends a running wait as `end` says, with its terminal event, exactly once:
    /// true when this call ended it, false when it had ended already.
    pub async fn end(
        &self,
        tenant: &str,
        wait_id: Uuid,
        end: &CallbackEnd,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let event = |state: Option<String>| {
            EventBody::end(
                end.status,
                Ending {
                    reason: end.reason.clone(),
                    state,
                    error_detail: end.error_detail.clone(),
                    last_error: None,
                    output: end.output.clone(),
                },
            )
            .to_parts()
        };
        sql!(self.end_running(
            tenant,
            wait_id,
            now,
            &end.reason,
            end.status.as_str(),
            end.error_detail.as_ref(),
            end.output.as_ref(),
            &event
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_256_bits_of_hex_and_its_hash_matches_only_itself() {
        let a = Secret::generate();
        let b = Secret::generate();
        assert_eq!(a.expose().len(), SECRET_BYTES * 2);
        assert_ne!(a.expose(), b.expose());
        assert!(a.hash().matches(&a.hash().0));
        assert!(!a.hash().matches(&b.hash().0));
        assert!(!a.hash().matches(&a.hash().0[..31]));
        assert!(!format!("{a:?}").contains(a.expose()));
    }
}
