//! Webhook deliveries as the API shows them: where each stands, why one was
//! dropped, its attempts, and the `webhook-id` it is sent under.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::millis;

/// Where a webhook delivery stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryStatus {
    /// Not yet answered with a 2xx: its next attempt is due at `next_attempt_at`.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Every attempt of the retry schedule failed (or the SSRF guard refused the
    /// receiver's address).
    Failed,
    /// The receiver answered 410 Gone: nothing more is sent to that webhook.
    Stopped,
    /// Taken out of the queue unsent by a bound on pending deliveries
    /// (`drop_reason` names it).
    Dropped,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Failed => "failed",
            DeliveryStatus::Stopped => "stopped",
            DeliveryStatus::Dropped => "dropped",
        }
    }

    pub fn parse(s: &str) -> Option<DeliveryStatus> {
        [
            DeliveryStatus::Pending,
            DeliveryStatus::Delivered,
            DeliveryStatus::Failed,
            DeliveryStatus::Stopped,
            DeliveryStatus::Dropped,
        ]
        .into_iter()
        .find(|d| d.as_str() == s)
    }
}

/// The bound on pending deliveries that dropped a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Its webhook had `--max-pending-deliveries-per-webhook` pending.
    WebhookCap,
    /// Its wait had `--max-pending-deliveries-per-wait` pending.
    WaitCap,
    /// Its tenant had `--max-pending-deliveries-per-tenant` pending.
    TenantCap,
}

impl DropReason {
    pub const ALL: [DropReason; 3] = [
        DropReason::WebhookCap,
        DropReason::WaitCap,
        DropReason::TenantCap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::WebhookCap => "webhook_cap",
            DropReason::WaitCap => "wait_cap",
            DropReason::TenantCap => "tenant_cap",
        }
    }

    pub fn parse(s: &str) -> Option<DropReason> {
        DropReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One attempt to deliver a webhook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attempt {
    /// When it was sent.
    #[serde(with = "millis")]
    pub at: DateTime<Utc>,
    /// The receiver's HTTP status, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// Why it failed without an answer (a connection error, a timeout, a refusal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long it took, in milliseconds.
    pub duration_ms: u64,
}

/// A webhook delivery: one event of a wait, to one of its `notify` entries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Delivery {
    /// The delivery's id (for `POST /waits/{id}/deliveries/{delivery}/retry`).
    pub id: i64,
    /// The `webhook-id` header it is sent with: the same on every attempt, so a
    /// receiver can drop duplicates.
    pub webhook_id: String,
    /// Which `notify` entry (its index in the spec's list).
    pub endpoint: i32,
    pub url: String,
    /// The event it announces: its `seq` in the wait's history, and its kind.
    pub seq: i32,
    pub kind: String,
    pub status: DeliveryStatus,
    #[serde(with = "millis")]
    pub created_at: DateTime<Utc>,
    /// When the next attempt is due (pending only).
    #[serde(default, with = "millis::option")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// When it was delivered, failed, stopped or dropped.
    #[serde(default, with = "millis::option")]
    pub finished_at: Option<DateTime<Utc>>,
    /// When dropped: the bound that dropped it.
    pub drop_reason: Option<DropReason>,
    /// Attempts made, in all.
    pub attempts_total: i32,
    /// The latest attempts (at most 20), oldest first.
    pub attempts: Vec<Attempt>,
}

/// A wait's webhook deliveries, in event order.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeliveryPage {
    pub items: Vec<Delivery>,
    /// Pass as `after` for the next page; null on the last.
    pub next_cursor: Option<String>,
}

/// The `webhook-id` of a wait's event sent to one of its webhooks.
pub fn webhook_id(wait: Uuid, seq: i32, endpoint: i32) -> String {
    format!("msg_{}_{seq}_{endpoint}", wait.simple())
}
