//! A callback wait's `callback` (docs/design.md §2.15): the wait ends when someone
//! POSTs to its callback URL, so it has no target to poll.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Errors, opt, parse_duration, type_name};
use crate::engine::{duration, schema};

/// What a callback wait listens for, in place of a target.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Callback {
    /// Silence longer than this (no heartbeat, no completion) ends the wait
    /// `failed`. Absent: only the deadline bounds it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_opt_text"
    )]
    #[schema(value_type = Option<schema::DurationText>)]
    pub heartbeat: Option<Duration>,
}

pub(super) fn parse_callback(v: &Value, timeout: Duration, errs: &mut Errors) -> Option<Callback> {
    let Value::Object(obj) = v else {
        errs.push(
            "callback",
            format!(
                "must be an object such as {{}} or {{\"heartbeat\": \"5m\"}}, not {}",
                type_name(v)
            ),
        );
        return None;
    };
    errs.unknown(obj, "callback", &["heartbeat"]);
    let heartbeat = match opt(obj, "heartbeat") {
        None => None,
        Some(v) => {
            let d = parse_duration("callback.heartbeat", v, errs)?;
            if d.is_zero() {
                errs.push("callback.heartbeat", "must be longer than 0s");
                return None;
            }
            if d > timeout {
                errs.push(
                    "callback.heartbeat",
                    format!(
                        "is {}, longer than the wait's timeout of {}: the deadline would always come first; shorten it or leave it out",
                        duration::format(d),
                        duration::format(timeout)
                    ),
                );
                return None;
            }
            Some(d)
        }
    };
    Some(Callback { heartbeat })
}
