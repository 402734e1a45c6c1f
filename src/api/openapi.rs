//! The OpenAPI 3.1 document, generated from the handlers' annotations. The committed
//! copy at `openapi/openapi.json` is checked against it by a test.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::OpenApi;

use crate::api::error::{Problem, ProblemField};
use crate::api::events::EventPage;
use crate::api::presets::PresetList;
use crate::api::waits::WaitPage;
use crate::model::{Ending, Event, EventBody, Status, Wait};
use crate::presets::{Param, ParamKind, Preset, PresetSummary};

/// The request body of `POST /waits`. Unknown fields are rejected.
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)] // documentation only: requests are parsed by `Spec::from_request`
pub struct CreateWait {
    /// A named waiter definition (`GET /presets` lists them) whose fields this request starts from; the request's own fields override them (objects merge key by key, arrays are replaced). An unknown preset is a 422.
    pub preset: Option<String>,
    /// Values for the preset's `{param}` placeholders, by name; `base_url` points a preset at another host. A missing or unknown parameter is a 422 naming `params.<name>`.
    pub params: Option<BTreeMap<String, String>>,
    /// What to poll. Required unless a preset gives it.
    pub target: Option<TargetSchema>,
    /// Where the state lives in the target's JSON body: a JSON Pointer (`/data/attributes/status`) or a JSONPath (`$.items[*].status`). Required unless a preset gives it.
    pub state: Option<String>,
    /// States that mean done (strings, numbers or booleans, compared as JSON text). With several values at `state`, all must be in `want`. Required unless a preset gives it.
    pub want: Option<Vec<String>>,
    /// States that end the wait as `failed` at once; any value in `fail` is enough.
    pub fail: Option<Vec<String>>,
    /// The healthy in-progress states; when given, any other state is retried against the retry budget.
    pub pending: Option<Vec<String>>,
    /// Pointer or JSONPath to a failure detail object, returned as `error_detail`.
    pub error: Option<String>,
    /// A `want` state counts only after a state outside `want` and `fail` was seen. Default false.
    pub require_transition: Option<bool>,
    /// How many successive `want` observations success needs (1–100). Default 1.
    pub consecutive: Option<u32>,
    /// What a 404 or 410 means: `error` (default), `retry`, `success`.
    pub not_found: Option<String>,
    /// Compare states case-insensitively. Default false.
    pub ignore_case: Option<bool>,
    /// Duration such as `10m`, at most the server's maximum (default 24h). Default 10m.
    pub timeout: Option<String>,
    pub poll: Option<PollSchema>,
    pub retry: Option<RetrySchema>,
    /// String labels for listing and filtering (at most 32).
    pub labels: Option<BTreeMap<String, String>>,
}

/// What to poll.
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct TargetSchema {
    /// An http or https URL (at most 2048 bytes; no credentials in it).
    pub url: String,
    /// Request headers (at most 32). Values are secrets: write-only, shown as `<redacted>`.
    pub headers: Option<BTreeMap<String, String>>,
}

/// Delay between healthy polls: starts at `initial`, multiplied by `factor`, capped at `max`, never below the server's floor, spread by ±`jitter`.
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct PollSchema {
    /// Default `2s`.
    pub initial: Option<String>,
    /// 1–10, default 1.5; 1 is a fixed interval.
    pub factor: Option<f64>,
    /// Default `15s`.
    pub max: Option<String>,
    /// A fraction in [0, 1), default 0.1.
    pub jitter: Option<f64>,
    /// Wait before the first poll. Default `0s`.
    pub delay: Option<String>,
}

/// After a transient error or an unexpected observation the next poll waits `delay`, doubling per consecutive retry up to `max_delay`.
#[derive(Serialize, utoipa::ToSchema)]
#[allow(dead_code)]
pub struct RetrySchema {
    /// Default `1s`.
    pub delay: Option<String>,
    /// Default `30s`.
    pub max_delay: Option<String>,
    /// Consecutive retries allowed (0–10000), default 10; null retries until the deadline.
    pub max_retries: Option<u32>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "waitd",
        description = "An HTTP service that waits for you: it polls a URL until a JSON state is reached and reports it by GET, by a blocking GET, and by server-sent events.",
        license(name = "Apache-2.0"),
    ),
    paths(
        super::waits::create,
        super::waits::get_one,
        super::waits::list,
        super::waits::cancel,
        super::events::wait_events,
        super::events::all_events,
        super::presets::list,
        super::presets::get_one,
    ),
    components(schemas(Wait, Status, Event, EventBody, Ending, WaitPage, EventPage, Problem, ProblemField, CreateWait, TargetSchema, PollSchema, RetrySchema, PresetList, Preset, PresetSummary, Param, ParamKind)),
    modifiers(&Security),
    tags(
        (name = "waits", description = "Create, read, list, block on and cancel waits"),
        (name = "events", description = "A wait's history, and live streams"),
        (name = "presets", description = "Named waiter definitions a create request can start from"),
    )
)]
pub struct ApiDoc;

/// Bearer tokens on every route of the API (health, readiness, metrics and this
/// document stay open), and the responses every authenticated route can give.
struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
        };
        use utoipa::openapi::{ContentBuilder, RefOr, ResponseBuilder};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        doc.security = Some(vec![SecurityRequirement::new(
            "bearer",
            Vec::<String>::new(),
        )]);
        let problem = || {
            ContentBuilder::new()
                .schema(Some(utoipa::openapi::Ref::from_schema_name("Problem")))
                .build()
        };
        for item in doc.paths.paths.values_mut() {
            for op in [&mut item.get, &mut item.post].into_iter().flatten() {
                let responses = &mut op.responses.responses;
                responses.entry("401".into()).or_insert_with(|| {
                    RefOr::T(
                        ResponseBuilder::new()
                            .description(
                                "Missing or invalid API token (when tokens are configured)",
                            )
                            .content("application/problem+json", problem())
                            .build(),
                    )
                });
                responses.entry("429".into()).or_insert_with(|| {
                    RefOr::T(
                        ResponseBuilder::new()
                            .description("Over this token's request rate; see Retry-After")
                            .content("application/problem+json", problem())
                            .build(),
                    )
                });
                responses.entry("503".into()).or_insert_with(|| {
                    RefOr::T(
                        ResponseBuilder::new()
                            .description("The store is unreachable; try again shortly")
                            .content("application/problem+json", problem())
                            .build(),
                    )
                });
            }
        }
    }
}

/// The document as pretty JSON, with a trailing newline.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut s = doc
        .to_pretty_json()
        .expect("the OpenAPI document serialises");
    s.push('\n');
    s
}
