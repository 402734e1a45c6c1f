//! Waits: creating one (with its idempotency key, under its tenant's running-wait
//! limit), reading, listing and canceling, through the [`Waits`] handle, which the
//! API holds with the rest of the store.
//!
//! On SQLite the one writer counts and inserts in one transaction, and every
//! create is a transaction of its own. On Postgres creates far from the limit
//! share statements ([`batches`]); near it, a create counts under the tenant's
//! advisory lock, so that concurrent creates cannot overshoot. On both, the
//! tenant's count is cached ([`counts`]) so that a create far under the limit
//! does not count.

pub(super) mod batches;
mod counts;
pub(super) mod postgres;
pub(super) mod sqlite;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{
    Admission, Core, Dialect, Ending, EventBody, Inserted, NewWait, Status, StoreError, Wait,
    WaitRow, rows,
};
use crate::engine::Spec;
pub(super) use counts::TenantCounts;

/// Filters of `GET /waits`.
#[derive(Clone, Debug, Default)]
pub struct ListFilter {
    pub status: Option<Status>,
    pub labels: BTreeMap<String, String>,
    pub limit: i64,
    /// Return waits older than this id (UUIDv7 order).
    pub before: Option<Uuid>,
}

/// The result of a create: the wait, and whether an idempotency key found an earlier one.
#[derive(Debug)]
pub struct Created {
    pub wait: Wait,
    pub existing: bool,
}

/// The answer to a cancel: the wait as it now stands, and whether this cancel is
/// what ended it (false when it had ended already).
#[derive(Debug)]
pub struct Canceled {
    pub wait: Wait,
    pub ended: bool,
}

/// The reason recorded when a client cancels a wait.
pub const CANCEL_REASON: &str = "canceled by a client";

/// Waits: creates, reads, lists, cancels. Cloning is shallow.
#[derive(Clone, Debug)]
pub struct Waits {
    pub(super) core: Arc<Core>,
}

impl Waits {
    /// Creates a wait with its `created` event. With an idempotency key (and the
    /// request's hash), a second call with the same key and hash returns the first
    /// wait; the same key with another hash is [`StoreError::IdempotencyConflict`].
    pub async fn create(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
    ) -> Result<Created, StoreError> {
        self.create_within(tenant, spec, now, idempotency, None, None)
            .await
    }

    /// [`Waits::create`], refusing with [`StoreError::TooManyActive`] when the tenant
    /// already has `max_active` running waits. The count and the insert are atomic
    /// (concurrent creates cannot overshoot), and an idempotent replay is answered
    /// before the limit is looked at. `trace` is the `traceparent` the wait's
    /// polls and webhook attempts join.
    pub async fn create_within(
        &self,
        tenant: &str,
        spec: &Spec,
        now: DateTime<Utc>,
        idempotency: Option<(&str, &str)>,
        max_active: Option<i64>,
        trace: Option<&str>,
    ) -> Result<Created, StoreError> {
        if let Some((key, hash)) = idempotency
            && let Some(found) = self.find_idempotent(tenant, key, hash).await?
        {
            return Ok(Created {
                wait: found,
                existing: true,
            });
        }
        let mut nw = NewWait::prepare(spec, now, &self.core.cipher, trace)?;
        nw.placement = Some(rows::placement(
            tenant,
            spec.target.as_ref().map_or("", |t| t.url.as_str()),
        ));
        let admission = self.admission(tenant, max_active);
        let inserted = match &self.core.db {
            Dialect::Postgres(d) => {
                let creates = &self.core.creates;
                d.insert_wait(tenant, now, &nw, idempotency, admission, creates)
                    .await
            }
            Dialect::Sqlite(d) => {
                d.insert_wait(tenant, now, &nw, idempotency, admission)
                    .await
            }
        };
        match inserted? {
            Inserted::Yes { counted } => {
                if let Some(n) = counted {
                    self.counted(tenant, n);
                }
                Ok(Created {
                    wait: nw.wait(now),
                    existing: false,
                })
            }
            Inserted::Full(n) => {
                self.counted(tenant, n);
                // A request with the same key may have made the wait meanwhile (its
                // place is what the limit counted): then the answer is that wait.
                if let Some((key, hash)) = idempotency
                    && let Some(found) = self.find_idempotent(tenant, key, hash).await?
                {
                    return Ok(Created {
                        wait: found,
                        existing: true,
                    });
                }
                Err(StoreError::TooManyActive(n))
            }
            Inserted::KeyTaken => {
                let (key, hash) = idempotency.expect("a key was taken, so one was given");
                match self.find_idempotent(tenant, key, hash).await? {
                    Some(found) => Ok(Created {
                        wait: found,
                        existing: true,
                    }),
                    None => Err(StoreError::Decode {
                        what: "idempotency key",
                        why: "the key was taken, then vanished".into(),
                    }),
                }
            }
        }
    }

    /// How a create of `tenant`'s is admitted under `max_active`: counted in its
    /// transaction, unless no limit applies or the tenant is far under it.
    pub(super) fn admission(&self, tenant: &str, max_active: Option<i64>) -> Admission {
        match max_active {
            Some(max) if !self.far_under_limit(tenant, max) => Admission::Count { max },
            _ => Admission::Free,
        }
    }

    pub(super) async fn find_idempotent(
        &self,
        tenant: &str,
        key: &str,
        hash: &str,
    ) -> Result<Option<Wait>, StoreError> {
        match sql!(self.find_idempotent(tenant, key))? {
            None => Ok(None),
            Some((h, _)) if h != hash => Err(StoreError::IdempotencyConflict),
            Some((_, id)) => self.get(tenant, id).await,
        }
    }

    fn far_under_limit(&self, tenant: &str, max: i64) -> bool {
        let mut counts = self.core.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.far_under(tenant, max, Instant::now())
    }

    pub(super) fn counted(&self, tenant: &str, n: i64) {
        let mut counts = self.core.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.counted(tenant, n, Instant::now());
    }

    pub async fn get(&self, tenant: &str, id: Uuid) -> Result<Option<Wait>, StoreError> {
        Ok(self.read(tenant, id).await?.map(|(wait, _)| wait))
    }

    /// [`Waits::get`], and whether the wait is a group or a member of one (whose
    /// groups [`Waits::annotate_groups`] then fills in), in one statement.
    pub async fn read(&self, tenant: &str, id: Uuid) -> Result<Option<(Wait, bool)>, StoreError> {
        sql!(self.get(tenant, id))?
            .map(|row| Ok((row.wait.into_wait()?, row.grouped)))
            .transpose()
    }

    /// A page of a tenant's waits, newest first.
    pub async fn list(&self, tenant: &str, filter: &ListFilter) -> Result<Vec<Wait>, StoreError> {
        sql!(self.list(tenant, filter))?
            .into_iter()
            .map(WaitRow::into_wait)
            .collect()
    }

    /// Cancels a running wait, ending it exactly once; an ended wait is returned as it
    /// is. `None` when the tenant has no such wait.
    pub async fn cancel(
        &self,
        tenant: &str,
        id: Uuid,
        now: DateTime<Utc>,
    ) -> Result<Option<Canceled>, StoreError> {
        let canceled = |state: Option<String>| {
            EventBody::end(
                Status::Canceled,
                Ending {
                    reason: CANCEL_REASON.into(),
                    state,
                    error_detail: None,
                    last_error: None,
                    output: None,
                },
            )
            .to_parts()
        };
        let ended = sql!(self.end_running(
            tenant,
            id,
            now,
            CANCEL_REASON,
            Status::Canceled.as_str(),
            None,
            None,
            &canceled
        ))?;
        Ok(self
            .get(tenant, id)
            .await?
            .map(|wait| Canceled { wait, ended }))
    }

    /// Running waits in the store; with a tenant, only that tenant's.
    pub async fn count_running(&self, tenant: Option<&str>) -> Result<i64, StoreError> {
        sql!(self.count_running(tenant))
    }
}
