//! What one wait makes of a response: its observation (the state read from the
//! body, §3.3) and its conditions' verdict (§3.13), with the memo that spares
//! evaluating them again on an identical response. No I/O: the response is read
//! already.

use std::collections::BTreeMap;

use bytes::Bytes;
use http::header::HeaderMap;
use serde_json::Value;

use crate::engine::{Budget, Exceeded, Observation, Selected, Spec, ValuePath, condition};

/// Bodies up to this size are read where they arrive; larger ones on the CPU pool.
const INLINE_BODY: usize = 16 * 1024;

/// A response whose body has been read, before its JSON, state and conditions are.
pub(super) struct Answer {
    pub(super) status: u16,
    /// The headers the conditions read, when the wait has conditions.
    pub(super) headers: Option<BTreeMap<String, String>>,
    pub(super) body: Bytes,
    /// The observation the status alone made.
    pub(super) base: Observation,
    /// The state is in the body.
    pub(super) needs_body: bool,
    /// The memo key of this response, when the wait has conditions or its state
    /// is in the body.
    pub(super) key: Option<u64>,
    /// What the wait made of the same response before.
    pub(super) hit: Option<Memo>,
    /// How long the response took, from sending the request to its last byte.
    pub(super) elapsed: std::time::Duration,
    /// Every header, when the wait's `output` names a CEL expression.
    pub(super) all_headers: Option<BTreeMap<String, String>>,
}

impl Answer {
    /// What the memo of the identical response before gives this one: the state
    /// read from its body, and what the conditions decided on it.
    fn kept(&self) -> (Option<Short>, Option<(bool, Option<bool>)>) {
        let Some(m) = self.hit else {
            return (None, None);
        };
        let state = m.state.filter(|_| self.needs_body);
        (state, m.verdict.filter(|_| self.headers.is_some()))
    }

    /// Whether the body must be parsed: for a state the memo does not give, for
    /// conditions it has no verdict of, or for an `output` to take.
    fn parses(&self, spec: &Spec) -> bool {
        let (state, verdict) = self.kept();
        (self.needs_body && state.is_none())
            || (self.headers.is_some() && verdict.is_none())
            || !spec.output.is_empty()
    }

    /// Whether reading it is work for the CPU pool: a large body to parse,
    /// conditions to evaluate, a CEL `output`, or a JSONPath to run.
    pub(super) fn heavy(&self, spec: &Spec) -> bool {
        let (state, verdict) = self.kept();
        (self.body.len() > INLINE_BODY && self.parses(spec))
            || (self.headers.is_some() && verdict.is_none())
            || self.all_headers.is_some()
            || (self.needs_body
                && state.is_none()
                && matches!(spec.state, Some(ValuePath::Query { .. })))
    }

    /// The observation, the memo for the next response (when the wait has a
    /// state in the body or conditions), and the wait's `output` taken from this
    /// response (when it names one).
    pub(super) fn read(self, spec: &Spec) -> (Observation, Option<Memo>, Option<Value>) {
        let (kept_state, kept_verdict) = self.kept();
        // A response whose state and verdict the memo gives, with no output to
        // take: the body need not even be parsed.
        let parsed: Option<Value> = if self.parses(spec) {
            serde_json::from_slice(&self.body).ok()
        } else {
            None
        };
        let Answer {
            status,
            headers,
            body,
            base,
            needs_body,
            key,
            elapsed,
            all_headers,
            ..
        } = self;
        let output = taken(spec, parsed.as_ref(), status, all_headers.as_ref());
        let base = match kept_state.and_then(|s| s.observation()) {
            Some(state) => state,
            None if needs_body => classify_body(&body, parsed.as_ref(), spec),
            None => base,
        };
        let state = if needs_body { Short::of(&base) } else { None };
        let (obs, verdict, reused) = match (headers, kept_verdict) {
            (None, _) => (base, None, false),
            (Some(_), Some((failure, success))) => {
                let obs = Observation::Judged {
                    status,
                    failure,
                    success,
                    base: Box::new(base),
                };
                (obs, Some((failure, success)), true)
            }
            (Some(headers), None) => {
                let obs = judge_took(spec, status, &headers, parsed.as_ref(), base, Some(elapsed));
                // A condition that reads `now` or `elapsed` may decide the same
                // response differently later, so its answer is not remembered.
                let timeless = !spec
                    .conditions()
                    .iter()
                    .any(|c| c.reads_now() || c.reads_elapsed());
                let verdict = match &obs {
                    Observation::Judged {
                        failure, success, ..
                    } if timeless => Some((*failure, *success)),
                    _ => None,
                };
                (obs, verdict, false)
            }
        };
        let memo = key
            .filter(|_| verdict.is_some() || state.is_some())
            .map(|key| Memo {
                key,
                verdict,
                state,
                reused,
            });
        (obs, memo, output)
    }
}

/// The wait's `output` from a response: each string that holds one of the
/// target's secrets (a header value, a credential) reads `<redacted>`.
fn taken(
    spec: &Spec,
    body: Option<&Value>,
    status: u16,
    headers: Option<&BTreeMap<String, String>>,
) -> Option<Value> {
    if spec.output.is_empty() {
        return None;
    }
    let none = BTreeMap::new();
    let mut out =
        crate::engine::spec::output::take(&spec.output, body, status, headers.unwrap_or(&none))?;
    if let Some(t) = &spec.target {
        let secrets = t.secrets();
        crate::engine::spec::output::redact(&mut out, secrets.values().map(String::as_str));
    }
    Some(out)
}

/// A 2xx body (and its JSON, when it parsed): the state, or why there is none.
/// The state path (and the error path, read only when a state is in `fail`) are
/// evaluated under one [`Budget`]; an evaluation past it is a permanent error.
fn classify_body(body: &[u8], json: Option<&Value>, spec: &Spec) -> Observation {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Observation::Missing {
            reason: "the response body is empty, not JSON".to_string(),
        };
    }
    let Some(json) = json else {
        return Observation::Missing {
            reason: "the response body is not JSON".to_string(),
        };
    };
    classify_json(json, spec)
}

/// What a callback wait makes of the JSON body of a callback to its URL
/// (docs/design.md §2.15): what its state path and conditions make of it, as of a
/// response with HTTP 200 carrying it.
pub fn callback_observation(
    spec: &Spec,
    body: &Value,
    headers: &BTreeMap<String, String>,
) -> Observation {
    let base = match &spec.state {
        Some(_) => classify_json(body, spec),
        None => Observation::Answered { status: 200 },
    };
    if spec.success_condition.is_none() && spec.failure_condition.is_none() {
        return base;
    }
    judge(spec, 200, headers, Some(body), base)
}

/// A JSON body: the state at the spec's path, or why there is none.
fn classify_json(json: &Value, spec: &Spec) -> Observation {
    let Some(state) = &spec.state else {
        return Observation::Missing {
            reason: "the wait has no state path".to_string(),
        };
    };
    let path = state.as_str();
    let mut budget = Budget::default();
    let over = |which: &str, p: &str, e: Exceeded| Observation::Permanent {
        error: format!("the {which} path {p} could not be evaluated on this response: {e}"),
    };
    match state.state_values(json, &mut budget) {
        Err(e) => over("state", path, e),
        Ok(Selected::Values(values)) => {
            let failed = values.iter().any(|v| spec.set_contains(&spec.fail, v));
            let detail = match &spec.error {
                Some(p) if failed => match p.detail(json, &mut budget) {
                    Ok(d) => d,
                    Err(e) => return over("error", p.as_str(), e),
                },
                _ => None,
            };
            Observation::State { values, detail }
        }
        Ok(Selected::Nothing) => Observation::Missing {
            reason: format!("the response has no value at {path}"),
        },
        Ok(Selected::OnlyNull) => Observation::Missing {
            reason: format!("the value at {path} is null"),
        },
    }
}

/// Header names in lower case (as `http` keeps them), repeated ones joined with ", ";
/// a value that is not UTF-8 is read lossily.
pub fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        out.entry(name.as_str().to_string())
            .and_modify(|v| {
                v.push_str(", ");
                v.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    out
}

/// What a wait made of the last response it read, under a 64-bit hash of what
/// it can see of it (the status, the body's bytes, the headers its conditions
/// read): the state read from the body, when that was one short value, and what
/// the conditions decided. Both are pure functions of it, so the next response
/// with the same hash is read without parsing, converting or evaluating
/// anything: most polls of a wait see an unchanged resource. (The hash is not
/// cryptographic; a target that wanted an earlier reading could as well send the
/// earlier body, so only accidental collisions matter, one in 2^64.) Evaluations
/// that fail are not kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Memo {
    pub(super) key: u64,
    /// `(failure, success)`, when the wait's conditions read neither `now` nor
    /// `elapsed`.
    verdict: Option<(bool, Option<bool>)>,
    /// The state, kept in the memo itself: a held wait's memory stays flat.
    state: Option<Short>,
    /// The last response's verdict was this memo's, not evaluated.
    reused: bool,
}

impl Memo {
    /// Whether the last response was decided as the one before it.
    pub fn reused(&self) -> bool {
        self.reused
    }

    /// Whether the memo holds what the wait's conditions decided (not only its
    /// state).
    pub fn judged(&self) -> bool {
        self.verdict.is_some()
    }

    /// The key a response is kept under: a hash of its status, its body's bytes
    /// and the headers the conditions read.
    pub fn key_of(status: u16, body: &[u8], headers: &BTreeMap<String, String>) -> u64 {
        use std::hash::BuildHasher;
        static SEED: std::sync::LazyLock<foldhash::fast::RandomState> =
            std::sync::LazyLock::new(foldhash::fast::RandomState::default);
        SEED.hash_one((status, body, headers))
    }
}

/// A state of one value of at most [`Short::MAX`] bytes with no error detail,
/// the common case (`"on"`, `"ACTIVE"`, `"CREATE_COMPLETE"`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Short {
    len: u8,
    bytes: [u8; Short::MAX],
}

impl Short {
    const MAX: usize = 15;

    fn of(obs: &Observation) -> Option<Short> {
        let Observation::State {
            values,
            detail: None,
        } = obs
        else {
            return None;
        };
        let [value] = values.as_slice() else {
            return None;
        };
        let mut bytes = [0; Short::MAX];
        bytes
            .get_mut(..value.len())?
            .copy_from_slice(value.as_bytes());
        Some(Short {
            len: value.len() as u8,
            bytes,
        })
    }

    fn observation(&self) -> Option<Observation> {
        let value = std::str::from_utf8(self.bytes.get(..usize::from(self.len))?).ok()?;
        Some(Observation::State {
            values: vec![value.to_owned()],
            detail: None,
        })
    }
}

/// Evaluates the wait's conditions on a response: [`Observation::Judged`], or why
/// they could not be (an error is a missing state, retried; the budget is
/// permanent, as for paths).
pub fn judge(
    spec: &Spec,
    status: u16,
    headers: &BTreeMap<String, String>,
    body: Option<&Value>,
    base: Observation,
) -> Observation {
    judge_took(spec, status, headers, body, base, None)
}

/// [`judge`], with `elapsed`, how long the response took, for the conditions
/// that read it.
pub fn judge_took(
    spec: &Spec,
    status: u16,
    headers: &BTreeMap<String, String>,
    body: Option<&Value>,
    base: Observation,
    elapsed: Option<std::time::Duration>,
) -> Observation {
    // `state` is what the state path yields: one value, the list a JSONPath
    // selects, or the status for `@status`.
    let conditions = spec.conditions();
    let reads_state = conditions.iter().any(|c| c.reads_state());
    let state: Option<Value> = match (&spec.state, body) {
        _ if !reads_state => None,
        (Some(ValuePath::HttpStatus), _) => Some(Value::from(status)),
        (Some(ValuePath::Query { .. }), Some(body)) => spec
            .state
            .as_ref()
            .and_then(|p| p.select(body, &mut Budget::default()).ok())
            .map(|nodes| Value::Array(nodes.into_iter().cloned().collect())),
        (Some(p), Some(body)) => p
            .select(body, &mut Budget::default())
            .ok()
            .and_then(|nodes| nodes.into_iter().next().cloned()),
        _ => None,
    };
    // `now` is the time of this poll: the engine is given it, never reads a clock.
    let mut vars =
        condition::Vars::for_conditions(&conditions, body, status, headers, state.as_ref())
            .at(chrono::Utc::now());
    if let Some(elapsed) = elapsed {
        vars = vars.took(elapsed);
    }
    decide(spec, &vars, status, base)
}

/// The wait's conditions evaluated on `vars`, under one budget: the failure
/// condition first, then the success condition.
pub(super) fn decide(
    spec: &Spec,
    vars: &condition::Vars<'_>,
    status: u16,
    base: Observation,
) -> Observation {
    let mut budget = condition::Budget::default();
    let mut run =
        |name: &str, c: &Option<condition::Condition>| -> Result<Option<bool>, Observation> {
            let Some(c) = c else { return Ok(None) };
            match c.evaluate(vars, &mut budget) {
                Ok(b) => Ok(Some(b)),
                Err(condition::Failure::Error(e)) => Err(Observation::Missing {
                    reason: format!("the {name} could not be evaluated on this response: {e}"),
                }),
                Err(f @ condition::Failure::Budget) => Err(Observation::Permanent {
                    error: format!("the {name} could not be evaluated on this response: {f}"),
                }),
            }
        };
    let failure = match run("failure_condition", &spec.failure_condition) {
        Ok(f) => f.unwrap_or(false),
        Err(obs) => return obs,
    };
    let success = if failure {
        None
    } else {
        match run("success_condition", &spec.success_condition) {
            Ok(s) => s,
            Err(obs) => return obs,
        }
    };
    Observation::Judged {
        status,
        failure,
        success,
        base: Box::new(base),
    }
}
