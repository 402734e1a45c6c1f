//! `/sources`: a tenant's event sources (docs/design.md §2.18): create, list,
//! read, delete. A source's secret is write-only: no answer, log or event
//! carries it. Its events arrive at its hook URL ([`super::hooks`]).

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use super::auth::Tenant;
use super::error::{ApiError, ApiResult, Problem};
use super::extract::{ApiQuery, JsonBody, NoQuery};
use super::{AppState, json_response};
use crate::engine::FieldError;
use crate::engine::spec::{SOURCE_NAME_RULE, is_source_name};
use crate::sources::{KeyFrom, Kind, check_secret};
use crate::store::sources::{NewSource, OPERATOR, Source};

/// The path of a source's hook URL, before its id.
pub const HOOK_PATH: &str = "/hooks/";
/// The most sources one tenant may have.
pub const MAX_SOURCES: i64 = 100;
pub use crate::sources::DEFAULT_LOOKBACK;

/// An event source as every answer shows it (never its secret). One the
/// operator declares shows neither its hook id nor its hook URL: the sender is
/// the operator's to configure.
#[derive(Debug, Serialize, ToSchema)]
pub struct SourceView {
    /// The random id in its hook URL; absent on the operator's sources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    /// `github`, `standard-webhooks` or `bearer`: how its events are signed.
    pub kind: String,
    /// How an event's key is read: a JSON Pointer into its body, or a CEL
    /// expression over its `body` and `headers`.
    pub key: String,
    /// How long its events are kept for waits created after them.
    pub lookback: String,
    /// Where its events are POSTed: no API token, the signature is checked.
    /// Absent on the operator's sources.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook_url: Option<String>,
    /// True for a source the operator declares (`--credentials-file`): the
    /// tenant's waits may name it, and only the operator may change it.
    pub operator: bool,
    pub created_at: DateTime<Utc>,
}

/// A tenant's event sources.
#[derive(Debug, Serialize, ToSchema)]
pub struct SourceList {
    pub sources: Vec<SourceView>,
}

/// How a source's events are signed.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum SourceKindText {
    #[schema(rename = "github")]
    Github,
    #[schema(rename = "standard-webhooks")]
    StandardWebhooks,
    #[schema(rename = "bearer")]
    Bearer,
}

/// A create request for an event source.
#[derive(Debug, serde::Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct CreateSource {
    /// 1 to 64 lowercase letters, digits, '.', '_' or '-': what waits name in
    /// `on_event.source`.
    #[schema(pattern = r"^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub name: String,
    /// `github`, `standard-webhooks` or `bearer`.
    #[schema(value_type = SourceKindText)]
    pub kind: String,
    /// The signing secret (write-only): GitHub's webhook secret, a Standard
    /// Webhooks `whsec_…` secret, or the bearer token.
    #[schema(min_length = 16, max_length = 512)]
    pub secret: String,
    /// A JSON Pointer into an event's body (`/workflow_run/id`) or a CEL
    /// expression over `body` and `headers` (`body.workflow_run.head_sha`).
    #[schema(min_length = 1, max_length = 1024)]
    pub key: String,
    /// How long events are kept for waits created after them: `1s` to `1h`,
    /// default `5m`.
    #[schema(value_type = Option<crate::engine::schema::DurationText>)]
    pub lookback: Option<String>,
}

pub(super) fn view(s: &Source, headers: &HeaderMap) -> SourceView {
    let operator = s.tenant == OPERATOR;
    SourceView {
        id: (!operator).then(|| s.id.clone()),
        name: s.name.clone(),
        kind: s.kind.as_str().to_string(),
        key: s.key_from.clone(),
        lookback: crate::engine::duration::format(s.lookback),
        hook_url: (!operator).then(|| super::waits::capability_url(headers, HOOK_PATH, &s.id)),
        operator,
        created_at: s.created_at,
    }
}

/// The source `tenant`'s waits mean by `name`: its own of that name, else the
/// operator's, if the operator lists the tenant for it.
pub(super) async fn usable(s: &AppState, tenant: &str, name: &str) -> ApiResult<Option<Source>> {
    if let Some(own) = s.store.sources().get(tenant, name).await? {
        return Ok(Some(own));
    }
    if s.credentials.source_for(tenant, name).is_none() {
        return Ok(None);
    }
    Ok(s.store.sources().get(OPERATOR, name).await?)
}

fn invalid(errors: Vec<FieldError>) -> ApiError {
    ApiError {
        title: "Invalid source",
        ..ApiError::validation(errors)
    }
}

/// Create an event source
///
/// Declares a receiver of signed webhooks: its events are POSTed to the
/// `hook_url` of the answer, checked by its kind's signature, kept for its
/// lookback window, and matched by key to the waits whose `on_event` names it.
#[utoipa::path(
    post, path = "/sources", tag = "sources", operation_id = "create_source",
    request_body(content = CreateSource, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = SourceView),
        (status = 400, description = "Invalid request (see `errors`)", body = Problem, content_type = "application/problem+json"),
        (status = 403, description = "A read-only API token, which may only read", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The tenant has a source of this name, or 100 sources already", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "Body over 64 KiB", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn create_source(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
    headers: HeaderMap,
    JsonBody(body): JsonBody,
) -> ApiResult<Response> {
    let tenant_for = tenant.clone();
    let parsed = crate::cpu::pool()
        .run(crate::cpu::Lane::Quick, &tenant_for, move || parse(&body))
        .await
        .map_err(|lost| {
            tracing::error!(error = %lost, "a source's validation was lost");
            ApiError::internal()
        })?
        .map_err(invalid)?;
    let (name, kind, secret, key, lookback) = parsed;
    if s.store.sources().count(&tenant).await? >= MAX_SOURCES {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "Too many sources",
            format!(
                "this tenant has {MAX_SOURCES} event sources, the most allowed; delete one it no longer uses"
            ),
        ));
    }
    let new = NewSource {
        tenant: &tenant,
        name: &name,
        kind,
        key_from: &key,
        lookback,
        secret: &secret,
    };
    let made = s.store.sources().create(&new, Utc::now()).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "Source exists",
            format!("this tenant has an event source named \"{name}\" already; delete it first or choose another name"),
        )
    })?;
    tracing::info!(source = %made.name, kind = made.kind.as_str(), "event source created");
    Ok(json_response(StatusCode::CREATED, view(&made, &headers)))
}

type Parsed = (String, Kind, String, String, Duration);

/// A create request's fields, or every problem with them.
fn parse(body: &Value) -> Result<Parsed, Vec<FieldError>> {
    let mut errs = Vec::new();
    let mut push = |field: &str, message: String| {
        errs.push(FieldError {
            field: field.into(),
            message,
        })
    };
    let Some(obj) = body.as_object() else {
        push(
            "",
            "the request body must be a JSON object: {\"name\", \"kind\", \"secret\", \"key\"}"
                .into(),
        );
        return Err(errs);
    };
    const FIELDS: [&str; 5] = ["name", "kind", "secret", "key", "lookback"];
    for k in obj.keys().filter(|k| !FIELDS.contains(&k.as_str())) {
        push(
            &k.chars().take(64).collect::<String>(),
            format!(
                "is not a field of a source; known fields are {}",
                FIELDS.join(", ")
            ),
        );
    }
    let text = |k: &str| obj.get(k).and_then(Value::as_str);
    let name = match text("name") {
        Some(n) if is_source_name(n) => Some(n.to_string()),
        _ => {
            push("name", format!("must be a string of {SOURCE_NAME_RULE}"));
            None
        }
    };
    let kinds = Kind::ALL.map(Kind::as_str).join("\", \"");
    let kind = match text("kind").and_then(Kind::parse) {
        Some(k) => Some(k),
        None => {
            push(
                "kind",
                format!("must be one of \"{kinds}\": how the source's events are signed"),
            );
            None
        }
    };
    let secret = match (text("secret"), kind) {
        (Some(sec), Some(k)) => match check_secret(k, sec) {
            Ok(()) => Some(sec.to_string()),
            Err(why) => {
                push("secret", why);
                None
            }
        },
        (Some(_), None) => None,
        (None, _) => {
            push(
                "secret",
                "is required: the secret the sender signs its events with".into(),
            );
            None
        }
    };
    let key = match text("key") {
        Some(k) => match KeyFrom::parse(k) {
            Ok(_) => Some(k.to_string()),
            Err(why) => {
                push("key", why);
                None
            }
        },
        None => {
            push("key", "is required: a JSON Pointer such as \"/workflow_run/id\" or a CEL expression such as \"body.workflow_run.head_sha\", read from each event for the waits to name in on_event.key".into());
            None
        }
    };
    let lookback = match obj.get("lookback") {
        None | Some(Value::Null) => Some(DEFAULT_LOOKBACK),
        Some(Value::String(t)) => match crate::sources::lookback(t) {
            Ok(d) => Some(d),
            Err(why) => {
                push("lookback", why);
                None
            }
        },
        Some(_) => {
            push(
                "lookback",
                "must be a duration string such as \"5m\"".into(),
            );
            None
        }
    };
    match (name, kind, secret, key, lookback) {
        (Some(n), Some(k), Some(s), Some(key), Some(l)) if errs.is_empty() => Ok((n, k, s, key, l)),
        _ => Err(errs),
    }
}

/// List event sources
///
/// The tenant's event sources and the operator's it may use, by name; never
/// their secrets.
#[utoipa::path(
    get, path = "/sources", tag = "sources", operation_id = "list_sources",
    responses(
        (status = 200, description = "The tenant's sources", body = SourceList),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn list_sources(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let mut sources = s.store.sources().list(&tenant).await?;
    if s.credentials
        .sources()
        .keys()
        .any(|n| s.credentials.source_for(&tenant, n).is_some())
    {
        let operators: Vec<Source> = s
            .store
            .sources()
            .list(OPERATOR)
            .await?
            .into_iter()
            .filter(|o| {
                s.credentials.source_for(&tenant, &o.name).is_some()
                    && !sources.iter().any(|own| own.name == o.name)
            })
            .collect();
        sources.extend(operators);
        sources.sort_by(|a, b| a.name.cmp(&b.name));
    }
    let sources = sources.iter().map(|x| view(x, &headers)).collect();
    Ok(json_response(StatusCode::OK, &SourceList { sources }))
}

fn no_such_source(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "this tenant has no event source named \"{}\"; see GET /sources",
        name.chars().take(64).collect::<String>().escape_debug()
    ))
}

/// Read an event source
#[utoipa::path(
    get, path = "/sources/{name}", tag = "sources", operation_id = "get_source",
    params(("name" = String, Path, description = "The source's name")),
    responses(
        (status = 200, description = "The source", body = SourceView),
        (status = 404, description = "No source of this name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn get_source(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let found = usable(&s, &tenant, &name).await?;
    let found = found.ok_or_else(|| no_such_source(&name))?;
    Ok(json_response(StatusCode::OK, view(&found, &headers)))
}

/// Delete an event source
///
/// Deletes the source, its kept events and its listeners: its hook URL answers
/// `404` from now on, and the waits that listened to it go on polling.
#[utoipa::path(
    delete, path = "/sources/{name}", tag = "sources", operation_id = "delete_source",
    params(("name" = String, Path, description = "The source's name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 403, description = "A read-only API token, which may only read, or a source the operator declares", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No source of this name", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "The store is unreachable: repeat it after Retry-After", body = Problem, content_type = "application/problem+json",
         headers(("Retry-After" = u32, description = "Seconds to wait before repeating"))),
    )
)]
pub async fn delete_source(
    State(s): State<AppState>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
) -> ApiResult<Response> {
    if !s.store.sources().delete(&tenant, &name).await? {
        if s.credentials.source_for(&tenant, &name).is_some() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "Operator's source",
                format!(
                    "the event source \"{name}\" is the operator's (--credentials-file): this tenant's waits may name it, and only the operator may change or remove it"
                ),
            ));
        }
        return Err(no_such_source(&name));
    }
    Ok(axum::response::IntoResponse::into_response(
        StatusCode::NO_CONTENT,
    ))
}
