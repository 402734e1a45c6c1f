//! Webhook deliveries: the outbox.
//!
//! A wait's `notify` entries are rows of `wait_notify`, written with the wait. A
//! trigger on `wait_events` adds, in the transaction that writes an event, one
//! `deliveries` row per entry that announces the event's kind: an event committed
//! is a delivery owed, whichever path wrote it (a create, a poll's progress, a
//! cancel, an abandoned wait). Replicas take due deliveries under a lease of their
//! own (owner, `lease_until`, epoch), and write each attempt's outcome fenced by
//! owner and epoch, as the worker pool does for waits. A claim gives each tenant
//! its turn (see [`Turns`]).
//!
//! The outbox is bounded: the trigger drops pending deliveries beyond the
//! [`DeliveryLimits`] per webhook, per wait and per tenant.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::columns::{Json, Time, from_row};
use super::{Dialect, Store, StoreError, WaitRow};
use crate::engine::spec::Notify;
use crate::model::{
    Attempt, Delivery, DeliveryStatus, DropReason, Event, EventBody, Wait, webhook_id,
};

/// The attempts a delivery keeps for `GET /waits/{id}/deliveries` (the count of all
/// of them is kept apart).
pub const KEPT_ATTEMPTS: usize = 20;

/// A `notify` entry as stored: its index, URL, event kinds, and sealed secret.
pub(crate) struct NotifyRow {
    pub endpoint: i32,
    pub url: String,
    pub kinds: i32,
    pub secret: Value,
}

impl NotifyRow {
    pub(crate) fn of(
        notify: &[Notify],
        cipher: &super::secrets::Cipher,
    ) -> Result<Vec<NotifyRow>, StoreError> {
        notify
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let secret = cipher
                    .seal(&BTreeMap::from([("secret".to_string(), n.secret.clone())]))
                    .map_err(|why| StoreError::Decode {
                        what: "webhook secret",
                        why: why.0,
                    })?;
                Ok(NotifyRow {
                    endpoint: i as i32,
                    url: n.url.clone(),
                    kinds: n.kinds(),
                    secret,
                })
            })
            .collect()
    }
}

/// The columns a [`DeliveryRow`] reads, from `deliveries d JOIN wait_notify n`.
pub(crate) const DELIVERY_COLUMNS: &str = "d.id AS d_id, d.wait_id AS d_wait_id, d.tenant AS d_tenant, \
     d.endpoint AS d_endpoint, d.seq AS d_seq, d.kind AS d_kind, d.status AS d_status, \
     d.created_at AS d_created_at, d.next_attempt_at AS d_next_attempt_at, \
     d.finished_at AS d_finished_at, d.tries AS d_tries, d.attempts_total AS d_attempts_total, \
     d.attempts AS d_attempts, d.epoch AS d_epoch, d.drop_reason AS d_drop_reason, n.url AS d_url";

from_row! {
/// A delivery as both dialects read it back.
pub(crate) struct DeliveryRow {
    d_id: i64,
    d_wait_id: Uuid,
    d_tenant: String,
    d_endpoint: i32,
    d_seq: i32,
    d_kind: String,
    d_status: String,
    d_created_at: Time,
    d_next_attempt_at: Option<Time>,
    d_finished_at: Option<Time>,
    d_tries: i32,
    d_attempts_total: i32,
    d_attempts: Json,
    d_epoch: i64,
    d_drop_reason: Option<String>,
    d_url: String,
}
}

impl DeliveryRow {
    fn into_delivery(self) -> Result<Delivery, StoreError> {
        Ok(Delivery {
            id: self.d_id,
            webhook_id: webhook_id(self.d_wait_id, self.d_seq, self.d_endpoint),
            endpoint: self.d_endpoint,
            url: self.d_url,
            seq: self.d_seq,
            kind: self.d_kind,
            status: DeliveryStatus::parse(&self.d_status).ok_or_else(|| StoreError::Decode {
                what: "delivery status",
                why: self.d_status.clone(),
            })?,
            created_at: self.d_created_at.0,
            next_attempt_at: self.d_next_attempt_at.map(|t| t.0),
            finished_at: self.d_finished_at.map(|t| t.0),
            drop_reason: self.d_drop_reason.as_deref().and_then(DropReason::parse),
            attempts_total: self.d_attempts_total,
            attempts: serde_json::from_value(self.d_attempts.0).unwrap_or_default(),
        })
    }
}

from_row! {
/// A due delivery as the claim reads it: the delivery, its webhook's sealed secret,
/// the event, the wait, and whether the wait is a group or a member of one.
pub(crate) struct DueRow {
    d_secret: Json,
    d_stopped_at: Option<Time>,
    d_event_at: Time,
    d_event_data: Json,
    d_trace: Option<String>,
    grouped: bool,
    ..d: DeliveryRow,
    ..wait: WaitRow,
}
}

/// What [`Store::finish_deliveries`] wrote.
#[derive(Debug, Default)]
pub struct Finished {
    /// Per outcome, in order: false when the delivery was no longer this owner's.
    pub written: Vec<bool>,
    /// A delivery written as ended had another of its webhook pending behind it,
    /// which is first in line now: a claim can take it.
    pub next_in_line: bool,
}

/// A delivery this replica has just taken, with everything its attempt needs.
#[derive(Clone, Debug)]
pub struct Due {
    pub delivery: Delivery,
    pub tenant: String,
    pub wait_id: Uuid,
    pub epoch: i64,
    /// Attempts in the current round (the retry schedule's position).
    pub tries: i32,
    /// The webhook's signing secret (`whsec_…`).
    pub secret: String,
    /// The webhook answered 410 Gone to an earlier delivery (this one was written
    /// meanwhile): it is stopped without an attempt.
    pub stopped: bool,
    pub event: Event,
    /// The wait as it stands now.
    pub wait: Wait,
    /// The `traceparent` of the wait's trace, which the attempt joins.
    pub trace: Option<String>,
}

/// What one attempt changed, written fenced by owner and epoch.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub id: i64,
    pub epoch: i64,
    pub wait_id: Uuid,
    pub endpoint: i32,
    pub status: DeliveryStatus,
    /// When pending: the next attempt.
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub tries: i32,
    /// The latest attempts, this one last ([`KEPT_ATTEMPTS`] at most).
    pub attempts: Vec<Attempt>,
    /// Whether an attempt was made (a delivery to a stopped webhook is stopped
    /// without one).
    pub attempted: bool,
}

/// What a claimer holds, so that a claim gives each tenant its turn.
///
/// A tenant's due deliveries are numbered soonest first, after the `taken` it
/// already holds (a tenant not named holds none), and the claim takes the lowest
/// numbers first and none beyond `per_tenant`. So every tenant with a delivery due
/// gets one before any gets a second, and the claimer never holds more than
/// `per_tenant` of one tenant's, however many of them are due and however long
/// they have been. Deliveries to the `stalled` webhook URLs of a tenant are left
/// where they are, the claimer could only give them back, and those due are put
/// off until `stalled_until`: the claims meanwhile do not read them again.
#[derive(Clone, Copy, Debug)]
pub struct Turns<'a> {
    pub per_tenant: i64,
    /// Per tenant: deliveries the claimer holds (in flight or waiting for a slot).
    pub taken: &'a [(String, i64)],
    /// `(tenant, url)` of webhooks whose receiver has stopped answering.
    pub stalled: &'a [(String, String)],
    pub stalled_until: DateTime<Utc>,
}

/// The bounds on the outbox. Each replica writes its settings to the store at
/// start-up ([`Store::set_delivery_limits`]): the outbox trigger, which applies the
/// caps in the transaction of every event, reads them there, as redeliveries do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeliveryLimits {
    /// Most pending deliveries of one webhook of a wait.
    pub per_webhook: u32,
    /// Most pending deliveries of one wait, over its webhooks.
    pub per_wait: u32,
    /// Most pending deliveries of one tenant.
    pub per_tenant: u32,
    /// Least time between two redeliveries of one delivery.
    pub redelivery_interval: Duration,
}

impl Default for DeliveryLimits {
    fn default() -> DeliveryLimits {
        DeliveryLimits {
            per_webhook: 8,
            per_wait: 16,
            per_tenant: 10_000,
            redelivery_interval: Duration::from_secs(10),
        }
    }
}

/// The answer to a redelivery request.
#[derive(Debug)]
pub enum Redeliver {
    /// Queued again: its next attempt is due now.
    Queued(Delivery),
    /// Already pending: nothing changed.
    Pending(Delivery),
    /// An attempt of it is still in flight (its webhook was stopped meanwhile):
    /// nothing changed.
    InFlight(Delivery),
    /// Queued again less than the redelivery interval ago: nothing changed.
    TooSoon {
        delivery: Delivery,
        /// When it can be queued again, from now.
        retry_after: Duration,
        interval: Duration,
    },
    /// Its webhook, wait or tenant already has as many pending deliveries as that
    /// bound allows: nothing changed.
    Full {
        delivery: Delivery,
        bound: DropReason,
        limit: u32,
    },
    /// No such delivery of this wait.
    NotFound,
}

/// What a dialect's redelivery came to, before the delivery is read back.
pub(crate) enum Requeue {
    Queued,
    Pending,
    InFlight,
    TooSoon(Duration, Duration),
    Full(DropReason, u32),
    NotFound,
}

/// A delivery as a redelivery finds it, and the bounds.
pub(crate) struct Found {
    pub status: String,
    pub leased: bool,
    pub redelivered_at: Option<DateTime<Utc>>,
    pub limits: DeliveryLimits,
}

impl Found {
    /// Whether it may be queued again now, before the bounds on pending deliveries
    /// are counted: not while pending or in flight, and once per interval.
    pub(crate) fn refusal(&self, now: DateTime<Utc>) -> Option<Requeue> {
        if self.status == DeliveryStatus::Pending.as_str() {
            return Some(Requeue::Pending);
        }
        if self.leased {
            return Some(Requeue::InFlight);
        }
        let interval = self.limits.redelivery_interval;
        let next = self.redelivered_at? + chrono::Duration::from_std(interval).ok()?;
        (next > now).then(|| Requeue::TooSoon((next - now).to_std().unwrap_or_default(), interval))
    }

    /// The first bound that the pending deliveries of its webhook, wait and tenant
    /// (counted in that order) already reach.
    pub(crate) fn full(&self, webhook: i64, wait: i64, tenant: i64) -> Option<Requeue> {
        let l = self.limits;
        [
            (webhook, l.per_webhook, DropReason::WebhookCap),
            (wait, l.per_wait, DropReason::WaitCap),
            (tenant, l.per_tenant, DropReason::TenantCap),
        ]
        .into_iter()
        .find(|(n, limit, _)| *n >= i64::from(*limit))
        .map(|(_, limit, bound)| Requeue::Full(bound, limit))
    }
}

/// The row of `delivery_limits`, on both dialects.
pub(crate) const LIMITS_SQL: &str = "SELECT CAST(per_webhook AS bigint), CAST(per_wait AS bigint), \
     CAST(per_tenant AS bigint), CAST(redelivery_interval_ms AS bigint) FROM delivery_limits";

pub(crate) type LimitsRow = (i64, i64, i64, i64);

/// The bounds a row of `delivery_limits` holds (none: the defaults).
pub(crate) fn limits_of(row: Option<LimitsRow>) -> DeliveryLimits {
    let Some(row) = row else {
        return DeliveryLimits::default();
    };
    let n = |v: i64| u32::try_from(v.max(1)).unwrap_or(u32::MAX);
    DeliveryLimits {
        per_webhook: n(row.0),
        per_wait: n(row.1),
        per_tenant: n(row.2),
        redelivery_interval: Duration::from_millis(row.3.max(0) as u64),
    }
}

/// The columns of a due row: the delivery's, the secret, the event, the wait.
pub(crate) fn due_columns() -> String {
    format!(
        "{DELIVERY_COLUMNS}, n.secret AS d_secret, n.stopped_at AS d_stopped_at, e.at AS d_event_at, e.data AS d_event_data, s.trace AS d_trace, {}, {}",
        super::rows::GROUPED_COLUMN,
        super::WAIT_COLUMNS
    )
}

/// The joins of a due row, after `FROM deliveries d`.
pub(crate) const DUE_JOINS: &str = "JOIN wait_notify n ON n.wait_id = d.wait_id AND n.endpoint = d.endpoint \
     JOIN wait_events e ON e.wait_id = d.wait_id AND e.seq = d.seq \
     JOIN waits w ON w.id = d.wait_id JOIN wait_specs s ON s.wait_id = d.wait_id";

impl Store {
    /// Takes up to `limit` due pending deliveries (none of whose wait's earlier
    /// deliveries to the same webhook are still pending) under a lease of `ttl`:
    /// unowned, or whose lease ran out (epoch + 1). Tenants take turns (see
    /// [`Turns`]).
    pub async fn claim_deliveries(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        ttl: Duration,
        limit: i64,
        turns: &Turns<'_>,
    ) -> Result<Vec<Due>, StoreError> {
        let rows = sql!(self.claim_deliveries(owner, now, ttl, limit, turns))?;
        let mut due = Vec::with_capacity(rows.len());
        let mut grouped = Vec::with_capacity(rows.len());
        for row in rows {
            grouped.push(row.grouped);
            let secret = self
                .cipher
                .open(&row.d_secret.0)
                .ok()
                .and_then(|mut m| m.remove("secret"))
                .unwrap_or_default();
            let event = Event {
                id: None,
                seq: row.d.d_seq,
                wait_id: row.d.d_wait_id,
                at: row.d_event_at.0,
                body: EventBody::from_parts(&row.d.d_kind, row.d_event_data.0).map_err(|e| {
                    StoreError::Decode {
                        what: "event",
                        why: e.to_string(),
                    }
                })?,
            };
            let tenant = row.d.d_tenant.clone();
            let epoch = row.d.d_epoch;
            let tries = row.d.d_tries;
            let wait_id = row.d.d_wait_id;
            let stopped = row.d_stopped_at.is_some();
            let trace = row.d_trace.clone();
            due.push(Due {
                delivery: row.d.into_delivery()?,
                tenant,
                wait_id,
                epoch,
                tries,
                secret,
                stopped,
                event,
                wait: row.wait.into_wait()?,
                trace,
            });
        }
        // A group's webhook shows its mode and members, a member's its group (looked
        // up only for those the claim found in a group).
        if grouped.contains(&true) {
            self.annotate_groups_of(
                due.iter_mut()
                    .zip(&grouped)
                    .filter(|(_, g)| **g)
                    .map(|(d, _)| &mut d.wait),
            )
            .await?;
        }
        Ok(due)
    }

    /// Writes attempts' outcomes in one transaction, each fenced by owner and
    /// epoch: per outcome, false when the delivery is no longer this owner's. A
    /// `stopped` outcome (410 Gone) also stops the webhook: its other pending
    /// deliveries, and those of later events.
    pub async fn finish_deliveries(
        &self,
        owner: Uuid,
        now: DateTime<Utc>,
        outcomes: &[Outcome],
    ) -> Result<Finished, StoreError> {
        if outcomes.is_empty() {
            return Ok(Finished::default());
        }
        let attempts = outcomes
            .iter()
            .map(|o| {
                serde_json::to_string(&o.attempts).map_err(|e| StoreError::Decode {
                    what: "attempts",
                    why: e.to_string(),
                })
            })
            .collect::<Result<Vec<String>, _>>()?;
        let rows = sql!(self.finish_deliveries(owner, now, outcomes, &attempts))?;
        let next_in_line = rows.iter().any(|(_, behind)| *behind);
        let written: std::collections::HashSet<i64> = rows.into_iter().map(|(id, _)| id).collect();
        Ok(Finished {
            written: outcomes.iter().map(|o| written.contains(&o.id)).collect(),
            next_in_line,
        })
    }

    /// A tenant's wait's deliveries with id `> after`, in id order (event order per
    /// webhook).
    pub async fn deliveries(
        &self,
        tenant: &str,
        wait_id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        sql!(self.deliveries(tenant, wait_id, after, limit))?
            .into_iter()
            .map(DeliveryRow::into_delivery)
            .collect()
    }

    /// Queues a delivered, failed, stopped or dropped delivery again, due now, with
    /// a fresh retry schedule; a stopped webhook is started again. Not while it is
    /// pending or in flight, not twice within the redelivery interval, and not when
    /// its webhook, wait or tenant is at its bound on pending deliveries.
    pub async fn redeliver(
        &self,
        tenant: &str,
        wait_id: Uuid,
        id: i64,
        now: DateTime<Utc>,
    ) -> Result<Redeliver, StoreError> {
        let requeue = sql!(self.redeliver(tenant, wait_id, id, now))?;
        let found = sql!(self.deliveries(tenant, wait_id, id - 1, 1))?
            .into_iter()
            .next()
            .filter(|d| d.d_id == id)
            .map(DeliveryRow::into_delivery)
            .transpose()?;
        let Some(delivery) = found else {
            return Ok(Redeliver::NotFound);
        };
        Ok(match requeue {
            Requeue::Queued => Redeliver::Queued(delivery),
            Requeue::Pending => Redeliver::Pending(delivery),
            Requeue::InFlight => Redeliver::InFlight(delivery),
            Requeue::TooSoon(retry_after, interval) => Redeliver::TooSoon {
                delivery,
                retry_after,
                interval,
            },
            Requeue::Full(bound, limit) => Redeliver::Full {
                delivery,
                bound,
                limit,
            },
            Requeue::NotFound => Redeliver::NotFound,
        })
    }

    /// Writes the bounds the outbox trigger and redeliveries apply.
    pub async fn set_delivery_limits(&self, limits: DeliveryLimits) -> Result<(), StoreError> {
        sql!(self.set_delivery_limits(limits))
    }

    /// The bounds in force.
    pub async fn delivery_limits(&self) -> Result<DeliveryLimits, StoreError> {
        sql!(self.delivery_limits())
    }

    /// Deliveries dropped by each bound ([`DropReason::ALL`]'s order), over the
    /// store's life and every replica.
    pub async fn dropped_deliveries(&self) -> Result<[i64; 3], StoreError> {
        sql!(self.dropped_deliveries())
    }

    /// When the oldest pending delivery was created, if any is pending.
    pub async fn oldest_pending_delivery(&self) -> Result<Option<DateTime<Utc>>, StoreError> {
        sql!(self.oldest_pending_delivery())
    }
}
