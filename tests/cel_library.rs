//! The CEL libraries conditions may call: every function `docs/conditions.md`
//! lists evaluates, `now` is the time the evaluation is given, and each function
//! whose work or result grows with a stranger's input ends on the budget in well
//! under a second.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use serde_json::{Value, json};
use waitd::engine::condition::{self, Condition, Failure, Vars};

fn at() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, 12, 0, 0).unwrap()
}

fn eval_with(expr: &str, body: &Value) -> Result<bool, Failure> {
    let c = Condition::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    let headers = BTreeMap::from([("x-phase".to_string(), "Done".to_string())]);
    let vars = Vars::new(Some(body), 200, &headers, None).at(at());
    c.evaluate(&vars, &mut condition::Budget::default())
}

fn eval(expr: &str) -> Result<bool, Failure> {
    eval_with(
        expr,
        &json!({
            "s": "Hello, World",
            "n": [3, 1, 2],
            "t": "2026-03-01T11:50:00Z",
            "bad": "yesterday",
        }),
    )
}

/// One expression per function `docs/conditions.md` lists, true when the
/// function does what the document says.
const EACH: &[(&str, &str)] = &[
    ("size", "size(body.s) == 12 && body.n.size() == 3"),
    ("contains", "body.s.contains('World')"),
    ("startsWith", "body.s.startsWith('Hell')"),
    ("endsWith", "body.s.endsWith('rld')"),
    ("matches", "body.s.matches('^H.*d$')"),
    (
        "int",
        "int('42') == 42 && int(timestamp('1970-01-01T00:01:00Z')) == 60",
    ),
    ("uint", "uint(7) == 7u"),
    ("double", "double(1) == 1.0"),
    (
        "string",
        "string(12) == '12' && string(duration('90s')) == '90s'",
    ),
    ("bytes", "bytes('a') == b'a'"),
    ("bool", "bool('true')"),
    (
        "type",
        "type(1) == int && type(body.s) == string && type(now) == google.protobuf.Timestamp",
    ),
    ("dyn", "dyn(1) == 1"),
    ("optional.of", "optional.of(1).hasValue()"),
    (
        "optional.ofNonZeroValue",
        "!optional.ofNonZeroValue(0).hasValue()",
    ),
    ("optional.none", "!optional.none().hasValue()"),
    ("hasValue", "body.?s.hasValue()"),
    ("value", "body.?s.value() == 'Hello, World'"),
    ("or", "body.?x.or(optional.of(2)).value() == 2"),
    ("orValue", "body.?x.orValue(3) == 3"),
    ("timestamp", "timestamp(body.t) < now"),
    ("duration", "now - timestamp(body.t) == duration('10m')"),
    ("getFullYear", "now.getFullYear() == 2026"),
    ("getMonth", "now.getMonth() == 2"),
    ("getDayOfYear", "now.getDayOfYear() == 59"),
    ("getDayOfMonth", "now.getDayOfMonth() == 0"),
    (
        "getDate",
        "now.getDate() == 1 && now.getDate('Asia/Tokyo') == 1",
    ),
    ("getDayOfWeek", "now.getDayOfWeek() == 0"),
    (
        "getHours",
        "now.getHours() == 12 && duration('3h5m').getHours() == 3",
    ),
    (
        "getMinutes",
        "now.getMinutes() == 0 && duration('3h5m').getMinutes() == 185",
    ),
    ("getSeconds", "now.getSeconds() == 0"),
    ("getMilliseconds", "now.getMilliseconds() == 0"),
    ("charAt", "body.s.charAt(4) == 'o'"),
    (
        "indexOf",
        "body.s.indexOf('o') == 4 && body.s.indexOf('o', 5) == 8 && body.n.indexOf(2) == 2",
    ),
    (
        "lastIndexOf",
        "body.s.lastIndexOf('o') == 8 && body.n.lastIndexOf(9) == -1",
    ),
    ("lowerAscii", "headers['x-phase'].lowerAscii() == 'done'"),
    ("upperAscii", "body.s.upperAscii() == 'HELLO, WORLD'"),
    (
        "replace",
        "body.s.replace('l', 'L') == 'HeLLo, WorLd' && body.s.replace('l', '', 1) == 'Helo, World'",
    ),
    ("split", "body.s.split(', ') == ['Hello', 'World']"),
    (
        "substring",
        "body.s.substring(7) == 'World' && body.s.substring(0, 5) == 'Hello'",
    ),
    ("trim", "'  x '.trim() == 'x'"),
    (
        "join",
        "['a', 'b'].join('-') == 'a-b' && ['a', 'b'].join() == 'ab'",
    ),
    (
        "reverse",
        "'abc'.reverse() == 'cba' && body.n.reverse() == [2, 1, 3]",
    ),
    (
        "format",
        "'%s is %d, %.2f'.format(['x', 3, 1.5]) == 'x is 3, 1.50'",
    ),
    ("strings.quote", "strings.quote('a\"b') == '\"a\\\\\"b\"'"),
    ("isSorted", "!body.n.isSorted() && [1, 2, 2].isSorted()"),
    (
        "sum",
        "body.n.sum() == 6 && [duration('1s'), duration('2s')].sum() == duration('3s')",
    ),
    (
        "min",
        "body.n.min() == 1 && min(body.n) == 1 && min(5, 4) == 4",
    ),
    (
        "max",
        "body.n.max() == 3 && max(body.n) == 3 && max(1, 9, 2) == 9",
    ),
    ("slice", "body.n.slice(1, 3) == [1, 2]"),
    ("flatten", "[[1], [2, [3]]].flatten() == [1, 2, [3]]"),
    ("distinct", "[1, 2, 1].distinct() == [1, 2]"),
    ("sort", "body.n.sort() == [1, 2, 3]"),
    (
        "find",
        "body.s.find('[A-Z][a-z]+') == 'Hello' && body.s.find('x') == ''",
    ),
    (
        "findAll",
        "body.s.findAll('[A-Z]') == ['H', 'W'] && body.s.findAll('o', 1) == ['o']",
    ),
];

#[test]
fn every_listed_function_evaluates_as_documented() {
    let tested: Vec<&str> = EACH.iter().map(|(f, _)| *f).collect();
    for f in condition::FUNCTIONS {
        assert!(tested.contains(f), "{f} is listed but has no case here");
    }
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/conditions.md"))
        .expect("docs/conditions.md");
    let wrong: Vec<String> = EACH
        .iter()
        .filter_map(|(f, expr)| {
            let got = eval(expr);
            (got != Ok(true)).then(|| format!("{f}: {expr}: {got:?}"))
        })
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
    for (f, _) in EACH {
        assert!(
            doc.contains(&format!("`{f}`")),
            "{f} is not in docs/conditions.md"
        );
    }
}

#[test]
fn a_bad_timestamp_is_cel_s_error_not_false() {
    let got = eval("timestamp(body.bad) < now");
    let Err(Failure::Error(e)) = got else {
        panic!("{got:?}")
    };
    assert!(e.contains("timestamp"), "{e}");
}

#[test]
fn now_is_the_time_the_evaluation_is_given() {
    let c = Condition::compile("now > timestamp('2026-01-01T00:00:00Z')").unwrap();
    assert!(c.reads_now());
    assert!(!Condition::compile("status == 200").unwrap().reads_now());
    let headers = BTreeMap::new();
    let before = Utc.with_ymd_and_hms(2025, 6, 1, 0, 0, 0).unwrap();
    let vars = Vars::new(None, 200, &headers, None).at(before);
    assert_eq!(
        c.evaluate(&vars, &mut condition::Budget::default()),
        Ok(false)
    );
    let vars = Vars::new(None, 200, &headers, None).at(at());
    assert_eq!(
        c.evaluate(&vars, &mut condition::Budget::default()),
        Ok(true)
    );
}

#[test]
fn type_names_are_values_and_unknown_names_are_still_refused() {
    assert_eq!(eval("type(body.n) == list && type(1u) == uint"), Ok(true));
    assert!(Condition::compile("type(1) == integer").is_err());
    assert!(Condition::compile("google.protobuf.Any == int").is_err());
}

/// Well under a second on the release build; the unoptimised test build is
/// several times slower.
fn limit() -> Duration {
    if cfg!(debug_assertions) {
        Duration::from_secs(5)
    } else {
        Duration::from_millis(500)
    }
}

/// Each case builds or scans something a 1 MiB string from the body makes huge;
/// each must end on the budget, in well under a second.
#[test]
fn growth_of_a_large_body_string_ends_on_the_budget() {
    let body = crate::support::hostile_cel::body();
    for &expr in crate::support::hostile_cel::CASES {
        let t = crate::support::thread_cpu();
        let got = eval_with(expr, &body);
        let took = crate::support::thread_cpu() - t;
        eprintln!("{expr}: {got:?} after {took:?}");
        assert_eq!(got, Err(Failure::Budget), "{expr}");
        assert!(took < limit(), "{expr} took {took:?}");
    }
}

#[test]
fn the_budget_sentence_names_the_budget() {
    let s = Failure::Budget.to_string();
    assert!(s.contains("1,000,000 units"), "{s}");
}

fn stranger_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,64}",
        "[0-9.:TZz+-]{0,64}",
        "-?[0-9.]{1,40}(h|m|s|ms|us|ns){1,3}",
        "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,12})?(Z|[+-][0-9]{2}:[0-9]{2})",
        "%[-.0-9a-z%]{0,12}",
        (1usize..200_000).prop_map(|n| "9".repeat(n) + "h"),
        (1usize..200_000).prop_map(|n| "1s".repeat(n)),
        (1usize..20).prop_map(|n| format!("%.{}f", "9".repeat(n))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Timestamp, duration, time zone and format strings a target sends: past
    /// their limits too, each ends with a value, CEL's error or the budget, within
    /// the budget, quickly, and never panics.
    #[test]
    fn strangers_strings_for_the_parsers_end_quickly(text in stranger_text()) {
        let body = json!({"x": text});
        for expr in [
            "timestamp(body.x) < now",
            "duration(body.x) > duration('0s')",
            "now.getHours(body.x) >= 0",
            "body.x.format([1.5, 'a', 2]).size() >= 0",
            "body.x.format([]).size() >= 0",
        ] {
            let c = Condition::compile(expr).unwrap();
            let headers = BTreeMap::new();
            let vars = Vars::new(Some(&body), 200, &headers, None).at(at());
            let mut budget = condition::Budget::default();
            let t = crate::support::thread_cpu();
            let _ = c.evaluate(&vars, &mut budget);
            let took = crate::support::thread_cpu() - t;
            prop_assert!(budget.spent() <= condition::BUDGET);
            prop_assert!(took < Duration::from_millis(500), "{expr} on {:?}: {took:?} of CPU", &body["x"].as_str().map(|s| &s[..s.len().min(40)]));
        }
    }
}

/// kubernetes.condition with `held_for`: the condition must be True and have
/// changed at least that long before the poll.
#[test]
fn the_kubernetes_condition_preset_waits_for_a_condition_to_have_held() {
    use waitd::engine::{Limits, Observation, Spec};
    let spec = |held_for: Option<&str>| {
        let mut params = json!({"path": "/api/v1/namespaces/a/pods/b", "condition": "Ready"});
        if let Some(h) = held_for {
            params["held_for"] = json!(h);
        }
        let request = json!({"preset": "kubernetes.condition", "params": params});
        let merged = waitd::presets::Registry::builtin()
            .apply(&request)
            .expect("the preset applies");
        Spec::from_request(&merged, &Limits::default()).expect("valid")
    };
    let pod = |ago: chrono::Duration| {
        let at = (Utc::now() - ago).to_rfc3339();
        json!({"status": {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": at}]}})
    };
    let judged = |spec: &Spec, body: &Value| {
        let base = Observation::State {
            values: vec!["True".into()],
            detail: None,
        };
        match waitd::probe::judge(spec, 200, &BTreeMap::new(), Some(body), base) {
            Observation::Judged { success, .. } => success,
            other => panic!("{other:?}"),
        }
    };
    let held = spec(Some("5m"));
    assert_eq!(
        judged(&held, &pod(chrono::Duration::minutes(10))),
        Some(true)
    );
    assert_eq!(
        judged(&held, &pod(chrono::Duration::minutes(1))),
        Some(false)
    );
    // Without held_for, True is enough, as kubectl wait --for=condition.
    assert_eq!(
        judged(&spec(None), &pod(chrono::Duration::zero())),
        Some(true)
    );
}

/// The request kubernetes.condition makes with `held_for` set to `v`: its error
/// fields when the preset refuses it.
fn held_for_request(v: &str) -> Result<(), Vec<String>> {
    let request = json!({
        "preset": "kubernetes.condition",
        "params": {"path": "/api/v1/namespaces/a/pods/b", "condition": "Ready", "held_for": v}
    });
    waitd::presets::Registry::builtin()
        .apply(&request)
        .map(|_| ())
        .map_err(|errors| errors.iter().map(|e| e.field.clone()).collect())
}

/// A `held_for` CEL cannot read is refused at creation, naming the parameter,
/// rather than failing every poll until the wait ends in error.
#[test]
fn an_unreadable_held_for_is_refused_naming_it() {
    for good in ["0", "0s", "90s", "5m", "1h30m", "1.5h", "250ms"] {
        assert_eq!(held_for_request(good), Ok(()), "{good}");
    }
    let long = "1h".repeat(1_100);
    for bad in [
        "",
        "5 minutes",
        "5",
        "-5m",
        "m",
        "1.h",
        ".5h",
        "1e3s",
        "5m'",
        "99999999999999h",
        long.as_str(),
    ] {
        assert_eq!(
            held_for_request(bad),
            Err(vec!["params.held_for".to_string()]),
            "{bad:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]
    /// Whatever `held_for` the preset accepts, CEL's `duration()` reads without an
    /// error: generated over the characters the grammar is made of, and beyond.
    #[test]
    fn every_held_for_the_preset_accepts_is_a_duration_cel_reads(v in "[0-9.hmsun' -]{1,16}") {
        if held_for_request(&v).is_ok() {
            let read = eval(&format!("duration('{v}') >= duration('0s')"));
            prop_assert!(read.is_ok(), "{v:?}: {read:?}");
        }
    }
}
