//! The polling engine: what one observation of the target means for a wait.
//!
//! Pure by rule: no I/O, no clock, no randomness of its own, nothing imported from the
//! rest of the crate. It takes the validated [`Spec`], the wait's [`EngineState`], one
//! [`Observation`] and a [`Context`] (now, the operator's floor, a jitter sample) and
//! returns a [`Step`]: poll again at a time, or end with an [`Outcome`], plus the
//! events worth recording. Everything time-dependent is a function of the inputs, so
//! it is tested without sleeping, and a state serialised on one replica makes the
//! same decisions when restored on another.

pub mod bound;
mod cel;
pub mod condition;
pub mod duration;
pub mod jsonpath;
pub mod path;
pub mod pattern;
pub mod schema;
pub mod spec;

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use jsonpath::{Budget, Exceeded};
pub use path::{Selected, ValuePath};
pub use spec::{FieldError, Limits, NotFound, Poll, Retry, Spec, Target};

/// What one GET of the target showed. The prober builds these; tests write them.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// 2xx, a JSON body, the state path present: its values, and the error detail
    /// when the spec names an `error` path and the body has it.
    State {
        values: Vec<String>,
        detail: Option<Value>,
    },
    /// 2xx but the state is absent or null, or the body is not JSON.
    Missing { reason: String },
    /// 404 or 410.
    NotFound { status: u16 },
    /// Worth trying again: connection errors, timeouts, 408, 425, 429, 5xx.
    /// `retry_after` is the target's own lower bound on the next delay.
    Transient {
        error: String,
        retry_after: Option<Duration>,
    },
    /// Not worth trying again: any other status.
    Permanent { error: String },
    /// 2xx, and the wait has no state path (it is decided by its
    /// `success_condition`): healthy, with nothing to compare.
    Answered { status: u16 },
    /// The wait's conditions, evaluated on a response (the prober evaluates them,
    /// [`condition`]); `success` is `None` without a `success_condition`. `base` is
    /// what the response is without them, used when they decide nothing.
    Judged {
        status: u16,
        failure: bool,
        success: Option<bool>,
        base: Box<Observation>,
    },
}

impl Observation {
    /// The kinds of observation, as metrics name them.
    pub const KINDS: [&'static str; 6] = [
        "state",
        "missing",
        "not_found",
        "transient",
        "permanent",
        "answered",
    ];

    /// This observation's kind, one of [`Observation::KINDS`]; a judged response
    /// is of the kind it is without its conditions.
    pub fn kind(&self) -> &'static str {
        match self {
            Observation::State { .. } => "state",
            Observation::Missing { .. } => "missing",
            Observation::NotFound { .. } => "not_found",
            Observation::Transient { .. } => "transient",
            Observation::Permanent { .. } => "permanent",
            Observation::Answered { .. } => "answered",
            Observation::Judged { base, .. } => base.kind(),
        }
    }
}

/// How a wait ended, as the engine sees it. (`canceled` is the API's business.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    Succeeded,
    Failed,
    TimedOut,
    Error,
}

impl End {
    pub fn as_str(self) -> &'static str {
        match self {
            End::Succeeded => "succeeded",
            End::Failed => "failed",
            End::TimedOut => "timed_out",
            End::Error => "error",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub end: End,
    /// One human sentence.
    pub reason: String,
    /// From the spec's `error` path, when the wait failed.
    pub error_detail: Option<Value>,
}

impl Outcome {
    /// An outcome whose reason is cut to [`bound::MAX_REASON`].
    pub fn new(end: End, reason: String, error_detail: Option<Value>) -> Outcome {
        Outcome {
            end,
            reason: bound::text(&reason, bound::MAX_REASON).into_owned(),
            error_detail,
        }
    }
}

/// Events worth recording (polls that change nothing produce none).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// The observed state changed.
    State { from: Option<String>, to: String },
    /// A transient error or an unexpected observation; `attempt` counts from 1 since
    /// the last healthy observation.
    Retry {
        error: String,
        attempt: u32,
        delay: Duration,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    PollAt(DateTime<Utc>),
    End(Outcome),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub decision: Decision,
    pub events: Vec<Event>,
}

/// The inputs that come from outside the wait: the time, the operator's floor, and a
/// jitter sample in [-1, 1] (the worker draws it; tests pass 0 or a fixed value).
#[derive(Clone, Copy, Debug)]
pub struct Context {
    pub now: DateTime<Utc>,
    pub floor: Duration,
    pub jitter: f64,
}

/// The engine's memory of one wait. Small, serialisable, and all it needs: the
/// service checkpoints it and another replica resumes from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EngineState {
    pub deadline: DateTime<Utc>,
    pub polls: u32,
    /// Retries over the wait's life (reported).
    pub retries: u32,
    /// Consecutive retries since the last healthy observation (the budget spent).
    pub budget_used: u32,
    /// The next healthy interval, before jitter, in milliseconds.
    pub poll_interval_ms: u64,
    /// The next retry delay, before jitter, in milliseconds.
    pub retry_delay_ms: u64,
    /// A state outside `want` and `fail` has been seen (for `require_transition`).
    pub transition_seen: bool,
    /// Consecutive observations in `want` (for `consecutive`).
    pub hits: u32,
    /// The last observed state, values joined by ", ".
    pub state: Option<String>,
    pub last_error: Option<String>,
    /// The pause that held back the wait's last poll, until the next poll that is
    /// sent (see [`hold`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
}

/// A pause the target asked for, which holds a wait's polls back: until when,
/// and why, as a sentence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Paused {
    pub until: DateTime<Utc>,
    pub reason: String,
}

impl EngineState {
    /// The state of a wait created at `created_at`, and when to poll it first.
    pub fn start(spec: &Spec, created_at: DateTime<Utc>) -> (EngineState, DateTime<Utc>) {
        let deadline = created_at + delta(spec.timeout);
        let state = EngineState {
            deadline,
            polls: 0,
            retries: 0,
            budget_used: 0,
            poll_interval_ms: millis(spec.poll.initial),
            retry_delay_ms: millis(spec.retry.delay),
            transition_seen: false,
            hits: 0,
            state: None,
            last_error: None,
            paused: None,
        };
        let first = (created_at + delta(spec.poll.delay)).min(deadline);
        (state, first)
    }

    /// The outcome of a wait whose deadline passed with no poll left to make.
    pub fn timed_out(&self) -> Outcome {
        let mut reason = format!(
            "the deadline passed after {} poll{}",
            self.polls,
            if self.polls == 1 { "" } else { "s" }
        );
        match &self.state {
            Some(s) => reason.push_str(&format!("; the last state was \"{s}\"")),
            None => reason.push_str("; no state was observed"),
        }
        if let Some(e) = &self.last_error {
            reason.push_str(&format!("; the last error was: {e}"));
        }
        if let Some(p) = &self.paused {
            reason.push_str(&format!(
                "; then its polls were held back: {} (until {})",
                p.reason,
                p.until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
        Outcome::new(End::TimedOut, reason, None)
    }
}

/// A poll that was due and not sent, because the target asked for quiet (a
/// pause, docs/engine.md §3.2). It is not an observation: it counts toward no poll, no
/// retry and no run of bad observations, and changes no state. The wait shows
/// the pause and polls again when it ends, or at its deadline, whichever comes
/// first; a poll held back at or after the deadline ends the wait `timed_out`.
pub fn hold(st: &mut EngineState, pause: Paused, now: DateTime<Utc>) -> Step {
    let until = pause.until;
    st.paused = Some(Paused {
        reason: bound::text(&pause.reason, bound::MAX_ERROR).into_owned(),
        until,
    });
    let decision = if now >= st.deadline {
        Decision::End(st.timed_out())
    } else {
        Decision::PollAt(until.clamp(now, st.deadline))
    };
    Step {
        decision,
        events: Vec::new(),
    }
}

/// What an observation means, before timing.
enum Verdict {
    Done(Outcome),
    Healthy,
    Bad(String, Option<Duration>),
}

/// Applies one observation made at `cx.now` to the wait.
pub fn step(spec: &Spec, st: &mut EngineState, obs: Observation, cx: Context) -> Step {
    st.polls += 1;
    // A poll was sent: whatever held the wait back is over.
    st.paused = None;
    let mut events = Vec::new();
    let verdict = match classify(spec, st, obs, &mut events) {
        // What a target says is kept only within bounds (see [`bound`]).
        Verdict::Bad(error, ra) => {
            Verdict::Bad(bound::text(&error, bound::MAX_ERROR).into_owned(), ra)
        }
        v => v,
    };
    let decision = match verdict {
        Verdict::Done(outcome) => Decision::End(outcome),
        // The deadline wins over everything that has not ended the wait.
        _ if cx.now >= st.deadline => {
            if let Verdict::Bad(error, _) = &verdict {
                st.last_error = Some(error.clone());
            }
            Decision::End(st.timed_out())
        }
        Verdict::Healthy => {
            st.budget_used = 0;
            st.retry_delay_ms = millis(spec.retry.delay);
            let base = Duration::from_millis(st.poll_interval_ms);
            let delay = spread(base, spec.poll.jitter, cx.jitter)
                .max(cx.floor)
                .min(spec.poll.max);
            st.poll_interval_ms = millis(scale(base, spec.poll.factor).min(spec.poll.max));
            Decision::PollAt(at_or_deadline(cx.now, delay, st.deadline))
        }
        Verdict::Bad(error, retry_after) => {
            st.last_error = Some(error.clone());
            match spec.retry.max_retries {
                Some(max) if st.budget_used >= max => Decision::End(Outcome::new(
                    End::Error,
                    format!(
                        "gave up after {} consecutive bad observation{} (retry.max_retries is {max}); the last error was: {error}",
                        st.budget_used + 1,
                        if st.budget_used == 0 { "" } else { "s" },
                    ),
                    None,
                )),
                _ => {
                    st.budget_used += 1;
                    st.retries += 1;
                    let base = Duration::from_millis(st.retry_delay_ms);
                    let mut delay = spread(base, spec.poll.jitter, cx.jitter)
                        .max(cx.floor)
                        .min(spec.retry.max_delay);
                    if let Some(ra) = retry_after {
                        delay = delay.max(ra);
                    }
                    st.retry_delay_ms = millis(scale(base, 2.0).min(spec.retry.max_delay));
                    let at = at_or_deadline(cx.now, delay, st.deadline);
                    events.push(Event::Retry {
                        error,
                        attempt: st.budget_used,
                        // The delay actually scheduled: the deadline may cut it short.
                        delay: (at - cx.now).to_std().unwrap_or_default(),
                    });
                    Decision::PollAt(at)
                }
            }
        }
    };
    Step { decision, events }
}

fn classify(
    spec: &Spec,
    st: &mut EngineState,
    obs: Observation,
    events: &mut Vec<Event>,
) -> Verdict {
    match obs {
        Observation::State { values, detail } => {
            let shown = show(st, &values, events);
            if let Some(done) = fail_state(spec, &values, detail.as_ref()) {
                return done;
            }
            if spec.success_condition.is_none()
                && !spec.want.is_empty()
                && values.iter().all(|v| spec.set_contains(&spec.want, v))
            {
                let reason = |hits: u32| {
                    if hits > 1 {
                        format!("the target reported \"{shown}\" {hits} times in a row")
                    } else {
                        format!("the target reached \"{shown}\"")
                    }
                };
                return hit(spec, st, reason);
            }
            st.hits = 0;
            st.transition_seen = true;
            if let Some(pending) = &spec.pending
                && let Some(odd) = values
                    .iter()
                    .find(|v| !spec.set_contains(pending, v) && !spec.set_contains(&spec.want, v))
            {
                return Verdict::Bad(
                    format!(
                        "unrecognised state \"{}\"",
                        bound::text(odd, bound::MAX_QUOTED)
                    ),
                    None,
                );
            }
            Verdict::Healthy
        }
        Observation::Answered { .. } => {
            st.hits = 0;
            st.transition_seen = true;
            Verdict::Healthy
        }
        Observation::Judged {
            status,
            failure,
            success,
            base,
        } => judged(spec, st, status, failure, success, *base, events),
        Observation::Missing { reason } => {
            st.hits = 0;
            Verdict::Bad(reason, None)
        }
        Observation::NotFound { status } => {
            st.hits = 0;
            let text = format!(
                "the target answered {status} {}",
                if status == 410 { "Gone" } else { "Not Found" }
            );
            match spec.not_found {
                NotFound::Success => Verdict::Done(Outcome::new(
                    End::Succeeded,
                    format!("{text}: it is gone"),
                    None,
                )),
                NotFound::Retry => Verdict::Bad(text, None),
                NotFound::Error => {
                    st.last_error = Some(text.clone());
                    Verdict::Done(Outcome::new(
                        End::Error,
                        format!("{text} (not_found is \"error\")"),
                        None,
                    ))
                }
            }
        }
        Observation::Transient { error, retry_after } => Verdict::Bad(error, retry_after),
        Observation::Permanent { error } => {
            let error = bound::text(&error, bound::MAX_ERROR).into_owned();
            let reason = format!("{error}; this is not retried");
            st.last_error = Some(error);
            Verdict::Done(Outcome::new(End::Error, reason, None))
        }
    }
}

/// Records the observed state (an event when it changed); returns it as shown.
fn show(st: &mut EngineState, values: &[String], events: &mut Vec<Event>) -> String {
    let shown = bound::join(values, ", ", bound::MAX_STATE);
    show_text(st, &shown, events);
    shown
}

fn show_text(st: &mut EngineState, shown: &str, events: &mut Vec<Event>) {
    if st.state.as_deref() != Some(shown) {
        events.push(Event::State {
            from: st.state.take(),
            to: shown.to_string(),
        });
        st.state = Some(shown.to_string());
    }
}

/// A state in `fail`: the wait fails at once.
fn fail_state(spec: &Spec, values: &[String], detail: Option<&Value>) -> Option<Verdict> {
    let f = values.iter().find(|v| spec.set_contains(&spec.fail, v))?;
    Some(Verdict::Done(Outcome::new(
        End::Failed,
        format!("the target reached the failure state \"{f}\""),
        detail.map(bound::detail),
    )))
}

/// An observation that means done: success once `consecutive` of them came in a
/// row (and, with `require_transition`, after a transition).
fn hit(spec: &Spec, st: &mut EngineState, reason: impl Fn(u32) -> String) -> Verdict {
    if spec.require_transition && !st.transition_seen {
        // Gated: a success before any transition does not count, and is not
        // itself a transition.
        st.hits = 0;
        return Verdict::Healthy;
    }
    st.hits += 1;
    if st.hits >= spec.consecutive {
        return Verdict::Done(Outcome::new(End::Succeeded, reason(st.hits), None));
    }
    Verdict::Healthy
}

/// The most bytes of a condition quoted in an end's reason.
const QUOTED_CONDITION: usize = 512;

/// A response on which the wait's conditions were evaluated.
fn judged(
    spec: &Spec,
    st: &mut EngineState,
    status: u16,
    failure: bool,
    success: Option<bool>,
    base: Observation,
    events: &mut Vec<Event>,
) -> Verdict {
    let quoted = |c: &Option<condition::Condition>| {
        c.as_ref()
            .map(|c| bound::text(c.source(), QUOTED_CONDITION).into_owned())
            .unwrap_or_default()
    };
    // Without a state path, the state shown is what the conditions said.
    let summary = |text: String, st: &mut EngineState, events: &mut Vec<Event>| {
        if spec.state.is_none() {
            show_text(st, &format!("{text} (HTTP {status})"), events);
        }
    };
    if failure {
        if let Observation::State { values, .. } = &base {
            show(st, values, events);
        }
        summary("failure_condition true".into(), st, events);
        return Verdict::Done(Outcome::new(
            End::Failed,
            format!(
                "the failure_condition held on a response with HTTP {status}: {}",
                quoted(&spec.failure_condition)
            ),
            None,
        ));
    }
    let Some(holds) = success else {
        // Only a failure_condition, and it is false: the usual rules.
        return classify(spec, st, base, events);
    };
    summary(format!("success_condition {holds}"), st, events);
    let wanted = match &base {
        _ if spec.want.is_empty() => true,
        Observation::State { values, .. } => {
            values.iter().all(|v| spec.set_contains(&spec.want, v))
        }
        _ => false,
    };
    if holds && wanted {
        if let Observation::State { values, detail } = &base {
            show(st, values, events);
            if let Some(done) = fail_state(spec, values, detail.as_ref()) {
                return done;
            }
        }
        let source = quoted(&spec.success_condition);
        return hit(spec, st, |hits| {
            if hits > 1 {
                format!(
                    "the success_condition held on {hits} responses in a row (the last with HTTP {status}): {source}"
                )
            } else {
                format!("the success_condition held on a response with HTTP {status}: {source}")
            }
        });
    }
    // Not done: the response is what it is without the conditions (a `want` state
    // alone is not success when a success_condition is given).
    let verdict = classify(spec, st, base, events);
    st.hits = 0;
    st.transition_seen = true;
    verdict
}

/// `base` spread by ±`fraction` according to `sample` in [-1, 1].
fn spread(base: Duration, fraction: f64, sample: f64) -> Duration {
    let sample = if sample.is_finite() {
        sample.clamp(-1.0, 1.0)
    } else {
        0.0
    };
    scale(base, 1.0 + fraction * sample)
}

fn scale(d: Duration, factor: f64) -> Duration {
    let ms = d.as_millis() as f64 * factor;
    if ms.is_finite() && ms > 0.0 {
        Duration::from_micros((ms * 1000.0).min(u64::MAX as f64 / 2.0) as u64)
    } else {
        Duration::ZERO
    }
}

/// `now + delay`, but never after the deadline (and never overflowing: a delay past
/// chrono's range is simply "at the deadline").
fn at_or_deadline(now: DateTime<Utc>, delay: Duration, deadline: DateTime<Utc>) -> DateTime<Utc> {
    now.checked_add_signed(delta(delay))
        .map_or(deadline, |t| t.min(deadline))
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

/// A std duration as a chrono delta, saturating (durations here are bounded by the
/// operator's maximum timeout, far below chrono's range).
pub fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}
