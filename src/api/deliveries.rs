//! `/waits/{id}/deliveries`: a wait's webhook deliveries, and redelivery.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::Utc;
use serde::Deserialize;
use uuid::Uuid;

use super::auth::Tenant;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiQuery, NoQuery, WaitId};
use super::{AppState, json_response};
use crate::model::{Delivery, DeliveryPage, DropReason};
use crate::store::Redeliver;

/// Deliveries per page.
pub const PAGE: i64 = 100;

/// `Retry-After` of a redelivery refused at a bound on pending deliveries: about
/// what the default schedule's first retries (5 s, then 30 s) take to settle some.
const PENDING_RETRY_AFTER: u64 = 30;

/// The query of `GET /waits/{id}/deliveries`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// Only deliveries with a greater `id` (the `next_cursor` of the page before).
    #[param(pattern = "^[0-9]{1,18}$")]
    pub after: Option<String>,
}

/// A paging cursor or delivery id: digits, at most 18 of them.
fn number(text: &str) -> Option<i64> {
    (!text.is_empty() && text.len() <= 18 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse().ok())
        .flatten()
}

fn no_such_wait(id: Uuid) -> ApiError {
    ApiError::not_found(crate::retention::no_such_wait(id))
}

/// A wait's webhook deliveries
///
/// One per event and `notify` entry that announces it, oldest first, each with its
/// latest attempts (time, status code or error, duration) and its next attempt.
#[utoipa::path(
    get, path = "/waits/{id}/deliveries", tag = "webhooks", operation_id = "list_deliveries",
    params(("id" = Uuid, Path, description = "The wait's id"), DeliveriesQuery),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryPage),
        (status = 400, description = "A bad `after`, or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_deliveries(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    ApiQuery(q): ApiQuery<DeliveriesQuery>,
) -> ApiResult<Response> {
    let after = match q.after.as_deref() {
        None => 0,
        Some(t) => number(t).ok_or_else(|| {
            ApiError::bad_request(
                "after must be a delivery id (the next_cursor of the page before)",
            )
        })?,
    };
    if s.store.waits().get(&tenant, id).await?.is_none() {
        return Err(no_such_wait(id));
    }
    let mut items = s
        .store
        .outbox()
        .of_wait(&tenant, id, after, PAGE + 1)
        .await?;
    let more = items.len() as i64 > PAGE;
    items.truncate(PAGE as usize);
    let next_cursor = more
        .then(|| items.last().map(|d| d.id.to_string()))
        .flatten();
    Ok(json_response(
        StatusCode::OK,
        DeliveryPage { items, next_cursor },
    ))
}

/// Redeliver a webhook
///
/// Queues a delivered, failed, stopped or dropped delivery again: its next attempt
/// is due at once, with a fresh retry schedule, and a webhook stopped by a 410 is
/// started again. It keeps its `webhook-id`. One delivery is queued again at most
/// once per `--webhook-redelivery-interval` (10 s), never while it is pending or an
/// attempt of it is in flight, and not while its webhook, wait or tenant is at its
/// bound on pending deliveries.
#[utoipa::path(
    post, path = "/waits/{id}/deliveries/{delivery}/retry", tag = "webhooks", operation_id = "retry_delivery",
    params(
        ("id" = Uuid, Path, description = "The wait's id"),
        ("delivery" = i64, Path, description = "The delivery's id"),
        NoQuery,
    ),
    responses(
        (status = 202, description = "Queued: the delivery as it now stands", body = Delivery),
        (status = 400, description = "A query parameter was given", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait, or no such delivery of it", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The delivery is still pending (its next attempt is already planned), or an attempt of it is in flight", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Over this token's request rate; or the delivery was queued again less than the redelivery interval ago, or its webhook, wait or tenant is at its bound on pending deliveries: repeat after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn retry_delivery(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    path: Result<Path<(String, String)>, axum::extract::rejection::PathRejection>,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
) -> ApiResult<Response> {
    let (wait, delivery) = path.map(|Path(p)| p).unwrap_or_default();
    let id = Uuid::parse_str(&wait).map_err(|_| {
        ApiError::not_found(format!(
            "there is no wait \"{}\"; wait ids are UUIDs such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21",
            wait.chars().take(64).collect::<String>()
        ))
    })?;
    let no_such_delivery = || {
        ApiError::not_found(format!(
            "wait {id} has no delivery \"{}\"; GET /waits/{id}/deliveries lists them",
            delivery.chars().take(32).collect::<String>()
        ))
    };
    let number = number(&delivery).ok_or_else(no_such_delivery)?;
    if s.store.waits().get(&tenant, id).await?.is_none() {
        return Err(no_such_wait(id));
    }
    match s
        .store
        .outbox()
        .redeliver(&tenant, id, number, Utc::now())
        .await?
    {
        Redeliver::Queued(d) => {
            tracing::info!(wait_id = %id, delivery = number, "webhook redelivery queued");
            Ok(json_response(StatusCode::ACCEPTED, d))
        }
        Redeliver::Pending(d) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "Delivery pending",
            format!(
                "delivery {number} is still pending{}; it can be queued again once it is delivered, failed, stopped or dropped",
                d.next_attempt_at
                    .map(|t| format!(
                        ": its next attempt is due at {}",
                        t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ))
                    .unwrap_or_default()
            ),
        )),
        Redeliver::InFlight(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "Delivery in flight",
            format!(
                "an attempt of delivery {number} is in flight; it can be queued again once that attempt is written"
            ),
        )),
        Redeliver::TooSoon {
            retry_after,
            interval,
            ..
        } => {
            let secs = retry_after.as_millis().div_ceil(1000).max(1) as u64;
            Err(ApiError {
                retry_after: Some(secs),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Redelivered too recently",
                    format!(
                        "delivery {number} was queued again less than {} ago; a delivery is queued again at most once per {}, so try again in {secs} s",
                        crate::engine::duration::format(interval),
                        crate::engine::duration::format(interval),
                    ),
                )
            })
        }
        Redeliver::Full { bound, limit, .. } => {
            let whose = match bound {
                DropReason::WebhookCap => "its webhook".to_string(),
                DropReason::WaitCap => format!("wait {id}"),
                DropReason::TenantCap => "your tenant".to_string(),
            };
            Err(ApiError {
                retry_after: Some(PENDING_RETRY_AFTER),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too many pending deliveries",
                    format!(
                        "delivery {number} cannot be queued again: {whose} already has {limit} pending deliveries, the most it may have; try again once some are delivered"
                    ),
                )
            })
        }
        Redeliver::NotFound => Err(no_such_delivery()),
    }
}
