//! The create request, validated: a [`Spec`] or a list of [`FieldError`]s, each naming
//! its field in words a person can act on.
//!
//! Parsing walks the JSON by hand rather than through `#[derive(Deserialize)]` so that
//! it reports every mistake at once, names each by its dotted path (`poll.initial`),
//! and rejects unknown fields (a typo such as `"wnat"` must never silently mean
//! something else).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::condition::Condition;
use super::duration;
use super::path::ValuePath;
use super::schema;

mod auth;
mod callback;
pub mod dns;
mod fields;
mod method;
mod notify;
mod on_event;
pub mod output;
mod schedule;
mod target;
mod tcp;
pub mod tls;

pub use auth::{Auth, ClientAuth, OAuth2, is_credential_name};
pub use callback::Callback;
use callback::parse_callback;
use fields::{
    Errors, opt, parse_bool, parse_condition, parse_duration, parse_labels, parse_path, parse_set,
    type_name, whole_number,
};
pub use fields::{LABEL_NAME_RULE, close, is_label_name};
pub use method::{MAX_BODY, Method, body_bytes, body_content_type};
use notify::parse_notify;
pub use notify::{MAX_NOTIFY, NOTIFY_EVENTS, Notify, secret_key};
use on_event::parse_on_event;
pub use on_event::{MAX_KEY, OnEvent, SOURCE_NAME_RULE, Then, is_source_name};
use output::parse_output;
pub use output::{Output, Pick};
use schedule::{parse_poll, parse_retry};
pub use target::Target;
use target::parse_target;

/// What the operator allows; the API passes its settings in.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Floor under every poll and retry delay (`--min-poll-interval`).
    pub min_poll_interval: Duration,
    /// Largest `timeout` a request may ask for (`--max-timeout`).
    pub max_timeout: Duration,
    pub max_set_size: usize,
    pub max_value_len: usize,
    pub max_path_len: usize,
    pub max_url_len: usize,
    pub max_headers: usize,
    pub max_header_len: usize,
    pub max_labels: usize,
    pub max_label_len: usize,
    /// Whether a `dns://` target may name its own resolver
    /// (`--dns-tenant-resolvers`); without it only the operator's is asked.
    pub dns_tenant_resolvers: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            min_poll_interval: Duration::from_secs(1),
            max_timeout: Duration::from_secs(24 * 3600),
            max_set_size: 64,
            max_value_len: 256,
            max_path_len: 512,
            max_url_len: 2048,
            max_headers: 32,
            max_header_len: 8192,
            max_labels: 32,
            max_label_len: 256,
            dns_tenant_resolvers: false,
        }
    }
}

/// One validation problem: which field, and what to do about it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// What an HTTP 404 or 410 from the target means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NotFound {
    /// The wait ends in `error` (the default).
    #[default]
    Error,
    /// Not created yet: retried against the retry budget.
    Retry,
    /// Waiting for deletion: gone is done.
    Success,
}

/// Delay between healthy polls: starts at `initial`, multiplied by `factor`, capped
/// at `max`, never below the server's floor, spread by ±`jitter`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Poll {
    /// Default `2s`.
    #[serde(with = "duration::serde_text")]
    #[schema(value_type = Option<schema::DurationText>)]
    pub initial: Duration,
    /// 1 to 10, default 1.5; 1 is a fixed interval.
    #[schema(value_type = Option<f64>, minimum = 1, maximum = 10)]
    pub factor: f64,
    /// Default `15s`.
    #[serde(with = "duration::serde_text")]
    #[schema(value_type = Option<schema::DurationText>)]
    pub max: Duration,
    /// A fraction in [0, 1), default 0.1.
    #[schema(value_type = Option<f64>, minimum = 0, exclusive_maximum = 1)]
    pub jitter: f64,
    /// Wait before the first poll. Default `0s`.
    #[serde(with = "duration::serde_text")]
    #[schema(value_type = Option<schema::DurationText>)]
    pub delay: Duration,
}

/// After a transient error or an unexpected observation the next poll waits
/// `delay`, doubling per consecutive retry up to `max_delay`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// Default `1s`.
    #[serde(with = "duration::serde_text")]
    #[schema(value_type = Option<schema::DurationText>)]
    pub delay: Duration,
    /// Default `30s`.
    #[serde(with = "duration::serde_text")]
    #[schema(value_type = Option<schema::DurationText>)]
    pub max_delay: Duration,
    /// Consecutive retries allowed (0 to 10000), default 10; null retries until the
    /// deadline.
    #[schema(value_type = Option<u32>, minimum = 0, maximum = 10000)]
    pub max_retries: Option<u32>,
}

/// A validated wait request, normalised: every default filled in. Its serialised form
/// is a valid request that means the same thing, and its schema (derived here) is
/// the request's: `POST /waits` takes these fields (plus `preset` and `params`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// What to poll. Required unless a preset gives it, or `callback` stands in
    /// its place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    /// In place of `target`: the wait ends when someone POSTs to its callback URL,
    /// which the create's answer carries (docs/design.md §2.15).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// Where the state lives in the target's JSON body: a JSON Pointer
    /// (`/data/attributes/status`), a JSONPath (`$.items[*].status`), or `@status`
    /// for the HTTP status code. Required with `want`, `fail`, `pending` or `error`;
    /// a wait with only `success_condition` may leave it out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::PathText>)]
    pub state: Option<ValuePath>,
    /// States that mean done (strings, numbers or booleans, compared as JSON text).
    /// With several values at `state`, all must be in `want`. A wait needs `want`,
    /// `success_condition` or both (then both must hold).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Option<Vec<schema::StateValue>>, min_items = 1, max_items = 64)]
    pub want: Vec<String>,
    /// A CEL expression over `body`, `status`, `headers` and `state`: the wait
    /// succeeds when it is true (together with `want` when both are given), on any
    /// response, whatever its status. At most 2048 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::ConditionText>)]
    pub success_condition: Option<Condition>,
    /// A CEL expression like `success_condition`: the wait ends `failed` as soon as
    /// it is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::ConditionText>)]
    pub failure_condition: Option<Condition>,
    /// States that end the wait as `failed` at once; any value in `fail` is enough.
    #[serde(default)]
    #[schema(value_type = Option<Vec<schema::StateValue>>, max_items = 64)]
    pub fail: Vec<String>,
    /// The healthy in-progress states; when given, any other state is retried
    /// against the retry budget. `None` when not given: then every state outside
    /// `want` and `fail` is progress.
    #[serde(default)]
    #[schema(value_type = Option<Vec<schema::StateValue>>, max_items = 64)]
    pub pending: Option<Vec<String>>,
    /// Pointer or JSONPath to a failure detail object, returned as `error_detail`.
    #[serde(default)]
    #[schema(value_type = Option<schema::PathText>)]
    pub error: Option<ValuePath>,
    /// A `want` state counts only after a state outside `want` and `fail` was seen.
    /// Default false.
    #[serde(default)]
    #[schema(value_type = Option<bool>)]
    pub require_transition: bool,
    /// How many successive `want` observations success needs (1 to 100). Default 1.
    #[serde(default = "one")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 100)]
    pub consecutive: u32,
    /// What a 404 or 410 means. Default `error`.
    #[serde(default)]
    #[schema(nullable)]
    pub not_found: NotFound,
    /// Compare states case-insensitively. Default false.
    #[serde(default)]
    #[schema(value_type = Option<bool>)]
    pub ignore_case: bool,
    /// A duration such as `10m`, at most the server's maximum (default 24h).
    /// Default `10m`.
    #[serde(with = "duration::serde_text", default = "default_timeout")]
    #[schema(value_type = Option<schema::DurationText>)]
    pub timeout: Duration,
    #[serde(default)]
    #[schema(nullable)]
    pub poll: Poll,
    #[serde(default)]
    #[schema(nullable)]
    pub retry: Retry,
    /// String labels for listing and filtering (at most 32).
    #[serde(default)]
    #[schema(value_type = Option<schema::Labels>)]
    pub labels: BTreeMap<String, String>,
    /// Webhooks that announce the wait's events (at most 4): a POST per event,
    /// signed by the Standard Webhooks scheme, delivered at least once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 4)]
    pub notify: Vec<Notify>,
    /// What the wait ends with, by name (at most 16): each a JSON Pointer or
    /// JSONPath into the body of the response it ended on, or a CEL expression
    /// over its `body`, `status` and `headers`. A callback wait's output is the
    /// body of the callback that ended it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub output: Output,
    /// Give the wait a nudge URL (in the create's answer, once): a POST to it
    /// schedules a poll now, paced to one a minimum poll interval. A nudge
    /// decides nothing: the poll does. Default false; not on a callback wait.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    #[schema(value_type = Option<bool>)]
    pub nudge: bool,
    /// Listen to an event source (docs/design.md §2.18): an event whose key is
    /// `key` (and that `match` accepts) polls the wait now, or with `then: end`
    /// is judged by its conditions as a callback's body is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_event: Option<OnEvent>,
}

fn one() -> u32 {
    1
}

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

/// The most successive `want` observations a request may ask for.
pub const MAX_CONSECUTIVE: u32 = 100;
/// The most retries a request may allow.
pub const MAX_RETRIES: u32 = 10_000;
/// The largest poll interval growth factor.
pub const MAX_FACTOR: f64 = 10.0;

impl Default for Poll {
    /// The defaults of a request that gives no `poll`, before the server's floor.
    fn default() -> Poll {
        Poll {
            initial: Duration::from_secs(2),
            factor: 1.5,
            max: Duration::from_secs(15),
            jitter: 0.1,
            delay: Duration::ZERO,
        }
    }
}

impl Default for Retry {
    /// The defaults of a request that gives no `retry`, before the server's floor.
    fn default() -> Retry {
        Retry {
            delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
            max_retries: Some(10),
        }
    }
}

pub const REDACTED: &str = "<redacted>";

/// Why a NUL character is refused: one store would keep it and another refuse it.
pub(super) const NUL_REFUSED: &str =
    "contains a NUL character (\\u0000), which waitd does not store; remove it";

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// The fields of a request (and of [`Spec`]); any other is refused.
pub const FIELDS: &[&str] = &[
    "target",
    "callback",
    "state",
    "want",
    "success_condition",
    "failure_condition",
    "fail",
    "pending",
    "error",
    "require_transition",
    "consecutive",
    "not_found",
    "ignore_case",
    "timeout",
    "poll",
    "retry",
    "labels",
    "notify",
    "output",
    "nudge",
    "on_event",
];

impl Spec {
    /// Validates a create request (already merged with its preset, if any).
    pub fn from_request(request: &Value, limits: &Limits) -> Result<Spec, Vec<FieldError>> {
        let mut errs = Errors::default();
        let Some(obj) = request.as_object() else {
            errs.push(
                "",
                "the request body must be a JSON object describing the wait",
            );
            return Err(errs.0);
        };
        errs.unknown(obj, "", FIELDS);

        // A callback stands in the target's place, and any POST to it may end
        // the wait: it needs neither `want` nor `success_condition`.
        let is_callback = opt(obj, "callback").is_some();
        let target = match opt(obj, "callback") {
            None => parse_target(obj.get("target"), limits, &mut errs),
            Some(_) => None,
        };
        // A tcp:// target's state is "connected" or "refused": there is no body
        // to point into, and a wait without want is done when it connects.
        let connects = tcp::kind_of(obj.get("target"));
        let tcp = connects.is_some();
        let done = match connects {
            Some("tls") => "verified",
            Some("grpc") => "SERVING",
            Some("dns") => "resolved",
            _ => "connected",
        };
        let success_condition = parse_condition(obj, "success_condition", &mut errs);
        let failure_condition = parse_condition(obj, "failure_condition", &mut errs);
        let state = match obj.get("state") {
            Some(v) if tcp && !v.is_null() => {
                let states = match done {
                    "verified" => "\"verified\" or \"unverified\"",
                    "SERVING" => {
                        "the serving status: \"SERVING\", \"NOT_SERVING\", \"UNKNOWN\" or \"SERVICE_UNKNOWN\""
                    }
                    "resolved" => "\"resolved\", \"NODATA\" or \"NXDOMAIN\"",
                    _ => "\"connected\" or \"refused\"",
                };
                errs.push("state", format!("is not read from a {}:// target, whose state is {states}; remove it and list the state that means done in want (default [\"{done}\"])", connects.unwrap_or_default()));
                None
            }
            None | Some(Value::Null) if tcp => None,
            None | Some(Value::Null) => {
                // Only a wait decided by its success_condition alone needs no state.
                // An empty `fail` names no state: it is the default, and how a
                // spec without one reads back.
                let needs: Vec<&str> = ["want", "fail", "pending", "error"]
                    .into_iter()
                    .filter(|k| {
                        opt(obj, k).is_some_and(|v| {
                            *k != "fail" || v.as_array().is_none_or(|a| !a.is_empty())
                        })
                    })
                    .collect();
                if !needs.is_empty() || (opt(obj, "success_condition").is_none() && !is_callback) {
                    let why = if needs.is_empty() {
                        String::new()
                    } else {
                        format!(" (with {})", needs.join(", "))
                    };
                    errs.push("state", format!("is required{why}: a JSON Pointer such as \"/data/attributes/status\" or a JSONPath such as \"$.status\"; a wait decided by success_condition alone may leave it out"));
                }
                None
            }
            Some(v) => parse_path("state", v, limits, &mut errs),
        };
        let error = match obj.get("error") {
            None | Some(Value::Null) => None,
            Some(v) => match parse_path("error", v, limits, &mut errs) {
                Some(ValuePath::HttpStatus) => {
                    errs.push("error", "is \"@status\", the HTTP status code, which carries no failure detail; point it at a JSON Pointer or JSONPath in the body");
                    None
                }
                other => other,
            },
        };
        let want = match obj.get("want") {
            None | Some(Value::Null) if tcp && opt(obj, "success_condition").is_none() => {
                vec![done.to_string()]
            }
            None | Some(Value::Null) => {
                if opt(obj, "success_condition").is_none() && !is_callback {
                    errs.push(
                        "want",
                        "is required unless success_condition is given: list the states that mean done, e.g. [\"on\"]",
                    );
                }
                Vec::new()
            }
            Some(v) => {
                let set = parse_set("want", v, limits, &mut errs);
                if set.as_ref().is_some_and(Vec::is_empty) {
                    errs.push("want", "must list at least one state");
                }
                set.unwrap_or_default()
            }
        };
        let fail = opt(obj, "fail")
            .and_then(|v| parse_set("fail", v, limits, &mut errs))
            .unwrap_or_default();
        let pending = opt(obj, "pending").and_then(|v| parse_set("pending", v, limits, &mut errs));
        let require_transition = parse_bool(obj, "require_transition", &mut errs).unwrap_or(false);
        let ignore_case = parse_bool(obj, "ignore_case", &mut errs).unwrap_or(false);
        let consecutive = match opt(obj, "consecutive") {
            None => 1,
            Some(v) => match whole_number(v) {
                Some(n) if (1..=u64::from(MAX_CONSECUTIVE)).contains(&n) => n as u32,
                _ => {
                    errs.push("consecutive", "must be a whole number from 1 to 100");
                    1
                }
            },
        };
        let not_found = match opt(obj, "not_found") {
            None => NotFound::Error,
            Some(Value::String(s)) if s == "error" => NotFound::Error,
            Some(Value::String(s)) if s == "retry" => NotFound::Retry,
            Some(Value::String(s)) if s == "success" => NotFound::Success,
            Some(_) => {
                errs.push("not_found", "must be \"error\", \"retry\" (not created yet) or \"success\" (waiting for deletion)");
                NotFound::Error
            }
        };
        let timeout = match opt(obj, "timeout") {
            None => DEFAULT_TIMEOUT.min(limits.max_timeout),
            Some(v) => parse_duration("timeout", v, &mut errs).unwrap_or(DEFAULT_TIMEOUT),
        };
        if timeout.is_zero() {
            errs.push("timeout", "must be longer than 0s");
        } else if timeout > limits.max_timeout {
            errs.push(
                "timeout",
                format!(
                    "is {}, longer than this server's maximum of {}",
                    duration::format(timeout),
                    duration::format(limits.max_timeout)
                ),
            );
        }
        let callback = match opt(obj, "callback") {
            None => None,
            Some(_) if opt(obj, "target").is_some() => {
                errs.push(
                    "callback",
                    "is given with target: a wait either polls its target or waits for its callback; remove one",
                );
                None
            }
            Some(v) => {
                // Each callback's body is judged alone: nothing counts across them.
                if consecutive != 1 {
                    errs.push("consecutive", "is not read on a callback wait, where each callback's body is judged alone; remove it");
                }
                if require_transition {
                    errs.push("require_transition", "is not read on a callback wait, where each callback's body is judged alone; remove it");
                }
                parse_callback(v, timeout, &mut errs)
            }
        };
        let poll = parse_poll(opt(obj, "poll"), timeout, limits, &mut errs);
        let retry = parse_retry(opt(obj, "retry"), limits, &mut errs);
        let labels = parse_labels(opt(obj, "labels"), limits, &mut errs);
        let notify = parse_notify(opt(obj, "notify"), limits, &mut errs);
        let output = match opt(obj, "output") {
            Some(_) if is_callback => {
                errs.push("output", "is not read on a callback wait, whose output is the body of the callback that ends it; remove it");
                None
            }
            Some(v) => parse_output(v, limits, &mut errs),
            None => None,
        }
        .unwrap_or_default();
        let nudge = parse_bool(obj, "nudge", &mut errs).unwrap_or(false);
        if nudge && is_callback {
            errs.push("nudge", "is not read on a callback wait, which has nothing to poll: its callback URL ends it; remove it");
        }
        let on_event = opt(obj, "on_event").and_then(|v| parse_on_event(v, is_callback, &mut errs));
        // An event's body is judged alone, as a callback's is: nothing counts across.
        if on_event.as_ref().is_some_and(|o| o.then == Then::End) {
            if consecutive != 1 {
                errs.push("on_event.then", format!("is \"end\", which judges each event's body alone, so consecutive ({consecutive}) could never be reached by an event; use \"poll\", or leave consecutive out"));
            }
            if require_transition {
                errs.push("on_event.then", "is \"end\", which judges each event's body alone, so require_transition could never be met by an event; use \"poll\", or leave require_transition out");
            }
        }

        // Contradictions between the sets.
        let fold = |s: &String| {
            if ignore_case {
                s.to_lowercase()
            } else {
                s.clone()
            }
        };
        for w in &want {
            if fail.iter().any(|f| fold(f) == fold(w)) {
                errs.push(
                    "fail",
                    format!("\"{w}\" is in both want and fail; a state can mean only one of them"),
                );
            }
        }
        if let Some(p) = &pending {
            for s in p {
                if want.iter().chain(fail.iter()).any(|x| fold(x) == fold(s)) {
                    errs.push("pending", format!("\"{s}\" is also in want or fail; pending lists the in-progress states only"));
                }
            }
        }

        if !errs.0.is_empty() {
            return Err(errs.0);
        }
        Ok(Spec {
            target,
            callback,
            state,
            want,
            success_condition,
            failure_condition,
            fail,
            pending,
            error,
            require_transition,
            consecutive,
            not_found,
            ignore_case,
            timeout,
            poll: poll.expect("poll is Some when there are no errors"),
            retry: retry.expect("retry is Some when there are no errors"),
            labels,
            notify,
            output,
            nudge,
            on_event,
        })
    }

    /// The spec as every read path shows it: header values replaced by `<redacted>`.
    pub fn redacted(&self) -> Spec {
        let mut s = self.clone();
        if let Some(t) = &mut s.target {
            t.redact();
        }
        for n in &mut s.notify {
            n.secret = REDACTED.to_string();
        }
        s
    }

    /// The wait's conditions, failure first.
    pub fn conditions(&self) -> Vec<&Condition> {
        self.failure_condition
            .iter()
            .chain(self.success_condition.iter())
            .collect()
    }

    /// Whether `value` is in `set`, honouring `ignore_case`.
    pub fn set_contains(&self, set: &[String], value: &str) -> bool {
        if self.ignore_case {
            set.iter().any(|s| s.to_lowercase() == value.to_lowercase())
        } else {
            set.iter().any(|s| s == value)
        }
    }
}
