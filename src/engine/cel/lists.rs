//! Kubernetes' list library (`isSorted`, `sum`, `min`, `max`; `indexOf` and
//! `lastIndexOf` are in [`super::strings`], which takes both), `min` and `max` as
//! global functions of a list, and the lists extension's `distinct`, which
//! compares every pair and so is charged a unit a comparison.
//!
//! Pure: no I/O, no clock.

use std::cmp::Ordering;

use cel::common::types::{CelBool, CelDouble, CelDuration, CelInt, CelUInt};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError};

use super::{charge, declare, owned_list, take, wrong_type};

pub(super) fn declare_all(env: &mut Env) {
    declare(env, "isSorted", true, 1, is_sorted);
    declare(env, "sum", true, 1, sum);
    declare(env, "min", true, 1, min);
    declare(env, "max", true, 1, max);
    declare(env, "min", false, 1, min);
    declare(env, "max", false, 1, max);
    declare(env, "distinct", true, 1, distinct);
}

/// The elements of `v`, a list, borrowed.
fn elements<'a, 'v>(
    function: &str,
    v: &'a (dyn Val + 'v),
) -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
    let list = v
        .as_iterable()
        .ok_or_else(|| wrong_type(function, v, "a list"))?;
    let mut items = list.iter();
    let mut out = Vec::new();
    while let Some(item) = items.next() {
        out.push(item);
    }
    Ok(out)
}

fn compare(function: &str, a: &dyn Val, b: &dyn Val) -> Result<Ordering, ExecutionError> {
    if a.get_type() != b.get_type() {
        return Err(ExecutionError::function_error(
            function,
            format!(
                "the list mixes {} and {}; its elements must be of one type",
                a.get_type().name(),
                b.get_type().name()
            ),
        ));
    }
    a.as_comparer()
        .ok_or_else(|| {
            ExecutionError::function_error(
                function,
                format!("{} values have no order", a.get_type().name()),
            )
        })?
        .compare(b)
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements("isSorted", &*list)?;
    for pair in items.windows(2) {
        if compare("isSorted", pair[0], pair[1])? == Ordering::Greater {
            return Ok(CowVal::Owned(Box::new(CelBool::from(false))));
        }
    }
    Ok(CowVal::Owned(Box::new(CelBool::from(true))))
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "min", Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme(args, "max", Ordering::Greater)
}

/// The element that orders `keep` against every other (the first of equals);
/// a value that is not a list is its own extreme (`max(3)` is 3).
fn extreme<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    function: &str,
    keep: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    if list.as_iterable().is_none() {
        return match list.as_comparer() {
            Some(_) => Ok(list),
            None => Err(wrong_type(function, &*list, "a list, or values that order")),
        };
    }
    let items = elements(function, &*list)?;
    let Some((&first, rest)) = items.split_first() else {
        return Err(ExecutionError::function_error(
            function,
            "the list is empty, and an empty list has none",
        ));
    };
    let mut best = first;
    for &item in rest {
        if compare(function, item, best)? == keep {
            best = item;
        }
    }
    Ok(CowVal::Owned(best.clone_as_boxed()))
}

/// The sum of a list of ints, uints, doubles or durations (0 when empty), an
/// error on overflow.
fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements("sum", &*list)?;
    let overflow = || ExecutionError::function_error("sum", "the sum overflows");
    let Some(first) = items.first() else {
        return Ok(CowVal::Owned(Box::new(CelInt::from(0))));
    };
    if let Some(other) = items.iter().find(|v| v.get_type() != first.get_type()) {
        return Err(ExecutionError::function_error(
            "sum",
            format!(
                "the list mixes {} and {}; its elements must be of one type",
                first.get_type().name(),
                other.get_type().name()
            ),
        ));
    }
    let total: Box<dyn Val> = if first.downcast_ref::<CelInt>().is_some() {
        let mut t: i64 = 0;
        for v in &items {
            let i = *v.downcast_ref::<CelInt>().ok_or_else(overflow)?.inner();
            t = t.checked_add(i).ok_or_else(overflow)?;
        }
        Box::new(CelInt::from(t))
    } else if first.downcast_ref::<CelUInt>().is_some() {
        let mut t: u64 = 0;
        for v in &items {
            let u = *v.downcast_ref::<CelUInt>().ok_or_else(overflow)?.inner();
            t = t.checked_add(u).ok_or_else(overflow)?;
        }
        Box::new(CelUInt::from(t))
    } else if first.downcast_ref::<CelDouble>().is_some() {
        let mut t = 0.0;
        for v in &items {
            t += *v.downcast_ref::<CelDouble>().ok_or_else(overflow)?.inner();
        }
        Box::new(CelDouble::from(t))
    } else if first.downcast_ref::<CelDuration>().is_some() {
        let mut t = chrono::Duration::zero();
        for v in &items {
            let d = v
                .downcast_ref::<CelDuration>()
                .ok_or_else(overflow)?
                .inner();
            t = t.checked_add(d).ok_or_else(overflow)?;
        }
        Box::new(CelDuration::from(t))
    } else {
        return Err(wrong_type(
            "sum",
            *first,
            "a list of ints, uints, doubles or durations",
        ));
    };
    Ok(CowVal::Owned(total))
}

/// The first of each set of equal elements, in order (CEL's equality, so `1`,
/// `1u` and `1.0` are one element); a unit a comparison.
fn distinct<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    let items = elements("distinct", &*list)?;
    let mut unique: Vec<&(dyn Val + 'v)> = Vec::new();
    for item in items {
        charge(unique.len() as u64 + 1)?;
        if !unique.iter().any(|seen| item.equals(*seen)) {
            unique.push(item);
        }
    }
    Ok(owned_list(
        unique.into_iter().map(|v| v.clone_as_boxed()).collect(),
    ))
}
