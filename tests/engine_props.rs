//! Property tests for the polling engine (docs/engine.md §3): over random valid specs,
//! random observation sequences and random jitter samples, a delay never exceeds its
//! cap nor falls under the floor, no poll is scheduled past the deadline, the retry
//! budget resets only on healthy observations, every wait ends by its deadline, a
//! state restored from JSON mid-wait decides exactly as the original, and a poll
//! held back by a pause changes nothing but when the next one comes.
//!
//! The classification used to judge the engine (`Kind`) is written here from the
//! design, not taken from the engine's events, so a misclassification shows up.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::{Value, json};
use waitd::engine::{
    Context, Decision, End, EngineState, Event, Limits, Observation, Paused, Spec, Step, hold, step,
};

const WANT: &[&str] = &["ready", "done"];
const FAIL: &[&str] = &["broken"];
const PENDING: &[&str] = &["building", "queued"];

/// The knobs of one generated spec, kept beside it to judge the engine.
#[derive(Clone, Debug)]
struct Params {
    initial_ms: u64,
    max_ms: u64,
    factor: f64,
    jitter: f64,
    delay_ms: u64,
    retry_delay_ms: u64,
    retry_max_ms: u64,
    max_retries: Option<u32>,
    timeout_ms: u64,
    floor_ms: u64,
    with_pending: bool,
    require_transition: bool,
    consecutive: u32,
    not_found: &'static str,
    ignore_case: bool,
}

impl Params {
    fn request(&self) -> Value {
        json!({
            "target": {"url": "https://api.example.com/things/1", "headers": {"Authorization": "Bearer x"}},
            "state": "/status",
            "want": WANT,
            "fail": FAIL,
            "pending": if self.with_pending { json!(PENDING) } else { Value::Null },
            "require_transition": self.require_transition,
            "consecutive": self.consecutive,
            "not_found": self.not_found,
            "ignore_case": self.ignore_case,
            "timeout": format!("{}ms", self.timeout_ms),
            "poll": {
                "initial": format!("{}ms", self.initial_ms),
                "factor": self.factor,
                "max": format!("{}ms", self.max_ms),
                "jitter": self.jitter,
                "delay": format!("{}ms", self.delay_ms),
            },
            "retry": {
                "delay": format!("{}ms", self.retry_delay_ms),
                "max_delay": format!("{}ms", self.retry_max_ms),
                "max_retries": self.max_retries,
            },
        })
    }

    fn spec(&self) -> Result<Spec, TestCaseError> {
        let limits = Limits {
            min_poll_interval: Duration::from_millis(1),
            ..Limits::default()
        };
        Spec::from_request(&self.request(), &limits).map_err(|errs| {
            TestCaseError::fail(format!("a generated request was refused: {errs:?}"))
        })
    }

    fn floor(&self) -> Duration {
        Duration::from_millis(self.floor_ms)
    }

    fn in_set(&self, set: &[&str], v: &str) -> bool {
        set.iter().any(|s| {
            if self.ignore_case {
                s.to_lowercase() == v.to_lowercase()
            } else {
                *s == v
            }
        })
    }

    /// What the design says an observation is, before timing.
    fn kind(&self, obs: &Observation) -> Kind {
        match obs {
            Observation::State { values, .. } => {
                if values.iter().any(|v| self.in_set(FAIL, v)) {
                    Kind::Fails
                } else if values.iter().all(|v| self.in_set(WANT, v)) {
                    Kind::Wanted
                } else if self.with_pending
                    && values
                        .iter()
                        .any(|v| !self.in_set(PENDING, v) && !self.in_set(WANT, v))
                {
                    Kind::Bad
                } else {
                    Kind::Healthy
                }
            }
            Observation::Missing { .. } | Observation::Transient { .. } => Kind::Bad,
            Observation::NotFound { .. } => match self.not_found {
                "retry" => Kind::Bad,
                "success" => Kind::Gone,
                _ => Kind::Fatal,
            },
            Observation::Permanent { .. } => Kind::Fatal,
            // Waits with conditions are modelled in tests/conditions.rs.
            Observation::Answered { .. } | Observation::Judged { .. } => {
                unreachable!("the generated waits have no conditions")
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// A `fail` value: ends `failed`, whatever else holds.
    Fails,
    /// Every value in `want`: healthy, or success when transition/consecutive allow.
    Wanted,
    /// Healthy progress: resets the budget.
    Healthy,
    /// Unexpected, missing, transient, or not found with `retry`: spends a retry.
    Bad,
    /// Not found with `success`.
    Gone,
    /// Permanent error, or not found with `error`.
    Fatal,
}

fn params() -> impl Strategy<Value = Params> {
    (
        (
            prop_oneof![10u64..=200, 10u64..=3_000],
            0u64..=20_000,
            prop_oneof![Just(1.0), 1.0f64..=3.0],
            prop_oneof![Just(0.0), 0.0f64..0.5],
            prop_oneof![Just(0u64), 0u64..=5_000],
        ),
        (
            prop_oneof![10u64..=200, 10u64..=2_000],
            0u64..=30_000,
            prop_oneof![Just(None), (0u32..=6).prop_map(Some)],
            1u64..=60_000,
            1u64..=3_000,
        ),
        (
            any::<bool>(),
            any::<bool>(),
            1u32..=3,
            prop::sample::select(vec!["error", "retry", "success"]),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (initial_ms, max_extra, factor, jitter, delay_ms),
                (retry_delay_ms, retry_extra, max_retries, timeout_ms, floor_ms),
                (with_pending, require_transition, consecutive, not_found, ignore_case),
            )| Params {
                initial_ms,
                max_ms: initial_ms + max_extra,
                factor,
                jitter,
                delay_ms: delay_ms.min(timeout_ms),
                retry_delay_ms,
                retry_max_ms: retry_delay_ms + retry_extra,
                max_retries,
                timeout_ms,
                // The operator's floor sits at or under every interval.
                floor_ms: floor_ms.min(initial_ms).min(retry_delay_ms),
                with_pending,
                require_transition,
                consecutive,
                not_found,
                ignore_case,
            },
        )
}

fn state_value() -> impl Strategy<Value = String> {
    // Weighted towards progress so that many waits run long enough to meet their
    // deadline or spend their budget, rather than end on the second poll.
    prop_oneof![
        20 => Just("building"),
        16 => Just("queued"),
        6 => Just("strange"),
        3 => Just("ready"),
        1 => Just("done"),
        2 => Just("READY"),
        1 => Just("broken"),
        1 => Just("Broken"),
    ]
    .prop_map(String::from)
}

fn observation() -> impl Strategy<Value = Observation> {
    let values = prop_oneof![
        4 => prop::collection::vec(state_value(), 1..=1),
        1 => prop::collection::vec(state_value(), 2..=3),
    ];
    prop_oneof![
        60 => values.prop_map(|values| Observation::State { values, detail: None }),
        6 => Just(Observation::Missing { reason: "the state is absent".into() }),
        2 => prop_oneof![Just(404u16), Just(410)].prop_map(|status| Observation::NotFound { status }),
        12 => prop_oneof![3 => Just(None), 1 => (0u64..=90_000).prop_map(Some)].prop_map(|ms| Observation::Transient {
            error: "503 Service Unavailable".into(),
            retry_after: ms.map(Duration::from_millis),
        }),
        1 => Just(Observation::Permanent { error: "403 Forbidden".into() }),
    ]
}

fn samples() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![Just(-1.0), Just(1.0), -1.0f64..=1.0], 1..8)
}

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 12, 0, 0).unwrap()
}

/// One call of `step`, with what surrounded it.
#[derive(Clone, Debug)]
struct Rec {
    now: DateTime<Utc>,
    obs: Observation,
    before: EngineState,
    after: EngineState,
    out: Step,
}

/// Feeds the observations (cycled endlessly) and samples (cycled), advancing `now` to
/// each `PollAt`, until the engine ends or `max_steps` calls were made.
fn simulate(
    p: &Params,
    spec: &Spec,
    observations: &[Observation],
    samples: &[f64],
    max_steps: usize,
) -> Vec<Rec> {
    let (mut st, first) = EngineState::start(spec, t0());
    let mut now = first;
    let mut recs = Vec::new();
    for i in 0..max_steps {
        let obs = observations[i % observations.len()].clone();
        let cx = Context {
            now,
            floor: p.floor(),
            jitter: samples[i % samples.len()],
        };
        let before = st.clone();
        let out = step(spec, &mut st, obs.clone(), cx);
        let next = match &out.decision {
            Decision::PollAt(at) => Some(*at),
            Decision::End(_) => None,
        };
        recs.push(Rec {
            now,
            obs,
            before,
            after: st.clone(),
            out,
        });
        match next {
            Some(at) if at > now => now = at,
            // Ended, or a poll not after now (which the checks report).
            _ => break,
        }
    }
    recs
}

/// A generous bound on the polls a wait can make: one at its start, one per floor
/// interval to its deadline, and the last one at the deadline.
fn poll_bound(p: &Params) -> usize {
    (p.timeout_ms / p.floor_ms) as usize + 3
}

fn std_delay(from: DateTime<Utc>, to: DateTime<Utc>) -> Duration {
    (to - from).to_std().unwrap_or(Duration::ZERO)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn delays_stay_between_the_floor_and_their_cap_and_no_poll_is_scheduled_after_the_deadline(
        p in params(),
        observations in prop::collection::vec(observation(), 1..40),
        samples in samples(),
    ) {
        let spec = p.spec()?;
        let recs = simulate(&p, &spec, &observations, &samples, poll_bound(&p));
        for (i, r) in recs.iter().enumerate() {
            let Decision::PollAt(at) = r.out.decision else { continue };
            let deadline = r.after.deadline;
            prop_assert!(at > r.now, "step {i}: poll at {at} is not after now {}", r.now);
            prop_assert!(at <= deadline, "step {i}: poll at {at} is after the deadline {deadline}");
            prop_assert!(r.now < deadline, "step {i}: a poll was scheduled at or past the deadline");
            let d = std_delay(r.now, at);
            // The one poll clamped to the deadline may fall under the floor.
            let clamped = at == deadline;
            match p.kind(&r.obs) {
                Kind::Healthy | Kind::Wanted => {
                    prop_assert!(d <= spec.poll.max, "step {i}: healthy delay {d:?} over poll.max {:?}", spec.poll.max);
                    prop_assert!(clamped || d >= p.floor(), "step {i}: healthy delay {d:?} under the floor {:?}", p.floor());
                }
                Kind::Bad => {
                    let retry_after = match &r.obs {
                        Observation::Transient { retry_after, .. } => *retry_after,
                        _ => None,
                    };
                    let cap = spec.retry.max_delay.max(retry_after.unwrap_or_default());
                    prop_assert!(d <= cap, "step {i}: retry delay {d:?} over its cap {cap:?}");
                    prop_assert!(clamped || d >= p.floor(), "step {i}: retry delay {d:?} under the floor {:?}", p.floor());
                    if let Some(ra) = retry_after {
                        prop_assert!(clamped || d >= ra, "step {i}: retry delay {d:?} under Retry-After {ra:?}");
                    }
                }
                k => prop_assert!(false, "step {i}: a {k:?} observation scheduled another poll"),
            }
        }
    }

    #[test]
    fn the_retry_budget_resets_only_on_healthy_observations_and_otherwise_never_decreases(
        p in params(),
        observations in prop::collection::vec(observation(), 1..40),
        samples in samples(),
    ) {
        let spec = p.spec()?;
        let recs = simulate(&p, &spec, &observations, &samples, poll_bound(&p));
        for (i, r) in recs.iter().enumerate() {
            let (before, after) = (r.before.budget_used, r.after.budget_used);
            let kind = p.kind(&r.obs);
            let polls_again = matches!(r.out.decision, Decision::PollAt(_));
            if after < before {
                prop_assert!(
                    matches!(kind, Kind::Healthy | Kind::Wanted) && after == 0,
                    "step {i}: the budget went from {before} to {after} on a {kind:?} observation"
                );
            }
            if let Some(max) = p.max_retries {
                prop_assert!(after <= max, "step {i}: budget {after} over max_retries {max}");
            }
            match (kind, polls_again) {
                (Kind::Healthy | Kind::Wanted, true) => {
                    prop_assert_eq!(after, 0, "step {}: a healthy poll did not reset the budget", i);
                }
                (Kind::Bad, true) => {
                    prop_assert_eq!(after, before + 1, "step {}: a retried observation did not spend one retry", i);
                    let attempts: Vec<u32> = r.out.events.iter().filter_map(|e| match e {
                        Event::Retry { attempt, .. } => Some(*attempt),
                        Event::State { .. } => None,
                    }).collect();
                    prop_assert_eq!(attempts, vec![after], "step {}: the retry event's attempt", i);
                }
                (Kind::Bad, false) => {
                    prop_assert_eq!(after, before, "step {}: the budget moved on the last poll", i);
                    let Decision::End(o) = &r.out.decision else { unreachable!() };
                    let exhausted = p.max_retries.is_some_and(|m| before >= m);
                    prop_assert!(
                        (o.end == End::TimedOut && r.now >= r.after.deadline)
                            || (o.end == End::Error && exhausted && o.reason.contains("gave up")),
                        "step {i}: a bad observation ended the wait as {o:?} with budget {before}"
                    );
                }
                _ => {}
            }
            if !matches!(kind, Kind::Bad) {
                prop_assert!(
                    !r.out.events.iter().any(|e| matches!(e, Event::Retry { .. })),
                    "step {i}: a {kind:?} observation recorded a retry"
                );
            }
        }
    }

    #[test]
    fn every_wait_ends_by_its_deadline_within_a_bounded_number_of_polls(
        p in params(),
        observations in prop::collection::vec(observation(), 1..40),
        samples in samples(),
    ) {
        let spec = p.spec()?;
        let bound = poll_bound(&p);
        let recs = simulate(&p, &spec, &observations, &samples, bound + 1);
        let last = recs.last().expect("at least one step");
        let deadline = last.after.deadline;
        prop_assert_eq!(deadline, t0() + chrono::TimeDelta::milliseconds(p.timeout_ms as i64));
        let Decision::End(outcome) = &last.out.decision else {
            return Err(TestCaseError::fail(format!(
                "no end after {} polls (bound {bound}); last poll at {}, deadline {deadline}",
                recs.len(), last.now
            )));
        };
        prop_assert!(recs.len() <= bound, "{} polls, over the bound {bound}", recs.len());
        prop_assert!(last.now <= deadline, "the wait ended at {}, after its deadline {deadline}", last.now);
        prop_assert_eq!(last.after.polls as usize, recs.len());
        if outcome.end == End::TimedOut {
            prop_assert_eq!(last.now, deadline, "a timeout comes from the last poll, at the deadline");
        }
        // Every step before the deadline that ended, ended for a reason of its own.
        for (i, r) in recs.iter().enumerate() {
            let Decision::End(o) = &r.out.decision else { continue };
            let kind = p.kind(&r.obs);
            let ok = match kind {
                Kind::Fails => o.end == End::Failed,
                Kind::Gone => o.end == End::Succeeded,
                Kind::Fatal => o.end == End::Error,
                Kind::Wanted => o.end == End::Succeeded || (o.end == End::TimedOut && r.now >= deadline),
                Kind::Healthy => o.end == End::TimedOut && r.now >= deadline,
                Kind::Bad => o.end == End::Error || (o.end == End::TimedOut && r.now >= deadline),
            };
            prop_assert!(ok, "step {i}: a {kind:?} observation at {} ended as {o:?}", r.now);
        }
    }

    #[test]
    fn a_state_restored_from_json_mid_wait_makes_the_same_decisions_as_the_original(
        p in params(),
        observations in prop::collection::vec(observation(), 2..40),
        samples in samples(),
        split in any::<prop::sample::Index>(),
    ) {
        let spec = p.spec()?;
        let bound = poll_bound(&p);
        let recs = simulate(&p, &spec, &observations, &samples, bound);
        let k = split.index(recs.len());
        // The state as the checkpoint would hold it after k polls, and when it was due.
        let (checkpoint, mut now) = if k == 0 {
            EngineState::start(&spec, t0())
        } else {
            let Decision::PollAt(at) = recs[k - 1].out.decision else {
                unreachable!("only the last step ends")
            };
            (recs[k - 1].after.clone(), at)
        };
        let text = serde_json::to_string(&checkpoint).expect("the state serialises");
        let mut restored: EngineState = serde_json::from_str(&text).expect("and reads back");
        prop_assert_eq!(&restored, &checkpoint);
        let mut original = checkpoint;
        for (i, r) in recs.iter().enumerate().skip(k) {
            let obs = observations[i % observations.len()].clone();
            let cx = Context { now, floor: p.floor(), jitter: samples[i % samples.len()] };
            let a = step(&spec, &mut original, obs.clone(), cx);
            let b = step(&spec, &mut restored, obs, cx);
            prop_assert_eq!(&a, &b, "step {} decided differently after the restore", i);
            prop_assert_eq!(&original, &restored, "step {} left different states", i);
            prop_assert_eq!(&a, &r.out, "step {} differs from the uninterrupted run", i);
            match a.decision {
                Decision::PollAt(at) => now = at,
                Decision::End(_) => break,
            }
        }
    }

    #[test]
    fn a_validated_spec_read_back_from_its_json_is_the_same_spec(p in params()) {
        let spec = p.spec()?;
        let text = serde_json::to_value(&spec).expect("a spec serialises");
        let again: Spec = serde_json::from_value(text.clone()).expect("and deserialises");
        prop_assert_eq!(&again, &spec);
        // Its serialised form is itself a valid request meaning the same thing.
        let limits = Limits { min_poll_interval: Duration::from_millis(1), ..Limits::default() };
        let revalidated = Spec::from_request(&text, &limits);
        prop_assert_eq!(revalidated, Ok(spec));
    }

    /// A poll held back by a pause (of any length, from a moment to far past
    /// the deadline) is no observation: the next poll comes when the pause ends
    /// or at the deadline, never before now nor after the deadline; a poll held
    /// at or after the deadline ends the wait `timed_out`; and the wait then
    /// decides every observation exactly as it would have without the pause.
    #[test]
    fn a_poll_held_back_by_a_pause_changes_nothing_but_when_the_next_comes(
        p in params(),
        observations in prop::collection::vec(observation(), 2..40),
        samples in samples(),
        split in any::<prop::sample::Index>(),
        pause_ms in prop_oneof![0i64..=10, 0i64..=120_000, Just(i64::from(u32::MAX))],
    ) {
        let spec = p.spec()?;
        let recs = simulate(&p, &spec, &observations, &samples, poll_bound(&p));
        let k = split.index(recs.len());
        let (before, due) = if k == 0 {
            EngineState::start(&spec, t0())
        } else {
            let Decision::PollAt(at) = recs[k - 1].out.decision else {
                unreachable!("only the last step ends")
            };
            (recs[k - 1].after.clone(), at)
        };
        let until = due + chrono::TimeDelta::milliseconds(pause_ms);
        let mut held = before.clone();
        let out = hold(&mut held, Paused { until, reason: "asked".into() }, due);
        prop_assert!(out.events.is_empty(), "a hold recorded {:?}", out.events);
        prop_assert_eq!(held.polls, before.polls);
        prop_assert_eq!(held.retries, before.retries);
        prop_assert_eq!(held.budget_used, before.budget_used);
        prop_assert_eq!(&held.last_error, &before.last_error);
        prop_assert_eq!(held.paused.as_ref().map(|p| p.until), Some(until));
        let resume = match out.decision {
            Decision::End(o) => {
                prop_assert!(due >= before.deadline, "a hold before the deadline ended the wait: {o:?}");
                prop_assert_eq!(o.end, End::TimedOut);
                prop_assert!(o.reason.contains("held back"), "{}", o.reason);
                return Ok(());
            }
            Decision::PollAt(at) => at,
        };
        prop_assert!(due < before.deadline);
        prop_assert!(resume >= due && resume <= before.deadline, "resumes at {resume}");
        prop_assert_eq!(resume, until.min(before.deadline).max(due));
        // From there on, the same observations decide as they would have.
        let (mut with, mut without) = (held, before);
        for i in k..recs.len() {
            let obs = observations[i % observations.len()].clone();
            let cx = Context { now: resume, floor: p.floor(), jitter: samples[i % samples.len()] };
            let a = step(&spec, &mut with, obs.clone(), cx);
            let b = step(&spec, &mut without, obs, cx);
            prop_assert_eq!(&a, &b, "step {} decided otherwise after a hold", i);
            prop_assert_eq!(&with, &without, "step {} left another state after a hold", i);
            if matches!(a.decision, Decision::End(_)) {
                break;
            }
        }
    }
}
