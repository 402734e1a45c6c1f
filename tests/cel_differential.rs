//! waitd's conditions against a second, independent CEL: Google's C++ runtime
//! through its Python package `cel-expr-python` (PyPI), installed at test time
//! into a virtualenv in the tests' scratch directory. Generated expressions over
//! generated JSON bodies are evaluated by both; they must agree on every value,
//! or on the kind of error.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use waitd::engine::condition;

const PACKAGE: &str = "cel-expr-python==0.1.3";

/// Reads `{"expr", "body"}` lines, answers `{"type", "value"}` or `{"error"}`
/// lines, with the strings extension as waitd has it.
const EVALUATOR: &str = r#"
import json, math, os, sys
from cel_expr_python import cel
from cel_expr_python.ext import ext_optional, ext_strings
env = cel.NewEnv(variables={"body": cel.Type.DYN}, extensions=[ext_strings.ExtStrings(), ext_optional.ExtOptional()])
def plain(v):
    if isinstance(v, float):
        if math.isnan(v): return "NaN"
        if math.isinf(v): return "Infinity" if v > 0 else "-Infinity"
        return v
    if isinstance(v, bytes): return {"bytes": v.hex()}
    if isinstance(v, list): return [plain(x) for x in v]
    if isinstance(v, dict): return {json.dumps(plain(k)): plain(x) for k, x in v.items()}
    return v
for line in sys.stdin:
    case = json.loads(line)
    try:
        value = env.compile(case["expr"]).eval(data={"body": case["body"]})
        t = value.type().name()
        out = {"error": value.plain_value()} if t == "ERROR" else {"type": t.split("<")[0], "value": plain(value.plain_value())}
    except Exception as e:
        out = {"error": str(e)}
    print(json.dumps(out), flush=True)
# The package's teardown frees None once too often ("none_dealloc") when a
# value held null: leave without it.
os._exit(0)
"#;

fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            crate::support::venv::python_with(
                "WAITD_TEST_CEL_PYTHON",
                "cel-python-venv",
                PACKAGE,
                "from cel_expr_python import cel",
                "python3 (3.11 or later) with venv for the differential CEL test",
            )
        })
        .clone()
}

/// The kind of an error, from either implementation's sentence.
fn kind(message: &str) -> &'static str {
    let m = message.to_lowercase();
    if m.contains("divide by zero")
        || m.contains("division by zero")
        || m.contains("modulus by zero")
        || m.contains("modulo by zero")
        || m.contains("remainder by zero")
    {
        "division by zero"
    } else if m.contains("index") || m.contains("greater than") && m.contains("size") {
        "index"
    } else if m.contains("overflow") || m.contains("range") {
        "overflow"
    } else if m.contains("index") {
        "index"
    } else if m.contains("no such key")
        || m.contains("key not found")
        || m.contains("no such field")
    {
        "no such key"
    } else {
        "other"
    }
}

/// A value as the Python side writes it.
fn plain(v: &cel::Value) -> Value {
    match v {
        cel::Value::Int(i) => json!(i),
        cel::Value::UInt(u) => json!(u),
        cel::Value::Float(f) if f.is_nan() => json!("NaN"),
        cel::Value::Float(f) if f.is_infinite() => {
            json!(if *f > 0.0 { "Infinity" } else { "-Infinity" })
        }
        cel::Value::Float(f) => json!(f),
        cel::Value::String(s) => json!(s.as_str()),
        cel::Value::Bytes(b) => json!({"bytes": hex::encode(&**b)}),
        cel::Value::Bool(b) => json!(b),
        cel::Value::Null => Value::Null,
        cel::Value::List(items) => Value::Array(items.iter().map(plain).collect()),
        cel::Value::Map(m) => Value::Object(
            m.map
                .iter()
                .map(|(k, v)| {
                    let k: cel::Value = k.clone().into();
                    (plain(&k).to_string(), plain(v))
                })
                .collect(),
        ),
        other => json!(format!("{other:?}")),
    }
}

fn type_name(v: &cel::Value) -> &'static str {
    match v {
        cel::Value::Int(_) => "INT",
        cel::Value::UInt(_) => "UINT",
        cel::Value::Float(_) => "DOUBLE",
        cel::Value::String(_) => "STRING",
        cel::Value::Bytes(_) => "BYTES",
        cel::Value::Bool(_) => "BOOL",
        cel::Value::Null => "NULL_TYPE",
        cel::Value::List(_) => "LIST",
        cel::Value::Map(_) => "MAP",
        _ => "OTHER",
    }
}

/// What waitd says, in the Python side's words.
fn waitd(expr: &str, body: &Value) -> Value {
    match condition::evaluate_any(expr, Some(body), Vec::new()) {
        Ok(v) => json!({"type": type_name(&v), "value": plain(&v)}),
        Err(e) => json!({"error": e}),
    }
}

/// The same value, or errors of one kind. When both operands of `&&` or `||`
/// (or two elements of a macro's range) fail, CEL lets an implementation
/// report either error, so there any error agrees with any other.
fn agree(expr: &str, ours: &Value, theirs: &Value) -> bool {
    let either = ["&&", "||", ".all(", ".exists"]
        .iter()
        .any(|op| expr.contains(op));
    match (ours.get("error"), theirs.get("error")) {
        (Some(_), Some(_)) if either => true,
        (Some(a), Some(b)) => kind(&a.to_string()) == kind(&b.to_string()),
        (None, None) => ours == theirs,
        _ => false,
    }
}

// ---- Generated expressions ----

fn small_int() -> impl Strategy<Value = i64> {
    prop_oneof![-3i64..10, Just(i64::MAX), Just(i64::MIN), Just(0)]
}

fn word() -> impl Strategy<Value = String> {
    "[a-cA-C ,é-]{0,6}"
}

fn body() -> impl Strategy<Value = Value> {
    (
        small_int(),
        small_int(),
        prop_oneof![Just(0.5), Just(-2.25), Just(1e300), Just(3.0)],
        word(),
        word(),
        prop::collection::vec(-3i64..5, 0..5),
        prop::collection::btree_map("[a-c]", -3i64..5, 0..3),
        any::<bool>(),
    )
        .prop_map(|(a, b, f, s, t, l, m, ok)| {
            json!({"a": a, "b": b, "f": f, "s": s, "t": t, "l": l, "m": m, "n": null, "ok": ok})
        })
}

fn int_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("body.a".to_string()),
        Just("body.b".to_string()),
        (-3i64..10).prop_map(|i| i.to_string()),
        Just("size(body.s)".to_string()),
        Just("size(body.l)".to_string()),
        Just("body.s.indexOf(body.t)".to_string()),
        Just("body.s.lastIndexOf('a')".to_string()),
        (0i64..4).prop_map(|i| format!("body.l[{i}]")),
        Just("body.m.a".to_string()),
        Just("int(body.f)".to_string()),
    ];
    leaf.prop_recursive(2, 8, 2, |inner| {
        (
            inner.clone(),
            prop::sample::select(vec!["+", "-", "*", "/", "%"]),
            inner,
        )
            .prop_map(|(a, op, b)| format!("({a} {op} {b})"))
    })
}

fn string_expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just("body.s".to_string()),
        Just("body.t".to_string()),
        word().prop_map(|w| format!("'{w}'")),
        Just("string(body.a)".to_string()),
    ];
    leaf.prop_recursive(2, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} + {b})")),
            inner.clone().prop_map(|a| format!("{a}.lowerAscii()")),
            inner.clone().prop_map(|a| format!("{a}.upperAscii()")),
            inner.clone().prop_map(|a| format!("{a}.trim()")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}.replace({b}, 'x')")),
            (inner.clone(), 0i64..4).prop_map(|(a, i)| format!("{a}.substring({i})")),
            (inner.clone(), 0i64..4).prop_map(|(a, i)| format!("{a}.charAt({i})")),
            (inner.clone(), inner).prop_map(|(a, b)| format!("{a}.split({b}).join('|')")),
        ]
    })
}

fn bool_expr() -> impl Strategy<Value = String> {
    let cmp = prop::sample::select(vec!["==", "!=", "<", "<=", ">", ">="]);
    let leaf = prop_oneof![
        (int_expr(), cmp.clone(), int_expr()).prop_map(|(a, o, b)| format!("{a} {o} {b}")),
        (string_expr(), cmp.clone(), string_expr()).prop_map(|(a, o, b)| format!("{a} {o} {b}")),
        (int_expr(), cmp, Just("body.f")).prop_map(|(a, o, b)| format!("{a} {o} {b}")),
        (string_expr(), string_expr()).prop_map(|(a, b)| format!("{a}.contains({b})")),
        (string_expr(), string_expr()).prop_map(|(a, b)| format!("{a}.startsWith({b})")),
        (string_expr(), string_expr()).prop_map(|(a, b)| format!("{a}.endsWith({b})")),
        string_expr().prop_map(|a| format!("{a}.matches('^[a-c]+$')")),
        int_expr().prop_map(|a| format!("{a} in body.l")),
        string_expr().prop_map(|a| format!("{a} in body.m")),
        Just("has(body.m.a)".to_string()),
        Just("body.ok".to_string()),
        Just("body.n == null".to_string()),
        int_expr().prop_map(|a| format!("body.l.exists(x, x == {a})")),
        int_expr().prop_map(|a| format!("body.l.all(x, x < {a})")),
        Just("body.l.exists_one(x, x > 0)".to_string()),
        Just("body.?x.orValue(true)".to_string()),
        Just("body.a + body.f > 0.0".to_string()),
    ];
    leaf.prop_recursive(2, 8, 2, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} && {b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a} || {b})")),
            inner.prop_map(|a| format!("!({a})")),
        ]
    })
}

fn any_expr() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => bool_expr(),
        2 => int_expr(),
        2 => string_expr(),
        1 => int_expr().prop_map(|a| format!("body.l.map(x, x * {a})")),
        1 => Just("body.l.filter(x, x % 2 == 0)".to_string()),
        1 => Just("body.f * 2.0".to_string()),
        1 => Just("double(body.a) / 2.0".to_string()),
        1 => Just("[body.a, body.s, body.n]".to_string()),
        1 => Just("{'k': body.l}".to_string()),
    ]
}

#[test]
fn waitd_and_google_s_cel_agree_on_generated_expressions() {
    // A fixed seed: the same cases every run, so the test is not flaky; change
    // the seed to explore others.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 2000,
            ..Config::default()
        },
        proptest::test_runner::TestRng::from_seed(
            proptest::test_runner::RngAlgorithm::ChaCha,
            &[7; 32],
        ),
    );
    let cases: Vec<(String, Value)> = (0..2000)
        .map(|_| {
            let e = any_expr().new_tree(&mut runner).unwrap().current();
            let b = body().new_tree(&mut runner).unwrap().current();
            (e, b)
        })
        .collect();
    let mut child = Command::new(python())
        .args(["-c", EVALUATOR])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python runs");
    let mut stdin = child.stdin.take().unwrap();
    let input: String = cases
        .iter()
        .map(|(e, b)| json!({"expr": e, "body": b}).to_string() + "\n")
        .collect();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let theirs: Vec<Value> = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.expect("a line")).expect("JSON"))
        .collect();
    writer.join().unwrap().expect("written");
    assert!(child.wait().expect("python ends").success());
    assert_eq!(theirs.len(), cases.len(), "one answer a case");
    let mut disagree = Vec::new();
    let mut errors = 0;
    for ((expr, body), theirs) in cases.iter().zip(&theirs) {
        let ours = waitd(expr, body);
        errors += usize::from(ours.get("error").is_some());
        if !agree(expr, &ours, theirs) {
            disagree.push(format!(
                "{expr}\n  body: {body}\n  waitd: {ours}\n  cel-cpp: {theirs}"
            ));
        }
    }
    eprintln!(
        "{} cases, {errors} of them errors, {} disagree",
        cases.len(),
        disagree.len()
    );
    assert!(
        disagree.is_empty(),
        "{}\n…{} in all",
        disagree
            .iter()
            .take(15)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        disagree.len()
    );
}
