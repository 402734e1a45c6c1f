//! `success_condition` and `failure_condition`: CEL expressions checked at creation,
//! evaluated on every response within a budget, and what the engine makes of them.
//!
//! The engine's side goes through its public functions (`probe::judge` builds the
//! observation a response makes, `engine::step` applies it); the API's side through
//! waitd's router in this process, on an in-memory SQLite store, against a scripted
//! upstream.

use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use serde_json::{Value, json};
use waitd::engine::condition::{self, Condition, Failure, Vars};
use waitd::engine::{Context, Decision, End, EngineState, Limits, Observation, Spec, step};
use waitd::presets::Registry;
use waitd::probe::{Polled, judge};

use support::in_process::InProcess;
use support::{Reply, Upstream};

fn limits() -> Limits {
    Limits {
        min_poll_interval: Duration::from_millis(1),
        ..Limits::default()
    }
}

fn spec(request: Value) -> Spec {
    let mut request = request;
    request["target"] = json!({"url": "http://127.0.0.1:9/x"});
    Spec::from_request(&request, &limits()).unwrap_or_else(|e| panic!("refused: {e:?}"))
}

fn refused(request: Value) -> Vec<(String, String)> {
    let mut request = request;
    request["target"] = json!({"url": "http://127.0.0.1:9/x"});
    match Spec::from_request(&request, &limits()) {
        Ok(_) => panic!("accepted: {request}"),
        Err(errs) => errs.into_iter().map(|e| (e.field, e.message)).collect(),
    }
}

fn eval(expr: &str, body: Value) -> Result<bool, Failure> {
    let c = Condition::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let headers = BTreeMap::from([("x-ready".to_string(), "yes, really".to_string())]);
    let vars = Vars::new(Some(&body), 200, &headers, None);
    c.evaluate(&vars, &mut condition::Budget::default())
}

fn no_headers() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// What one response does to a wait: the observation `judge` makes of it (with
/// `base` as the prober's own classification), applied by the engine.
fn respond(
    spec: &Spec,
    st: &mut EngineState,
    status: u16,
    body: Value,
    base: Observation,
) -> (Decision, Vec<waitd::engine::Event>) {
    let obs = judge(spec, status, &no_headers(), Some(&body), base);
    let s = step(spec, st, obs, cx());
    (s.decision, s.events)
}

/// The context of every step here: a fixed now, the 1 ms floor, no jitter.
fn cx() -> Context {
    Context {
        now: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
        floor: Duration::from_millis(1),
        jitter: 0.0,
    }
}

fn start(spec: &Spec) -> EngineState {
    EngineState::start(spec, Utc.timestamp_opt(1_700_000_000, 0).unwrap()).0
}

fn ended(d: &Decision) -> Option<(End, String)> {
    match d {
        Decision::End(o) => Some((o.end, o.reason.clone())),
        Decision::PollAt(_) => None,
    }
}

// ---- Creation: what is refused, and how it is said ----

#[test]
fn a_syntax_error_is_refused_with_its_position() {
    let errs = refused(json!({"success_condition": "status == = 200"}));
    assert_eq!(errs.len(), 1, "{errs:?}");
    let (field, message) = &errs[0];
    assert_eq!(field, "success_condition");
    assert!(message.contains("line 1, column"), "no position: {message}");
}

#[test]
fn unknown_variables_and_functions_are_named_with_a_suggestion() {
    let errs = refused(json!({"success_condition": "bdy.ready == true"}));
    assert!(
        errs[0].1.contains("bdy") && errs[0].1.contains("did you mean body"),
        "{errs:?}"
    );
    let errs =
        refused(json!({"failure_condition": "sizee(body.items) > 0", "success_condition": "true"}));
    assert_eq!(errs[0].0, "failure_condition");
    assert!(
        errs[0].1.contains("sizee") && errs[0].1.contains("did you mean size"),
        "{errs:?}"
    );
    // A comprehension's own variable is known inside it, and only there.
    spec(json!({"success_condition": "body.items.all(i, i.ok)"}));
    let errs = refused(json!({"success_condition": "body.items.all(i, i.ok) && i.ok"}));
    assert!(errs[0].1.contains("names i"), "{errs:?}");
}

#[test]
fn an_expression_that_can_never_be_a_bool_is_refused() {
    for (expr, kind) in [
        ("1 + 2", "a number"),
        ("size(body.items)", "a number"),
        ("'done'", "a string"),
        ("body.items.map(i, i.ok)", "a list"),
        ("{'a': 1}", "a map"),
    ] {
        let errs = refused(json!({"success_condition": expr}));
        assert!(
            errs[0].1.contains(kind) && errs[0].1.contains("never a bool"),
            "{expr}: {errs:?}"
        );
    }
    // Known only on a response: accepted, and an error there.
    spec(json!({"success_condition": "body.ready"}));
    spec(json!({"success_condition": "body.items.exists(i, i.ok)"}));
}

#[test]
fn size_and_nesting_limits_are_400s_not_crashes() {
    let long = format!("status == 200 {}", "|| status == 201 ".repeat(200));
    let errs = refused(json!({"success_condition": long}));
    assert!(errs[0].1.contains("the limit is 2048"), "{errs:?}");
    // Nesting past the limit is refused by the parser, on a test thread's stack.
    let deep = format!("{}true{}", "(".repeat(200), ")".repeat(200));
    let errs = refused(json!({"success_condition": deep}));
    assert_eq!(errs[0].0, "success_condition", "{errs:?}");
    let deep = format!("{}1{}", "[".repeat(500), "]".repeat(500));
    let errs = refused(json!({"success_condition": deep}));
    assert_eq!(errs[0].0, "success_condition");
    assert!(
        errs[0].1.contains("nests deeper than 32 levels"),
        "{errs:?}"
    );
    for bad in [json!(""), json!("   "), json!(7), json!(["status == 200"])] {
        let errs = refused(json!({"success_condition": bad}));
        assert_eq!(errs[0].0, "success_condition", "{bad}: {errs:?}");
    }
}

#[test]
fn a_wait_needs_want_or_a_success_condition_and_want_needs_state() {
    let errs = refused(json!({}));
    let fields: Vec<&str> = errs.iter().map(|(f, _)| f.as_str()).collect();
    assert!(
        fields.contains(&"state") && fields.contains(&"want"),
        "{errs:?}"
    );
    let errs = refused(json!({"want": ["on"], "success_condition": "true"}));
    assert_eq!(errs[0].0, "state", "{errs:?}");
    assert!(errs[0].1.contains("with want"), "{errs:?}");
    // A failure_condition alone decides nothing that would end the wait well.
    let errs = refused(json!({"failure_condition": "status == 403"}));
    assert!(errs.iter().any(|(f, _)| f == "want"), "{errs:?}");
    let s = spec(json!({"success_condition": "status == 404"}));
    assert!(s.state.is_none() && s.want.is_empty());
}

#[test]
fn a_spec_with_conditions_reads_back_as_a_request_meaning_the_same() {
    let s = spec(json!({
        "state": "/status", "want": ["done"],
        "success_condition": "body.count >= 3",
        "failure_condition": "status == 403"
    }));
    let text = serde_json::to_value(&s).unwrap();
    assert_eq!(text["success_condition"], "body.count >= 3");
    let again = Spec::from_request(&text, &limits()).unwrap();
    assert_eq!(again, s);
    let stored: Spec = serde_json::from_value(text.clone()).unwrap();
    assert_eq!(stored, s);
    // Waits held with the same expression share its compiled form.
    let again: Spec = serde_json::from_value(text).unwrap();
    let (a, b) = (
        stored.success_condition.unwrap(),
        again.success_condition.unwrap(),
    );
    assert!(a.shares_tree_with(&b));
    assert!(!a.shares_tree_with(&s.success_condition.unwrap()));
}

// ---- Evaluation: the variables, CEL's semantics as waitd feeds it ----

#[test]
fn the_variables_are_body_status_headers_and_state() {
    let body = json!({"spec": {"replicas": 3}, "status": {"readyReplicas": 3, "ratio": 1.0},
        "items": [{"state": "ok"}, {"state": "failed"}], "name": "web"});
    assert_eq!(
        eval(
            "body.status.readyReplicas >= body.spec.replicas",
            body.clone()
        ),
        Ok(true)
    );
    // JSON numbers: an integer compares with an int literal, a fraction with a double.
    assert_eq!(
        eval(
            "body.status.ratio == 1.0 && body.spec.replicas == 3",
            body.clone()
        ),
        Ok(true)
    );
    assert_eq!(
        eval("body.items.exists(i, i.state == 'failed')", body.clone()),
        Ok(true)
    );
    assert_eq!(
        eval("body.items.all(i, i.state == 'ok')", body.clone()),
        Ok(false)
    );
    assert_eq!(
        eval(
            "body.items.filter(i, i.state == 'ok').size() == 1",
            body.clone()
        ),
        Ok(true)
    );
    assert_eq!(
        eval(
            "body.name.startsWith('w') && body.name.matches('^w.b$')",
            body.clone()
        ),
        Ok(true)
    );
    assert_eq!(
        eval(
            "status == 200 && headers['x-ready'].contains('yes')",
            body.clone()
        ),
        Ok(true)
    );
    assert_eq!(
        eval("has(body.missing) || !has(body.status.phase)", body.clone()),
        Ok(true)
    );
    assert_eq!(
        eval("body.?missing.?deeper.orValue(7) == 7", body.clone()),
        Ok(true)
    );
    assert_eq!(eval("state == null", body), Ok(true));
}

#[test]
fn an_evaluation_error_is_cel_s_own_sentence() {
    let body = json!({"a": 1});
    match eval("body.b == 1", body.clone()) {
        Err(Failure::Error(e)) => assert!(e.contains('b'), "{e}"),
        other => panic!("{other:?}"),
    }
    match eval("body.a", body.clone()) {
        Err(Failure::Error(e)) => assert!(e.contains("not a bool"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        eval("body.a == 'x' || body.a > 'y'", body),
        Err(Failure::Error(_))
    ));
}

/// A list of `n` small objects, as a target might send.
fn items(n: usize) -> Value {
    json!({"items": (0..n).map(|i| json!({"id": i, "state": "ok"})).collect::<Vec<_>>()})
}

#[test]
fn linear_work_over_a_large_body_fits_the_budget() {
    let body = items(50_000);
    let t = Instant::now();
    assert_eq!(
        eval("body.items.all(i, i.state == 'ok')", body.clone()),
        Ok(true)
    );
    assert_eq!(
        eval("body.items.filter(i, i.id % 2 == 0).size() == 25000", body),
        Ok(true)
    );
    eprintln!("two linear passes over 50,000 items: {:?}", t.elapsed());
}

#[test]
fn quadratic_and_copying_expressions_stop_at_the_budget() {
    let body = items(20_000);
    let hostile = [
        // Nested macros over the same large list: 4 * 10^8 steps unmetered.
        "body.items.all(x, body.items.all(y, x.id != y.id || x == y))",
        "body.items.exists(x, body.items.exists(y, x.id == y.id + 20000))",
        "body.items.map(x, body.items).size() == 0",
        "body.items.all(x, x in body.items) && false",
        // Copying: each step builds a list as large as the body.
        "body.items.map(x, body.items + body.items).size() > 0",
        "body.items.exists_one(x, body.items.filter(y, y.id > x.id).size() == 0)",
    ];
    for expr in hostile {
        let t = crate::support::thread_cpu();
        let got = eval(expr, body.clone());
        let took = crate::support::thread_cpu() - t;
        assert_eq!(got, Err(Failure::Budget), "{expr}");
        eprintln!("{expr}: stopped after {took:?}");
        assert!(took < Duration::from_secs(10), "{expr} took {took:?}");
    }
}

#[test]
fn string_growth_is_charged_by_its_bytes() {
    let body = json!({"s": "x".repeat(512 * 1024), "items": (0..1000).collect::<Vec<_>>()});
    let expr = "body.items.map(i, body.s + body.s).size() > 0";
    let t = Instant::now();
    assert_eq!(eval(expr, body.clone()), Err(Failure::Budget));
    eprintln!("{expr}: stopped after {:?}", t.elapsed());
    // A chain as long as the tree's depth allows; a longer one is refused at
    // creation (`a_chain_past_the_tree_depth_is_refused_whatever_its_operator`).
    let chain = format!("size(body.s{}) > 0", " + body.s".repeat(60));
    assert_eq!(eval(&chain, body), Err(Failure::Budget));
}

#[test]
fn the_two_conditions_of_a_response_share_one_budget() {
    let body = items(5_000);
    let headers = no_headers();
    let vars = Vars::new(Some(&body), 200, &headers, None);
    let mut budget = condition::Budget::default();
    let c = Condition::compile("body.items.all(i, i.state == 'ok')").unwrap();
    assert_eq!(c.evaluate(&vars, &mut budget), Ok(true));
    let once = budget.spent();
    assert!(once > 5_000, "a pass over 5,000 items cost {once} units");
    assert_eq!(c.evaluate(&vars, &mut budget), Ok(true));
    assert!(
        budget.spent() >= 2 * once,
        "{} after two, {once} after one",
        budget.spent()
    );
}

// ---- The engine: what a response decided ----

#[test]
fn a_true_success_condition_succeeds_and_the_reason_names_it() {
    let s = spec(json!({"success_condition": "status == 404"}));
    let mut st = start(&s);
    let (d, ev) = respond(
        &s,
        &mut st,
        200,
        json!({}),
        Observation::Answered { status: 200 },
    );
    assert!(ended(&d).is_none());
    assert_eq!(
        st.state.as_deref(),
        Some("success_condition false (HTTP 200)")
    );
    assert_eq!(ev.len(), 1, "the first state is an event: {ev:?}");
    let (d, _) = respond(
        &s,
        &mut st,
        404,
        json!({}),
        Observation::NotFound { status: 404 },
    );
    let (end, reason) = ended(&d).expect("ended");
    assert_eq!(end, End::Succeeded);
    assert!(
        reason.contains("success_condition held") && reason.contains("status == 404"),
        "{reason}"
    );
}

#[test]
fn a_failure_condition_fails_fast_whatever_the_status() {
    let s =
        spec(json!({"state": "/phase", "want": ["done"], "failure_condition": "status == 403"}));
    let mut st = start(&s);
    let (d, _) = respond(
        &s,
        &mut st,
        403,
        json!({}),
        Observation::Permanent {
            error: "the target answered 403 Forbidden".into(),
        },
    );
    let (end, reason) = ended(&d).expect("ended");
    assert_eq!(end, End::Failed);
    assert!(reason.contains("failure_condition held"), "{reason}");
}

#[test]
fn when_neither_condition_holds_the_response_is_classified_as_today() {
    let s = spec(
        json!({"success_condition": "body.ready == true", "failure_condition": "body.broken == true"}),
    );
    let mut st = start(&s);
    let body = json!({"ready": false, "broken": false});
    let transient = Observation::Transient {
        error: "the target answered 503".into(),
        retry_after: None,
    };
    let (d, ev) = respond(&s, &mut st, 503, body.clone(), transient);
    assert!(ended(&d).is_none());
    assert_eq!(st.budget_used, 1, "a 503 is a retry: {ev:?}");
    let (d, _) = respond(
        &s,
        &mut st,
        500,
        body.clone(),
        Observation::Permanent {
            error: "the target answered 501".into(),
        },
    );
    assert_eq!(ended(&d).map(|e| e.0), Some(End::Error));
    // A body without the field: CEL's error, counted as a missing state.
    let mut st = start(&s);
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        json!({}),
        Observation::Answered { status: 200 },
    );
    assert!(ended(&d).is_none());
    assert_eq!(st.budget_used, 1);
    assert!(
        st.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("could not be evaluated"),
        "{:?}",
        st.last_error
    );
}

#[test]
fn want_and_success_condition_together_need_both() {
    let s = spec(
        json!({"state": "/phase", "want": ["Running"], "success_condition": "body.ready >= 2"}),
    );
    let state = |v: &str| Observation::State {
        values: vec![v.into()],
        detail: None,
    };
    let mut st = start(&s);
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        json!({"phase": "Running", "ready": 1}),
        state("Running"),
    );
    assert!(ended(&d).is_none(), "want alone is not enough");
    assert_eq!(st.state.as_deref(), Some("Running"));
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        json!({"phase": "Pending", "ready": 2}),
        state("Pending"),
    );
    assert!(ended(&d).is_none(), "the condition alone is not enough");
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        json!({"phase": "Running", "ready": 2}),
        state("Running"),
    );
    assert_eq!(ended(&d).map(|e| e.0), Some(End::Succeeded));
}

#[test]
fn consecutive_and_require_transition_apply_to_the_success_condition() {
    let s =
        spec(json!({"success_condition": "body.up", "consecutive": 2, "require_transition": true}));
    let mut st = start(&s);
    let ok = |st: &mut EngineState, up: bool| {
        respond(
            &s,
            st,
            200,
            json!({"up": up}),
            Observation::Answered { status: 200 },
        )
        .0
    };
    // True before any false: gated.
    assert!(ended(&ok(&mut st, true)).is_none());
    assert!(ended(&ok(&mut st, true)).is_none());
    assert!(ended(&ok(&mut st, false)).is_none());
    assert!(ended(&ok(&mut st, true)).is_none(), "one of two");
    let (end, reason) = ended(&ok(&mut st, true)).expect("two in a row");
    assert_eq!(end, End::Succeeded);
    assert!(reason.contains("2 responses in a row"), "{reason}");
}

#[test]
fn the_state_variable_is_what_the_path_yields() {
    let s = spec(
        json!({"state": "$.items[*].phase", "success_condition": "state.all(p, p == 'Ready')"}),
    );
    let body = json!({"items": [{"phase": "Ready"}, {"phase": "Ready"}]});
    let obs = Observation::State {
        values: vec!["Ready".into(), "Ready".into()],
        detail: None,
    };
    let mut st = start(&s);
    let (d, _) = respond(&s, &mut st, 200, body, obs);
    assert_eq!(ended(&d).map(|e| e.0), Some(End::Succeeded));
    assert_eq!(
        st.state.as_deref(),
        Some("Ready, Ready"),
        "the path's value is still the state shown"
    );

    let s = spec(json!({"state": "@status", "success_condition": "state == 204"}));
    let mut st = start(&s);
    let obs = Observation::State {
        values: vec!["204".into()],
        detail: None,
    };
    let (d, _) = respond(&s, &mut st, 204, json!(null), obs);
    assert_eq!(ended(&d).map(|e| e.0), Some(End::Succeeded));
}

#[test]
fn a_budget_overrun_ends_the_wait_in_error_with_a_sentence() {
    let s =
        spec(json!({"success_condition": "body.items.all(x, body.items.exists(y, y.id == x.id))"}));
    let mut st = start(&s);
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        items(5_000),
        Observation::Answered { status: 200 },
    );
    let (end, reason) = ended(&d).expect("ended");
    assert_eq!(end, End::Error);
    assert!(reason.contains("budget"), "{reason}");
}

// ---- Presets ----

/// The spec a built-in preset makes with `params`.
fn preset(name: &str, params: Value) -> Spec {
    let request = json!({"preset": name, "params": params});
    let merged = Registry::builtin()
        .apply(&request)
        .expect("the preset applies");
    Spec::from_request(&merged, &Limits::default()).expect("the preset's request is valid")
}

/// A Deployment as the API server returns it: zero counts are left out.
fn deployment(
    generation: i64,
    obs: i64,
    spec_replicas: Option<i64>,
    counts: [i64; 3],
    conditions: Value,
) -> Value {
    let mut status = serde_json::Map::new();
    for (k, v) in [
        ("observedGeneration", obs),
        ("replicas", counts[0]),
        ("updatedReplicas", counts[1]),
        ("availableReplicas", counts[2]),
    ] {
        if v != 0 {
            status.insert(k.into(), json!(v));
        }
    }
    if conditions != json!([]) {
        status.insert("conditions".into(), conditions);
    }
    let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "foo", "namespace": "bar"}, "spec": {}, "status": status});
    if generation != 0 {
        d["metadata"]["generation"] = json!(generation);
    }
    if let Some(r) = spec_replicas {
        d["spec"]["replicas"] = json!(r);
    }
    d
}

#[derive(Debug, PartialEq)]
enum Rollout {
    Waiting,
    Done,
    Error,
}

/// kubectl's `DeploymentStatusViewer.Status` cases (kubernetes/kubectl,
/// pkg/polymorphichelpers/rollout_status_test.go: test1 to test5), then the
/// branches its test leaves out, worked from its code: the progress deadline (its
/// only error), which only counts once the generation is observed and looks at the
/// reason alone, and an absent `spec.replicas`.
#[test]
fn kubernetes_rollout_decides_as_kubectl_rollout_status() {
    let deadline = |status: &str| json!([{"type": "Progressing", "status": status, "reason": "ProgressDeadlineExceeded"}]);
    let cases: Vec<(&str, Value, Rollout)> = vec![
        (
            "test1",
            deployment(0, 1, Some(1), [1, 0, 1], json!([])),
            Rollout::Waiting,
        ),
        (
            "test2",
            deployment(1, 1, Some(1), [2, 1, 2], json!([])),
            Rollout::Waiting,
        ),
        (
            "test3",
            deployment(1, 1, Some(2), [2, 2, 1], json!([])),
            Rollout::Waiting,
        ),
        (
            "test4",
            deployment(1, 1, Some(2), [2, 2, 2], json!([])),
            Rollout::Done,
        ),
        (
            "test5",
            deployment(2, 1, Some(2), [2, 2, 2], json!([])),
            Rollout::Waiting,
        ),
        (
            "deadline",
            deployment(1, 1, Some(2), [2, 1, 1], deadline("False")),
            Rollout::Error,
        ),
        (
            "deadline, generation not observed",
            deployment(2, 1, Some(2), [2, 1, 1], deadline("False")),
            Rollout::Waiting,
        ),
        (
            "deadline reason, status True",
            deployment(1, 1, Some(2), [2, 2, 2], deadline("True")),
            Rollout::Error,
        ),
        (
            "progressing",
            deployment(
                1,
                1,
                Some(2),
                [2, 2, 2],
                json!([{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]),
            ),
            Rollout::Done,
        ),
        (
            "no spec.replicas",
            deployment(1, 1, None, [0, 0, 0], json!([])),
            Rollout::Done,
        ),
        (
            "nothing observed yet",
            json!({"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {}}),
            Rollout::Waiting,
        ),
    ];
    let s = preset(
        "kubernetes.rollout",
        json!({"name": "foo", "namespace": "bar"}),
    );
    assert!(
        s.target
            .as_ref()
            .unwrap()
            .url
            .ends_with("/apis/apps/v1/namespaces/bar/deployments/foo"),
        "{}",
        s.target.as_ref().unwrap().url
    );
    for (name, body, want) in cases {
        let mut st = start(&s);
        let (d, _) = respond(
            &s,
            &mut st,
            200,
            body,
            Observation::Answered { status: 200 },
        );
        let got = match ended(&d) {
            None => Rollout::Waiting,
            Some((End::Succeeded, _)) => Rollout::Done,
            Some((End::Failed, _)) => Rollout::Error,
            Some(other) => panic!("{name}: {other:?} (last error {:?})", st.last_error),
        };
        assert_eq!(got, want, "{name}");
        assert_eq!(
            st.budget_used, 0,
            "{name}: no evaluation error ({:?})",
            st.last_error
        );
    }
}

#[test]
fn kubernetes_job_ends_on_complete_or_failed() {
    let s = preset("kubernetes.job", json!({"name": "migrate"}));
    let job = |conds: Value| json!({"kind": "Job", "status": {"conditions": conds}});
    let cond = |t: &str, v: &str| json!({"type": t, "status": v});
    let cases = [
        (json!({"kind": "Job", "status": {}}), None),
        (job(json!([cond("Suspended", "True")])), None),
        (job(json!([cond("Complete", "False")])), None),
        (
            job(json!([
                cond("SuccessCriteriaMet", "True"),
                cond("Complete", "True")
            ])),
            Some(End::Succeeded),
        ),
        (
            job(json!([cond("FailureTarget", "True")])),
            Some(End::Failed),
        ),
        (
            job(json!([
                cond("FailureTarget", "True"),
                cond("Failed", "True")
            ])),
            Some(End::Failed),
        ),
    ];
    for (body, want) in cases {
        let mut st = start(&s);
        let (d, _) = respond(
            &s,
            &mut st,
            200,
            body.clone(),
            Observation::Answered { status: 200 },
        );
        assert_eq!(ended(&d).map(|e| e.0), want, "{body}");
    }
}

#[test]
fn kubernetes_deleted_and_http_status_decide_on_the_status() {
    let s = preset(
        "kubernetes.deleted",
        json!({"path": "/api/v1/namespaces/default/pods/web-0"}),
    );
    let mut st = start(&s);
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        json!({"metadata": {"deletionTimestamp": "x"}}),
        Observation::Answered { status: 200 },
    );
    assert!(ended(&d).is_none());
    let (d, _) = respond(
        &s,
        &mut st,
        404,
        json!({"kind": "Status"}),
        Observation::NotFound { status: 404 },
    );
    assert_eq!(ended(&d).map(|e| e.0), Some(End::Succeeded));

    let s = preset(
        "http.status",
        json!({"url": "http://127.0.0.1:9/drain", "status": "503"}),
    );
    assert_eq!(
        s.success_condition.as_ref().map(|c| c.source()),
        Some("status == 503")
    );
    let mut st = start(&s);
    let (d, _) = respond(
        &s,
        &mut st,
        200,
        json!(null),
        Observation::Answered { status: 200 },
    );
    assert!(ended(&d).is_none());
    let transient = Observation::Transient {
        error: "the target answered 503".into(),
        retry_after: None,
    };
    let (d, _) = respond(&s, &mut st, 503, json!(null), transient);
    assert_eq!(ended(&d).map(|e| e.0), Some(End::Succeeded));
    let errs = Registry::builtin()
        .apply(&json!({"preset": "http.status", "params": {"url": "http://127.0.0.1:9/", "status": "200 || true"}}))
        .expect_err("a status that is not a code");
    assert_eq!(errs[0].field, "params.status", "{errs:?}");
}

// ---- Fuzzing: hostile expressions on hostile bodies ----

/// Pieces of expressions, combined at random: the macros, operators and functions
/// a stranger may nest, over the parts of a body that may be large.
fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("body".to_string()),
        Just("body.items".to_string()),
        Just("body.s".to_string()),
        Just("body.n".to_string()),
        Just("status".to_string()),
        Just("headers".to_string()),
        Just("state".to_string()),
        Just("x".to_string()),
        Just("1".to_string()),
        Just("'a'".to_string()),
        Just("[1, 2]".to_string()),
        Just("{'k': body}".to_string()),
        Just("null".to_string()),
    ];
    leaf.prop_recursive(5, 48, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}.all(x, {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}.exists(x, {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}.map(x, {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}.filter(x, {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} + {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} == {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} in {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} || {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} && {b})")),
            (inner.clone(), inner.clone())
                .prop_map(|(a, b)| format!("string({a}).matches(string({b}))")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}[{b}]")),
            inner.clone().prop_map(|a| format!("size({a})")),
            inner.clone().prop_map(|a| format!("string({a})")),
            inner.clone().prop_map(|a| format!("!{a}")),
            inner.prop_map(|a| format!("[{a}, {a}]")),
        ]
    })
}

fn hostile_body() -> impl Strategy<Value = Value> {
    (0usize..3000, 0usize..20_000, 0usize..3).prop_map(|(n, s, shape)| {
        let item = match shape {
            0 => json!(1),
            1 => json!({"a": "b", "c": [1, 2, 3]}),
            _ => json!([[[[]]]]),
        };
        json!({"items": vec![item; n], "s": "y".repeat(s), "n": n})
    })
}

/// JSON over a few keys, nested, as the bodies of the pruning test.
fn nested_body() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!(null)),
        any::<bool>().prop_map(Value::from),
        (-3i64..4).prop_map(Value::from),
        prop_oneof![Just("x"), Just("y")].prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 40, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![Just("a"), Just("b"), Just("c"), Just("l")].prop_map(String::from),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Expressions that read a body by paths, whole, by optional and `has` forms, by
/// index, and inside macros.
fn reading_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("body"),
        Just("body.a"),
        Just("body.a.b"),
        Just("body.l"),
        Just("body['a']"),
        Just("body.?a.?b.orValue(0)"),
        Just("has(body.a.c)"),
        Just("size(body.a)"),
        Just("x"),
        Just("x.b"),
        Just("1"),
        Just("'x'"),
    ]
    .prop_map(String::from);
    leaf.prop_recursive(3, 24, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} == {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} || {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} && {b})")),
            inner.clone().prop_map(|a| format!("body.l.exists(x, {a})")),
            inner.clone().prop_map(|a| format!("body.a.all(x, {a})")),
            inner.prop_map(|a| format!("body.l.map(x, {a}).size() > 0")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Converting only what the conditions read decides as converting the whole
    /// body would: the same bool, or an error on both.
    #[test]
    fn converting_only_what_is_read_decides_as_the_whole_body(e in reading_expr(), body in nested_body()) {
        let Ok(c) = Condition::compile(&e) else { return Ok(()) };
        let headers = BTreeMap::new();
        let whole = Vars::new(Some(&body), 200, &headers, None);
        let read = Vars::for_conditions(&[&c], Some(&body), 200, &headers, None);
        let a = c.evaluate(&whole, &mut condition::Budget::default());
        let b = c.evaluate(&read, &mut condition::Budget::default());
        match (&a, &b) {
            (Ok(x), Ok(y)) => prop_assert_eq!(x, y, "{} on {}", e, body),
            (Err(Failure::Error(_)), Err(Failure::Error(_))) => {}
            _ => prop_assert!(false, "{} on {}: whole {:?}, read {:?}", e, body, a, b),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Whatever the expression and the body: compiling never panics; evaluating
    /// ends with a bool, CEL's error or the budget, never spends more than the
    /// budget, and never runs long.
    #[test]
    fn evaluation_is_bounded_for_any_expression_and_body(e in expr(), body in hostile_body()) {
        let Ok(c) = Condition::compile(&e) else { return Ok(()) };
        let headers = BTreeMap::from([("a".to_string(), "b".to_string())]);
        let state = json!("x");
        let vars = Vars::new(Some(&body), 200, &headers, Some(&state));
        let mut budget = condition::Budget::default();
        let t = crate::support::thread_cpu();
        let _ = c.evaluate(&vars, &mut budget);
        let took = crate::support::thread_cpu() - t;
        prop_assert!(budget.spent() <= condition::BUDGET);
        prop_assert!(took < Duration::from_secs(5), "{e} took {took:?}");
    }

    /// Arbitrary text is refused or compiled, never a panic, and a refusal says
    /// where.
    #[test]
    fn compiling_arbitrary_text_never_panics(text in "\\PC{0,200}") {
        if let Err(e) = Condition::compile(&text) {
            prop_assert!(!e.is_empty());
        }
    }
}

/// Found by the property above (6 s in CI): a map literal holding the whole body,
/// built for each item. A literal copies its elements, so each is charged by its
/// deep size; the receiver `string(body)` is evaluated first and is CEL's error
/// (no `string` of a map), so this ends at once, and within a second whichever
/// end it reaches.
#[test]
fn copying_the_body_into_a_literal_for_each_item_ends_on_the_budget() {
    let e = "body.items.all(x, string(body).matches(string({'k': body})))";
    let c = Condition::compile(e).unwrap();
    let body =
        json!({"items": vec![json!({"a": "b", "c": [1, 2, 3]}); 3000], "s": "y".repeat(20_000)});
    let headers = BTreeMap::new();
    let vars = Vars::new(Some(&body), 200, &headers, None);
    let mut budget = condition::Budget::default();
    let t = crate::support::thread_cpu();
    let got = c.evaluate(&vars, &mut budget);
    assert!(
        matches!(got, Err(Failure::Budget | Failure::Error(_))),
        "{got:?}"
    );
    let took = crate::support::thread_cpu() - t;
    assert!(took < Duration::from_secs(1), "{took:?} of CPU");
    // Built for each item without the receiver's error, the copies end on the budget.
    let e = "body.items.all(x, size({'k': body}) == 1)";
    let c = Condition::compile(e).unwrap();
    let t = crate::support::thread_cpu();
    let got = c.evaluate(&vars, &mut condition::Budget::default());
    assert_eq!(got, Err(Failure::Budget));
    let took = crate::support::thread_cpu() - t;
    assert!(took < Duration::from_secs(1), "{took:?} of CPU");
}

// ---- Through the API ----

#[tokio::test]
async fn a_wait_with_a_success_condition_runs_to_its_end() {
    let upstream = Upstream::start().await;
    let app = InProcess::start().await;
    let url = upstream.script(
        "/deploy",
        vec![
            Reply::json(
                200,
                json!({"status": {"ready": 1}, "spec": {"replicas": 2}}),
            ),
            Reply::json(
                200,
                json!({"status": {"ready": 2}, "spec": {"replicas": 2}}),
            ),
        ],
    );
    let (code, w) = app
        .create(json!({
            "target": {"url": url},
            "success_condition": "body.status.ready >= body.spec.replicas",
            "poll": {"initial": "5ms", "factor": 1}
        }))
        .await;
    assert_eq!(code, 201, "{w}");
    assert_eq!(
        w["spec"]["success_condition"],
        "body.status.ready >= body.spec.replicas"
    );
    assert!(w["spec"].get("state").is_none(), "{w}");
    let id = w["id"].as_str().unwrap();
    let (_, done) = app.get(&format!("/waits/{id}?wait=10s")).answer().await;
    assert_eq!(done["status"], "succeeded", "{done}");
    assert!(
        done["reason"]
            .as_str()
            .unwrap()
            .contains("success_condition held"),
        "{done}"
    );
    let (_, events) = app.get(&format!("/waits/{id}/events")).answer().await;
    let states: Vec<&str> = events["items"]
        .as_array()
        .expect("a page of events")
        .iter()
        .filter(|e| e["kind"] == "state")
        .filter_map(|e| e["to"].as_str())
        .collect();
    assert_eq!(
        states,
        [
            "success_condition false (HTTP 200)",
            "success_condition true (HTTP 200)"
        ],
        "{events}"
    );
    // Two different bodies: both evaluated.
    let metrics = app.get("/metrics").send().await.text;
    assert!(
        metrics.contains("waitd_condition_responses_total{decided=\"evaluated\"} 2"),
        "{metrics}"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_bad_condition_is_a_400_naming_the_field_and_position() {
    let app = InProcess::start().await;
    let (code, p) = app
        .create(
            json!({"target": {"url": "http://127.0.0.1:9/"}, "success_condition": "body.ready =="}),
        )
        .await;
    assert_eq!(code, 400, "{p}");
    let e = &p["errors"][0];
    assert_eq!(e["field"], "success_condition", "{p}");
    assert!(e["message"].as_str().unwrap().contains("column"), "{p}");
    app.stop().await;
}

/// The six examples of docs/conditions.md: each is a valid request, and each
/// decides as its comment says on a response of the kind it names.
#[test]
fn the_documented_examples_are_valid_and_mean_what_they_say() {
    let doc = include_str!("../docs/conditions.md");
    let section = doc
        .split_once("## Examples")
        .and_then(|(_, rest)| rest.split_once("```jsonc"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .expect("docs/conditions.md has an Examples section with a jsonc block");
    let text: String = section
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let examples: Vec<Value> = serde_json::Deserializer::from_str(&text)
        .into_iter::<Value>()
        .map(|v| v.expect("each example is JSON"))
        .collect();
    assert_eq!(examples.len(), 6);
    let specs: Vec<Spec> = examples
        .iter()
        .map(|e| Spec::from_request(e, &limits()).unwrap_or_else(|errs| panic!("{e}: {errs:?}")))
        .collect();
    let deployment = |updated: i64, reason: &str| {
        json!({"metadata": {"generation": 2}, "spec": {"replicas": 3},
            "status": {"observedGeneration": 2, "updatedReplicas": updated, "availableReplicas": updated,
                "conditions": [{"type": "Progressing", "status": "False", "reason": reason}]}})
    };
    let instances = |states: &[&str]| json!({"Reservations": [{"Instances": states.iter().map(|s| json!({"State": {"Name": s}})).collect::<Vec<_>>()}]});
    let checks = |c: &[(&str, Value)]| json!({"check_runs": c.iter().map(|(s, c)| json!({"status": s, "conclusion": c})).collect::<Vec<_>>()});
    let tasks =
        |t: &[&str]| json!({"tasks": t.iter().map(|s| json!({"state": s})).collect::<Vec<_>>()});
    // (example, status, headers, body) → succeeded, failed, or going on.
    type Case<'a> = (usize, u16, Vec<(&'a str, &'a str)>, Value, Option<End>);
    let cases: Vec<Case> = vec![
        (
            0,
            200,
            vec![],
            deployment(3, "NewReplicaSetAvailable"),
            Some(End::Succeeded),
        ),
        (0, 200, vec![], deployment(1, "ReplicaSetUpdated"), None),
        (
            0,
            200,
            vec![],
            deployment(1, "ProgressDeadlineExceeded"),
            Some(End::Failed),
        ),
        (
            1,
            200,
            vec![],
            instances(&["running", "running"]),
            Some(End::Succeeded),
        ),
        (1, 200, vec![], instances(&["running", "pending"]), None),
        (
            1,
            200,
            vec![],
            instances(&["running", "terminated"]),
            Some(End::Failed),
        ),
        (
            2,
            200,
            vec![],
            checks(&[
                ("completed", json!("success")),
                ("completed", json!("skipped")),
            ]),
            Some(End::Succeeded),
        ),
        (
            2,
            200,
            vec![],
            checks(&[
                ("completed", json!("success")),
                ("in_progress", json!(null)),
            ]),
            None,
        ),
        (
            2,
            200,
            vec![],
            checks(&[
                ("completed", json!("failure")),
                ("in_progress", json!(null)),
            ]),
            Some(End::Failed),
        ),
        (2, 200, vec![], checks(&[]), None),
        (
            3,
            200,
            vec![],
            tasks(&["SUCCEEDED", "SUCCEEDED"]),
            Some(End::Succeeded),
        ),
        (3, 200, vec![], tasks(&["SUCCEEDED", "RUNNING"]), None),
        (
            3,
            200,
            vec![],
            tasks(&["FAILED", "RUNNING"]),
            Some(End::Failed),
        ),
        (4, 200, vec![("x-app-version", "1.4.1")], json!(null), None),
        // A response without the header goes on, rather than failing to evaluate.
        (4, 200, vec![], json!(null), None),
        (5, 200, vec![], json!({"id": "vol-9"}), None),
        (
            5,
            404,
            vec![],
            json!({"error": "not found"}),
            Some(End::Succeeded),
        ),
        (
            5,
            403,
            vec![],
            json!({"error": "forbidden"}),
            Some(End::Failed),
        ),
    ];
    for (i, status, headers, body, want) in cases {
        let s = &specs[i];
        let headers: BTreeMap<String, String> = headers
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let base = match status {
            200 => Observation::Answered { status },
            404 => Observation::NotFound { status },
            _ => Observation::Permanent {
                error: format!("the target answered {status}"),
            },
        };
        let mut st = start(s);
        let obs = judge(s, status, &headers, Some(&body), base);
        let got = ended(&step(s, &mut st, obs, cx()).decision).map(|e| e.0);
        assert_eq!(got, want, "example {}: {body} ({:?})", i + 1, st.last_error);
        assert_eq!(
            st.budget_used,
            0,
            "example {}: {body}: {:?}",
            i + 1,
            st.last_error
        );
    }
    // Example 5 needs three good answers in a row.
    let s = &specs[4];
    let headers = BTreeMap::from([("x-app-version".to_string(), "1.4.2".to_string())]);
    let mut st = start(s);
    for n in 1..=3 {
        let obs = judge(
            s,
            200,
            &headers,
            None,
            Observation::Answered { status: 200 },
        );
        let got = ended(&step(s, &mut st, obs, cx()).decision).map(|e| e.0);
        assert_eq!(got, (n == 3).then_some(End::Succeeded), "answer {n}");
    }
}

/// A wait's prober keeps what its conditions decided on the last response; an
/// identical response is decided the same, a changed one is evaluated afresh.
#[tokio::test]
async fn an_unchanged_response_is_decided_as_before_and_a_changed_one_afresh() {
    use waitd::probe::{ProbeConfig, Prober};
    let up = Upstream::start().await;
    let url = up.script(
        "/d",
        vec![
            Reply::json(200, json!({"ready": 1})),
            Reply::json(200, json!({"ready": 1})),
            Reply::json(200, json!({"ready": 2})),
        ],
    );
    let mut request = json!({"success_condition": "body.ready >= 2"});
    request["target"] = json!({"url": url});
    let s = Spec::from_request(&request, &limits()).unwrap();
    let prober = Prober::new(ProbeConfig {
        guard: waitd::probe::Guard::new(&["127.0.0.1".to_string()]).unwrap(),
        ..ProbeConfig::default()
    })
    .unwrap();
    let target = prober.target(&s).unwrap();
    let mut memo = None;
    let judged = |o: &Polled| match o {
        Polled::Observed(Observation::Judged { success, .. }, _) => *success,
        other => panic!("{other:?}"),
    };
    let o = prober
        .probe_memo(uuid::Uuid::nil(), &s, &target, &mut memo)
        .await;
    assert_eq!(judged(&o), Some(false));
    let first = memo.expect("a decision is kept");
    let o = prober
        .probe_memo(uuid::Uuid::nil(), &s, &target, &mut memo)
        .await;
    assert_eq!(judged(&o), Some(false));
    let second = memo.expect("kept");
    assert!(second.reused(), "the same response is decided as before");
    assert!(!first.reused());
    let o = prober
        .probe_memo(uuid::Uuid::nil(), &s, &target, &mut memo)
        .await;
    assert_eq!(judged(&o), Some(true), "a changed body is evaluated again");
    let third = memo.expect("kept");
    assert!(!third.reused());
    assert_ne!(third, first);
    assert_eq!(up.hits("/d"), 3);
}
