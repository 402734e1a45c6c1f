//! What a request says besides its route: the query string, read into a typed struct
//! per route (unknown parameters refused), the `{id}` of a wait route, and the JSON
//! body. Every failure is the API's own problem+json with a sentence, not the
//! framework's text.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use uuid::Uuid;

use super::AppState;
use super::error::ApiError;
use crate::engine::Limits;
use crate::engine::spec::{LABEL_NAME_RULE, is_label_name};
use crate::model::Status;
use crate::store::ListFilter;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Longest `Idempotency-Key`.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;

/// A query string as `T` (repeated keys collect into a `Vec`). A parameter `T` does
/// not know, one given twice that takes one value, or a value of the wrong form, is
/// a 400 that says which.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let q = parts.uri.query().unwrap_or("");
        serde_html_form::from_str(q)
            .map(ApiQuery)
            .map_err(|e| query_error(q, &e.to_string()))
    }
}

/// The sentence for a query `T` could not be read from.
fn query_error(query: &str, serde_says: &str) -> ApiError {
    let quoted = |s: &str| s.split('`').nth(1).map(str::to_string);
    if let Some(rest) = serde_says.strip_prefix("unknown field ") {
        let name: String = quoted(rest).unwrap_or_default().chars().take(64).collect();
        let takes = match rest.split_once("expected ") {
            Some((_, names)) => names
                .trim_start_matches("one of ")
                .replace('`', "")
                .to_string(),
            None => "no parameters".to_string(),
        };
        return ApiError::bad_request(format!(
            "unknown query parameter \"{}\"; this route takes {takes}",
            name.escape_debug()
        ));
    }
    // A key given twice where one value is read.
    let mut seen = std::collections::HashSet::new();
    let twice = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, _)| k.into_owned())
        .find(|k| k != "label" && !seen.insert(k.clone()));
    match twice {
        Some(k) => ApiError::bad_request(format!(
            "the query parameter \"{}\" is given more than once; give it once",
            k.chars().take(64).collect::<String>().escape_debug()
        )),
        None => ApiError::bad_request(format!(
            "the query string could not be read: {}",
            serde_says.chars().take(200).collect::<String>()
        )),
    }
}

/// The `{id}` of a wait route. Anything that is not a UUID (including text that is
/// not even UTF-8) is a wait that does not exist: a 404 problem, like any other.
pub struct WaitId(pub Uuid);

impl<S: Send + Sync> FromRequestParts<S> for WaitId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<WaitId, ApiError> {
        let raw = Path::<String>::from_request_parts(parts, state).await.ok();
        let text = raw.as_ref().map(|p| p.0.as_str()).unwrap_or("");
        Uuid::parse_str(text).map(WaitId).map_err(|_| {
            ApiError::not_found(format!(
                "there is no wait \"{}\"; wait ids are UUIDs such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21",
                text.chars().take(64).collect::<String>()
            ))
        })
    }
}

/// How long a request may hold its response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// `?wait=true`: until the wait ends.
    UntilEnd,
    /// `?wait=30s`: until the wait ends or this passes.
    For(Duration),
}

/// The query of `POST /waits` and `GET /waits/{id}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HoldQuery {
    /// Hold the response until the wait ends (`true`), or until it ends or this
    /// duration passes (`30s`, `5m`); `false` (the default) answers at once.
    #[param(pattern = r"^(|true|false|([0-9]+(ms|s|m|h|d))+)$")]
    pub wait: Option<String>,
}

impl HoldQuery {
    pub fn hold(&self) -> Result<Option<Hold>, ApiError> {
        match self.wait.as_deref() {
            None | Some("false") => Ok(None),
            Some("true") | Some("") => Ok(Some(Hold::UntilEnd)),
            // Longer than anything can last: as long as it takes.
            Some(d) => crate::engine::duration::parse_saturating(d)
                .map(|d| Some(Hold::For(d)))
                .map_err(|e| {
                    ApiError::bad_request(format!(
                        "wait {e}; or use wait=true to hold until the wait ends"
                    ))
                }),
        }
    }
}

/// The query of `GET /waits`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only waits with this status.
    #[param(value_type = Option<Status>)]
    pub status: Option<String>,
    /// `key:value`; repeat for several (all must match; at most 32).
    #[serde(default)]
    #[param(value_type = Option<Vec<String>>, max_items = 32, pattern = r"^[A-Za-z0-9._/-]{1,63}:[^\u0000-\u001f\u007f-\u009f]{0,256}$")]
    pub label: Vec<String>,
    /// How many, from 1 to 500 (default 50).
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
    /// Pass `next_cursor` of the previous page.
    #[param(value_type = Option<String>, format = Uuid)]
    pub cursor: Option<String>,
}

/// Most waits a list page gives.
pub const MAX_PAGE: i64 = 500;

impl ListQuery {
    /// The filter this query stands for, with a sentence for each bad value.
    pub fn filter(&self, limits: &Limits) -> Result<ListFilter, ApiError> {
        let mut filter = ListFilter {
            limit: 50,
            labels: labels(&self.label, limits)?,
            ..Default::default()
        };
        if let Some(st) = &self.status {
            filter.status = Some(st.parse::<Status>().map_err(|_| {
                ApiError::bad_request(format!("status must be one of {}", Status::list()))
            })?);
        }
        if let Some(l) = &self.limit {
            filter.limit = l
                .parse::<i64>()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "limit must be a whole number from 1 to {MAX_PAGE}"
                    ))
                })?;
        }
        if let Some(c) = &self.cursor {
            // Only the hyphenated form this server gives out (the schema's `uuid`).
            let hyphenated = Some(c).filter(|c| c.len() == 36);
            filter.before = Some(
                hyphenated
                    .and_then(|c| Uuid::parse_str(c).ok())
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "cursor is not one this server gave out; pass next_cursor as it came",
                        )
                    })?,
            );
        }
        Ok(filter)
    }
}

/// How an events route answers: a JSON page, or a stream of server-sent events
/// (`Accept: text/event-stream` or `?follow=true`).
pub fn wants_stream(headers: &HeaderMap, follow: Option<&str>) -> Result<bool, ApiError> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .contains("text/event-stream");
    let follow = match follow {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            return Err(ApiError::bad_request(
                "follow must be true or false, as in follow=true",
            ));
        }
    };
    Ok(accept || follow)
}

/// The header an events route resumes from.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct ResumeHeader {
    /// Resume after this event (browsers send it on reconnect); takes the place of
    /// `after`.
    #[param(rename = "Last-Event-ID", nullable = false, pattern = "^[0-9]{0,18}$")]
    pub last_event_id: Option<String>,
}

impl ResumeHeader {
    /// The header as sent; an empty one is none.
    pub fn read(headers: &HeaderMap) -> Result<ResumeHeader, ApiError> {
        let last_event_id = match headers.get("last-event-id") {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| not_an_event_id())?.to_string()),
        };
        Ok(ResumeHeader {
            last_event_id: last_event_id.filter(|v| !v.is_empty()),
        })
    }
}

fn not_an_event_id() -> ApiError {
    ApiError::bad_request("Last-Event-ID (or after) must be an event id this server sent")
}

/// The position a stream or page resumes after: `Last-Event-ID` (as browsers send
/// on reconnect), else `?after=`, else the start.
pub fn resume_point(headers: &HeaderMap, after: Option<&str>) -> Result<i64, ApiError> {
    // Both are checked, though the header wins: a bad value is never ignored.
    let from_query = after.map(event_id).transpose()?;
    let from_header = ResumeHeader::read(headers)?
        .last_event_id
        .as_deref()
        .map(event_id)
        .transpose()?;
    Ok(from_header.or(from_query).unwrap_or(0))
}

/// An event id as this server writes it: up to 18 digits (empty: the start).
fn event_id(v: &str) -> Result<i64, ApiError> {
    if v.is_empty() {
        return Ok(0);
    }
    Some(v)
        .filter(|v| v.len() <= 18 && v.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|v| v.parse::<i64>().ok())
        .ok_or_else(not_an_event_id)
}

/// The query of `GET /waits/{id}/events`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitEventsQuery {
    /// Only events with a greater `seq` (empty: from the start).
    #[param(pattern = "^[0-9]{0,18}$")]
    pub after: Option<String>,
    /// Stream as server-sent events.
    #[param(value_type = Option<bool>)]
    pub follow: Option<String>,
}

/// The query of `GET /events`.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Only events with a greater global `id`, or `latest` for events from now on
    /// (as JSON: an empty page whose `next_cursor` is the newest id).
    #[param(pattern = "^(|[0-9]{1,18}|latest)$")]
    pub after: Option<String>,
    /// Stream as server-sent events.
    #[param(value_type = Option<bool>)]
    pub follow: Option<String>,
    /// `key:value`; repeat for several (all must match; at most 32).
    #[serde(default)]
    #[param(value_type = Option<Vec<String>>, max_items = 32, pattern = r"^[A-Za-z0-9._/-]{1,63}:[^\u0000-\u001f\u007f-\u009f]{0,256}$")]
    pub label: Vec<String>,
}

/// The query of a route that takes no parameters.
#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NoQuery {}

/// The `label=key:value` filters of a list or a feed. A key that no wait can carry,
/// a value that none can hold, or more filters than a wait has labels, match
/// nothing: each is a 400 with a sentence, never a query.
pub fn labels(given: &[String], limits: &Limits) -> Result<BTreeMap<String, String>, ApiError> {
    if given.len() > limits.max_labels {
        return Err(ApiError::bad_request(format!(
            "more than {} label filters; a wait has at most {} labels",
            limits.max_labels, limits.max_labels
        )));
    }
    let mut labels = BTreeMap::new();
    for v in given {
        let (lk, lv) = v.split_once(':').ok_or_else(|| {
            ApiError::bad_request("label must be written key:value, e.g. label=pipeline:1234")
        })?;
        let shown: String = lk.chars().take(64).collect();
        if !is_label_name(lk) {
            return Err(ApiError::bad_request(format!(
                "label \"{}\" {LABEL_NAME_RULE}",
                shown.escape_debug()
            )));
        }
        if lv.len() > limits.max_label_len || lv.chars().any(char::is_control) {
            return Err(ApiError::bad_request(format!(
                "the value of label {shown} is longer than {} bytes or has a control character, so no wait can carry it",
                limits.max_label_len
            )));
        }
        match labels.get(lk) {
            // Two values for one label: all filters must match and a wait has one
            // value per label, so nothing matches. Said with a value no wait can
            // carry (label values have no control characters), which every store
            // and the live feed compare like any other.
            Some(before) if before != lv => {
                labels.insert(lk.to_string(), UNMATCHABLE.to_string());
            }
            _ => {
                labels.insert(lk.to_string(), lv.to_string());
            }
        }
    }
    Ok(labels)
}

/// A label value no wait carries: what a label filtered on two values becomes.
const UNMATCHABLE: &str = "\u{7}";

/// The header that makes a create safe to repeat.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IdempotencyHeader {
    /// Makes a repeated POST answer with the first wait (and hold on it when asked
    /// to); the same key with another body is a 409.
    #[param(
        rename = "Idempotency-Key",
        nullable = false,
        min_length = 1,
        max_length = 255
    )]
    pub idempotency_key: Option<String>,
}

/// The `Idempotency-Key` header: one, of 1 to 255 visible ASCII characters (no
/// space or tab, which a header value may hold but a key should not: `a b` and
/// `a  b` would be two keys a person cannot tell apart).
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut all = headers.get_all("idempotency-key").iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(ApiError::bad_request(
            "Idempotency-Key was sent more than once; send it once",
        ));
    }
    let bytes = v.as_bytes();
    if bytes.is_empty()
        || bytes.len() > MAX_IDEMPOTENCY_KEY
        || !bytes.iter().all(u8::is_ascii_graphic)
    {
        return Err(ApiError::bad_request(format!(
            "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters, without spaces"
        )));
    }
    Ok(Some(String::from_utf8_lossy(bytes).into_owned()))
}

/// A JSON request body, with every failure rendered as problem+json: a wrong
/// content type (415), a body over [`MAX_BODY`] (413, at once when its
/// `Content-Length` says so), a body not sent within `--body-timeout` (408), a body
/// that breaks off or whose chunked framing is malformed (400), or JSON that does
/// not parse or names a key twice in one object (400, [`super::strict`]).
pub struct JsonBody(pub Value);

impl FromRequest<AppState> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, s: &AppState) -> Result<JsonBody, ApiError> {
        check_content_type(req.headers())?;
        let announced = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if announced.is_some_and(|n| n > MAX_BODY as u64) {
            return Err(too_large());
        }
        let bytes = match tokio::time::timeout(s.body_timeout, read_body(req)).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "Request timeout",
                    format!(
                        "the request body did not arrive within {}",
                        crate::engine::duration::format(s.body_timeout)
                    ),
                ));
            }
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "the request body is empty; send the wait as a JSON object",
            ));
        }
        super::strict::from_slice(&bytes)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
    }
}

fn too_large() -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "Request too large",
        format!("the request body is over the {} KiB limit", MAX_BODY / 1024),
    )
}

/// The body's bytes, refused as soon as they pass [`MAX_BODY`].
async fn read_body(req: Request) -> Result<Vec<u8>, ApiError> {
    use futures_util::StreamExt;
    let mut stream = req.into_body().into_data_stream();
    let mut bytes: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| {
            ApiError::bad_request(
                "the request body could not be read: it broke off, or its chunked encoding is malformed",
            )
        })?;
        if bytes.len() + chunk.len() > MAX_BODY {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// JSON, or no type, or curl's `-d` default (form-urlencoded) whose body is JSON:
/// so that `curl -d @spec.json` works as written.
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime == "application/json"
        || mime.ends_with("+json")
        || mime == "application/x-www-form-urlencoded"
    {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Unsupported media type",
            format!("the request body must be JSON (Content-Type: application/json), not {mime}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_parameter_is_named_with_what_the_route_takes() {
        let e = serde_html_form::from_str::<HoldQuery>("wiat=1s")
            .err()
            .unwrap();
        let p = query_error("wiat=1s", &e.to_string());
        assert_eq!(
            p.detail,
            "unknown query parameter \"wiat\"; this route takes wait"
        );
        let e = serde_html_form::from_str::<NoQuery>("x=1").err().unwrap();
        let p = query_error("x=1", &e.to_string());
        assert_eq!(
            p.detail,
            "unknown query parameter \"x\"; this route takes no parameters"
        );
    }

    #[test]
    fn a_parameter_given_twice_is_named_and_labels_repeat() {
        let q = "wait=1s&wait=2s";
        let e = serde_html_form::from_str::<HoldQuery>(q).err();
        assert!(e.is_some(), "a repeated wait is not read as one value");
        let p = query_error(q, &e.unwrap().to_string());
        assert!(
            p.detail.contains("\"wait\" is given more than once"),
            "{}",
            p.detail
        );
        let q: ListQuery = serde_html_form::from_str("label=a:1&label=b:2").unwrap();
        assert_eq!(q.label, ["a:1", "b:2"]);
        let q = "label=a:1&label=b:2&limit=1&limit=2";
        let e = serde_html_form::from_str::<ListQuery>(q).err().unwrap();
        let p = query_error(q, &e.to_string());
        assert!(
            p.detail.contains("\"limit\" is given more than once"),
            "{}",
            p.detail
        );
    }
}
