//! `POST /waits/{id}/complete` and `POST /waits/{id}/fail`: a running callback
//! wait ended by a holder of an API token of its tenant (a person in the
//! dashboard, a chat tool), rather than by its callback URL (docs/design.md
//! §2.15). The end is the callback URL's own: the same conditional write, so the
//! first of the two to arrive wins and the other is a `409`.

use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;
use uuid::Uuid;

use super::AppState;
use super::auth::Tenant;
use super::callbacks::finish;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiQuery, JsonBody, NoQuery, WaitId};
use super::read::no_such_wait;
use crate::model::{Status, Wait};
use crate::store::{Callback, CallbackEnd};

/// The reason `complete` records.
pub const APPROVED: &str = "approved through the API";
/// The reason `fail` records.
pub const REJECTED: &str = "rejected through the API";

/// A request body that may be left out: none (no bytes at all) is `None`; one
/// that is there is read as [`JsonBody`] reads it, with its limits and refusals.
pub struct OptionalJson(pub Option<Value>);

impl FromRequest<AppState> for OptionalJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &AppState) -> Result<OptionalJson, ApiError> {
        use axum::body::HttpBody;
        if req.body().is_end_stream() || req.body().size_hint().exact() == Some(0) {
            return Ok(OptionalJson(None));
        }
        let JsonBody(v) = JsonBody::from_request(req, s).await?;
        Ok(OptionalJson(Some(v)))
    }
}

/// Approve a callback wait
///
/// Ends a running callback wait `succeeded` ("approved through the API"), as a
/// POST to its callback URL would, without the URL: the API token is the
/// credential. The body, if any, is JSON of at most 64 KiB and becomes the wait's
/// `output`; it is not judged by the spec's conditions, since a person decided.
/// The first end wins: a wait that had ended is a `409` carrying the wait as it
/// ended.
#[utoipa::path(
    post, path = "/waits/{id}/complete", tag = "waits", operation_id = "complete_wait",
    params(("id" = Uuid, Path, description = "The callback wait's id"), NoQuery),
    request_body(content = Option<serde_json::Value>, content_type = "application/json",
        description = "Optional: any JSON value, such as {\"approved\": true}"),
    responses(
        (status = 200, description = "The wait, ended succeeded by this request", body = Wait),
        (status = 400, description = "A query parameter was given, or the body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within the server's body timeout", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The wait had already ended: the wait, as it ended", body = Wait),
        (status = 413, description = "Body over 64 KiB; the wait goes on", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The wait is not a callback wait: it ends by polling, by its members or by a cancel", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn complete_wait(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
    OptionalJson(body): OptionalJson,
) -> ApiResult<Response> {
    let cb = callback_wait(&s, &tenant, id).await?;
    let end = CallbackEnd {
        status: Status::Succeeded,
        reason: APPROVED.into(),
        error_detail: None,
        output: body.as_ref().map(crate::engine::bound::output),
    };
    finish(&s, &cb, &end).await
}

/// Reject a callback wait
///
/// Ends a running callback wait `failed` ("rejected through the API"), with the
/// body, if any, as its `error_detail` (such as `{"reason": "not this week"}`),
/// as a POST to its callback URL's `/fail` would. The first end wins: a wait that
/// had ended is a `409` carrying the wait as it ended.
#[utoipa::path(
    post, path = "/waits/{id}/fail", tag = "waits", operation_id = "fail_wait",
    params(("id" = Uuid, Path, description = "The callback wait's id"), NoQuery),
    request_body(content = Option<serde_json::Value>, content_type = "application/json",
        description = "Optional: any JSON value, kept as the wait's error_detail"),
    responses(
        (status = 200, description = "The wait, ended failed by this request", body = Wait),
        (status = 400, description = "A query parameter was given, or the body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such wait", body = Problem, content_type = "application/problem+json"),
        (status = 408, description = "The body did not arrive within the server's body timeout", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The wait had already ended: the wait, as it ended", body = Wait),
        (status = 413, description = "Body over 64 KiB; the wait goes on", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "The body is not JSON", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "The wait is not a callback wait: it ends by polling, by its members or by a cancel", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn fail_wait(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    WaitId(id): WaitId,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
    OptionalJson(body): OptionalJson,
) -> ApiResult<Response> {
    let cb = callback_wait(&s, &tenant, id).await?;
    let end = CallbackEnd {
        status: Status::Failed,
        reason: REJECTED.into(),
        error_detail: body.as_ref().map(crate::engine::bound::detail),
        output: None,
    };
    finish(&s, &cb, &end).await
}

/// The tenant's callback wait `id`: a `404` when the tenant has no such wait, a
/// `422` when the wait is not a callback wait (its spec has no `callback`).
async fn callback_wait(s: &AppState, tenant: &str, id: Uuid) -> ApiResult<Callback> {
    let wait = s
        .store
        .waits()
        .get(tenant, id)
        .await?
        .ok_or_else(|| no_such_wait(id))?;
    if wait.spec.get("callback").is_none_or(Value::is_null) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Not a callback wait",
            format!(
                "wait {id} is not a callback wait, so it ends by its own polls, its members or a cancel; \
             only a wait created with \"callback\" in place of \"target\" ends by POST /waits/{{id}}/complete or /fail"
            ),
        ));
    }
    // `finish` ends the wait by its tenant and id, and reads nothing else of it.
    Ok(Callback {
        wait_id: id,
        tenant: tenant.to_string(),
        heartbeat: None,
        beat_at: wait.created_at,
        judged: false,
    })
}
