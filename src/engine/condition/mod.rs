//! Conditions as CEL expressions (`success_condition`, `failure_condition`).
//!
//! An expression is parsed once, when a wait is created or held, by the `cel` crate
//! (cel-rust, the maintained Rust implementation of the Common Expression Language),
//! checked for what can be checked before any response exists (size, nesting, the
//! variables and functions it names), and rewritten so that its evaluation is
//! metered ([`super::cel::check`], [`super::cel::meter`]). It is then evaluated on
//! every response against five variables:
//!
//! | variable | value |
//! |---|---|
//! | `body` | the parsed JSON body; `null` when the body is not JSON |
//! | `status` | the HTTP status, an int |
//! | `headers` | lower-case header name → value; repeated headers joined with `", "` |
//! | `state` | what the wait's `state` path yields (one value, a list for a JSONPath, the status for `@status`); `null` without one |
//! | `now` | the time of the poll, which the evaluation is given ([`Vars::at`]) |
//! | `elapsed` | the response time, a duration, which the evaluation is given ([`Vars::took`]) |
//! | `tcp`, `tls` | a `tcp://` or `tls://` target's observation, a map ([`Vars::observed`]); `null` for others |
//!
//! ## The budget
//!
//! cel-rust has no cost limit of its own, and the macros over a 1 MiB body nest
//! into quadratic work, while `+`, `map`, `replace` or `split` can copy the body
//! over and over. So every place where work grows with the size of a value is
//! charged, before the work, to one budget per evaluation ([`BUDGET`] units; a
//! unit is one value, or 16 bytes of a string): the expression is rewritten to
//! call the meters of [`super::cel::meter`], and the functions of
//! [`super::cel`] charge what they build. `docs/conditions.md` lists what each
//! costs. What is not charged costs a bounded amount per node of the
//! expression, and the expression itself is bounded ([`MAX_LEN`], [`MAX_DEPTH`],
//! [`MAX_TREE`]). An evaluation past the budget stops at the next charge and is
//! reported as [`Failure::Budget`], whatever its result would have been.
//!
//! ## Recursion
//!
//! Everything that walks an expression recurses on its tree: the checks and the
//! metering here, cel-rust's interpreter, and dropping it. So the tree's depth is
//! measured right after parsing, without recursion, counting every node (an
//! operator, a call, a member, an index, an element of a literal, a macro and the
//! calls it expands into), and a tree deeper than [`MAX_TREE`] is refused before
//! anything else walks it. The parse itself recurses as deep as the text nests,
//! at most once or a few times a byte of its [`MAX_LEN`] bytes, so it runs where
//! the stack is sized for that: [`Condition::compile`] runs on the CPU pool's
//! threads ([`crate::cpu::STACK`]), and moves itself there when called elsewhere.
//!
//! Pure: no I/O, no clock.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, Weak};

use cel::Context;
use cel::common::ast::IdedExpr;
use cel::common::types::{
    CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelUInt,
};
use cel::common::value::Val;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

mod reads;
mod vars;

use reads::{Reads, collect_reads};
pub use vars::Vars;

/// The most bytes of one expression.
pub const MAX_LEN: usize = 2048;
/// The deepest nesting the parser accepts (parentheses, calls, operators).
pub const MAX_DEPTH: u16 = 32;
/// The deepest tree an expression may parse to, counting every node on the way
/// down (see the module's text).
pub const MAX_TREE: usize = 64;
/// What one evaluation of a response's conditions may spend, in units.
pub const BUDGET: u64 = 1_000_000;
/// The variables an expression may name.
pub const VARIABLES: [&str; 10] = [
    "body", "status", "headers", "state", "now", "elapsed", "tcp", "tls", "grpc", "dns",
];

/// The types an expression may name, as in `type(x) == int`.
pub const TYPES: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "optional_type",
    "google.protobuf.Timestamp",
    "google.protobuf.Duration",
];

/// The functions an expression may call, besides operators and macros: CEL's
/// standard functions, timestamps and durations, the strings extension, and the
/// list and regex libraries Kubernetes adds. `docs/conditions.md` describes each
/// and what it costs; a test evaluates every one.
pub const FUNCTIONS: &[&str] = &[
    // Standard.
    "size",
    "contains",
    "startsWith",
    "endsWith",
    "matches",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "bool",
    "type",
    "dyn",
    // Optional values.
    "optional.of",
    "optional.ofNonZeroValue",
    "optional.none",
    "hasValue",
    "value",
    "or",
    "orValue",
    // Timestamps and durations.
    "timestamp",
    "duration",
    "getFullYear",
    "getMonth",
    "getDayOfYear",
    "getDayOfMonth",
    "getDate",
    "getDayOfWeek",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
    // Strings extension.
    "charAt",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "reverse",
    "format",
    "strings.quote",
    // Lists: Kubernetes' library and the lists extension.
    "isSorted",
    "sum",
    "min",
    "max",
    "slice",
    "flatten",
    "distinct",
    "sort",
    // Regular expressions (Kubernetes).
    "find",
    "findAll",
];

sentence_error! {
    /// Why a text is not a condition: a sentence with where in the text, if
    /// it can say.
    pub struct ConditionError;
}

/// A compiled condition: its source, the metered expression evaluated, and what
/// of a response it reads, shared by the waits that hold the same text.
#[derive(Clone)]
pub struct Condition {
    expr: Arc<Compiled>,
}

struct Compiled {
    source: String,
    expr: IdedExpr,
    reads: Reads,
}

/// One field of the map an observation other than an HTTP response is to
/// conditions (`tcp.connected`, `tcp.elapsed`).
#[derive(Clone, Debug, PartialEq)]
pub enum Field {
    Bool(bool),
    Int(i64),
    Text(String),
    Duration(std::time::Duration),
    Timestamp(DateTime<Utc>),
    List(Vec<String>),
    Null,
}

impl PartialEq for Condition {
    fn eq(&self, other: &Self) -> bool {
        self.expr.source == other.expr.source
    }
}

impl fmt::Debug for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Condition({:?})", self.expr.source)
    }
}

impl Serialize for Condition {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.expr.source)
    }
}

impl<'de> Deserialize<'de> for Condition {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let source = String::deserialize(d)?;
        Condition::compile_shared(&source).map_err(serde::de::Error::custom)
    }
}

/// Why a condition gave no answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// CEL's own error (a missing field without `has()`, a type mismatch, a result
    /// that is not a bool): the response counts as a missing state.
    Error(String),
    /// The evaluation ran past [`BUDGET`].
    Budget,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(e) => f.write_str(e),
            Failure::Budget => f.write_str(
                "it ran past its budget, the 1,000,000 units one response's evaluation may spend (a unit is one value, or 16 bytes of a string); nested macros over large lists cost the product of their sizes",
            ),
        }
    }
}

impl Condition {
    /// Parses and checks `source`; the error is a sentence with the position. Runs
    /// on the CPU pool (waiting for it when called from another thread), whose
    /// stack is sized for the parser's recursion.
    pub fn compile(source: &str) -> Result<Condition, ConditionError> {
        if crate::cpu::on_pool_thread() {
            return Condition::compile_here(source);
        }
        let source = source.to_string();
        crate::cpu::pool()
            .run_blocking(move || Condition::compile_here(&source))
            .unwrap_or_else(|lost| Err(format!("could not be parsed: {lost}").into()))
    }

    /// [`Condition::compile`] on the calling thread, whatever its stack: for tests
    /// that measure what the parse needs.
    #[doc(hidden)]
    pub fn compile_here(source: &str) -> Result<Condition, ConditionError> {
        Condition::compile_as(source, true)
    }

    /// [`Condition::compile`] of an expression that may yield any value (a wait's
    /// `output`), evaluated with [`Condition::evaluate_value`].
    pub fn compile_value(source: &str) -> Result<Condition, ConditionError> {
        if crate::cpu::on_pool_thread() {
            return Condition::compile_as(source, false);
        }
        let source = source.to_string();
        crate::cpu::pool()
            .run_blocking(move || Condition::compile_as(&source, false))
            .unwrap_or_else(|lost| Err(format!("could not be parsed: {lost}").into()))
    }

    fn compile_as(source: &str, boolean: bool) -> Result<Condition, ConditionError> {
        let mut expr = super::cel::check::parse_checked(source, &[], boolean)?;
        let mut reads = Reads::default();
        collect_reads(&expr, &mut reads);
        super::cel::meter::meter(&mut expr);
        Ok(Condition {
            expr: Arc::new(Compiled {
                source: source.to_string(),
                expr,
                reads,
            }),
        })
    }

    /// The lower bound on its tree's depth that is read from the tokens of
    /// `source` before the parse, and the depth of the tree it parses to (none when
    /// it does not parse), parsed on the CPU pool: for the test that holds the one
    /// under the other.
    #[doc(hidden)]
    pub fn depths(source: &str) -> (usize, Option<usize>) {
        let source = source.to_string();
        crate::cpu::pool()
            .run_blocking(move || super::cel::check::depths(&source))
            .unwrap_or((0, None))
    }

    /// Whether the expression names `headers` (the prober then collects them).
    pub fn reads_headers(&self) -> bool {
        self.expr.reads.headers
    }

    /// Whether the expression names `state` (the prober then selects it).
    pub fn reads_state(&self) -> bool {
        self.expr.reads.state
    }

    /// Whether the expression names `now`: its answer on one response can change
    /// with time, so it is not remembered for the next same response.
    pub fn reads_now(&self) -> bool {
        self.expr.reads.now
    }

    /// Whether the expression names `elapsed`: the same response can come
    /// faster or slower, so its answer is not remembered either.
    pub fn reads_elapsed(&self) -> bool {
        self.expr.reads.elapsed
    }

    /// [`Condition::compile`], sharing the compiled form with every other held
    /// wait whose expression is the same text (thousands of waits from one preset
    /// hold one tree).
    pub fn compile_shared(source: &str) -> Result<Condition, ConditionError> {
        static SHARED: LazyLock<Mutex<HashMap<String, Weak<Compiled>>>> =
            LazyLock::new(Mutex::default);
        let lock = || SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(expr) = lock().get(source).and_then(Weak::upgrade) {
            return Ok(Condition { expr });
        }
        let c = Condition::compile(source)?;
        let mut shared = lock();
        // Forget the texts no wait holds any more, so the map stays as large as
        // the set of distinct expressions held.
        if shared.len() >= 1024 && shared.len().is_power_of_two() {
            shared.retain(|_, w| w.strong_count() > 0);
        }
        shared.insert(source.to_string(), Arc::downgrade(&c.expr));
        Ok(c)
    }

    pub fn source(&self) -> &str {
        &self.expr.source
    }

    /// Whether `self` and `other` hold one compiled tree ([`Condition::compile_shared`]).
    pub fn shares_tree_with(&self, other: &Condition) -> bool {
        Arc::ptr_eq(&self.expr, &other.expr)
    }

    /// Evaluates the condition against `vars`, charging `budget`.
    pub fn evaluate(&self, vars: &Vars<'_>, budget: &mut Budget) -> Result<bool, Failure> {
        match self.resolve(vars, budget)? {
            cel::Value::Bool(b) => Ok(b),
            other => Err(Failure::Error(format!(
                "it evaluated to {}, not a bool",
                type_name(&other)
            ))),
        }
    }

    /// The expression's value on `vars`, its cost charged to `budget`.
    fn resolve(&self, vars: &Vars<'_>, budget: &mut Budget) -> Result<cel::Value, Failure> {
        if budget.left == 0 {
            return Err(Failure::Budget);
        }
        super::cel::start(budget.left);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            vars.context.resolve(&self.expr.expr)
        }));
        match super::cel::finish() {
            Some(left) => budget.left = left,
            None => {
                budget.left = 0;
                return Err(Failure::Budget);
            }
        }
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Failure::Error(explain(&e))),
            Err(_) => Err(Failure::Error(
                "the CEL interpreter failed on this response".into(),
            )),
        }
    }
}

impl Condition {
    /// Evaluates the expression against `vars`, charging `budget`, to whatever
    /// JSON it yields (a wait's `output`): timestamps as RFC 3339 text, durations
    /// as seconds, bytes as their text read lossily.
    pub fn evaluate_value(&self, vars: &Vars<'_>, budget: &mut Budget) -> Result<Value, Failure> {
        let v = self.resolve(vars, budget)?;
        cel_json(&v, 0).ok_or_else(|| {
            Failure::Error(format!(
                "it evaluated to {}, which has no JSON form",
                type_name(&v)
            ))
        })
    }
}

/// A CEL value as JSON, or `None` for one that has no JSON form (a function, an
/// opaque value, nesting past [`MAX_JSON_DEPTH`]).
fn cel_json(v: &cel::Value, depth: usize) -> Option<Value> {
    use cel::Value as C;
    if depth > MAX_JSON_DEPTH {
        return None;
    }
    Some(match v {
        C::Null => Value::Null,
        C::Bool(b) => Value::Bool(*b),
        C::Int(i) => Value::from(*i),
        C::UInt(u) => Value::from(*u),
        C::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        C::String(s) => Value::String(s.to_string()),
        C::Bytes(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
        C::Timestamp(t) => Value::String(t.to_rfc3339()),
        C::Duration(d) => serde_json::Number::from_f64(d.num_milliseconds() as f64 / 1000.0)
            .map_or(Value::Null, Value::Number),
        C::List(items) => Value::Array(
            items
                .iter()
                .map(|x| cel_json(x, depth + 1))
                .collect::<Option<Vec<_>>>()?,
        ),
        C::Map(m) => Value::Object(
            m.map
                .iter()
                .map(|(k, x)| Some((k.to_string(), cel_json(x, depth + 1)?)))
                .collect::<Option<serde_json::Map<_, _>>>()?,
        ),
        _ => return None,
    })
}

/// The deepest nesting a CEL value is turned into JSON through.
const MAX_JSON_DEPTH: usize = 128;

/// CEL's error as a sentence: a key or field that is not there says how to read
/// one that may be missing, which CEL's own text ("No such key: x") does not.
fn explain(e: &cel::ExecutionError) -> String {
    match e {
        cel::ExecutionError::NoSuchKey(key) => {
            let key: String = key.chars().take(64).collect();
            format!(
                "no such key \"{}\"; read a key or field that may be missing behind `in` or `has()`, e.g. 'x-phase' in headers && headers['x-phase'] == 'failed', or has(body.status.phase) && body.status.phase == 'Failed'",
                key.escape_debug()
            )
        }
        other => other.to_string(),
    }
}

/// An expression evaluated to whatever value it yields, over `body` and
/// `variables`, with waitd's checks, meters and budget: how the conformance tests
/// hold waitd's evaluator to CEL's specification. Not for conditions, which must
/// yield a bool.
#[doc(hidden)]
pub fn evaluate_any(
    source: &str,
    body: Option<&Value>,
    variables: Vec<(String, cel::Value)>,
) -> Result<cel::Value, String> {
    let names: Vec<String> = variables.iter().map(|(n, _)| n.clone()).collect();
    let mut expr = super::cel::check::parse_checked(source, &names, false).map_err(|e| e.0)?;
    super::cel::meter::meter(&mut expr);
    let mut context = Context::with_env(Arc::clone(&super::cel::ENV));
    let body: Box<dyn Val> = match body {
        Some(b) => json(b),
        None => Box::new(CelNull),
    };
    context.add_variable_as_val("body", body);
    for (name, value) in variables {
        context.add_variable_from_value(name, value);
    }
    super::cel::start(BUDGET);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| context.resolve(&expr)));
    if super::cel::finish().is_none() {
        return Err(Failure::Budget.to_string());
    }
    match result {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("the CEL interpreter failed".into()),
    }
}

/// What one response's evaluations may still spend: both conditions share one.
#[derive(Clone, Debug)]
pub struct Budget {
    left: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { left: BUDGET }
    }
}

impl Budget {
    /// Units spent so far.
    pub fn spent(&self) -> u64 {
        BUDGET - self.left.min(BUDGET)
    }
}

/// A JSON value as CEL sees it: integers that fit are `int` (then `uint`), other
/// numbers `double`.
fn json<'v>(v: &'v Value) -> Box<dyn Val + 'v> {
    match v {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or(f64::NAN))),
        },
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => Box::new(CelList::from(
            items.iter().map(json).collect::<Vec<Box<dyn Val + 'v>>>(),
        )),
        Value::Object(map) => Box::new(CelMap::from(
            map.iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), json(v)))
                .collect::<HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>>(),
        )),
    }
}

fn type_name(v: &cel::Value) -> &'static str {
    match v {
        cel::Value::List(_) => "a list",
        cel::Value::Map(_) => "a map",
        cel::Value::Int(_) => "an int",
        cel::Value::UInt(_) => "a uint",
        cel::Value::Float(_) => "a double",
        cel::Value::String(_) => "a string",
        cel::Value::Bytes(_) => "bytes",
        cel::Value::Null => "null",
        _ => "a value of another type",
    }
}
