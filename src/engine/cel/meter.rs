//! The rewrite that makes an expression pay for its evaluation.
//!
//! cel-rust has no cost limit of its own, so [`meter`] rewrites a parsed
//! expression to call identity functions that charge the budget
//! ([`super::charge`]) before the work they guard. What is charged where is
//! described in `docs/conditions.md` ("The budget").
//!
//! Pure: no I/O, no clock.

use cel::common::ast::{ComprehensionExpr, EntryExpr, Expr, IdedExpr, ListExpr, operators};
use cel::common::types::CelString;
use cel::common::value::CowVal;
use cel::{Env, ExecutionError};

use super::{charge, charge_deep_of, declare as declare_fn, take};

/// Charges its argument's deep size: a value that is copied or compared whole.
const DEEP: &str = "@waitd_deep";
/// Charges its argument's deep size: a value a function reads.
const FLAT: &str = "@waitd_flat";
/// Charges a result's deep size once it is built (functions whose result is at
/// most a few times the size of what they read, which was charged already).
const OUT: &str = "@waitd_out";
/// Charges a `format` string's precisions (`%.1000000f` builds a million digits).
const FORMAT: &str = "@waitd_format";

pub(super) fn declare(env: &mut Env) {
    for name in [DEEP, FLAT, OUT] {
        declare_fn(env, name, false, 1, charge_value);
    }
    declare_fn(env, FORMAT, false, 1, charge_format);
}

/// The namespaces of the functions conditions may call.
const NAMESPACES: &[&str] = &["optional", "strings"];

/// Functions that charge their own work and result (see their modules).
const OWN: &[&str] = &[
    "replace",
    "split",
    "join",
    "indexOf",
    "lastIndexOf",
    "distinct",
    "min",
    "max",
    "sum",
    "isSorted",
    "find",
    "findAll",
];

/// Functions whose result can be larger than a value: charged once built.
const GROWS: &[&str] = &[
    "substring",
    "charAt",
    "lowerAscii",
    "upperAscii",
    "trim",
    "format",
    "strings.quote",
    "reverse",
    "slice",
    "flatten",
    "sort",
    "@sortByAssociatedKeys",
    "string",
    "bytes",
];

/// Rewrites `e` so that evaluating it charges the budget.
pub(in crate::engine) fn meter(e: &mut IdedExpr) {
    match &mut e.expr {
        Expr::Call(call) => {
            // `optional.of(x)`: a function in a namespace, called by its full name
            // (its namespace is no value to charge).
            if let Some(Expr::Ident(ns)) = call.target.as_deref().map(|t| &t.expr)
                && NAMESPACES.contains(&ns.as_str())
            {
                call.func_name = format!("{ns}.{}", call.func_name);
                call.target = None;
            }
            if call.func_name == "getMilliseconds" && call.target.is_some() && call.args.is_empty()
            {
                call.func_name = super::time::GET_MILLISECONDS.to_string();
            }
            let name = call.func_name.clone();
            // `max(a, b, c)` is `max([a, b, c])`, as Kubernetes' `[a, b, c].max()`.
            if (name == "max" || name == "min") && call.target.is_none() && call.args.len() > 1 {
                let elements = std::mem::take(&mut call.args);
                call.args = vec![IdedExpr {
                    id: e.id,
                    expr: Expr::List(ListExpr {
                        elements,
                        optional_indices: Vec::new(),
                    }),
                }];
            }
            if let Some(t) = call.target.as_deref_mut() {
                meter(t);
            }
            for a in &mut call.args {
                meter(a);
            }
            let meter_fn = match name.as_str() {
                // Short-circuits and cheap operators: bounded per node.
                operators::LOGICAL_AND
                | operators::LOGICAL_OR
                | operators::LOGICAL_NOT
                | operators::CONDITIONAL
                | operators::NOT_STRICTLY_FALSE
                | operators::INDEX
                | operators::OPT_INDEX
                | operators::OPT_SELECT
                | operators::NEGATE
                | "size"
                | "type"
                | "dyn"
                | "hasValue"
                | "value"
                | "or"
                | "orValue" => None,
                operators::EQUALS | operators::NOT_EQUALS | operators::IN | operators::ADD => {
                    Some(DEEP)
                }
                n if n.starts_with("@waitd_") => None,
                _ => Some(FLAT),
            };
            let Some(meter_fn) = meter_fn else { return };
            // `s.matches(p)` and `matches(s, p)` charge the pattern's compile and
            // the search themselves.
            if name == "matches" && usize::from(call.target.is_some()) + call.args.len() == 2 {
                if let Some(t) = call.target.take() {
                    call.args.insert(0, *t);
                }
                call.func_name = super::regex::MATCHES.to_string();
                return;
            }
            if let Some(t) = call.target.as_deref_mut() {
                wrap(t, meter_fn);
            }
            for a in &mut call.args {
                wrap(a, meter_fn);
            }
            if name == "format"
                && let Some(t) = call.target.as_deref_mut()
            {
                wrap(t, FORMAT);
            }
            if GROWS.contains(&name.as_str()) {
                wrap(e, OUT);
            }
            debug_assert!(!OWN.contains(&name.as_str()) || !GROWS.contains(&name.as_str()));
        }
        Expr::Comprehension(c) => {
            meter_comprehension(c);
        }
        // A literal holds its elements by value: building it copies each one.
        Expr::List(l) => {
            for e in &mut l.elements {
                meter(e);
                wrap(e, DEEP);
            }
        }
        Expr::Map(m) => {
            for entry in &mut m.entries {
                if let EntryExpr::MapEntry(me) = &mut entry.expr {
                    meter(&mut me.key);
                    meter(&mut me.value);
                    wrap(&mut me.value, DEEP);
                }
            }
        }
        Expr::Select(s) => meter(&mut s.operand),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Struct(_) | Expr::Unspecified => {}
    }
}

fn meter_comprehension(c: &mut ComprehensionExpr) {
    meter(&mut c.iter_range);
    wrap(&mut c.iter_range, DEEP);
    meter(&mut c.accu_init);
    meter(&mut c.loop_cond);
    meter(&mut c.result);
    // `@result + [e]` (map, filter): the interpreter appends in place when it sees
    // this shape, so the shape stays and the element is charged instead.
    let accu = c.accu_var.clone();
    let step = &mut c.loop_step;
    let append = |e: &mut IdedExpr| -> bool {
        if let Expr::Call(call) = &mut e.expr
            && call.func_name == operators::ADD
            && call.target.is_none()
            && let [lhs, rhs] = call.args.as_mut_slice()
            && matches!(&lhs.expr, Expr::Ident(n) if *n == accu)
            && let Expr::List(list) = &mut rhs.expr
        {
            for el in &mut list.elements {
                meter(el);
                wrap(el, DEEP);
            }
            return true;
        }
        false
    };
    if append(step) {
        return;
    }
    if let Expr::Call(call) = &mut step.expr
        && call.func_name == operators::CONDITIONAL
        && call.args.len() == 3
    {
        let (guard, rest) = call.args.split_at_mut(1);
        if append(&mut rest[0]) {
            meter(&mut guard[0]);
            meter(&mut rest[1]);
            return;
        }
    }
    meter(step);
}

/// `e` becomes `f(e)`; a literal, bounded by the expression's length, stays as it is.
fn wrap(e: &mut IdedExpr, f: &str) {
    if matches!(e.expr, Expr::Literal(_)) {
        return;
    }
    let inner = std::mem::take(e);
    *e = IdedExpr {
        id: inner.id,
        expr: Expr::Call(cel::common::ast::CallExpr {
            func_name: f.to_string(),
            target: None,
            args: vec![inner],
        }),
    };
}

fn charge_value<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [v] = take(args)?;
    charge_deep_of(&*v)?;
    Ok(v)
}

/// The sum of the precisions a format string asks for (`%.3f` asks for 3), in
/// units, and the string's own length.
fn charge_format<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [v] = take(args)?;
    if let Some(s) = v.downcast_ref::<CelString>() {
        charge(format_units(s.inner()))?;
    }
    Ok(v)
}

/// What the digits a format string's precisions ask for cost, at a unit per
/// 16 bytes; saturating, so that an absurd precision is past any budget.
pub(crate) fn format_units(format: &str) -> u64 {
    let bytes = format.as_bytes();
    let mut units: u64 = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && bytes.get(i + 1) == Some(&b'.') {
            let mut precision: u64 = 0;
            let mut j = i + 2;
            while let Some(d) = bytes.get(j).filter(|d| d.is_ascii_digit()) {
                precision = precision
                    .saturating_mul(10)
                    .saturating_add(u64::from(d - b'0'));
                j += 1;
            }
            units = units.saturating_add(1 + precision / super::BYTES_PER_UNIT);
            i = j;
        } else {
            i += 1;
        }
    }
    units
}
