//! The variables a condition is evaluated on: one response's (or observation's)
//! `body`, `status`, `headers`, `state`, `now` and `elapsed`, converted once for
//! both conditions, and of the body only the fields the conditions read.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use cel::Context;
use cel::common::types::{
    CelBool, CelDuration, CelInt, CelList, CelMap, CelMapKey, CelNull, CelString, CelTimestamp,
};
use cel::common::value::Val;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::reads::{Fields, Reads};
use super::{Condition, Field, json};

/// The variables of one response, converted once for both conditions. Strings are
/// borrowed from the parsed body, not copied.
pub struct Vars<'v> {
    pub(super) context: Context<'v, 'v>,
}

impl<'v> Vars<'v> {
    /// Every variable, whole.
    pub fn new(
        body: Option<&'v Value>,
        status: u16,
        headers: &'v BTreeMap<String, String>,
        state: Option<&'v Value>,
    ) -> Vars<'v> {
        Vars::build(None, body, status, headers, state)
    }

    /// The variables as `conditions` read them: of the body only the fields they
    /// name (a field selected on a node is all that is read of it, unless the node
    /// is itself used), and `headers` and `state` only if they name them. What an
    /// expression can observe is the same; what is converted per response is less.
    pub fn for_conditions(
        conditions: &[&Condition],
        body: Option<&'v Value>,
        status: u16,
        headers: &'v BTreeMap<String, String>,
        state: Option<&'v Value>,
    ) -> Vars<'v> {
        Vars::build(Some(conditions), body, status, headers, state)
    }

    fn build(
        conditions: Option<&[&Condition]>,
        body: Option<&'v Value>,
        status: u16,
        headers: &'v BTreeMap<String, String>,
        state: Option<&'v Value>,
    ) -> Vars<'v> {
        let reads: Option<Vec<&Reads>> =
            conditions.map(|cs| cs.iter().map(|c| &c.expr.reads).collect());
        let any = |f: fn(&Reads) -> bool| reads.as_ref().is_none_or(|r| r.iter().any(|x| f(x)));
        let mut context = Context::with_env(Arc::clone(&crate::engine::cel::ENV));
        let body: Box<dyn Val + 'v> = match (body, &reads) {
            (None, _) => Box::new(CelNull),
            (Some(b), None) => json(b),
            (Some(b), Some(r)) => {
                let fields: Vec<&Fields> = r.iter().map(|x| &x.body).collect();
                pruned(b, &fields)
            }
        };
        context.add_variable_as_val("body", body);
        context.add_variable_as_val("status", Box::new(CelInt::from(i64::from(status))));
        let headers: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = if any(|r| r.headers) {
            headers
                .iter()
                .map(|(k, v)| {
                    (
                        CelMapKey::from(k.as_str()),
                        Box::new(CelString::from(v.as_str())) as Box<dyn Val>,
                    )
                })
                .collect()
        } else {
            HashMap::new()
        };
        context.add_variable_as_val("headers", Box::new(CelMap::from(headers)));
        let state = match state {
            Some(v) if any(|r| r.state) => json(v),
            _ => Box::new(CelNull),
        };
        context.add_variable_as_val("state", state);
        context.add_variable_as_val("tcp", Box::new(CelNull));
        context.add_variable_as_val("tls", Box::new(CelNull));
        context.add_variable_as_val("grpc", Box::new(CelNull));
        context.add_variable_as_val("dns", Box::new(CelNull));
        Vars { context }
    }

    /// The variables with `now`, the time of the poll (without it, an expression
    /// that names `now` fails to evaluate).
    pub fn at(mut self, now: DateTime<Utc>) -> Vars<'v> {
        self.context
            .add_variable_as_val("now", Box::new(CelTimestamp::from(now.fixed_offset())));
        self
    }

    /// The variables with the observation of a target kind, a map named after
    /// it (`tcp`), in place of `null`.
    pub fn observed(mut self, kind: &'static str, fields: &[(&'static str, Field)]) -> Vars<'v> {
        let map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = fields
            .iter()
            .map(|(name, value)| {
                let value: Box<dyn Val + 'v> = match value {
                    Field::Bool(b) => Box::new(CelBool::from(*b)),
                    Field::Int(i) => Box::new(CelInt::from(*i)),
                    Field::Text(t) => Box::new(CelString::from(t.clone())),
                    Field::Duration(d) => Box::new(CelDuration::from(
                        chrono::Duration::from_std(*d).unwrap_or(chrono::Duration::MAX),
                    )),
                    Field::Timestamp(t) => Box::new(CelTimestamp::from(t.fixed_offset())),
                    Field::List(items) => Box::new(CelList::from(
                        items
                            .iter()
                            .map(|i| Box::new(CelString::from(i.clone())) as Box<dyn Val + 'v>)
                            .collect::<Vec<_>>(),
                    )),
                    Field::Null => Box::new(CelNull),
                };
                (CelMapKey::from(*name), value)
            })
            .collect();
        self.context
            .add_variable_as_val(kind, Box::new(CelMap::from(map)));
        self
    }

    /// The variables with `elapsed`, how long the response took (without it, an
    /// expression that names `elapsed` fails to evaluate).
    pub fn took(mut self, elapsed: std::time::Duration) -> Vars<'v> {
        let elapsed = chrono::Duration::from_std(elapsed).unwrap_or(chrono::Duration::MAX);
        self.context
            .add_variable_as_val("elapsed", Box::new(CelDuration::from(elapsed)));
        self
    }
}

/// `v` as CEL sees it, keeping of an object only the fields some of `fields` name
/// (all of it where one uses the node whole, and any non-object as it is).
fn pruned<'v>(v: &'v Value, fields: &[&Fields]) -> Box<dyn Val + 'v> {
    let Value::Object(map) = v else {
        return json(v);
    };
    if fields.iter().any(|f| f.whole) {
        return json(v);
    }
    let mut out: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> = HashMap::new();
    let mut under: Vec<&Fields> = Vec::with_capacity(fields.len());
    for f in fields {
        for name in f.named.keys() {
            if out.contains_key(&CelMapKey::from(name.as_str())) {
                continue;
            }
            let Some((key, child)) = map.get_key_value(name.as_str()) else {
                continue;
            };
            under.clear();
            under.extend(fields.iter().filter_map(|g| g.named.get(name)));
            out.insert(CelMapKey::from(key.as_str()), pruned(child, &under));
        }
    }
    Box::new(CelMap::from(out))
}
