//! The JSONPath evaluator: a query's nodes in a document, every node touched and
//! every value produced charged to a [`Budget`].

use super::*;

/// The nodes `q` selects from `root`, in order.
pub(super) fn select<'a>(
    q: &Query,
    root: &'a Value,
    budget: &mut Budget,
) -> Result<Vec<&'a Value>, Exceeded> {
    crate::engine::pattern::begin_evaluation();
    let mut cx = Eval { root, budget };
    cx.query(q, root)
}

/// The result of a function: a value (or nothing), or a truth value. (No
/// standard function returns nodes.)
enum Out<'a> {
    Value(Option<std::borrow::Cow<'a, Value>>),
    Logical(bool),
}

struct Eval<'a, 'b> {
    root: &'a Value,
    budget: &'b mut Budget,
}

impl<'a> Eval<'a, '_> {
    fn query(&mut self, q: &Query, current: &'a Value) -> Result<Vec<&'a Value>, Exceeded> {
        let start = if q.relative { current } else { self.root };
        self.budget.nodes(1)?;
        let mut nodes = vec![start];
        for seg in &q.segments {
            let mut next = Vec::new();
            for node in nodes {
                if seg.descendant {
                    self.descend(seg, node, &mut next)?;
                } else {
                    self.apply(&seg.selectors, node, &mut next)?;
                }
            }
            nodes = next;
        }
        Ok(nodes)
    }

    /// The selectors applied to `node` and then to every descendant, in document order.
    /// It recurses once per level of the document, not of the query: documents come
    /// from `serde_json`, which refuses JSON nested deeper than 128.
    fn descend(
        &mut self,
        seg: &Segment,
        node: &'a Value,
        out: &mut Vec<&'a Value>,
    ) -> Result<(), Exceeded> {
        self.apply(&seg.selectors, node, out)?;
        match node {
            Value::Array(items) => {
                for v in items {
                    self.budget.nodes(1)?;
                    self.descend(seg, v, out)?;
                }
            }
            Value::Object(map) => {
                for v in map.values() {
                    self.budget.nodes(1)?;
                    self.descend(seg, v, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn push(&mut self, out: &mut Vec<&'a Value>, v: &'a Value) -> Result<(), Exceeded> {
        self.budget.nodes(1)?;
        out.push(v);
        Ok(())
    }

    fn apply(
        &mut self,
        selectors: &[Selector],
        node: &'a Value,
        out: &mut Vec<&'a Value>,
    ) -> Result<(), Exceeded> {
        for sel in selectors {
            match sel {
                Selector::Name(name) => {
                    if let Some(v) = node.as_object().and_then(|m| m.get(name)) {
                        self.push(out, v)?;
                    }
                }
                Selector::Wildcard => match node {
                    Value::Array(items) => {
                        for v in items {
                            self.push(out, v)?;
                        }
                    }
                    Value::Object(map) => {
                        for v in map.values() {
                            self.push(out, v)?;
                        }
                    }
                    _ => {}
                },
                Selector::Index(i) => {
                    if let Some(items) = node.as_array() {
                        let len = items.len() as i64;
                        let at = if *i < 0 { len + i } else { *i };
                        if (0..len).contains(&at) {
                            self.push(out, &items[at as usize])?;
                        }
                    }
                }
                Selector::Slice { start, end, step } => {
                    if let Some(items) = node.as_array() {
                        for at in slice_indices(items.len() as i64, *start, *end, *step) {
                            self.push(out, &items[at as usize])?;
                        }
                    }
                }
                Selector::Filter(f) => {
                    let children: Vec<&'a Value> = match node {
                        Value::Array(items) => items.iter().collect(),
                        Value::Object(map) => map.values().collect(),
                        _ => Vec::new(),
                    };
                    for child in children {
                        self.budget.nodes(1)?;
                        if self.test(f, child)? {
                            self.push(out, child)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn test(&mut self, f: &Logical, current: &'a Value) -> Result<bool, Exceeded> {
        Ok(match f {
            Logical::Or(fs) => {
                for f in fs {
                    if self.test(f, current)? {
                        return Ok(true);
                    }
                }
                false
            }
            Logical::And(fs) => {
                for f in fs {
                    if !self.test(f, current)? {
                        return Ok(false);
                    }
                }
                true
            }
            Logical::Not(f) => !self.test(f, current)?,
            Logical::Exists(q) => !self.query(q, current)?.is_empty(),
            Logical::Call(c) => match self.call(c, current)? {
                Out::Logical(b) => b,
                Out::Value(_) => false,
            },
            Logical::Compare(l, op, r) => {
                let l = self.comparable(l, current)?;
                let r = self.comparable(r, current)?;
                compare(l.as_deref(), *op, r.as_deref(), self.budget)?
            }
        })
    }

    fn comparable(
        &mut self,
        c: &Comparable,
        current: &'a Value,
    ) -> Result<Option<std::borrow::Cow<'a, Value>>, Exceeded> {
        Ok(match c {
            Comparable::Literal(v) => Some(std::borrow::Cow::Owned(v.clone())),
            Comparable::Query(q) => self
                .query(q, current)?
                .first()
                .map(|v| std::borrow::Cow::Borrowed(*v)),
            Comparable::Call(call) => match self.call(call, current)? {
                Out::Value(v) => v,
                _ => None,
            },
        })
    }

    fn value_arg(
        &mut self,
        arg: &Arg,
        current: &'a Value,
    ) -> Result<Option<std::borrow::Cow<'a, Value>>, Exceeded> {
        Ok(match arg {
            Arg::Literal(v) => Some(std::borrow::Cow::Owned(v.clone())),
            Arg::Query(q) => self
                .query(q, current)?
                .first()
                .map(|v| std::borrow::Cow::Borrowed(*v)),
            Arg::Call(c) => match self.call(c, current)? {
                Out::Value(v) => v,
                _ => None,
            },
            Arg::Logical(_) => None,
        })
    }

    fn nodes_arg(&mut self, arg: &Arg, current: &'a Value) -> Result<Vec<&'a Value>, Exceeded> {
        Ok(match arg {
            Arg::Query(q) => self.query(q, current)?,
            // Type checking lets only queries through (no function returns nodes).
            _ => Vec::new(),
        })
    }

    fn call(&mut self, c: &Call, current: &'a Value) -> Result<Out<'a>, Exceeded> {
        Ok(match c.func {
            Func::Length => {
                let v = self.value_arg(&c.args[0], current)?;
                if let Some(Value::String(s)) = v.as_deref() {
                    // Counting characters reads the whole string.
                    self.budget.nodes(s.len() as u64 / 1024)?;
                }
                Out::Value(
                    match v.as_deref() {
                        Some(Value::String(s)) => Some(s.chars().count()),
                        Some(Value::Array(a)) => Some(a.len()),
                        Some(Value::Object(o)) => Some(o.len()),
                        _ => None,
                    }
                    .map(|n| std::borrow::Cow::Owned(Value::from(n))),
                )
            }
            Func::Count => {
                let n = self.nodes_arg(&c.args[0], current)?.len();
                Out::Value(Some(std::borrow::Cow::Owned(Value::from(n))))
            }
            Func::Value => {
                let nodes = self.nodes_arg(&c.args[0], current)?;
                Out::Value(match nodes.as_slice() {
                    [one] => Some(std::borrow::Cow::Borrowed(*one)),
                    _ => None,
                })
            }
            Func::Match | Func::Search => {
                let s = self.value_arg(&c.args[0], current)?;
                let r = self.value_arg(&c.args[1], current)?;
                let (Some(Value::String(s)), Some(Value::String(r))) = (s.as_deref(), r.as_deref())
                else {
                    return Ok(Out::Logical(false));
                };
                // Patterns may come from the document, one per node: each is
                // compiled once into the bounded cache of `pattern`, and the
                // compile and the scan are charged (a node for each ten of its
                // units, the conditions' budget being ten times this one).
                let pattern = if c.func == Func::Match {
                    format!("(?R)^({r})$")
                } else {
                    format!("(?R)({r})")
                };
                use crate::engine::pattern;
                self.budget.nodes(1 + pattern::read_units(&pattern) / 10)?;
                let found = match pattern::cached(&pattern) {
                    Some(found) => found,
                    None => {
                        // A compile starts only when the budget can pay its worst.
                        if self.budget.nodes < 1 + pattern::worst_compile_units(&pattern) / 10 {
                            return Err(Exceeded::Nodes);
                        }
                        let (found, units) = pattern::compile_cached(&pattern);
                        self.budget.nodes(1 + units / 10)?;
                        found
                    }
                };
                // An invalid pattern matches nothing (RFC 9535 §2.4.6).
                let Ok(compiled) = found else {
                    return Ok(Out::Logical(false));
                };
                self.budget.nodes(1 + compiled.search_units(s.len()) / 10)?;
                Out::Logical(compiled.is_match(s))
            }
        })
    }
}

/// The indices a slice selects, in order (RFC 9535 §2.3.4.2.2).
fn slice_indices(len: i64, start: Option<i64>, end: Option<i64>, step: Option<i64>) -> Vec<i64> {
    let step = step.unwrap_or(1);
    if step == 0 {
        return Vec::new();
    }
    let norm = |i: i64| if i >= 0 { i } else { len + i };
    let mut out = Vec::new();
    if step > 0 {
        let start = norm(start.unwrap_or(0));
        let end = norm(end.unwrap_or(len));
        let lower = start.clamp(0, len);
        let upper = end.clamp(0, len);
        let mut i = lower;
        while i < upper {
            out.push(i);
            i = i.saturating_add(step);
        }
    } else {
        let start = norm(start.unwrap_or(len - 1));
        let end = norm(end.unwrap_or(-len - 1));
        let upper = start.clamp(-1, len - 1);
        let lower = end.clamp(-1, len - 1);
        let mut i = upper;
        while lower < i {
            out.push(i);
            i = i.saturating_add(step);
        }
    }
    out
}

/// Comparing is charged like reading, since a filter compares once per node it
/// tests and the values compared may be large: a string a node per KiB (as `match`
/// charges its subject), an array or object a node per entry. Scalars cost nothing
/// more than the query that found them.
fn compare(
    l: Option<&Value>,
    op: Op,
    r: Option<&Value>,
    budget: &mut Budget,
) -> Result<bool, Exceeded> {
    Ok(match op {
        Op::Eq => equal(l, r, budget)?,
        Op::Ne => !equal(l, r, budget)?,
        Op::Lt => less(l, r, budget)?,
        Op::Le => less(l, r, budget)? || equal(l, r, budget)?,
        Op::Gt => less(r, l, budget)?,
        Op::Ge => less(r, l, budget)? || equal(l, r, budget)?,
    })
}

fn equal(l: Option<&Value>, r: Option<&Value>, budget: &mut Budget) -> Result<bool, Exceeded> {
    Ok(match (l, r) {
        (None, None) => true,
        (Some(a), Some(b)) => json_eq(a, b, budget)?,
        _ => false,
    })
}

/// Recurses once per level of the values, which come from the document (nested at
/// most 128 deep, as `serde_json` reads it) or are literals (never nested).
fn json_eq(a: &Value, b: &Value, budget: &mut Budget) -> Result<bool, Exceeded> {
    Ok(match (a, b) {
        (Value::Number(x), Value::Number(y)) => num_eq(x, y),
        (Value::String(x), Value::String(y)) => {
            budget.nodes(x.len().min(y.len()) as u64 / 1024)?;
            x == y
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (a, b) in x.iter().zip(y) {
                budget.nodes(1)?;
                if !json_eq(a, b, budget)? {
                    return Ok(false);
                }
            }
            true
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (k, v) in x {
                budget.nodes(1)?;
                match y.get(k) {
                    Some(w) if json_eq(v, w, budget)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        _ => a == b,
    })
}

fn num_eq(x: &Number, y: &Number) -> bool {
    match (x.as_i64(), y.as_i64()) {
        (Some(a), Some(b)) => a == b,
        _ => match (x.as_u64(), y.as_u64()) {
            (Some(a), Some(b)) => a == b,
            _ => x.as_f64() == y.as_f64(),
        },
    }
}

fn less(l: Option<&Value>, r: Option<&Value>, budget: &mut Budget) -> Result<bool, Exceeded> {
    Ok(match (l, r) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => match (x.as_i64(), y.as_i64()) {
            (Some(a), Some(b)) => a < b,
            _ => match (x.as_f64(), y.as_f64()) {
                (Some(a), Some(b)) => a < b,
                _ => false,
            },
        },
        (Some(Value::String(x)), Some(Value::String(y))) => {
            budget.nodes(x.len().min(y.len()) as u64 / 1024)?;
            x < y
        }
        _ => false,
    })
}
