//! Table tests for the polling engine, ported from the test suites of the two
//! pollers it generalises (the AKS machine poller and the Latitude.sh CLI's
//! `internal/wait`; docs/engine.md §3.10 says what each contributes) plus the
//! semantics docs/engine.md §3 adds on top of them.
//!
//! Everything goes through the crate's public API: a request is validated by
//! `Spec::from_request`, then a list of observations is fed to `step` with `now`
//! advanced to each `Decision::PollAt`, exactly as the worker would, but without
//! sleeping. Seed cases that belong to other layers (a pre-canceled context, the
//! table of transient status codes) are the API's and the prober's to test.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Value, json};
use waitd::engine::{
    Budget, Context, Decision, End, EngineState, Event, FieldError, Limits, NotFound, Observation,
    Outcome, Selected, Spec, step,
};

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

const FINE_FLOOR: Duration = Duration::from_millis(1);
const DEFAULT_FLOOR: Duration = Duration::from_secs(1);

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Limits with a 1 ms floor, so tests can use the seeds' instant timings.
fn fine() -> Limits {
    Limits {
        min_poll_interval: FINE_FLOOR,
        ..Limits::default()
    }
}

/// `base` with `overrides`' top-level keys put over it.
fn merged(base: Value, overrides: Value) -> Value {
    let mut base = base;
    let obj = base.as_object_mut().expect("base is an object");
    for (k, v) in overrides.as_object().expect("overrides is an object") {
        obj.insert(k.clone(), v.clone());
    }
    base
}

fn valid(limits: &Limits, request: Value) -> Spec {
    Spec::from_request(&request, limits)
        .unwrap_or_else(|errs| panic!("request {request} should be valid, got {errs:?}"))
}

fn rejected(limits: &Limits, request: Value) -> Vec<FieldError> {
    match Spec::from_request(&request, limits) {
        Ok(spec) => panic!("request {request} should be rejected, got {spec:?}"),
        Err(errs) => errs,
    }
}

/// The error naming `field`; fails the test, listing what was reported, when none does.
fn error_for<'a>(errs: &'a [FieldError], field: &str) -> &'a FieldError {
    errs.iter()
        .find(|e| e.field == field)
        .unwrap_or_else(|| panic!("no error names {field:?}; got {errs:?}"))
}

/// The AKS machine poller as a waitd request, with the seed's `InstantOptions()`
/// (1 ms poll, 1 ms retry delay, MaxRetries 3) so tests run at once.
fn aks(overrides: Value) -> Spec {
    let base = json!({
        "target": {"url": "https://management.azure.com/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/c/agentPools/p/machines/m"},
        "state": "/properties/provisioningState",
        "want": ["Succeeded"],
        "fail": ["Failed", "Deleting"],
        "pending": ["Creating", "Updating"],
        "error": "/properties/status/provisioningError",
        "ignore_case": true,
        "poll": {"initial": "1ms", "factor": 1, "max": "1ms", "jitter": 0},
        "retry": {"delay": "1ms", "max_delay": "1ms", "max_retries": 3},
    });
    valid(&fine(), merged(base, overrides))
}

/// The Latitude.sh server waiter as a waitd request: errors other than permanent ones
/// are retried until the deadline (`max_retries: null`), like the CLI.
fn latitude(overrides: Value) -> Spec {
    valid(&fine(), latitude_request(overrides))
}

fn latitude_request(overrides: Value) -> Value {
    let base = json!({
        "target": {"url": "https://api.latitude.sh/servers/sv_1", "headers": {"Authorization": "Bearer t0k"}},
        "state": "/data/attributes/status",
        "want": ["on"],
        "fail": ["failed_deployment"],
        "poll": {"initial": "1ms", "factor": 1, "max": "1ms", "jitter": 0},
        "retry": {"delay": "1ms", "max_delay": "1ms", "max_retries": null},
    });
    merged(base, overrides)
}

/// A plain request for the semantics tests: state at `/status`, want `done`, fail
/// `broken`, no pending set.
fn plain(overrides: Value) -> Spec {
    plain_with(&fine(), overrides)
}

fn plain_with(limits: &Limits, overrides: Value) -> Spec {
    let base = json!({
        "target": {"url": "https://api.example.com/jobs/1"},
        "state": "/status",
        "want": ["done"],
        "fail": ["broken"],
        "poll": {"initial": "1s", "factor": 1, "max": "1s", "jitter": 0},
        "retry": {"delay": "1s", "max_delay": "1s", "max_retries": 10},
    });
    valid(limits, merged(base, overrides))
}

fn state(v: &str) -> Observation {
    Observation::State {
        values: vec![v.to_string()],
        detail: None,
    }
}

fn state_with_detail(v: &str, detail: Value) -> Observation {
    Observation::State {
        values: vec![v.to_string()],
        detail: Some(detail),
    }
}

fn missing() -> Observation {
    Observation::Missing {
        reason: "the state path is absent from the body".to_string(),
    }
}

fn not_found(status: u16) -> Observation {
    Observation::NotFound { status }
}

fn transient(error: &str) -> Observation {
    Observation::Transient {
        error: error.to_string(),
        retry_after: None,
    }
}

fn transient_after(error: &str, retry_after: Duration) -> Observation {
    Observation::Transient {
        error: error.to_string(),
        retry_after: Some(retry_after),
    }
}

fn permanent(error: &str) -> Observation {
    Observation::Permanent {
        error: error.to_string(),
    }
}

/// What feeding a list of observations to the engine did.
#[derive(Debug)]
struct Run {
    /// `None` when the observations ran out before the wait ended.
    outcome: Option<Outcome>,
    polls: u32,
    /// Between each poll and the next one scheduled.
    delays: Vec<Duration>,
    events: Vec<Event>,
    first_poll: DateTime<Utc>,
    /// When the last observation was made.
    last_poll: DateTime<Utc>,
    state: EngineState,
}

impl Run {
    fn end(&self) -> End {
        self.outcome
            .as_ref()
            .unwrap_or_else(|| panic!("the wait did not end: {self:#?}"))
            .end
    }

    fn reason(&self) -> &str {
        &self.outcome.as_ref().expect("the wait ended").reason
    }

    fn retry_events(&self) -> Vec<(String, u32, Duration)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Retry {
                    error,
                    attempt,
                    delay,
                } => Some((error.clone(), *attempt, *delay)),
                Event::State { .. } => None,
            })
            .collect()
    }
}

/// Feeds `observations` with no jitter, starting a wait created at [`t0`].
fn drive(spec: &Spec, floor: Duration, observations: impl IntoIterator<Item = Observation>) -> Run {
    drive_jittered(spec, floor, &[0.0], observations)
}

/// Feeds `observations`, the n-th with the jitter sample `samples[n % len]`, advancing
/// `now` to each `PollAt` time; stops at the first `End`.
fn drive_jittered(
    spec: &Spec,
    floor: Duration,
    samples: &[f64],
    observations: impl IntoIterator<Item = Observation>,
) -> Run {
    let (mut st, first) = EngineState::start(spec, t0());
    let mut now = first;
    let mut run = Run {
        outcome: None,
        polls: 0,
        delays: Vec::new(),
        events: Vec::new(),
        first_poll: first,
        last_poll: first,
        state: st.clone(),
    };
    for (i, obs) in observations.into_iter().enumerate() {
        let cx = Context {
            now,
            floor,
            jitter: samples[i % samples.len()],
        };
        let out = step(spec, &mut st, obs, cx);
        run.polls += 1;
        run.last_poll = now;
        assert_eq!(st.polls, run.polls, "the engine counts every observation");
        run.events.extend(out.events);
        match out.decision {
            Decision::PollAt(at) => {
                assert!(
                    at > now,
                    "poll {} scheduled at {at}, not after {now}",
                    i + 1
                );
                run.delays.push((at - now).to_std().unwrap());
                now = at;
            }
            Decision::End(outcome) => {
                run.outcome = Some(outcome);
                break;
            }
        }
    }
    run.state = st;
    run
}

// ---------------------------------------------------------------------------------
// A. The AKS machine poller's cases
// ---------------------------------------------------------------------------------

#[test]
fn aks_immediate_success_takes_one_poll() {
    let run = drive(&aks(json!({})), FINE_FLOOR, [state("Succeeded")]);
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 1);
    assert!(run.delays.is_empty());
    assert_eq!(run.outcome.unwrap().error_detail, None);
}

#[test]
fn aks_creating_twice_then_succeeded_succeeds_after_three_polls() {
    // waitd polls at once (the seed's ticker waits one interval first), so three
    // observations are three polls, as in the seed's three GETs.
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [state("Creating"), state("Creating"), state("Succeeded")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
    assert_eq!(run.delays, vec![ms(1), ms(1)]);
    assert_eq!(run.state.retries, 0);
}

#[test]
fn aks_preset_timing_polls_at_a_fixed_five_second_interval() {
    let spec = aks(json!({
        "poll": {"initial": "5s", "factor": 1, "max": "5s", "jitter": 0},
        "retry": {"delay": "1s", "max_delay": "30s", "max_retries": 10},
    }));
    let run = drive(
        &spec,
        DEFAULT_FLOOR,
        [
            state("Creating"),
            state("Creating"),
            state("Creating"),
            state("Succeeded"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.delays, vec![secs(5), secs(5), secs(5)]);
}

#[test]
fn aks_creating_then_failed_returns_the_provisioning_error_as_the_detail() {
    let detail = json!({"code": "SkuNotAvailable", "message": "The requested VM size is not available", "target": "vmSize", "details": []});
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [
            state("Creating"),
            state_with_detail("Failed", detail.clone()),
        ],
    );
    assert_eq!(run.end(), End::Failed);
    assert_eq!(run.polls, 2);
    let outcome = run.outcome.unwrap();
    assert_eq!(outcome.error_detail, Some(detail));
    assert!(outcome.reason.contains("Failed"), "{}", outcome.reason);
}

#[test]
fn aks_immediate_failed_ends_at_once_with_its_detail() {
    let detail = json!({"code": "SkuNotAvailable"});
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [state_with_detail("Failed", detail.clone())],
    );
    assert_eq!(run.end(), End::Failed);
    assert_eq!(run.polls, 1);
    assert_eq!(run.outcome.unwrap().error_detail, Some(detail));
}

#[test]
fn aks_failed_without_a_detail_still_ends_failed_with_no_detail() {
    // A deliberate departure from the seed, which reports "Failed, but
    // ProvisioningError is nil" as an error: the target did say Failed.
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [state("Creating"), state("Failed")],
    );
    assert_eq!(run.end(), End::Failed);
    assert_eq!(run.outcome.unwrap().error_detail, None);
}

#[test]
fn aks_deleting_is_in_the_fail_set_and_ends_the_wait_failed() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [state("Creating"), state("Deleting"), state("Succeeded")],
    );
    assert_eq!(run.end(), End::Failed);
    assert_eq!(run.polls, 2);
    assert!(run.reason().contains("Deleting"), "{}", run.reason());
}

#[test]
fn aks_creating_then_a_429_then_succeeded_succeeds_after_three_polls() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [
            state("Creating"),
            transient("429 Too Many Requests"),
            state("Succeeded"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
    assert_eq!(
        run.retry_events(),
        vec![("429 Too Many Requests".to_string(), 1, ms(1))]
    );
}

#[test]
fn aks_a_404_after_creating_ends_in_error_when_not_found_is_error() {
    let spec = aks(json!({}));
    assert_eq!(spec.not_found, NotFound::Error, "error is the default");
    let run = drive(
        &spec,
        FINE_FLOOR,
        [state("Creating"), not_found(404), state("Succeeded")],
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 2);
    assert!(run.reason().contains("404"), "{}", run.reason());
    assert!(run.reason().contains("not_found"), "{}", run.reason());
}

#[test]
fn aks_four_server_errors_with_max_retries_three_end_in_error_giving_up() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        std::iter::repeat_n(transient("500 Internal Server Error"), 10),
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(
        run.polls, 4,
        "max_retries + 1 bad observations end the wait"
    );
    let reason = run.reason();
    assert!(reason.contains("gave up"), "{reason}");
    assert!(reason.contains("500 Internal Server Error"), "{reason}");
    assert_eq!(run.state.retries, 3);
}

#[test]
fn aks_three_server_errors_with_max_retries_three_are_all_retried() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [
            transient("500"),
            transient("500"),
            transient("500"),
            state("Succeeded"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 4);
    let attempts: Vec<u32> = run.retry_events().iter().map(|r| r.1).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
}

#[test]
fn aks_missing_state_twice_then_succeeded_succeeds() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [missing(), missing(), state("Succeeded")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
    assert_eq!(run.state.retries, 2);
}

#[test]
fn aks_budget_resets_on_a_healthy_state_between_bursts_of_errors() {
    let spec = aks(json!({"retry": {"delay": "1ms", "max_delay": "1ms", "max_retries": 2}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("Creating"),
            transient("500"),
            transient("500"),
            state("Creating"),
            transient("500"),
            transient("500"),
            state("Succeeded"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 7);
    assert_eq!(run.state.retries, 4, "retries over the wait's life");
    let attempts: Vec<u32> = run.retry_events().iter().map(|r| r.1).collect();
    assert_eq!(attempts, vec![1, 2, 1, 2], "attempts count from the reset");
}

#[test]
fn aks_without_a_healthy_state_between_them_the_same_errors_exhaust_the_budget() {
    let spec = aks(json!({"retry": {"delay": "1ms", "max_delay": "1ms", "max_retries": 2}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("Creating"),
            transient("500"),
            transient("500"),
            transient("500"),
            state("Succeeded"),
        ],
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 4);
}

#[test]
fn aks_updating_twice_then_succeeded_succeeds() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [state("Updating"), state("Updating"), state("Succeeded")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
    assert_eq!(run.state.retries, 0);
}

#[test]
fn aks_four_unrecognised_states_with_max_retries_three_end_in_error() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        std::iter::repeat_n(state("Migrating"), 10),
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 4);
    let reason = run.reason();
    assert!(reason.contains("unrecognised"), "{reason}");
    assert!(reason.contains("Migrating"), "{reason}");
}

#[test]
fn aks_an_unrecognised_state_then_a_pending_one_resets_the_budget() {
    let spec = aks(json!({"retry": {"delay": "1ms", "max_delay": "1ms", "max_retries": 1}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("Migrating"),
            state("Creating"),
            state("Migrating"),
            state("Succeeded"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 4);
}

#[test]
fn aks_states_match_case_insensitively_like_the_preset() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [state("creating"), state("SUCCEEDED")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.state.retries, 0, "\"creating\" is the pending Creating");
}

// ---------------------------------------------------------------------------------
// B. The Latitude.sh CLI's cases
// ---------------------------------------------------------------------------------

#[test]
fn latitude_backoff_grows_by_one_and_a_half_up_to_fifteen_seconds() {
    let spec = valid(
        &Limits::default(),
        latitude_request(json!({
            "poll": {"initial": "2s", "factor": 1.5, "max": "15s", "jitter": 0},
            "retry": {"delay": "1s", "max_delay": "1s", "max_retries": null},
        })),
    );
    let run = drive(
        &spec,
        DEFAULT_FLOOR,
        std::iter::repeat_n(state("deploying"), 7),
    );
    assert_eq!(run.outcome, None);
    assert_eq!(
        run.delays,
        vec![
            ms(2000),
            ms(3000),
            ms(4500),
            ms(6750),
            ms(10125),
            ms(15000),
            ms(15000)
        ]
    );
}

#[test]
fn the_default_poll_is_two_seconds_times_one_and_a_half_up_to_fifteen() {
    let spec = valid(
        &Limits::default(),
        json!({
            "target": {"url": "https://api.latitude.sh/servers/sv_1"},
            "state": "/data/attributes/status",
            "want": ["on"],
        }),
    );
    assert_eq!(spec.poll.initial, secs(2));
    assert_eq!(spec.poll.factor, 1.5);
    assert_eq!(spec.poll.max, secs(15));
    assert_eq!(spec.poll.delay, Duration::ZERO);
}

#[test]
fn the_floor_raises_a_delay_shorter_than_itself() {
    let spec = plain(json!({"poll": {"initial": "100ms", "factor": 2, "max": "5s", "jitter": 0}}));
    let run = drive(
        &spec,
        DEFAULT_FLOOR,
        std::iter::repeat_n(state("working"), 7),
    );
    assert_eq!(
        run.delays,
        vec![
            secs(1),
            secs(1),
            secs(1),
            secs(1),
            ms(1600),
            ms(3200),
            secs(5)
        ]
    );
}

#[test]
fn a_poll_max_under_the_floor_wins_like_the_seed() {
    // The seed raises to its 1 s floor first, then caps at Max: a Max under the floor
    // wins. Here the operator's floor (the Context) is above what the spec was
    // validated against.
    let spec = plain(json!({"poll": {"initial": "10ms", "factor": 2, "max": "50ms", "jitter": 0}}));
    let run = drive(
        &spec,
        DEFAULT_FLOOR,
        std::iter::repeat_n(state("working"), 3),
    );
    assert_eq!(run.delays, vec![ms(50), ms(50), ms(50)]);
}

#[test]
fn the_floor_raises_a_short_retry_delay_and_a_max_delay_under_it_wins() {
    let spec = plain(json!({"retry": {"delay": "10ms", "max_delay": "5s", "max_retries": null}}));
    let run = drive(
        &spec,
        DEFAULT_FLOOR,
        std::iter::repeat_n(transient("503"), 3),
    );
    assert_eq!(run.delays, vec![secs(1), secs(1), secs(1)]);

    let spec = plain(json!({"retry": {"delay": "10ms", "max_delay": "50ms", "max_retries": null}}));
    let run = drive(
        &spec,
        DEFAULT_FLOOR,
        std::iter::repeat_n(transient("503"), 3),
    );
    assert_eq!(run.delays, vec![ms(50), ms(50), ms(50)]);
}

#[test]
fn latitude_polls_at_once_even_with_a_one_hour_initial_interval() {
    let spec = latitude(json!({
        "timeout": "2h",
        "poll": {"initial": "1h", "factor": 1, "max": "1h", "jitter": 0},
    }));
    let (_, first) = EngineState::start(&spec, t0());
    assert_eq!(first, t0());
    let run = drive(&spec, FINE_FLOOR, [state("deploying"), state("on")]);
    assert_eq!(run.delays, vec![secs(3600)]);
    assert_eq!(run.end(), End::Succeeded);
}

#[test]
fn latitude_stops_when_done_after_exactly_three_polls() {
    let run = drive(
        &latitude(json!({})),
        FINE_FLOOR,
        [
            state("deploying"),
            state("deploying"),
            state("on"),
            state("on"),
            state("on"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
}

#[test]
fn latitude_a_permanent_error_is_reported_as_is_and_ends_at_once() {
    let error = "the target answered 403 Forbidden: token lacks the servers scope";
    let run = drive(
        &latitude(json!({})),
        FINE_FLOOR,
        [permanent(error), state("on")],
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 1);
    assert!(run.reason().contains(error), "{}", run.reason());
    assert_eq!(run.state.last_error.as_deref(), Some(error));
}

#[test]
fn latitude_a_twenty_millisecond_deadline_times_out() {
    let spec = latitude(json!({
        "timeout": "20ms",
        "poll": {"initial": "5ms", "factor": 1, "max": "5ms", "jitter": 0},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        std::iter::repeat_n(state("deploying"), 100),
    );
    assert_eq!(run.end(), End::TimedOut);
    assert_eq!(run.polls, 5, "polls at 0, 5, 10, 15 and 20 ms");
    assert_eq!(run.last_poll, t0() + chrono::TimeDelta::milliseconds(20));
    assert!(run.reason().contains("deploying"), "{}", run.reason());
}

#[test]
fn latitude_a_missing_status_reads_as_missing_and_is_not_fatal() {
    let spec = latitude(json!({}));
    let values = |body: Value| {
        spec.state
            .as_ref()
            .expect("the seeds have a state path")
            .state_values(&body, &mut Budget::default())
            .unwrap()
    };
    assert_eq!(values(json!({"data": {}})), Selected::Nothing);
    assert_eq!(
        values(json!({"data": {"attributes": {"status": null}}})),
        Selected::OnlyNull
    );
    assert_eq!(values(json!(null)), Selected::Nothing);
    assert_eq!(
        values(json!({"data": {"attributes": {"status": "on"}}})),
        Selected::Values(vec!["on".to_string()])
    );
    let run = drive(&spec, FINE_FLOOR, [missing(), missing(), state("on")]);
    assert_eq!(run.end(), End::Succeeded);
}

#[test]
fn latitude_want_without_require_transition_is_done_at_once() {
    let run = drive(&latitude(json!({})), FINE_FLOOR, [state("on")]);
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 1);
}

#[test]
fn latitude_want_before_a_transition_does_not_count_and_is_not_itself_a_transition() {
    let spec = latitude(json!({"want": ["on", "off"], "require_transition": true}));
    let run = drive(&spec, FINE_FLOOR, [state("on"), state("off"), state("on")]);
    assert_eq!(
        run.outcome, None,
        "want states before a transition are gated"
    );
    assert!(!run.state.transition_seen);
    assert_eq!(
        run.state.retries, 0,
        "a gated want state is healthy progress"
    );

    let run = drive(
        &spec,
        FINE_FLOOR,
        [state("on"), state("deploying"), state("on")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
}

#[test]
fn latitude_deploying_then_on_is_done_with_require_transition() {
    let spec = latitude(json!({"want": ["on", "off"], "require_transition": true}));
    let run = drive(&spec, FINE_FLOOR, [state("deploying"), state("on")]);
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 2);
}

#[test]
fn latitude_a_fail_state_before_any_transition_ends_at_once() {
    let spec = latitude(json!({"require_transition": true}));
    let run = drive(&spec, FINE_FLOOR, [state("failed_deployment")]);
    assert_eq!(run.end(), End::Failed);
    assert_eq!(run.polls, 1);
    assert!(
        run.reason().contains("failed_deployment"),
        "{}",
        run.reason()
    );
}

#[test]
fn latitude_a_missing_state_does_not_count_as_a_transition() {
    let spec = latitude(json!({"require_transition": true}));
    let run = drive(&spec, FINE_FLOOR, [missing(), state("on")]);
    assert_eq!(run.outcome, None);
    let run = drive(
        &spec,
        FINE_FLOOR,
        [missing(), state("on"), state("off"), state("on")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 4);
}

#[test]
fn latitude_transient_errors_are_retried_until_the_deadline_when_max_retries_is_null() {
    let spec = latitude(json!({
        "timeout": "10s",
        "retry": {"delay": "1s", "max_delay": "1s", "max_retries": null},
    }));
    assert_eq!(spec.retry.max_retries, None);
    let run = drive(
        &spec,
        FINE_FLOOR,
        std::iter::repeat_n(transient("502 Bad Gateway"), 1000),
    );
    assert_eq!(run.end(), End::TimedOut);
    assert_eq!(
        run.polls, 11,
        "one poll at once, then one a second to the deadline"
    );
    assert_eq!(run.last_poll, t0() + chrono::TimeDelta::seconds(10));
    let reason = run.reason();
    assert!(reason.contains("last error"), "{reason}");
    assert!(reason.contains("502 Bad Gateway"), "{reason}");
}

#[test]
fn latitude_throttling_and_server_errors_are_not_terminal() {
    let run = drive(
        &latitude(json!({})),
        FINE_FLOOR,
        [
            transient("408 Request Timeout"),
            transient("425 Too Early"),
            transient("429 Too Many Requests"),
            transient("503 Service Unavailable"),
            transient("connection refused"),
            state("on"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 6);
}

// ---------------------------------------------------------------------------------
// C. docs/engine.md §3
// ---------------------------------------------------------------------------------

#[test]
fn retry_after_is_a_lower_bound_on_the_next_delay() {
    let spec = plain(json!({
        "retry": {"delay": "1s", "max_delay": "30s", "max_retries": null},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            // Raises the 1 s retry delay.
            transient_after("429", secs(7)),
            // Does not lower the 2 s retry delay.
            transient_after("429", ms(10)),
            // Raises even past max_delay: the target asked for it.
            transient_after("503", secs(45)),
            state("working"),
        ],
    );
    assert_eq!(run.delays, vec![secs(7), secs(2), secs(45), secs(1)]);
    let reported: Vec<Duration> = run.retry_events().iter().map(|r| r.2).collect();
    assert_eq!(reported, vec![secs(7), secs(2), secs(45)]);
}

#[test]
fn one_last_poll_happens_exactly_at_the_deadline_then_the_wait_times_out() {
    let spec = plain(json!({
        "timeout": "10s",
        "poll": {"initial": "4s", "factor": 1, "max": "4s", "jitter": 0},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        std::iter::repeat_n(state("working"), 100),
    );
    assert_eq!(run.end(), End::TimedOut);
    assert_eq!(run.delays, vec![secs(4), secs(4), secs(2)]);
    assert_eq!(run.polls, 4);
    assert_eq!(run.last_poll, run.state.deadline);
    assert_eq!(run.state.deadline, t0() + chrono::TimeDelta::seconds(10));
    let reason = run.reason();
    assert!(reason.contains("4 polls"), "{reason}");
    assert!(reason.contains("\"working\""), "{reason}");
}

#[test]
fn a_want_state_seen_at_the_last_poll_on_the_deadline_succeeds() {
    let spec = plain(json!({
        "timeout": "10s",
        "poll": {"initial": "4s", "factor": 1, "max": "4s", "jitter": 0},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("working"),
            state("working"),
            state("working"),
            state("done"),
        ],
    );
    assert_eq!(run.last_poll, run.state.deadline);
    assert_eq!(run.end(), End::Succeeded);
}

#[test]
fn a_fail_state_seen_at_the_deadline_fails_rather_than_timing_out() {
    let spec = plain(json!({"timeout": "2s"}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [state("working"), state("working"), state("broken")],
    );
    assert_eq!(run.last_poll, run.state.deadline);
    assert_eq!(run.end(), End::Failed);
}

#[test]
fn a_retry_that_would_pass_the_deadline_is_clamped_to_it() {
    let spec = plain(json!({
        "timeout": "5s",
        "retry": {"delay": "1s", "max_delay": "1m", "max_retries": null},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            transient_after("429", secs(600)),
            transient("503 Service Unavailable"),
        ],
    );
    assert_eq!(run.delays, vec![secs(5)]);
    assert_eq!(run.end(), End::TimedOut);
    assert!(
        run.reason().contains("503 Service Unavailable"),
        "{}",
        run.reason()
    );
}

#[test]
fn an_absurdly_long_retry_after_is_clamped_to_the_deadline_without_panicking() {
    // A target may send any number in Retry-After; ~317,000 years is past chrono's
    // range. The engine must still schedule the last poll at the deadline.
    let spec = plain(json!({
        "timeout": "5s",
        "retry": {"delay": "1s", "max_delay": "1m", "max_retries": null},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            transient_after("429", secs(9_999_999_999_999)),
            state("done"),
        ],
    );
    assert_eq!(run.delays, vec![secs(5)]);
    assert_eq!(run.end(), End::Succeeded);
}

#[test]
fn an_absurdly_long_poll_interval_is_refused_or_clamped_to_the_deadline_without_panicking() {
    // Validation bounds the timeout but not the intervals. Either fix is right: refuse
    // the request naming poll.initial, or schedule the next poll at the deadline.
    let request = merged(
        minimal(),
        json!({"timeout": "10m", "poll": {"initial": "100000000d"}}),
    );
    let spec = match Spec::from_request(&request, &fine()) {
        Err(errs) => {
            error_for(&errs, "poll.initial");
            return;
        }
        Ok(spec) => spec,
    };
    let run = drive(&spec, FINE_FLOOR, [state("working"), state("done")]);
    assert_eq!(run.delays, vec![secs(600)]);
    assert_eq!(run.end(), End::Succeeded);
}

#[test]
fn consecutive_three_needs_three_want_observations_in_a_row() {
    let spec = plain(json!({"consecutive": 3}));
    let run = drive(&spec, FINE_FLOOR, [state("done"), state("done")]);
    assert_eq!(run.outcome, None);
    let run = drive(
        &spec,
        FINE_FLOOR,
        [state("done"), state("done"), state("done"), state("done")],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
    assert!(
        run.reason().contains("3 times in a row"),
        "{}",
        run.reason()
    );
}

#[test]
fn a_non_want_state_resets_the_consecutive_count() {
    let spec = plain(json!({"consecutive": 3}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("done"),
            state("done"),
            state("working"),
            state("done"),
            state("done"),
        ],
    );
    assert_eq!(run.outcome, None, "only two in a row since the reset");
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("done"),
            state("done"),
            state("working"),
            state("done"),
            state("done"),
            state("done"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 6);
}

#[test]
fn a_missing_state_resets_the_consecutive_count() {
    let spec = plain(json!({"consecutive": 2}));
    let run = drive(&spec, FINE_FLOOR, [state("done"), missing(), state("done")]);
    assert_eq!(run.outcome, None);
}

#[test]
fn ignore_case_matches_want_and_fail_without_regard_to_case() {
    let spec = plain(json!({"want": ["Done"], "fail": ["Broken"], "ignore_case": true}));
    let run = drive(&spec, FINE_FLOOR, [state("DONE")]);
    assert_eq!(run.end(), End::Succeeded);
    let run = drive(&spec, FINE_FLOOR, [state("broken")]);
    assert_eq!(run.end(), End::Failed);
}

#[test]
fn without_ignore_case_a_differently_cased_state_is_not_a_match() {
    let spec = plain(json!({"want": ["Done"], "fail": ["Broken"]}));
    let run = drive(&spec, FINE_FLOOR, [state("DONE"), state("broken")]);
    assert_eq!(run.outcome, None);
    let spec = plain(json!({"want": ["Done"], "pending": ["Working"]}));
    let run = drive(&spec, FINE_FLOOR, [state("working")]);
    assert_eq!(
        run.state.budget_used, 1,
        "\"working\" is not the pending Working"
    );
}

/// The state values a spec's path reads from a body.
fn values_at(spec: &Spec, body: Value) -> Vec<String> {
    match spec
        .state
        .as_ref()
        .expect("the seeds have a state path")
        .state_values(&body, &mut Budget::default())
    {
        Ok(Selected::Values(v)) => v,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_jsonpath_with_several_values_succeeds_only_when_all_are_in_want() {
    let spec = plain(json!({"state": "$.items[*].status", "want": ["ready"], "fail": ["broken"]}));
    let some = values_at(
        &spec,
        json!({"items": [{"status": "ready"}, {"status": "pending"}]}),
    );
    let all = values_at(
        &spec,
        json!({"items": [{"status": "ready"}, {"status": "ready"}]}),
    );
    assert_eq!(all, vec!["ready", "ready"]);
    let obs = |values: Vec<String>| Observation::State {
        values,
        detail: None,
    };
    let run = drive(&spec, FINE_FLOOR, [obs(some.clone())]);
    assert_eq!(run.outcome, None, "one of two ready is not done");
    let run = drive(&spec, FINE_FLOOR, [obs(some), obs(all)]);
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 2);
}

#[test]
fn a_jsonpath_with_several_values_fails_when_any_is_in_fail() {
    let spec = plain(json!({"state": "$.items[*].status", "want": ["ready"], "fail": ["broken"]}));
    let values = values_at(
        &spec,
        json!({"items": [{"status": "ready"}, {"status": "broken"}, {"status": "ready"}]}),
    );
    let run = drive(
        &spec,
        FINE_FLOOR,
        [Observation::State {
            values,
            detail: None,
        }],
    );
    assert_eq!(run.end(), End::Failed);
    assert!(run.reason().contains("broken"), "{}", run.reason());
}

#[test]
fn numbers_and_booleans_compare_as_their_json_text() {
    let spec = plain(json!({"state": "/ready", "want": [true], "fail": [3]}));
    assert_eq!(spec.want, vec!["true"]);
    let values = values_at(&spec, json!({"ready": true}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [Observation::State {
            values,
            detail: None,
        }],
    );
    assert_eq!(run.end(), End::Succeeded);
    let values = values_at(&spec, json!({"ready": 3}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [Observation::State {
            values,
            detail: None,
        }],
    );
    assert_eq!(run.end(), End::Failed);
}

#[test]
fn poll_delay_postpones_the_first_poll() {
    let spec = plain(json!({"poll": {"initial": "1s", "delay": "30s"}}));
    let (st, first) = EngineState::start(&spec, t0());
    assert_eq!(first, t0() + chrono::TimeDelta::seconds(30));
    assert_eq!(st.deadline, t0() + chrono::TimeDelta::minutes(10));
    assert_eq!(st.polls, 0);
    let run = drive(&spec, FINE_FLOOR, [state("done")]);
    assert_eq!(run.first_poll, first);
    assert_eq!(run.last_poll, first);

    let spec = plain(json!({}));
    let (_, first) = EngineState::start(&spec, t0());
    assert_eq!(first, t0(), "without poll.delay the first poll is at once");
}

#[test]
fn a_permanent_error_ends_the_wait_in_error_at_once_even_with_unlimited_retries() {
    let spec = plain(json!({"retry": {"delay": "1s", "max_delay": "1s", "max_retries": null}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("working"),
            permanent("the target answered 401 Unauthorized"),
            state("done"),
        ],
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 2);
    assert!(
        run.reason().contains("401 Unauthorized"),
        "{}",
        run.reason()
    );
}

#[test]
fn the_retry_delay_doubles_up_to_max_delay_and_resets_after_a_healthy_state() {
    let spec = plain(json!({
        "poll": {"initial": "5s", "factor": 1, "max": "5s", "jitter": 0},
        "retry": {"delay": "1s", "max_delay": "4s", "max_retries": null},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            transient("500"),
            transient("500"),
            transient("500"),
            transient("500"),
            state("working"),
            transient("500"),
            missing(),
        ],
    );
    assert_eq!(
        run.delays,
        vec![
            secs(1),
            secs(2),
            secs(4),
            secs(4),
            secs(5),
            secs(1),
            secs(2)
        ]
    );
}

#[test]
fn a_healthy_poll_does_not_reset_the_growing_poll_interval() {
    // Only the retry side resets; the healthy interval keeps growing across retries.
    let spec = plain(json!({
        "poll": {"initial": "1s", "factor": 2, "max": "1m", "jitter": 0},
        "retry": {"delay": "1s", "max_delay": "1s", "max_retries": null},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("working"),
            state("working"),
            transient("503"),
            state("working"),
        ],
    );
    assert_eq!(run.delays, vec![secs(1), secs(2), secs(1), secs(4)]);
}

#[test]
fn a_jitter_sample_of_plus_or_minus_one_spreads_the_delay_by_the_jitter_fraction() {
    let spec = plain(json!({
        "poll": {"initial": "10s", "factor": 1, "max": "20s", "jitter": 0.1},
        "retry": {"delay": "4s", "max_delay": "20s", "max_retries": null},
    }));
    let run = drive_jittered(
        &spec,
        DEFAULT_FLOOR,
        &[1.0, -1.0, 0.5, 0.0, 1.0],
        [
            state("working"),
            state("working"),
            state("working"),
            state("working"),
            transient("503"),
        ],
    );
    assert_eq!(
        run.delays,
        vec![secs(11), secs(9), ms(10_500), secs(10), ms(4_400)]
    );
}

#[test]
fn jitter_never_takes_a_delay_over_the_max_or_under_the_floor() {
    let spec = plain_with(
        &Limits::default(),
        json!({"poll": {"initial": "10s", "factor": 1, "max": "10s", "jitter": 0.5}}),
    );
    let run = drive_jittered(
        &spec,
        DEFAULT_FLOOR,
        &[1.0],
        std::iter::repeat_n(state("working"), 2),
    );
    assert_eq!(run.delays, vec![secs(10), secs(10)], "capped at poll.max");

    let spec = plain_with(
        &Limits::default(),
        json!({"poll": {"initial": "1s", "factor": 1, "max": "10s", "jitter": 0.5}}),
    );
    let run = drive_jittered(
        &spec,
        DEFAULT_FLOOR,
        &[-1.0],
        std::iter::repeat_n(state("working"), 2),
    );
    assert_eq!(run.delays, vec![secs(1), secs(1)], "raised to the floor");

    let spec = plain_with(
        &Limits::default(),
        json!({"retry": {"delay": "8s", "max_delay": "8s", "max_retries": null}, "poll": {"jitter": 0.5}}),
    );
    let run = drive_jittered(
        &spec,
        DEFAULT_FLOOR,
        &[1.0],
        std::iter::repeat_n(transient("503"), 2),
    );
    assert_eq!(
        run.delays,
        vec![secs(8), secs(8)],
        "capped at retry.max_delay"
    );
}

#[test]
fn not_found_retry_is_retried_against_the_budget() {
    let spec = plain(
        json!({"not_found": "retry", "retry": {"delay": "1s", "max_delay": "1s", "max_retries": 2}}),
    );
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            not_found(404),
            not_found(404),
            state("working"),
            state("done"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.state.retries, 2);

    let run = drive(&spec, FINE_FLOOR, std::iter::repeat_n(not_found(404), 10));
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 3);
    assert!(run.reason().contains("404"), "{}", run.reason());
}

#[test]
fn not_found_success_ends_the_wait_succeeded_when_the_target_is_gone() {
    let spec = plain(json!({"not_found": "success"}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [state("deleting"), state("deleting"), not_found(410)],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.polls, 3);
    assert!(run.reason().contains("410"), "{}", run.reason());
}

#[test]
fn without_pending_every_state_outside_want_and_fail_is_healthy_progress() {
    let spec = plain(json!({"retry": {"delay": "1s", "max_delay": "1s", "max_retries": 0}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("queued"),
            state("whatever"),
            state("anything at all"),
            state("done"),
        ],
    );
    assert_eq!(run.end(), End::Succeeded);
    assert_eq!(run.state.retries, 0);
}

#[test]
fn max_retries_zero_ends_the_wait_on_the_first_bad_observation() {
    let spec = plain(json!({"retry": {"delay": "1s", "max_delay": "1s", "max_retries": 0}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [state("working"), missing(), state("done")],
    );
    assert_eq!(run.end(), End::Error);
    assert_eq!(run.polls, 2);
    assert!(run.reason().contains("absent"), "{}", run.reason());
}

#[test]
fn a_state_event_is_recorded_only_when_the_state_changes() {
    let run = drive(
        &aks(json!({})),
        FINE_FLOOR,
        [
            state("Creating"),
            state("Creating"),
            transient("500"),
            state("Creating"),
            state("Updating"),
            state("Succeeded"),
        ],
    );
    let changes: Vec<(Option<String>, String)> = run
        .events
        .iter()
        .filter_map(|e| match e {
            Event::State { from, to } => Some((from.clone(), to.clone())),
            Event::Retry { .. } => None,
        })
        .collect();
    assert_eq!(
        changes,
        vec![
            (None, "Creating".to_string()),
            (Some("Creating".to_string()), "Updating".to_string()),
            (Some("Updating".to_string()), "Succeeded".to_string()),
        ]
    );
}

#[test]
fn a_retry_event_carries_the_error_the_attempt_and_the_delay() {
    let spec = plain(json!({"retry": {"delay": "1s", "max_delay": "30s", "max_retries": 5}}));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            transient("503 Service Unavailable"),
            missing(),
            state("done"),
        ],
    );
    assert_eq!(
        run.retry_events(),
        vec![
            ("503 Service Unavailable".to_string(), 1, secs(1)),
            (
                "the state path is absent from the body".to_string(),
                2,
                secs(2)
            ),
        ]
    );
}

#[test]
fn a_healthy_poll_that_changes_nothing_records_no_event() {
    let spec = plain(json!({}));
    let (mut st, now) = EngineState::start(&spec, t0());
    let cx = Context {
        now,
        floor: FINE_FLOOR,
        jitter: 0.0,
    };
    let first = step(&spec, &mut st, state("working"), cx);
    assert_eq!(first.events.len(), 1);
    let cx = Context {
        now: now + chrono::TimeDelta::seconds(1),
        ..cx
    };
    let second = step(&spec, &mut st, state("working"), cx);
    assert!(second.events.is_empty(), "{:?}", second.events);
}

#[test]
fn a_timeout_reports_the_last_state_and_the_last_error() {
    let spec = plain(json!({
        "timeout": "3s",
        "retry": {"delay": "1s", "max_delay": "1s", "max_retries": null},
    }));
    let run = drive(
        &spec,
        FINE_FLOOR,
        [
            state("working"),
            transient("connection reset by peer"),
            state("working"),
            state("working"),
        ],
    );
    assert_eq!(run.end(), End::TimedOut);
    let reason = run.reason();
    assert!(reason.contains("\"working\""), "{reason}");
    assert!(reason.contains("connection reset by peer"), "{reason}");
    assert_eq!(
        run.state.last_error.as_deref(),
        Some("connection reset by peer")
    );
}

// ---------------------------------------------------------------------------------
// D. Validation: every mistake named by its field
// ---------------------------------------------------------------------------------

fn minimal() -> Value {
    json!({
        "target": {"url": "https://api.example.com/jobs/1"},
        "state": "/status",
        "want": ["done"],
    })
}

#[test]
fn a_valid_minimal_request_gets_the_documented_defaults() {
    let spec = valid(&Limits::default(), minimal());
    assert_eq!(spec.fail, Vec::<String>::new());
    assert_eq!(spec.pending, None);
    assert!(!spec.require_transition);
    assert_eq!(spec.consecutive, 1);
    assert_eq!(spec.not_found, NotFound::Error);
    assert!(!spec.ignore_case);
    assert_eq!(spec.timeout, secs(600));
    assert_eq!(spec.poll.jitter, 0.1);
    assert_eq!(spec.retry.delay, secs(1));
    assert_eq!(spec.retry.max_delay, secs(30));
    assert_eq!(spec.retry.max_retries, Some(10));
}

#[test]
fn a_misspelt_field_is_rejected_by_name_with_a_did_you_mean_hint() {
    let errs = rejected(
        &Limits::default(),
        json!({
            "target": {"url": "https://api.example.com/jobs/1"},
            "state": "/status",
            "wnat": ["done"],
        }),
    );
    let e = error_for(&errs, "wnat");
    assert!(e.message.contains("did you mean \"want\""), "{}", e.message);
    error_for(&errs, "want");
}

#[test]
fn an_unknown_nested_field_is_named_by_its_dotted_path() {
    let errs = rejected(
        &Limits::default(),
        merged(minimal(), json!({"poll": {"intial": "2s"}})),
    );
    let e = error_for(&errs, "poll.intial");
    assert!(
        e.message.contains("did you mean \"initial\""),
        "{}",
        e.message
    );
}

#[test]
fn a_request_without_want_is_rejected_naming_want() {
    let errs = rejected(
        &Limits::default(),
        json!({"target": {"url": "https://api.example.com/jobs/1"}, "state": "/status"}),
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(error_for(&errs, "want").message.contains("required"));
}

#[test]
fn an_empty_want_is_rejected_naming_want() {
    let errs = rejected(&Limits::default(), merged(minimal(), json!({"want": []})));
    assert!(
        error_for(&errs, "want").message.contains("at least one"),
        "{errs:?}"
    );
}

#[test]
fn malformed_durations_are_rejected_each_naming_its_field() {
    let errs = rejected(
        &Limits::default(),
        merged(
            minimal(),
            json!({
                "timeout": "5",
                "poll": {"initial": "1.5s", "max": 15},
                "retry": {"delay": "soon"},
            }),
        ),
    );
    assert!(
        error_for(&errs, "timeout").message.contains("unit"),
        "{errs:?}"
    );
    error_for(&errs, "poll.initial");
    assert!(
        error_for(&errs, "poll.max").message.contains("a number"),
        "{errs:?}"
    );
    error_for(&errs, "retry.delay");
}

#[test]
fn a_timeout_over_the_server_maximum_is_rejected() {
    let errs = rejected(
        &Limits::default(),
        merged(minimal(), json!({"timeout": "25h"})),
    );
    assert!(
        error_for(&errs, "timeout").message.contains("maximum"),
        "{errs:?}"
    );
    let limits = Limits {
        max_timeout: secs(3600),
        ..Limits::default()
    };
    rejected(&limits, merged(minimal(), json!({"timeout": "61m"})));
    valid(&limits, merged(minimal(), json!({"timeout": "1h"})));
}

#[test]
fn a_zero_timeout_is_rejected() {
    let errs = rejected(
        &Limits::default(),
        merged(minimal(), json!({"timeout": "0s"})),
    );
    error_for(&errs, "timeout");
}

#[test]
fn a_state_in_both_want_and_fail_is_rejected() {
    let errs = rejected(
        &Limits::default(),
        merged(minimal(), json!({"want": ["done"], "fail": ["done"]})),
    );
    assert!(
        error_for(&errs, "fail").message.contains("both"),
        "{errs:?}"
    );
    // With ignore_case, "Done" and "done" are the same state.
    let errs = rejected(
        &Limits::default(),
        merged(
            minimal(),
            json!({"want": ["Done"], "fail": ["done"], "ignore_case": true}),
        ),
    );
    error_for(&errs, "fail");
    valid(
        &Limits::default(),
        merged(minimal(), json!({"want": ["Done"], "fail": ["done"]})),
    );
}

#[test]
fn a_pending_state_that_is_also_wanted_is_rejected() {
    let errs = rejected(
        &Limits::default(),
        merged(minimal(), json!({"pending": ["working", "done"]})),
    );
    error_for(&errs, "pending");
}

#[test]
fn a_poll_interval_under_the_floor_is_rejected() {
    let errs = rejected(
        &Limits::default(),
        merged(
            minimal(),
            json!({"poll": {"initial": "500ms"}, "retry": {"delay": "100ms"}}),
        ),
    );
    assert!(
        error_for(&errs, "poll.initial").message.contains("minimum"),
        "{errs:?}"
    );
    error_for(&errs, "retry.delay");
    valid(
        &fine(),
        merged(
            minimal(),
            json!({"poll": {"initial": "500ms"}, "retry": {"delay": "100ms"}}),
        ),
    );
}

#[test]
fn out_of_range_settings_are_rejected_each_naming_its_field() {
    let errs = rejected(
        &Limits::default(),
        merged(
            minimal(),
            json!({
                "consecutive": 0,
                "not_found": "ignore",
                "poll": {"initial": "10s", "max": "5s", "factor": 0.5, "jitter": 1.0},
                "retry": {"max_retries": -1},
            }),
        ),
    );
    for field in [
        "consecutive",
        "not_found",
        "poll.max",
        "poll.factor",
        "poll.jitter",
        "retry.max_retries",
    ] {
        error_for(&errs, field);
    }
}

#[test]
fn a_poll_delay_longer_than_the_timeout_is_rejected() {
    let errs = rejected(
        &Limits::default(),
        merged(minimal(), json!({"timeout": "1m", "poll": {"delay": "2m"}})),
    );
    error_for(&errs, "poll.delay");
}

#[test]
fn a_header_value_with_cr_or_lf_is_rejected_without_echoing_it() {
    for value in ["secret\r\nX-Injected: 1", "secret\nX-Injected: 1"] {
        let errs = rejected(
            &Limits::default(),
            merged(
                minimal(),
                json!({"target": {"url": "https://api.example.com/jobs/1", "headers": {"X-Token": value}}}),
            ),
        );
        let e = error_for(&errs, "target.headers.X-Token");
        assert!(!e.message.contains("secret"), "{}", e.message);
        assert!(!e.message.contains("Injected"), "{}", e.message);
    }
}

#[test]
fn a_url_with_credentials_is_rejected_without_echoing_them() {
    let errs = rejected(
        &Limits::default(),
        merged(
            minimal(),
            json!({"target": {"url": "https://alice:hunter2@api.example.com/jobs/1"}}),
        ),
    );
    let e = error_for(&errs, "target.url");
    assert!(e.message.contains("credentials"), "{}", e.message);
    assert!(!e.message.contains("hunter2"), "{}", e.message);
}

#[test]
fn a_request_with_several_mistakes_reports_them_all_at_once() {
    let errs = rejected(
        &Limits::default(),
        json!({
            "target": {"url": "ftp://api.example.com/x"},
            "state": "status",
            "want": "done",
            "timeout": "forever",
        }),
    );
    for field in ["target.url", "state", "want", "timeout"] {
        error_for(&errs, field);
    }
}
