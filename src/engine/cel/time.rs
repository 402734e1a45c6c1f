//! `getMilliseconds` as the specification has it: on a duration, the
//! milliseconds past its whole seconds (cel-rust gives the whole duration in
//! milliseconds), and on a timestamp, the milliseconds past its second. The
//! other accessors are cel-rust's own.
//!
//! Pure: no I/O, no clock.

use cel::common::types::{CelDuration, CelInt, CelTimestamp};
use cel::common::value::CowVal;
use cel::{Env, ExecutionError};

use super::{declare, take, wrong_type};

/// What `x.getMilliseconds()` is rewritten to call ([`super::meter`]): the
/// standard library's own overload, declared first, would otherwise be taken.
pub(super) const GET_MILLISECONDS: &str = "@waitd_getMilliseconds";

pub(super) fn declare_all(env: &mut Env) {
    declare(env, GET_MILLISECONDS, true, 1, get_milliseconds);
}

fn get_milliseconds<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [v] = take(args)?;
    let millis = if let Some(d) = v.downcast_ref::<CelDuration>() {
        d.inner().subsec_nanos() as i64 / 1_000_000
    } else if let Some(t) = v.downcast_ref::<CelTimestamp>() {
        i64::from(t.inner().timestamp_subsec_millis())
    } else {
        return Err(wrong_type(
            "getMilliseconds",
            &*v,
            "a timestamp or a duration",
        ));
    };
    Ok(CowVal::Owned(Box::new(CelInt::from(millis))))
}
