//! Generated group create bodies given to the group parser (512 cases a
//! property): whatever a stranger sends as `all`/`any`, the parser answers
//! without a panic, accepts 1 to 100 members and no more, caps every new
//! member's timeout by the group's, and names each refusal's field in words a
//! person can act on.

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use waitd::engine::Limits;
use waitd::groups::request::parse;
use waitd::groups::{MAX_MEMBERS, MemberRequest, Refusal};

fn member_spec(timeout: &str) -> Value {
    json!({
        "target": {"url": "http://127.0.0.1:9/x"},
        "state": "/status",
        "want": ["on"],
        "timeout": timeout,
    })
}

/// Small JSON of any shape.
fn junk() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                "(all|any|id|required|target|timeout|[a-z]{1,6})",
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One member: a valid spec, an id, or something near or far from either.
fn member() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => "(1s|30s|10m|2h|0s|-1s|x)".prop_map(|t| member_spec(&t)),
        3 => any::<u128>().prop_map(|n| json!({"id": uuid::Uuid::from_u128(n)})),
        1 => (any::<u128>(), any::<bool>()).prop_map(|(n, r)| json!({"id": uuid::Uuid::from_u128(n), "required": r})),
        1 => (any::<u128>(), junk()).prop_map(|(n, j)| json!({"id": uuid::Uuid::from_u128(n), "target": j})),
        1 => junk().prop_map(|j| json!({"id": j})),
        1 => junk().prop_map(|j| json!({"all": [j]})),
        1 => junk().prop_map(|j| { let mut s = member_spec("1m"); s["required"] = j; s }),
        1 => junk(),
    ]
}

/// A group body: a mode (or two, or none but another key), 0 to 130 members
/// (past the limit of 100), and the group's own fields, valid or not.
fn body() -> impl Strategy<Value = Value> {
    let count = prop_oneof![0usize..6, 95usize..106, 120usize..131];
    (
        prop::sample::select(&["all", "any", "both"][..]),
        count,
        member(),
        prop::collection::vec(member(), 0..6),
        prop::option::of("(1s|5m|1h|0s|nope)"),
        prop::option::of(junk()),
        prop::option::of(junk()),
    )
        .prop_map(|(mode, n, fill, some, timeout, keep, extra)| {
            let mut members = some;
            while members.len() < n {
                members.push(fill.clone());
            }
            members.truncate(n);
            let mut b = Map::new();
            match mode {
                "both" => {
                    b.insert("all".into(), Value::Array(members.clone()));
                    b.insert("any".into(), Value::Array(members));
                }
                m => {
                    b.insert(m.into(), Value::Array(members));
                }
            }
            if let Some(t) = timeout {
                b.insert("timeout".into(), json!(t));
            }
            if let Some(k) = keep {
                b.insert("keep_running".into(), k);
            }
            if let Some(x) = extra {
                b.insert("target".into(), x);
            }
            Value::Object(b)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_group_body_is_judged_without_a_panic_and_within_its_limits(body in body()) {
        let limits = Limits::default();
        let expand = |v: &Value| -> Result<Value, String> { Ok(v.clone()) };
        let mode = if body.get("all").is_some() { "all" } else { "any" };
        let given = body[mode].as_array().map_or(0, Vec::len);
        match parse(&body, &limits, &expand) {
            Ok(g) => {
                prop_assert!((1..=MAX_MEMBERS).contains(&g.members.len()), "{}", g.members.len());
                prop_assert_eq!(g.members.len(), given);
                prop_assert!(body.get("target").is_none(), "a stray field was accepted: {}", body);
                for m in &g.members {
                    if let MemberRequest::Spec { spec, .. } = m {
                        prop_assert!(spec.timeout <= g.shell.timeout, "a member outlives its group");
                    }
                }
                prop_assert!(g.spec.get(g.mode.as_str()).is_some(), "{}", g.spec);
            }
            Err(Refusal::Invalid(errors)) => {
                prop_assert!(!errors.is_empty());
                for e in &errors {
                    prop_assert!(!e.message.trim().is_empty(), "{:?}", e);
                    prop_assert!(e.field.chars().count() <= 200, "{:?}", e);
                }
                if given > MAX_MEMBERS && body.get("any").is_some() != body.get("all").is_some() {
                    prop_assert!(
                        errors.iter().any(|e| e.field == mode && e.message.contains("at most 100")),
                        "{:?}", errors
                    );
                }
            }
            Err(Refusal::Expand { refused, .. }) => {
                prop_assert!(false, "the expansion never refuses: {}", refused)
            }
        }
    }
}
