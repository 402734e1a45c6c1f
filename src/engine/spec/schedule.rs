//! How a request's `poll` and `retry` are read: the healthy schedule and the
//! retry budget, within the server's floor and the wait's timeout.

use std::time::Duration;

use serde_json::Value;

use super::{
    Errors, Limits, MAX_FACTOR, MAX_RETRIES, Poll, Retry, duration, opt, parse_duration, type_name,
    whole_number,
};

pub(super) fn parse_poll(
    v: Option<&Value>,
    timeout: Duration,
    limits: &Limits,
    errs: &mut Errors,
) -> Option<Poll> {
    let floor = limits.min_poll_interval;
    let mut poll = Poll::default();
    poll.initial = poll.initial.max(floor);
    poll.max = poll.max.max(floor);
    let obj = match v {
        None => return Some(poll),
        Some(Value::Object(o)) => o,
        Some(other) => {
            errs.push("poll", format!("must be an object such as {{\"initial\": \"2s\", \"factor\": 1.5, \"max\": \"15s\"}}, not {}", type_name(other)));
            return None;
        }
    };
    errs.unknown(
        obj,
        "poll",
        &["initial", "factor", "max", "jitter", "delay"],
    );
    let before = errs.0.len();
    let initial_given = opt(obj, "initial").and_then(|v| parse_duration("poll.initial", v, errs));
    let max_given = opt(obj, "max").and_then(|v| parse_duration("poll.max", v, errs));
    if let Some(d) = initial_given {
        check_interval("poll.initial", d, limits, errs);
        poll.initial = d;
    }
    if let Some(d) = max_given {
        check_interval("poll.max", d, limits, errs);
        poll.max = d;
    }
    // A given initial above the default max raises the max rather than fail: the
    // client asked for nothing smaller.
    if initial_given.is_some() && max_given.is_none() {
        poll.max = poll.max.max(poll.initial);
    }
    if max_given.is_some() && initial_given.is_none() {
        poll.initial = poll.initial.min(poll.max);
    }
    if poll.max < poll.initial {
        errs.push(
            "poll.max",
            format!(
                "({}) is shorter than poll.initial ({}); the interval grows from initial up to max",
                duration::format(poll.max),
                duration::format(poll.initial)
            ),
        );
    }
    if let Some(f) = opt(obj, "factor") {
        match f.as_f64() {
            Some(x) if x.is_finite() && (1.0..=MAX_FACTOR).contains(&x) => poll.factor = x,
            _ => errs.push(
                "poll.factor",
                "must be a number from 1 (a fixed interval) to 10",
            ),
        }
    }
    if let Some(j) = opt(obj, "jitter") {
        match j.as_f64() {
            Some(x) if x.is_finite() && (0.0..1.0).contains(&x) => poll.jitter = x,
            _ => errs.push(
                "poll.jitter",
                "must be a fraction from 0 up to (not including) 1, e.g. 0.1 for ±10%",
            ),
        }
    }
    if let Some(d) = opt(obj, "delay").and_then(|v| parse_duration("poll.delay", v, errs)) {
        if d > timeout {
            errs.push(
                "poll.delay",
                "is longer than the timeout, so the target would never be polled",
            );
        }
        poll.delay = d;
    }
    (errs.0.len() == before).then_some(poll)
}

fn check_interval(field: &str, d: Duration, limits: &Limits, errs: &mut Errors) {
    if d < limits.min_poll_interval {
        errs.push(
            field,
            format!(
                "is {}, below this server's minimum poll interval of {}",
                duration::format(d),
                duration::format(limits.min_poll_interval)
            ),
        );
    } else if d > limits.max_timeout {
        errs.push(
            field,
            format!(
                "is {}, longer than this server's maximum timeout of {}",
                duration::format(d),
                duration::format(limits.max_timeout)
            ),
        );
    }
}

pub(super) fn parse_retry(v: Option<&Value>, limits: &Limits, errs: &mut Errors) -> Option<Retry> {
    let floor = limits.min_poll_interval;
    let mut retry = Retry::default();
    retry.delay = retry.delay.max(floor);
    retry.max_delay = retry.max_delay.max(floor);
    let obj = match v {
        None => return Some(retry),
        Some(Value::Object(o)) => o,
        Some(other) => {
            errs.push("retry", format!("must be an object such as {{\"delay\": \"1s\", \"max_delay\": \"30s\", \"max_retries\": 10}}, not {}", type_name(other)));
            return None;
        }
    };
    errs.unknown(obj, "retry", &["delay", "max_delay", "max_retries"]);
    let before = errs.0.len();
    let delay_given = opt(obj, "delay").and_then(|v| parse_duration("retry.delay", v, errs));
    let max_given = opt(obj, "max_delay").and_then(|v| parse_duration("retry.max_delay", v, errs));
    if let Some(d) = delay_given {
        check_interval("retry.delay", d, limits, errs);
        retry.delay = d;
    }
    if let Some(d) = max_given {
        check_interval("retry.max_delay", d, limits, errs);
        retry.max_delay = d;
    }
    if delay_given.is_some() && max_given.is_none() {
        retry.max_delay = retry.max_delay.max(retry.delay);
    }
    if max_given.is_some() && delay_given.is_none() {
        retry.delay = retry.delay.min(retry.max_delay);
    }
    if retry.max_delay < retry.delay {
        errs.push(
            "retry.max_delay",
            format!(
                "({}) is shorter than retry.delay ({})",
                duration::format(retry.max_delay),
                duration::format(retry.delay)
            ),
        );
    }
    match obj.get("max_retries") {
        None => {}
        Some(Value::Null) => retry.max_retries = None,
        Some(v) => match whole_number(v) {
            Some(n) if n <= u64::from(MAX_RETRIES) => retry.max_retries = Some(n as u32),
            _ => errs.push(
                "retry.max_retries",
                "must be a whole number from 0 to 10000, or null to retry until the deadline",
            ),
        },
    }
    (errs.0.len() == before).then_some(retry)
}
