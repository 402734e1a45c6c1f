//! Fuzzing with proptest, kept brief for CI (512 cases a property): any JSON value
//! given to `Spec::from_request` and any path over any body given to `ValuePath` must
//! never panic. A spec that is accepted must also honour the limits it was checked
//! against and read back the same from its own serialised form (docs/design.md §2.2–§2.3: the
//! normalised request means the same thing).

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Number, Value, json};
use waitd::engine::spec::output::{Output, Pick, take};
use waitd::engine::{Budget, Limits, Selected, Spec, ValuePath};

/// Field names the parser knows, so random objects often hit real code paths.
const KEYS: &[&str] = &[
    "target",
    "url",
    "headers",
    "state",
    "want",
    "fail",
    "pending",
    "error",
    "require_transition",
    "consecutive",
    "not_found",
    "ignore_case",
    "timeout",
    "poll",
    "initial",
    "factor",
    "max",
    "jitter",
    "delay",
    "retry",
    "max_delay",
    "max_retries",
    "labels",
    "preset",
    "params",
    "Authorization",
    "output",
    "callback",
    "heartbeat",
];

/// Where a near-valid spec gets a random value.
const POINTERS: &[&str] = &[
    "/target",
    "/target/url",
    "/target/headers",
    "/target/headers/Authorization",
    "/target/extra",
    "/state",
    "/want",
    "/fail",
    "/pending",
    "/error",
    "/require_transition",
    "/consecutive",
    "/not_found",
    "/ignore_case",
    "/timeout",
    "/poll",
    "/poll/initial",
    "/poll/factor",
    "/poll/max",
    "/poll/jitter",
    "/poll/delay",
    "/retry",
    "/retry/delay",
    "/retry/max_delay",
    "/retry/max_retries",
    "/labels",
    "/labels/team",
    "/output",
    "/output/id",
    "/wnat",
];

const NUMBERS: &[f64] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1.5,
    10.0,
    10.000001,
    100.0,
    101.0,
    4_294_967_296.0,
    1e19,
    1e308,
    -1e308,
    5e-324,
    f64::EPSILON,
];

/// Strings shaped like what the fields take: durations, paths, URLs, states.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        "([0-9]{1,22}(ms|s|m|h|d)){1,3}",
        "-?[0-9.]{0,6}[a-z ]{0,3}",
        "/[a-z0-9~/]{0,12}",
        "\\$[.\\[\\]*?@a-z0-9'=<>!&|() ,:-]{0,24}",
        "(http|https|ftp|file)://[a-z0-9.:\\[\\]@%-]{0,20}(/[a-z0-9]{0,5})?",
        "(on|off|deploying|failed_deployment|ON|error|retry|success)",
        "\\PC{0,12}",
        any::<String>(),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("a finite number", |f| Number::from_f64(f)
            .map(Value::Number)),
        prop::sample::select(NUMBERS).prop_map(|f| json!(f)),
        word().prop_map(Value::String),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(KEYS).prop_map(str::to_string),
        1 => "\\PC{0,8}",
    ]
}

/// Any JSON value, up to 4 levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid request with its every field spelled out.
fn valid() -> Value {
    json!({
        "target": {
            "url": "https://api.example.com/servers/1",
            "headers": {"Authorization": "Bearer x"}
        },
        "state": "/data/attributes/status",
        "want": ["on"],
        "fail": ["failed_deployment"],
        "pending": ["deploying"],
        "error": "$.error",
        "require_transition": true,
        "consecutive": 2,
        "not_found": "retry",
        "ignore_case": true,
        "timeout": "10m",
        "poll": {"initial": "2s", "factor": 1.5, "max": "15s", "jitter": 0.1, "delay": "1s"},
        "retry": {"delay": "1s", "max_delay": "30s", "max_retries": 10},
        "labels": {"team": "infra"}
    })
}

/// Sets the value at JSON Pointer `ptr`, making objects on the way as needed.
fn set(v: &mut Value, ptr: &str, x: Value) {
    let mut slot = v;
    for part in ptr.trim_start_matches('/').split('/') {
        if !slot.is_object() {
            *slot = json!({});
        }
        slot = slot
            .as_object_mut()
            .expect("an object")
            .entry(part.to_string())
            .or_insert(Value::Null);
    }
    *slot = x;
}

/// A duration string, valid more often than not.
fn duration() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[0-9]{1,4}(ms|s|m|h)",
        "([0-9]{1,2}(h|m|s)){1,3}",
        "-?[0-9]{0,22}[a-z]{0,3}",
    ]
    .prop_map(Value::String)
}

fn states() -> impl Strategy<Value = Value> {
    prop::collection::vec(
        prop_oneof![
            "(on|off|On|deploying|failed_deployment|x)".prop_map(Value::String),
            any::<bool>().prop_map(Value::Bool),
            (0u8..4).prop_map(Value::from),
            word().prop_map(Value::String),
        ],
        0..4,
    )
    .prop_map(Value::Array)
}

fn string_map(keys: &'static str) -> impl Strategy<Value = Value> {
    prop::collection::btree_map(keys, word(), 0..4)
        .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k, json!(v))).collect()))
}

/// A URL string: schemes, names, address literals and ports, valid or not.
const URL: &str = "(https?|ftp)://([a-z]{1,8}\\.example|[0-9.]{1,15}|\\[[0-9a-f:.]{2,20}\\]|localhost)\
                   (:[0-9]{1,5})?/[a-z0-9%]{0,6}";

/// One edit of a valid request: a plausible value for its field (often valid), or
/// anything at all anywhere.
fn edit() -> impl Strategy<Value = (&'static str, Value)> {
    let durations = prop::sample::select(
        &[
            "/timeout",
            "/poll/initial",
            "/poll/max",
            "/poll/delay",
            "/retry/delay",
            "/retry/max_delay",
        ][..],
    );
    let sets = prop::sample::select(&["/want", "/fail", "/pending"][..]);
    let paths = prop::sample::select(&["/state", "/error"][..]);
    let flags = prop::sample::select(&["/ignore_case", "/require_transition"][..]);
    let max_retries = prop_oneof![Just(Value::Null), (0u32..12_000).prop_map(Value::from)];
    prop_oneof![
        (durations, duration()),
        (sets, states()),
        (paths, path_text().prop_map(Value::String)),
        (
            Just("/target/headers"),
            string_map("[A-Za-z-]{1,12}|\\PC{0,4}")
        ),
        (Just("/labels"), string_map("[a-z0-9./_-]{1,10}|\\PC{0,4}")),
        (Just("/target/url"), URL.prop_map(Value::String)),
        (Just("/poll/factor"), (0.0f64..12.0).prop_map(|f| json!(f))),
        (Just("/poll/jitter"), (-0.5f64..1.5).prop_map(|f| json!(f))),
        (Just("/consecutive"), (0u32..120).prop_map(Value::from)),
        (Just("/retry/max_retries"), max_retries),
        (flags, any::<bool>().prop_map(Value::Bool)),
        (
            Just("/not_found"),
            "(error|retry|success|Error|)".prop_map(Value::String)
        ),
        (prop::sample::select(POINTERS), json_value()),
    ]
}

/// A valid request with one to three fields replaced.
fn near_valid() -> impl Strategy<Value = Value> {
    prop::collection::vec(edit(), 1..4).prop_map(|edits| {
        let mut v = valid();
        for (ptr, x) in edits {
            set(&mut v, ptr, x);
        }
        v
    })
}

fn limits() -> impl Strategy<Value = Limits> {
    prop_oneof![
        Just(Limits::default()),
        Just(Limits {
            min_poll_interval: Duration::from_millis(1),
            max_timeout: Duration::from_secs(3600),
            ..Limits::default()
        }),
    ]
}

/// What must hold of every accepted spec.
fn check_accepted(request: &Value, spec: &Spec, limits: &Limits) -> Result<(), TestCaseError> {
    // A callback wait polls nothing: it has no target, and needs no want.
    prop_assert_eq!(
        spec.callback.is_some(),
        spec.target.is_none(),
        "{}",
        request
    );
    prop_assert!(
        !spec.want.is_empty() || spec.callback.is_some(),
        "accepted with no want: {request}"
    );
    prop_assert!(!spec.timeout.is_zero() && spec.timeout <= limits.max_timeout);
    prop_assert!(spec.poll.initial >= limits.min_poll_interval);
    prop_assert!(spec.poll.initial <= spec.poll.max);
    prop_assert!(spec.poll.delay <= spec.timeout);
    prop_assert!(spec.retry.delay >= limits.min_poll_interval);
    prop_assert!(spec.retry.delay <= spec.retry.max_delay);
    prop_assert!((1.0..=10.0).contains(&spec.poll.factor));
    prop_assert!((0.0..1.0).contains(&spec.poll.jitter));
    prop_assert!((1..=100).contains(&spec.consecutive));
    for v in spec.target.iter().flat_map(|t| t.headers.values()) {
        prop_assert!(
            !v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
            "a header value with CR, LF or NUL was accepted: {request}"
        );
    }
    let redacted = spec.redacted();
    prop_assert!(
        redacted
            .target
            .iter()
            .flat_map(|t| t.headers.values())
            .all(|v| v == "<redacted>")
    );
    // The normalised form is a request that means the same thing.
    let text = serde_json::to_value(spec).expect("a spec serialises");
    match Spec::from_request(&text, limits) {
        Ok(again) => prop_assert_eq!(&again, spec, "{} read back differently", text),
        Err(e) => prop_assert!(false, "{text} (from {request}) is refused: {e:?}"),
    }
    Ok(())
}

/// Path texts: pointers, JSONPath queries built from real fragments, and noise.
fn path_text() -> impl Strategy<Value = String> {
    let fragment = prop::sample::select(
        &[
            ".a",
            ".status",
            "[*]",
            "..b",
            "..*",
            "[0]",
            "[-1]",
            "[1:3]",
            "[::-1]",
            "[-9007199254740991:9007199254740991:-9007199254740991]",
            "[9007199254740991]",
            "['k']",
            "['a','b']",
            "[?@.a]",
            "[?@.a == 'x']",
            "[?@.n > 1 && @.n < 3]",
            "[?!@.a || @.b != null]",
            "[?length(@) > 1]",
            "[?count(@.*) > 0]",
            "[?match(@, 'o.*')]",
            "[?search(@.s, '[a-z(]+')]",
            "[?value(@..x) == 1]",
            "[?match(@, '(a|b)*c{2,1000}')]",
            "[",
            "]",
            "?",
            "(",
        ][..],
    );
    prop_oneof![
        prop::collection::vec(fragment, 0..5).prop_map(|f| format!("${}", f.concat())),
        "/[a-z0-9~/]{0,16}",
        "/(~0|~1|~|[0-9]{1,22}|-|/){0,6}",
        "[$/][ -~]{0,24}",
        "\\PC{0,16}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_json_value_given_as_a_request_is_judged_without_a_panic(
        request in json_value(),
        limits in limits(),
    ) {
        if let Ok(spec) = Spec::from_request(&request, &limits) {
            check_accepted(&request, &spec, &limits)?;
        }
    }

    #[test]
    fn a_valid_request_with_hostile_fields_is_judged_without_a_panic(
        request in near_valid(),
        limits in limits(),
    ) {
        if let Ok(spec) = Spec::from_request(&request, &limits) {
            check_accepted(&request, &spec, &limits)?;
        }
    }

    #[test]
    fn any_path_over_any_body_extracts_states_without_a_panic(
        text in path_text(),
        body in json_value(),
    ) {
        if let Ok(path) = ValuePath::parse(&text) {
            prop_assert_eq!(path.as_str(), text.as_str());
            if let Ok(Selected::Values(values)) = path.state_values(&body, &mut Budget::default()) {
                prop_assert!(!values.is_empty(), "Values(empty) from {} over {}", text, body);
            }
            if let Ok(Some(detail)) = path.detail(&body, &mut Budget::default()) {
                prop_assert!(!detail.is_null());
            }
            // A path parsed from its own text is the same path.
            prop_assert_eq!(ValuePath::parse(path.as_str()).ok(), Some(path));
        }
    }

    #[test]
    fn any_output_pick_over_any_body_is_taken_within_its_bound(
        picks in prop::collection::btree_map("[a-z]{1,4}", prop_oneof![
            path_text(),
            "(body|headers|status)(\\.[a-z]{1,3}|\\[[0-9]\\]){0,4}( \\+ body\\.[a-z]{1,3}){0,3}",
            "\\PC{0,16}",
        ], 1..6),
        body in json_value(),
        wide in 0usize..3,
    ) {
        // Repeats of the body make the whole of it past the 64 KiB bound at times.
        let body = if wide == 0 {
            body
        } else {
            json!({"pad": "x".repeat(40_000 * wide), "b": body})
        };
        let mut output = Output::new();
        for (name, text) in &picks {
            if let Ok(pick) = serde_json::from_value::<Pick>(Value::String(text.clone())) {
                // A pick reads back as the text it was parsed from.
                prop_assert_eq!(serde_json::to_value(&pick).unwrap(), Value::String(text.clone()));
                output.insert(name.clone(), pick);
            }
        }
        let headers = std::collections::BTreeMap::from([("x-a".to_string(), "b".to_string())]);
        let mut all = output.clone();
        all.insert("all".into(), serde_json::from_value(json!("body")).unwrap());
        if let Some(taken) = take(&all, Some(&body), 200, &headers) {
            let text = serde_json::to_string(&taken).unwrap();
            prop_assert!(text.len() <= waitd::engine::bound::MAX_OUTPUT, "{} bytes", text.len());
            prop_assert!(!text.contains("\\u0000"), "{}", text);
        }
    }

    #[test]
    fn any_bytes_as_a_grpc_health_answer_are_read_without_a_panic(
        body in prop::collection::vec(any::<u8>(), 0..64),
        status in 0u64..8,
        junk in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        use waitd::probe::grpc::{Answer, read_response};
        // Any bytes: a status or a sentence saying what is wrong, never a panic.
        if let Answer::Broken(why) = read_response(&body) {
            prop_assert!(!why.is_empty());
        }
        // A well-formed answer with any unknown field after it reads its status.
        let mut proto = vec![0x08, status as u8, 0x1a, junk.len() as u8];
        proto.extend_from_slice(&junk);
        let mut framed = vec![0, 0, 0, 0, proto.len() as u8];
        framed.extend_from_slice(&proto);
        match read_response(&framed) {
            Answer::Status(s) => prop_assert!(status < 4, "{} from {}", s, status),
            Answer::Broken(_) => prop_assert!(status >= 4),
            other => prop_assert!(false, "{:?}", other),
        }
    }
}

/// The smallest specs whose normal form names an empty `fail`: read back, they
/// mean what they meant.
#[test]
fn a_callback_wait_and_a_wait_decided_by_a_condition_alone_read_back_the_same() {
    let limits = Limits::default();
    for request in [
        json!({"callback": {}}),
        json!({"target": {"url": "https://api.example.com/x"}, "success_condition": "status == 200"}),
    ] {
        let spec = Spec::from_request(&request, &limits).expect("a valid request");
        let text = serde_json::to_value(&spec).expect("a spec serialises");
        assert_eq!(text["fail"], json!([]), "{text}");
        let again = Spec::from_request(&text, &limits)
            .unwrap_or_else(|e| panic!("{text} (from {request}) is refused: {e:?}"));
        assert_eq!(again, spec);
    }
}
