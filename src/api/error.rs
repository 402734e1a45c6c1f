//! The one error type of the API: every failure renders as
//! `application/problem+json` (RFC 9457). A 5xx logs its cause and returns none of it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::engine::FieldError;
use crate::store::StoreError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub title: &'static str,
    pub detail: String,
    pub errors: Vec<FieldError>,
    pub retry_after: Option<u64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub type_: String,
    pub title: String,
    pub status: u16,
    /// A sentence a person can act on.
    pub detail: String,
    /// Validation problems, one per field.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<ProblemField>)]
    pub errors: Vec<FieldError>,
}

/// One field's validation problem.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ProblemField {
    /// The field, as a dotted path (`poll.initial`, `want[2]`).
    pub field: String,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, title: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            title,
            detail: detail.into(),
            errors: Vec::new(),
            retry_after: None,
        }
    }

    /// This refusal of a part of a request (a group's member at `at`, such as
    /// `all[2]`), its fields named from the whole request.
    pub fn within(mut self, at: &str) -> ApiError {
        for e in &mut self.errors {
            e.field = if e.field.is_empty() {
                at.to_string()
            } else {
                format!("{at}.{}", e.field)
            };
        }
        self.detail = match self.errors.as_slice() {
            [one] => format!("{} {}", one.field, one.message),
            _ => format!("{at}: {}", self.detail),
        };
        self
    }

    pub fn bad_request(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "Bad request", detail)
    }

    pub fn validation(errors: Vec<FieldError>) -> ApiError {
        let detail = match errors.as_slice() {
            [one] if one.field.is_empty() => one.message.clone(),
            [one] => format!("{} {}", one.field, one.message),
            many => format!("the request has {} problems; see errors", many.len()),
        };
        ApiError {
            errors,
            ..ApiError::new(StatusCode::BAD_REQUEST, "Invalid wait request", detail)
        }
    }

    pub fn not_found(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "Not found", detail)
    }

    pub fn unprocessable(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "Target refused", detail)
    }

    pub fn unauthorized(detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", detail)
    }

    pub fn internal() -> ApiError {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Internal error",
            "waitd failed to handle this request; the cause is in its log",
        )
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        match e {
            StoreError::Unavailable(cause) => {
                tracing::warn!(error = %cause, "store unavailable");
                ApiError {
                    retry_after: Some(1),
                    ..ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Store unavailable",
                        "waitd cannot reach its database right now; try again shortly",
                    )
                }
            }
            StoreError::IdempotencyConflict => ApiError::new(
                StatusCode::CONFLICT,
                "Idempotency key reused",
                "this Idempotency-Key was already used with a different request body; use a new key for a new wait",
            ),
            StoreError::TooManyActive(n) => ApiError {
                retry_after: Some(30),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "Too many active waits",
                    format!(
                        "this tenant already has {n} running waits, the most this server allows; cancel some or wait for them to end"
                    ),
                )
            },
            other => {
                tracing::error!(error = %other, "store error");
                ApiError::internal()
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let slug = self.title.to_lowercase().replace(' ', "-");
        let body = Problem {
            type_: format!("/problems/{slug}"),
            title: self.title.to_string(),
            status: self.status.as_u16(),
            detail: self.detail,
            errors: self.errors,
        };
        let mut res = (self.status, axum::Json(body)).into_response();
        res.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            res.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(s) = self.retry_after {
            res.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        res
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
