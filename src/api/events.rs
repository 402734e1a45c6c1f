//! Event history as JSON pages, and followed live as server-sent events
//! ([`super::sse`]).

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use uuid::Uuid;

use super::auth::Tenant;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{
    ApiQuery, EventsQuery, ResumeHeader, WaitEventsQuery, WaitId, labels, resume_point,
    wants_stream,
};
use super::openapi::{FeedFrame, WaitFrame};
use super::sse::{FeedStream, PAGE, WaitStream};
use super::{AppState, json_response};
use crate::bus::WaitSubscription;
use crate::model::{Event, EventPage};
use crate::store::StoreError;

/// A wait's events
///
/// JSON history by default; with `Accept: text/event-stream` or `?follow=true`, an
/// SSE stream (`id: <seq>`, `event: <kind>`, `data: <json>`): history first, then
/// live, ending after the terminal event. `Last-Event-ID` resumes after that seq.
#[utoipa::path(
    get, path = "/waits/{id}/events", tag = "events", operation_id = "list_wait_events",
    params(
        ("id" = Uuid, Path, description = "The wait's id"),
        WaitEventsQuery,
        ResumeHeader,
    ),
    responses(
        (status = 200, description = "The history (JSON), or the stream (text/event-stream), which ends after the terminal event",
         content((EventPage = "application/json"), (WaitFrame = "text/event-stream"))),
        (status = 400, description = "A bad `after`, `follow` or Last-Event-ID, or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_wait_events(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    ApiQuery(q): ApiQuery<WaitEventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let stream_it = wants_stream(&headers, q.follow.as_deref())?;
    // A seq past any a wait can have: after all of them.
    let after = i32::try_from(resume_point(&headers, q.after.as_deref())?).unwrap_or(i32::MAX);
    if s.store.waits().get(&tenant, id).await?.is_none() {
        return Err(ApiError::not_found(crate::retention::no_such_wait(id)));
    }
    if !stream_it {
        let mut items = sequenced_history(&s, &tenant, id, after, PAGE + 1).await?;
        let more = items.len() as i64 > PAGE;
        items.truncate(PAGE as usize);
        let next_cursor = more
            .then(|| items.last().map(|e| e.seq.to_string()))
            .flatten();
        return Ok(json_response(
            StatusCode::OK,
            EventPage { items, next_cursor },
        ));
    }
    let slot = s.streams.acquire(&tenant)?;
    Ok(WaitStream::respond(s, tenant, id, i64::from(after), slot))
}

/// All events
///
/// The same across all of the caller's waits, with a global cursor (`id`), filterable
/// by labels (`label=key:value`). As a stream it does not end by itself.
#[utoipa::path(
    get, path = "/events", tag = "events", operation_id = "list_events",
    params(
        EventsQuery,
        ResumeHeader,
    ),
    responses(
        (status = 200, description = "Events (JSON), or the stream (text/event-stream), which does not end by itself",
         content((EventPage = "application/json"), (FeedFrame = "text/event-stream"))),
        (status = 400, description = "A bad `after`, `follow`, label filter or Last-Event-ID, or an unknown query parameter", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The cursor is past the caller's newest event: the history was reset, or the cursor came from another server", body = Problem, content_type = "application/problem+json"),
        (status = 410, description = "The cursor is before events deleted with ended waits past the retention: start again from the cursor the detail gives", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_events(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let stream_it = wants_stream(&headers, q.follow.as_deref())?;
    let labels = labels(&q.label, &s.limits)?;
    let resuming = ResumeHeader::read(&headers)?.last_event_id.is_some();
    let latest = q.after.as_deref() == Some("latest") && !resuming;
    // The tenant's newest event: where `latest` follows from, and past which no
    // cursor this server gave the tenant can point.
    let newest = s.store.events().last_id(Some(&tenant)).await?;
    let after = if latest {
        newest
    } else {
        // `latest` with a Last-Event-ID: the header says where.
        let after = resume_point(&headers, q.after.as_deref().filter(|a| *a != "latest"))?;
        // A cursor no event of the tenant has reached: from another server, or one
        // whose history was reset. Following it would wait for ids already given
        // to other events.
        if after > newest {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "Cursor ahead of the events",
                format!(
                    "the cursor {after} is past the newest of your events on this server: its history was reset, or the cursor came from another server; start again from after=0, or after=latest for new events only"
                ),
            ));
        }
        // A cursor before events retention deleted: following it would skip them.
        let horizon = s.store.retention().event_horizon(&tenant).await?;
        if after > 0 && after < horizon {
            return Err(ApiError::new(
                StatusCode::GONE,
                "Cursor older than the events kept",
                format!(
                    "events after the cursor {after} were deleted with ended waits older than the server's retention (--retention); start again from after={horizon}, after=0 for every event kept, or after=latest for new events only"
                ),
            ));
        }
        after
    };
    if !stream_it {
        let mut items = s
            .store
            .events()
            .of_tenant(&tenant, after, &labels, PAGE + 1)
            .await?;
        let more = items.len() as i64 > PAGE;
        items.truncate(PAGE as usize);
        // The cursor to follow from: after the last event of the page, or where
        // this page started when it is empty (after=latest gives the newest).
        let next_cursor = match items.last() {
            Some(e) if more => e.id.map(|id| id.to_string()),
            _ if latest => Some(after.to_string()),
            _ => None,
        };
        return Ok(json_response(
            StatusCode::OK,
            EventPage { items, next_cursor },
        ));
    }
    let slot = s.streams.acquire(&tenant)?;
    Ok(FeedStream::respond(s, tenant, labels, after, slot))
}

/// A wait's history from `after`, as far as it is sequenced. On Postgres an event
/// committed a moment ago may not have its global cursor yet; reads do not number
/// events themselves but wait (for at most a second) for the sequencer's notice that
/// it has, then read again, so a client that saw the wait end sees all its events.
async fn sequenced_history(
    s: &AppState,
    tenant: &str,
    id: Uuid,
    after: i32,
    limit: i64,
) -> Result<Vec<Event>, StoreError> {
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    let mut notices: Option<WaitSubscription> = None;
    loop {
        let mut events = s.store.events().of_wait(tenant, id, after, limit).await?;
        let cut = events.iter().take_while(|e| e.id.is_some()).count();
        if cut == events.len() || tokio::time::Instant::now() >= until {
            events.truncate(cut);
            return Ok(events);
        }
        match notices.as_mut() {
            // Subscribed only now: read again first, so a notice sent meanwhile is
            // not waited for in vain.
            None => notices = Some(s.bus.subscribe_wait(id)),
            Some(rx) => {
                let _ = tokio::time::timeout_at(until, rx.recv()).await;
            }
        }
    }
}
