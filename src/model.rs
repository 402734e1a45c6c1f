//! waitd's vocabulary: what a wait is, how it can stand, and what its history
//! records. The API serves these types, the client reads them back, the store maps
//! them to rows, the worker writes them, and the OpenAPI document is derived from
//! them; a status or an event kind is spelled once, here, in its serde (and SQL)
//! form.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::engine;

mod delivery;
pub use delivery::{Attempt, Delivery, DeliveryPage, DeliveryStatus, DropReason, webhook_id};

/// Every timestamp waitd writes, in a response, an event or a webhook, has
/// millisecond precision: a wait reads the same from the answer to its create as
/// from any later read, whichever store keeps it (Postgres keeps microseconds,
/// the clock gives nanoseconds).
mod millis {
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&t.to_rfc3339_opts(SecondsFormat::Millis, true))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        DateTime::<Utc>::deserialize(d)
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(
            t: &Option<DateTime<Utc>>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => super::serialize(t, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<DateTime<Utc>>, D::Error> {
            Option::<DateTime<Utc>>::deserialize(d)
        }
    }
}

/// How a wait stands. Every status but `running` is an end, and an end is final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Still being polled.
    Running,
    /// The target reached a `want` state (or was gone, with `not_found: "success"`).
    Succeeded,
    /// The target reported a `fail` state.
    Failed,
    /// The deadline passed first.
    TimedOut,
    /// A client canceled it.
    Canceled,
    /// waitd could not tell: a permanent HTTP error, retries exhausted, a body it
    /// could not read…
    Error,
}

impl Status {
    pub const ALL: [Status; 6] = [
        Status::Running,
        Status::Succeeded,
        Status::Failed,
        Status::TimedOut,
        Status::Canceled,
        Status::Error,
    ];

    /// The ends, in the order metrics list them.
    pub const ENDS: [Status; 5] = [
        Status::Succeeded,
        Status::Failed,
        Status::TimedOut,
        Status::Error,
        Status::Canceled,
    ];

    /// The serde (and SQL) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::TimedOut => "timed_out",
            Status::Canceled => "canceled",
            Status::Error => "error",
        }
    }

    pub fn is_end(self) -> bool {
        self != Status::Running
    }

    /// `running, succeeded, …`: for sentences that list the choices.
    pub fn list() -> String {
        Status::ALL.map(Status::as_str).join(", ")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Status, UnknownStatus> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownStatus(s.chars().take(64).collect()))
    }
}

/// A status text that is none of [`Status::ALL`].
#[derive(Debug, thiserror::Error)]
#[error(
    "\"{0}\" is not a status; a status is one of running, succeeded, failed, timed_out, canceled, error"
)]
pub struct UnknownStatus(pub String);

impl From<engine::End> for Status {
    fn from(e: engine::End) -> Status {
        match e {
            engine::End::Succeeded => Status::Succeeded,
            engine::End::Failed => Status::Failed,
            engine::End::TimedOut => Status::TimedOut,
            engine::End::Error => Status::Error,
        }
    }
}

/// An engine event as the API records it.
impl From<&engine::Event> for EventBody {
    fn from(e: &engine::Event) -> EventBody {
        match e {
            engine::Event::State { from, to } => EventBody::State {
                from: from.clone(),
                to: to.clone(),
            },
            engine::Event::Retry {
                error,
                attempt,
                delay,
            } => EventBody::Retry {
                error: error.clone(),
                attempt: *attempt,
                delay: engine::duration::format(*delay),
            },
        }
    }
}

/// A wait as clients see it (`GET /waits/{id}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Wait {
    pub id: Uuid,
    pub status: Status,
    /// The last observed state (several values joined by ", "); null before the first good poll.
    pub state: Option<String>,
    /// One human sentence once the wait has ended.
    pub reason: Option<String>,
    /// From the spec's `error` path, when the wait failed: any JSON value.
    #[schema(value_type = Option<Value>)]
    pub error_detail: Option<Value>,
    /// The last transient or probe error.
    pub last_error: Option<String>,
    /// What the wait ended with: the body of the callback that ended a callback
    /// wait, or the values the spec's `output` names, taken from the response a
    /// polled wait ended on. At most 64 KiB of JSON; null otherwise.
    #[serde(default)]
    #[schema(value_type = Option<Value>)]
    pub output: Option<Value>,
    pub polls: i32,
    pub retries: i32,
    #[serde(with = "millis")]
    pub created_at: DateTime<Utc>,
    #[serde(with = "millis")]
    pub updated_at: DateTime<Utc>,
    #[serde(with = "millis")]
    pub deadline: DateTime<Utc>,
    #[serde(default, with = "millis::option")]
    pub next_poll_at: Option<DateTime<Utc>>,
    /// When `polls`, `retries` and `next_poll_at` were true: the moment of the read
    /// when the replica answering is the one polling the wait (always so with one
    /// replica); otherwise when they were last recorded, which for a running wait
    /// whose state does not change is at most ten lease TTLs before.
    #[serde(with = "millis")]
    pub progress_at: DateTime<Utc>,
    /// How the last poll's response came: `sent` (this wait's own request),
    /// `shared` (the response to an identical request of the same tenant begun
    /// within the share window), `not_modified` (the target answered `304` to a
    /// conditional request, so the previous response was read again) or `paused`
    /// (no request: the host asked for quiet). Null before the first poll, and
    /// when the replica answering the read does not poll the wait.
    #[serde(default)]
    pub last_poll: Option<LastPoll>,
    #[serde(default, with = "millis::option")]
    pub finished_at: Option<DateTime<Utc>>,
    #[schema(value_type = crate::engine::schema::Labels)]
    pub labels: BTreeMap<String, String>,
    /// The normalised request; every header value reads "<redacted>".
    #[schema(value_type = crate::engine::Spec)]
    pub spec: Value,
    /// A group's mode and members, or the group a member belongs to.
    #[serde(flatten)]
    pub grouping: Grouping,
}

/// How a poll's response came to the wait (`last_poll` of a wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LastPoll {
    /// The wait's own request was sent and answered.
    Sent,
    /// The response to an identical request of the same tenant, begun since the
    /// wait's previous poll and within the share window, was read.
    Shared,
    /// The target answered `304 Not Modified`; the previous response was read again.
    NotModified,
    /// No request was sent: the target's host asked for quiet until a time.
    Paused,
}

impl LastPoll {
    /// The name the API gives it.
    pub fn as_str(self) -> &'static str {
        match self {
            LastPoll::Sent => "sent",
            LastPoll::Shared => "shared",
            LastPoll::NotModified => "not_modified",
            LastPoll::Paused => "paused",
        }
    }
}

/// What a wait shows beside its own figures, each absent when it does not apply:
/// how it stands in a group (a group shows its `mode` and `members`, a member the
/// `group` it belongs to), and the pause that holds its polls back.
// They share this flattened part, which the places that make a wait fill in with
// `Default`, so that a fact added here changes none of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Grouping {
    /// A group's mode: `all` of its members must succeed, or `any` one of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<GroupMode>,
    /// A group's members, in the order given, each as it stands now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<GroupMember>>,
    /// The group this wait is a member of (the first, when several name it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<Uuid>,
    /// While a running wait's polls are held back because the target asked the
    /// requests of its tenant and credentials for quiet (429 or 503 with
    /// `Retry-After`, or a rate limit with none remaining): until when, and why.
    /// Held-back polls are not polls: they count toward no `polls`, no retry and
    /// no run of bad observations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
}

/// A pause that holds a wait's polls back (`paused` of a wait).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Paused {
    /// When the pause ends, and the wait polls again (unless its deadline comes
    /// first).
    #[serde(with = "millis")]
    pub until: DateTime<Utc>,
    /// Why, as a sentence.
    pub reason: String,
}

impl Paused {
    /// The pause an engine state holds, if it holds a running wait back at `now`.
    pub fn of(engine: &engine::Paused, now: DateTime<Utc>) -> Option<Paused> {
        (engine.until > now).then(|| Paused {
            until: engine.until,
            reason: engine.reason.clone(),
        })
    }
}

/// How a group decides from its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum GroupMode {
    /// Succeeds when every member has succeeded; fails as soon as a required one
    /// ends otherwise.
    All,
    /// Succeeds when the first member succeeds; fails when every member has ended
    /// without success.
    Any,
}

impl GroupMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GroupMode::All => "all",
            GroupMode::Any => "any",
        }
    }
}

/// One member of a group, as it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct GroupMember {
    pub id: Uuid,
    pub status: Status,
    /// `false` for a member of an `all` group that may end without success.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub required: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

impl Wait {
    pub fn is_running(&self) -> bool {
        self.status == Status::Running
    }
}

/// A page of waits, newest first.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WaitPage {
    pub items: Vec<Wait>,
    /// Pass as `cursor` for the next page; null on the last.
    pub next_cursor: Option<String>,
}

/// A page of events, oldest first.
#[derive(Clone, Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventPage {
    pub items: Vec<Event>,
    /// Pass as `after` for the next page; null when there is no more now.
    pub next_cursor: Option<String>,
}

/// One entry of a wait's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Event {
    /// The global cursor (`GET /events`). Events are served only once they have
    /// one, so it is never null in a response.
    pub id: Option<i64>,
    /// Position in this wait's history, from 1.
    pub seq: i32,
    pub wait_id: Uuid,
    #[serde(with = "millis")]
    pub at: DateTime<Utc>,
    /// The kind, and the kind's own fields, flattened into the event object.
    #[serde(flatten)]
    pub body: EventBody,
}

impl Event {
    pub fn kind(&self) -> &'static str {
        self.body.kind()
    }

    pub fn is_terminal(&self) -> bool {
        self.body.ending().is_some()
    }
}

/// What an event records, by kind (`kind` in JSON; `event:` in a stream).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventBody {
    /// The wait was created.
    Created {
        /// When it times out.
        #[serde(with = "millis")]
        deadline: DateTime<Utc>,
    },
    /// The observed state changed.
    State {
        /// The state before (null at the first observation).
        from: Option<String>,
        to: String,
    },
    /// A transient error or an unexpected observation: the wait polls again after
    /// `delay`.
    Retry {
        error: String,
        /// Consecutive retries since the last healthy observation, from 1.
        attempt: u32,
        /// A duration such as `2s`.
        delay: String,
    },
    /// The wait ended `succeeded`.
    Succeeded(Ending),
    /// The wait ended `failed`: the target reported a `fail` state.
    Failed(Ending),
    /// The wait ended `timed_out`: the deadline came first.
    TimedOut(Ending),
    /// The wait ended `canceled` by a client.
    Canceled(Ending),
    /// The wait ended in `error`: waitd could not tell.
    Error(Ending),
}

/// The fields of a terminal event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Ending {
    /// One human sentence.
    pub reason: String,
    /// The last observed state.
    pub state: Option<String>,
    /// From the spec's `error` path, when the wait failed: any JSON value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub error_detail: Option<Value>,
    /// The last transient or probe error, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// What the wait ended with (the wait's `output`), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub output: Option<Value>,
}

impl EventBody {
    /// The terminal event of an end.
    pub fn end(status: Status, ending: Ending) -> EventBody {
        match status {
            Status::Succeeded => EventBody::Succeeded(ending),
            Status::Failed => EventBody::Failed(ending),
            Status::TimedOut => EventBody::TimedOut(ending),
            Status::Canceled => EventBody::Canceled(ending),
            // `running` ends nothing; an end the store cannot name is an error.
            Status::Error | Status::Running => EventBody::Error(ending),
        }
    }

    /// Every kind, as [`EventBody::kind`] spells it (the SSE `event:` names).
    pub const KINDS: [&'static str; 8] = [
        "created",
        "state",
        "retry",
        "succeeded",
        "failed",
        "timed_out",
        "canceled",
        "error",
    ];

    /// The serde (and SQL) spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            EventBody::Created { .. } => "created",
            EventBody::State { .. } => "state",
            EventBody::Retry { .. } => "retry",
            EventBody::Succeeded(_) => "succeeded",
            EventBody::Failed(_) => "failed",
            EventBody::TimedOut(_) => "timed_out",
            EventBody::Canceled(_) => "canceled",
            EventBody::Error(_) => "error",
        }
    }

    /// The end this event records, if it is terminal.
    pub fn ending(&self) -> Option<(Status, &Ending)> {
        match self {
            EventBody::Succeeded(e) => Some((Status::Succeeded, e)),
            EventBody::Failed(e) => Some((Status::Failed, e)),
            EventBody::TimedOut(e) => Some((Status::TimedOut, e)),
            EventBody::Canceled(e) => Some((Status::Canceled, e)),
            EventBody::Error(e) => Some((Status::Error, e)),
            _ => None,
        }
    }

    /// The stored form: the kind, and the kind's fields as a JSON object.
    pub fn to_parts(&self) -> (&'static str, Value) {
        let mut v =
            serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Default::default()));
        if let Some(o) = v.as_object_mut() {
            o.remove("kind");
        }
        (self.kind(), v)
    }

    /// Back from the stored form.
    pub fn from_parts(kind: &str, data: Value) -> Result<EventBody, serde_json::Error> {
        let mut data = match data {
            Value::Object(o) => o,
            _ => Default::default(),
        };
        data.insert("kind".into(), Value::String(kind.to_string()));
        serde_json::from_value(Value::Object(data))
    }
}

#[cfg(test)]
mod tests;
