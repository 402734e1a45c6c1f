//! Regular expressions in conditions: `matches`, and Kubernetes' regex library
//! (`find`, `findAll`). Patterns are compiled by [`crate::engine::pattern`],
//! within its size bound and cache, and every compile and search is charged.
//!
//! Pure: no I/O, no clock.

use std::sync::Arc;

use cel::common::types::{CelBool, CelString};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError};

use super::{charge, declare, int_arg, left, owned_list, string_arg, string_units, take};
use crate::engine::pattern::{self, Compiled};

/// What `s.matches(p)` and `matches(s, p)` are rewritten to call.
pub(super) const MATCHES: &str = "@waitd_matches";

pub(super) fn declare_all(env: &mut Env) {
    declare(env, MATCHES, false, 2, matches);
    declare(env, "find", true, 2, find);
    declare(env, "findAll", true, 2, find_all);
    declare(env, "findAll", true, 3, find_all_n);
}

/// `pattern` from the cache or compiled, its compile charged; a compile starts
/// only when the budget can pay for the worst of it.
fn compiled(function: &str, pattern: &str) -> Result<Arc<Compiled>, ExecutionError> {
    charge(pattern::read_units(pattern))?;
    let found = match pattern::cached(pattern) {
        Some(found) => found,
        None => {
            if left() < pattern::worst_compile_units(pattern) {
                charge(u64::MAX)?;
            }
            let (found, units) = pattern::compile_cached(pattern);
            charge(units)?;
            found
        }
    };
    found.map_err(|refused| ExecutionError::function_error(function, &*refused.message))
}

/// The haystack and the compiled pattern of a call, the search charged.
fn searched<'a>(
    function: &str,
    s: &'a dyn Val,
    p: &dyn Val,
) -> Result<(&'a str, Arc<Compiled>), ExecutionError> {
    let s = string_arg(function, s)?;
    let compiled = compiled(function, string_arg(function, p)?)?;
    charge(compiled.search_units(s.len()))?;
    Ok((s, compiled))
}

fn matches<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, p] = take(args)?;
    let (s, compiled) = searched("matches", &*s, &*p)?;
    Ok(CowVal::Owned(Box::new(CelBool::from(compiled.is_match(s)))))
}

/// The first match, or the empty string.
fn find<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, p] = take(args)?;
    let (s, compiled) = searched("find", &*s, &*p)?;
    let found = compiled.find(s).map_or("", |r| &s[r]);
    charge(string_units(found.len()))?;
    Ok(CowVal::Owned(Box::new(CelString::from(found.to_owned()))))
}

fn find_all<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, p] = take(args)?;
    find_up_to(&*s, &*p, -1)
}

fn find_all_n<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, p, n] = take(args)?;
    find_up_to(&*s, &*p, int_arg("findAll", &*n)?)
}

/// The first `n` matches (all of them when `n` is negative), each charged as it
/// is found.
fn find_up_to<'b, 'v>(s: &dyn Val, p: &dyn Val, n: i64) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, compiled) = searched("findAll", s, p)?;
    let limit = usize::try_from(n).unwrap_or(usize::MAX);
    let mut found: Vec<Box<dyn Val>> = Vec::new();
    for r in compiled.find_iter(s).take(limit) {
        // A match is a value built: its bytes and a unit for the allocation.
        charge(1 + string_units(r.len()))?;
        found.push(Box::new(CelString::from(s[r].to_owned())));
    }
    Ok(owned_list(found))
}
