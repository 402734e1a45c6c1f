//! `/presets`: the named waiter definitions a request can use instead of spelling out
//! every field (docs/engine.md §4), and the expansion of a create request that names one.

use std::borrow::Cow;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use serde_json::Value;

use super::auth::Tenant;
use super::error::{ApiError, ApiResult, Problem};
use super::{AppState, json_response};
use crate::engine::FieldError;
use crate::presets::{Preset, PresetSummary};

/// Every preset of this server.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PresetList {
    /// By name.
    pub items: Vec<PresetSummary>,
}

/// List presets
///
/// Every preset this server knows (built-in, and from its `--presets-dir`): name,
/// description, and parameters with their defaults. A parameter without a default is
/// required.
#[utoipa::path(
    get, path = "/presets", tag = "presets", operation_id = "list_presets",
    responses(
        (status = 200, description = "The presets", body = PresetList),
    )
)]
pub async fn list_presets(State(s): State<AppState>, Tenant(_): Tenant) -> ApiResult<Response> {
    let items = s.presets.iter().map(Preset::summary).collect();
    Ok(json_response(StatusCode::OK, PresetList { items }))
}

/// Read a preset
///
/// One preset, with the request it stands for: its `{param}` placeholders are filled
/// from the create request's `params`, and the create request's own fields override
/// the preset's (objects merge key by key; arrays are replaced).
#[utoipa::path(
    get, path = "/presets/{name}", tag = "presets", operation_id = "get_preset",
    params(("name" = String, Path, description = "The preset's name, e.g. `latitude.server`")),
    responses(
        (status = 200, description = "The preset", body = Preset),
        (status = 404, description = "No such preset", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_preset(
    State(s): State<AppState>,
    Tenant(_): Tenant,
    name: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> ApiResult<Response> {
    // A name that is not even UTF-8 names no preset: the same 404 problem.
    let name = name.map(|Path(n)| n).unwrap_or_default();
    let preset = s.presets.get(&name).ok_or_else(|| {
        ApiError::not_found(format!(
            "there is no preset \"{}\"; GET /presets lists them",
            name.chars().take(100).collect::<String>()
        ))
    })?;
    Ok(json_response(StatusCode::OK, preset))
}

/// The plain request a create request stands for: itself, or, when it names a
/// preset, the preset filled in with its params and overridden by its own fields. An
/// unknown preset or a missing, unknown or malformed parameter is a 422 naming
/// `preset` or `params.<name>`.
pub(crate) fn expand<'a>(
    presets: &crate::presets::Registry,
    body: &'a Value,
) -> ApiResult<Cow<'a, Value>> {
    presets.apply(body).map_err(refused)
}

/// The 422 problem of a preset request refused: an unknown preset, or a missing,
/// unknown or malformed parameter.
pub(crate) fn refused(errors: Vec<FieldError>) -> ApiError {
    let detail = match errors.as_slice() {
        [one] => format!("{} {}", one.field, one.message),
        many => format!("the preset request has {} problems; see errors", many.len()),
    };
    ApiError {
        errors,
        ..ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid preset request",
            detail,
        )
    }
}
