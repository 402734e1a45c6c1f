//! What a create asks of the operator's rules before anything is stored: the SSRF
//! guard on a spec's target, token endpoint and webhook URLs, and the operator's
//! word on the credential it names.

use axum::http::StatusCode;

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::engine::Spec;

/// The SSRF guard on a spec's target, token endpoint and webhook URLs, and the
/// operator's word on the credential it names, with `at` naming where the spec
/// is.
pub(super) fn guard(
    s: &AppState,
    tenant: &str,
    spec: &Spec,
    at: &str,
    target: bool,
) -> ApiResult<()> {
    if target && let Some(own) = &spec.target {
        if let Some(crate::engine::spec::Auth::Credential(name)) = &own.auth {
            let url = url::Url::parse(&own.url)
                .map_err(|e| ApiError::bad_request(format!("{at}target.url: {e}")))?;
            let granted = s
                .credentials
                .for_target(tenant, name, &url)
                .map_err(|why| {
                    ApiError::new(
                        StatusCode::FORBIDDEN,
                        "Credential not allowed",
                        format!("{at}target.auth.credential: {why}"),
                    )
                })?;
            if granted.tls.is_some() && own.tls.is_some() {
                return Err(ApiError::bad_request(format!(
                    "{at}target.tls: the credential \"{name}\" brings its own TLS settings; remove target.tls"
                )));
            }
        }
        let url = url::Url::parse(&own.url)
            .map_err(|e| ApiError::bad_request(format!("{at}target.url: {e}")))?;
        s.guard
            .check_url(&url)
            .map_err(|refused| ApiError::unprocessable(format!("{at}target.url: {refused}")))?;
        if let Some(crate::engine::spec::Auth::Oauth2(o)) = &own.auth {
            let url = url::Url::parse(&o.token_url).map_err(|e| {
                ApiError::bad_request(format!("{at}target.auth.oauth2.token_url: {e}"))
            })?;
            s.guard.check_url(&url).map_err(|refused| {
                ApiError::unprocessable(format!(
                    "{at}target.auth.oauth2.token_url: {}",
                    refused
                        .to_string()
                        .replacen("the target host", "the token endpoint's host", 1)
                ))
            })?;
        }
    }
    for (i, n) in spec.notify.iter().enumerate() {
        let url = url::Url::parse(&n.url)
            .map_err(|e| ApiError::bad_request(format!("{at}notify[{i}].url: {e}")))?;
        s.guard.check_url(&url).map_err(|refused| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Webhook refused",
                format!(
                    "{at}notify[{i}].url: {}",
                    refused
                        .to_string()
                        .replacen("the target host", "the webhook host", 1)
                ),
            )
        })?;
    }
    Ok(())
}
