//! The CEL environment conditions are evaluated in, and the budget its functions
//! charge.
//!
//! The environment is cel-rust's standard library (with timestamps and durations),
//! its strings and lists extensions, and what this module adds: the libraries
//! Kubernetes enables (lists: `isSorted`, `sum`, `min`, `max`, `indexOf`,
//! `lastIndexOf`; regex: `find`, `findAll`), `min`/`max` as global functions, and
//! the meters [`meter`] rewrites an expression to call.
//!
//! Every function here that does work growing with its input, or builds a value
//! larger than its input, charges the evaluation's budget first ([`charge`]). The
//! budget is thread-local: an evaluation runs on one thread from start to end
//! ([`start`], [`finish`]).
//!
//! Pure: no I/O, no clock.

mod chains;
pub(super) mod check;
mod lists;
pub(super) mod meter;
mod regex;
mod strings;
mod time;

use std::cell::Cell;
use std::sync::{Arc, LazyLock};

use cel::common::types::{CelBytes, CelList, CelMap, CelMapKey, CelString, DYN_TYPE};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError};

/// Bytes of a string that cost one unit.
pub const BYTES_PER_UNIT: u64 = 16;

/// The environment every condition is parsed and evaluated in.
pub(super) static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    // Ours first: a call takes the first overload that accepts its arguments,
    // so these, declared on `dyn`, stand in front of the extensions' own
    // versions of the same names, which build their result before anything
    // could charge for it.
    meter::declare(&mut env);
    strings::declare_all(&mut env);
    lists::declare_all(&mut env);
    regex::declare_all(&mut env);
    time::declare_all(&mut env);
    cel::extensions::strings(&mut env).expect("the strings extension is declared once");
    cel::extensions::lists(&mut env).expect("the lists extension is declared once");
    Arc::new(env)
});

thread_local! {
    /// Units left in the evaluation running on this thread.
    static LEFT: Cell<u64> = const { Cell::new(0) };
    /// The evaluation on this thread ran past its budget.
    static SPENT: Cell<bool> = const { Cell::new(false) };
}

/// Starts an evaluation on this thread with `units` to spend.
pub(super) fn start(units: u64) {
    crate::engine::pattern::begin_evaluation();
    LEFT.with(|l| l.set(units));
    SPENT.with(|s| s.set(false));
}

/// Ends the evaluation on this thread: the units left, or `None` when it ran past
/// its budget.
pub(super) fn finish() -> Option<u64> {
    let left = LEFT.with(Cell::get);
    (!SPENT.with(Cell::get)).then_some(left)
}

/// Units left in the evaluation on this thread.
pub(super) fn left() -> u64 {
    LEFT.with(Cell::get)
}

/// Takes `units` from the budget, or fails the evaluation when it has fewer left.
pub(super) fn charge(units: u64) -> Result<(), ExecutionError> {
    let left = LEFT.with(Cell::get);
    if units > left {
        LEFT.with(|l| l.set(0));
        SPENT.with(|s| s.set(true));
        return Err(ExecutionError::function_error(
            "budget",
            "the evaluation ran past its budget",
        ));
    }
    LEFT.with(|l| l.set(left - units));
    Ok(())
}

/// What a string of `len` bytes costs.
pub(super) fn string_units(len: usize) -> u64 {
    1 + len as u64 / BYTES_PER_UNIT
}

/// Bytes of a string or bytes value; 0 for anything else.
pub(super) fn flat_len(v: &dyn Val) -> u64 {
    if let Some(s) = v.downcast_ref::<CelString>() {
        s.inner().len() as u64
    } else if let Some(b) = v.downcast_ref::<CelBytes>() {
        b.inner().len() as u64
    } else {
        0
    }
}

/// The units of `v` (one a value, one per 16 bytes of string), counted up to a
/// little past `cap`, so that measuring costs no more than charging.
pub(super) fn deep_units(v: &dyn Val, cap: u64) -> u64 {
    let mut units = 0;
    deep_size(v, cap, &mut units);
    units
}

fn deep_size(v: &dyn Val, cap: u64, units: &mut u64) {
    *units += 1 + flat_len(v) / BYTES_PER_UNIT;
    if *units > cap {
        return;
    }
    if let Some(list) = v.downcast_ref::<CelList>() {
        for item in list.inner() {
            deep_size(&**item, cap, units);
            if *units > cap {
                return;
            }
        }
    } else if let Some(map) = v.downcast_ref::<CelMap>() {
        for (k, item) in map.inner() {
            if let CelMapKey::String(s) = k {
                *units += s.inner().len() as u64 / BYTES_PER_UNIT;
            }
            deep_size(&**item, cap, units);
            if *units > cap {
                return;
            }
        }
    }
}

/// Charges what `v` deeply holds.
pub(super) fn charge_deep_of(v: &dyn Val) -> Result<(), ExecutionError> {
    charge(deep_units(v, left().saturating_add(1)))
}

/// The arguments of a call, `N` of them, or the error CEL gives for a wrong count.
pub(super) fn take<'b, 'v, const N: usize>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<[CowVal<'b, 'v>; N], ExecutionError> {
    args.try_into()
        .map_err(|args: Vec<_>| ExecutionError::invalid_argument_count(N, args.len()))
}

/// `v` as a string, or the no-such-overload error of `function`.
pub(super) fn string_arg<'a>(function: &str, v: &'a dyn Val) -> Result<&'a str, ExecutionError> {
    v.downcast_ref::<CelString>()
        .map(|s| s.inner())
        .ok_or_else(|| wrong_type(function, v, "a string"))
}

/// `v` as an int, or the no-such-overload error of `function`.
pub(super) fn int_arg(function: &str, v: &dyn Val) -> Result<i64, ExecutionError> {
    v.downcast_ref::<cel::common::types::CelInt>()
        .map(|i| *i.inner())
        .ok_or_else(|| wrong_type(function, v, "an int"))
}

pub(super) fn wrong_type(function: &str, v: &dyn Val, want: &str) -> ExecutionError {
    ExecutionError::function_error(
        function,
        format!("expects {want}, not {}", v.get_type().name()),
    )
}

/// Declares `f` as `name` for `arity` arguments of any type (a member function
/// counts its target), ahead of any typed overload declared later.
pub(super) fn declare(
    env: &mut Env,
    name: &str,
    member: bool,
    arity: usize,
    f: cel::common::functions::Function,
) {
    let id = format!("waitd_{name}_{}{arity}", if member { "m" } else { "g" });
    let result = if member {
        env.add_member_overload(
            name,
            &id,
            DYN_TYPE,
            (1..arity).map(|_| DYN_TYPE).collect(),
            f,
        )
    } else {
        env.add_overload(name, &id, (0..arity).map(|_| DYN_TYPE).collect(), f)
    };
    result.expect("waitd's overloads are declared once");
}

/// A list of values, owned.
pub(super) fn owned_list<'b, 'v>(items: Vec<Box<dyn Val + 'v>>) -> CowVal<'b, 'v> {
    CowVal::Owned(Box::new(CelList::from(items)))
}
