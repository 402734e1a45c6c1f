//! The CEL specification's own conformance tests, run against waitd's evaluator.
//!
//! The `simple` test files of the specification (`cel-spec`'s `tests/simple/testdata`)
//! are published on npm as `@bufbuild/cel-spec` ("CEL definitions and test data"),
//! as JSON in JavaScript modules. The test installs that package once into the
//! tests' scratch directory with npm, reads the files through node, and evaluates
//! every case of the suites for the features waitd claims with
//! `condition::evaluate_any`: waitd's parser, checks, meters and budget, over the
//! case's variables. It prints the pass count per suite. Every failing case is
//! listed with its reason in `tests/cel_conformance_exceptions.txt`; a failure not
//! listed there, or a listed case that passes, fails the test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::Value;
use waitd::engine::condition;

/// The package's version: the test data changes only when this does.
const PACKAGE: &str = "@bufbuild/cel-spec@0.6.1";

/// The suites for the features waitd claims (docs/conditions.md). Left out:
/// protobuf messages, enums and wrappers (`proto2`, `proto3`, `proto2_ext`,
/// `enums`, `dynamic`, `wrappers`), which waitd's variables never hold; the
/// checker's type deduction; and extensions waitd does not provide (`math_ext`,
/// `encoders_ext`, `bindings_ext`, `block_ext`, `network_ext`).
pub const SUITES: &[&str] = &[
    "basic",
    "comparisons",
    "conversions",
    "fields",
    "fp_math",
    "integer_math",
    "lists",
    "logic",
    "macros",
    "macros2",
    "namespace",
    "optionals",
    "parse",
    "plumbing",
    "string",
    "string_ext",
    "timestamps",
];

/// The conformance test data as JSON: the package installed (once) under the
/// tests' scratch directory, and read through node.
pub fn conformance_data() -> Value {
    static DATA: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DATA.get_or_init(load).clone()
}

fn load() -> Value {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cel-spec");
    let module = dir.join("node_modules/@bufbuild/cel-spec/dist/cjs/testdata/conformance.js");
    if !module.exists() {
        std::fs::create_dir_all(&dir).expect("the tests' scratch directory");
        let installed = Command::new("npm")
            .args([
                "install",
                "--silent",
                "--no-audit",
                "--no-fund",
                "--no-save",
                "--prefix",
            ])
            .arg(&dir)
            .arg(PACKAGE)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            installed && module.exists(),
            "the CEL conformance test needs npm and node (Debian: apt-get install nodejs npm) to install {PACKAGE} from the npm registry into {}",
            dir.display()
        );
    }
    let out = Command::new("node")
        .arg("-e")
        .arg("process.stdout.write(JSON.stringify(require(process.argv[1]).tests))")
        .arg(&module)
        .output()
        .expect("the CEL conformance test needs node (Debian: apt-get install nodejs)");
    assert!(
        out.status.success(),
        "node could not read {}: {}",
        module.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the conformance data is JSON")
}

/// A proto `cel.expr.Value` in its JSON form, as a value waitd's evaluator
/// holds; `None` for what waitd has no value for (messages, enums).
pub fn to_cel(v: &Value) -> Option<cel::Value> {
    let (kind, x) = v.as_object()?.iter().next()?;
    Some(match kind.as_str() {
        "int64Value" => cel::Value::Int(num(x)?),
        "uint64Value" => cel::Value::UInt(num(x)?),
        "doubleValue" => cel::Value::Float(double(x)?),
        "stringValue" => cel::Value::String(Arc::new(x.as_str()?.to_string())),
        "bytesValue" => cel::Value::Bytes(Arc::new(
            base64::engine::general_purpose::STANDARD
                .decode(x.as_str()?)
                .ok()?,
        )),
        "boolValue" => cel::Value::Bool(x.as_bool()?),
        "nullValue" => cel::Value::Null,
        "listValue" => cel::Value::List(Arc::new(
            x.get("values")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(to_cel).collect::<Option<Vec<_>>>())
                .unwrap_or(Some(Vec::new()))?,
        )),
        "mapValue" => {
            let mut map = std::collections::HashMap::new();
            for e in x
                .get("entries")
                .and_then(Value::as_array)
                .unwrap_or(&Vec::new())
            {
                let key = match to_cel(e.get("key")?)? {
                    cel::Value::Int(i) => cel::objects::Key::Int(i),
                    cel::Value::UInt(u) => cel::objects::Key::Uint(u),
                    cel::Value::Bool(b) => cel::objects::Key::Bool(b),
                    cel::Value::String(s) => cel::objects::Key::String(s),
                    _ => return None,
                };
                map.insert(key, to_cel(e.get("value")?)?);
            }
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
        "objectValue" => {
            let ty = x.get("@type")?.as_str()?;
            let text = x.get("value")?.as_str()?;
            match ty.rsplit('/').next()? {
                "google.protobuf.Timestamp" => {
                    cel::Value::Timestamp(chrono::DateTime::parse_from_rfc3339(text).ok()?)
                }
                "google.protobuf.Duration" => {
                    let secs: f64 = text.strip_suffix('s')?.parse().ok()?;
                    cel::Value::Duration(chrono::Duration::nanoseconds((secs * 1e9).round() as i64))
                }
                _ => return None,
            }
        }
        _ => return None,
    })
}

fn num<T: std::str::FromStr>(x: &Value) -> Option<T> {
    match x {
        Value::String(s) => s.parse().ok(),
        other => other.to_string().parse().ok(),
    }
}

fn double(x: &Value) -> Option<f64> {
    match x {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            s => s.parse().ok(),
        },
        _ => None,
    }
}

/// `v` written so that two values are the same exactly when their texts are:
/// typed, maps sorted, timestamps as instants, NaN equal to NaN.
pub fn canonical(v: &cel::Value) -> String {
    match v {
        cel::Value::Int(i) => format!("int {i}"),
        cel::Value::UInt(u) => format!("uint {u}"),
        // The data is read through JSON, which has no negative zero.
        cel::Value::Float(f) if *f == 0.0 => "double 0.0".into(),
        cel::Value::Float(f) => format!("double {f:?}"),
        cel::Value::String(s) => format!("string {s:?}"),
        cel::Value::Bytes(b) => format!("bytes {}", hex::encode(&**b)),
        cel::Value::Bool(b) => format!("bool {b}"),
        cel::Value::Null => "null".into(),
        cel::Value::Duration(d) => format!("duration {}", d.num_nanoseconds().unwrap_or(i64::MAX)),
        cel::Value::Timestamp(t) => {
            format!("timestamp {}", t.timestamp_nanos_opt().unwrap_or(i64::MAX))
        }
        cel::Value::List(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(", ")
        ),
        cel::Value::Map(m) => {
            let entries: BTreeSet<String> = m
                .map
                .iter()
                .map(|(k, v)| {
                    let k: cel::Value = k.clone().into();
                    format!("{}: {}", canonical(&k), canonical(v))
                })
                .collect();
            format!("{{{}}}", entries.into_iter().collect::<Vec<_>>().join(", "))
        }
        other => format!("{other:?}"),
    }
}

/// What a case expects.
enum Expected {
    Value(String),
    Type(String),
    Error,
}

/// How one case went: `None` when it passed, else what differed.
fn run(case: &Value) -> Option<String> {
    let expr = case.get("expr")?.as_str()?;
    let expected = if let Some(v) = case.get("value") {
        match v.get("typeValue") {
            Some(t) => Expected::Type(t.as_str().unwrap_or_default().to_string()),
            None => match to_cel(v) {
                Some(v) => Expected::Value(canonical(&v)),
                None => return Some(format!("expects a value waitd has no type for: {v}")),
            },
        }
    } else if let Some(v) = case.pointer("/typedResult/result") {
        match to_cel(v) {
            Some(v) => Expected::Value(canonical(&v)),
            None => return Some(format!("expects a value waitd has no type for: {v}")),
        }
    } else if case.get("evalError").is_some() || case.get("anyEvalErrors").is_some() {
        Expected::Error
    } else {
        Expected::Value(canonical(&cel::Value::Bool(true)))
    };
    let mut variables = Vec::new();
    if let Some(b) = case.get("bindings").and_then(Value::as_object) {
        for (name, v) in b {
            match v.get("value").and_then(to_cel) {
                Some(v) => variables.push((name.clone(), v)),
                None => return Some(format!("binds {name} to a value waitd has no type for")),
            }
        }
    }
    if case.get("container").is_some() {
        return Some("names a protobuf container".into());
    }
    let got = condition::evaluate_any(expr, None, variables);
    match (expected, got) {
        (Expected::Error, Err(_)) => None,
        (Expected::Error, Ok(v)) => Some(format!("expected an error, got {}", canonical(&v))),
        (Expected::Value(want), Ok(v)) if canonical(&v) == want => None,
        (Expected::Value(want), Ok(v)) => Some(format!("expected {want}, got {}", canonical(&v))),
        (Expected::Type(want), Ok(v)) => {
            let got = format!("{v:?}");
            // cel-rust's type values print as their names.
            (got.contains(&format!("\"{want}\"")) || got == want)
                .then_some(())
                .map_or_else(
                    || Some(format!("expected type {want}, got {got}")),
                    |_| None,
                )
        }
        (Expected::Value(want), Err(e)) => Some(format!("expected {want}, got the error: {e}")),
        (Expected::Type(want), Err(e)) => Some(format!("expected type {want}, got the error: {e}")),
    }
}

/// Every case of the claimed suites, by `suite/section/name`.
fn cases() -> Vec<(String, Value)> {
    let data = conformance_data();
    let mut out = Vec::new();
    for suite in data["suites"].as_array().expect("suites") {
        let name = suite["name"].as_str().unwrap_or_default();
        if !SUITES.contains(&name) {
            continue;
        }
        for section in suite["suites"].as_array().into_iter().flatten() {
            let sname = section["name"].as_str().unwrap_or_default();
            for t in section["tests"].as_array().into_iter().flatten() {
                let case = &t["original"];
                if case.get("checkOnly").and_then(Value::as_bool) == Some(true) {
                    continue;
                }
                let cname = case["name"].as_str().unwrap_or_default();
                out.push((format!("{name}/{sname}/{cname}"), case.clone()));
            }
        }
    }
    out
}

/// The exceptions file: `suite/section/name` and the reason, one a line.
fn exceptions() -> BTreeMap<String, String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/cel_conformance_exceptions.txt"
    );
    let text = std::fs::read_to_string(path).expect("tests/cel_conformance_exceptions.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((id, reason)) => (id.to_string(), reason.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

#[test]
fn the_cel_conformance_suites_pass_but_for_the_listed_exceptions() {
    let exceptions = exceptions();
    let mut per_suite: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut unlisted = Vec::new();
    let mut stale = Vec::new();
    let mut seen = BTreeSet::new();
    for (id, case) in cases() {
        let suite = id.split('/').next().unwrap_or_default().to_string();
        let failed = run(&case);
        let counts = per_suite.entry(suite).or_default();
        counts.1 += 1;
        if failed.is_none() {
            counts.0 += 1;
        }
        match (failed, exceptions.contains_key(&id)) {
            (Some(why), false) => unlisted.push(format!("{id}\t{why}")),
            (None, true) => stale.push(id.clone()),
            _ => {}
        }
        seen.insert(id);
    }
    let (mut pass, mut total) = (0, 0);
    for (suite, (p, t)) in &per_suite {
        eprintln!("{suite}: {p} of {t} cases pass");
        pass += p;
        total += t;
    }
    eprintln!("all: {pass} of {total} cases pass");
    let unknown: Vec<&String> = exceptions.keys().filter(|k| !seen.contains(*k)).collect();
    assert!(
        unlisted.is_empty(),
        "failing and not in tests/cel_conformance_exceptions.txt:\n{}",
        unlisted.join("\n")
    );
    assert!(
        stale.is_empty(),
        "listed in tests/cel_conformance_exceptions.txt but passing now; remove them:\n{}",
        stale.join("\n")
    );
    assert!(
        unknown.is_empty(),
        "listed in tests/cel_conformance_exceptions.txt but no such case: {unknown:?}"
    );
    assert!(
        exceptions.values().all(|r| !r.is_empty()),
        "every exception gives its reason"
    );
}
