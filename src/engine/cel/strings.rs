//! The strings extension's functions whose work or result a stranger's input
//! could grow past what reading their arguments cost: `replace`, `split`, `join`,
//! `indexOf` and `lastIndexOf` (on strings and on lists). Each charges its result
//! before it builds it, and searches in time linear in the haystack. The rest of
//! the extension is cel-rust's own (`cel::extensions::strings`).
//!
//! Indices are in code points, as everywhere in CEL.
//!
//! Pure: no I/O, no clock.

use cel::common::types::{CelInt, CelString};
use cel::common::value::{CowVal, Val};
use cel::{Env, ExecutionError};

use super::{charge, declare, int_arg, owned_list, string_arg, string_units, take, wrong_type};

pub(super) fn declare_all(env: &mut Env) {
    declare(env, "replace", true, 3, replace);
    declare(env, "replace", true, 4, replace_n);
    declare(env, "split", true, 2, split);
    declare(env, "split", true, 3, split_n);
    declare(env, "join", true, 1, join);
    declare(env, "join", true, 2, join_sep);
    declare(env, "indexOf", true, 2, index_of);
    declare(env, "indexOf", true, 3, index_of_offset);
    declare(env, "lastIndexOf", true, 2, last_index_of);
    declare(env, "lastIndexOf", true, 3, last_index_of_offset);
}

fn out_of_range(function: &str, idx: i64) -> ExecutionError {
    ExecutionError::function_error(function, format!("index out of range: {idx}"))
}

fn string<'b, 'v>(s: String) -> CowVal<'b, 'v> {
    CowVal::Owned(Box::new(CelString::from(s)))
}

fn int<'b, 'v>(i: i64) -> CowVal<'b, 'v> {
    CowVal::Owned(Box::new(CelInt::from(i)))
}

fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, from, to] = take(args)?;
    replace_up_to(&*s, &*from, &*to, -1)
}

fn replace_n<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, from, to, n] = take(args)?;
    replace_up_to(&*s, &*from, &*to, int_arg("replace", &*n)?)
}

/// The first `n` occurrences of `from` replaced (all of them when `n` is
/// negative), the result charged before it is built.
fn replace_up_to<'b, 'v>(
    s: &dyn Val,
    from: &dyn Val,
    to: &dyn Val,
    n: i64,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, from, to) = (
        string_arg("replace", s)?,
        string_arg("replace", from)?,
        string_arg("replace", to)?,
    );
    let limit = usize::try_from(n).unwrap_or(usize::MAX);
    let count = s.matches(from).take(limit).count();
    let len = s.len() - count * from.len() + count.saturating_mul(to.len());
    charge(string_units(len))?;
    Ok(string(s.replacen(from, to, limit)))
}

fn split<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, sep] = take(args)?;
    split_up_to(&*s, &*sep, -1)
}

fn split_n<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, sep, n] = take(args)?;
    split_up_to(&*s, &*sep, int_arg("split", &*n)?)
}

/// At most `n` parts, the last holding the unsplit remainder: none when `n` is
/// zero, all of them when it is negative. An empty separator splits between
/// code points. Two units a part and one per 16 bytes are charged before the
/// parts are built.
fn split_up_to<'b, 'v>(
    s: &dyn Val,
    sep: &dyn Val,
    n: i64,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (s, sep) = (string_arg("split", s)?, string_arg("split", sep)?);
    let limit = match usize::try_from(n) {
        Ok(0) => return Ok(owned_list(Vec::new())),
        Ok(n) => n,
        Err(_) => usize::MAX,
    };
    let parts: Vec<&str> = if sep.is_empty() {
        let mut parts = Vec::new();
        let mut rest = s;
        while let Some(c) = rest.chars().next() {
            if parts.len() + 1 == limit {
                break;
            }
            let (head, tail) = rest.split_at(c.len_utf8());
            parts.push(head);
            rest = tail;
        }
        if !rest.is_empty() {
            parts.push(rest);
        }
        parts
    } else {
        s.splitn(limit, sep).collect()
    };
    // A part is a value built: two units, with its bytes.
    charge(2 * parts.len() as u64 + string_units(s.len()))?;
    Ok(owned_list(
        parts
            .into_iter()
            .map(|p| Box::new(CelString::from(p.to_owned())) as Box<dyn Val>)
            .collect(),
    ))
}

fn join<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list] = take(args)?;
    join_with(&*list, "")
}

fn join_sep<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [list, sep] = take(args)?;
    join_with(&*list, string_arg("join", &*sep)?)
}

/// The strings of `list` with `sep` between each, charged before it is built.
fn join_with<'b, 'v>(list: &dyn Val, sep: &str) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let iterable = list
        .as_iterable()
        .ok_or_else(|| wrong_type("join", list, "a list of strings"))?;
    let mut items = iterable.iter();
    let mut parts = Vec::new();
    while let Some(item) = items.next() {
        parts.push(string_arg("join", item)?);
    }
    let len = parts.iter().map(|p| p.len()).sum::<usize>()
        + sep.len().saturating_mul(parts.len().saturating_sub(1));
    charge(string_units(len))?;
    Ok(string(parts.join(sep)))
}

/// The byte offset of code point `idx` in `s` (its length at the end), or
/// `None` past the end.
fn byte_offset(s: &str, idx: usize) -> Option<usize> {
    s.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(s.len()))
        .nth(idx)
}

fn chars_before(s: &str, byte: usize) -> i64 {
    s[..byte].chars().count() as i64
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [target, needle] = take(args)?;
    if let Some(list) = target.as_iterable() {
        let mut items = list.iter();
        let mut i = 0;
        while let Some(item) = items.next() {
            if item.equals(&*needle) {
                return Ok(int(i));
            }
            i += 1;
        }
        return Ok(int(-1));
    }
    let (s, needle) = (
        string_arg("indexOf", &*target)?,
        string_arg("indexOf", &*needle)?,
    );
    Ok(int(s.find(needle).map_or(-1, |b| chars_before(s, b))))
}

fn index_of_offset<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    from_offset("indexOf", args, |s, needle, start| {
        s[start..]
            .find(needle)
            .map_or(-1, |b| chars_before(s, start + b))
    })
}

/// `s.f(needle, offset)`: CEL's checks of the offset (in code points), then
/// `search` from its byte position.
fn from_offset<'b, 'v>(
    function: &str,
    args: Vec<CowVal<'b, 'v>>,
    search: impl Fn(&str, &str, usize) -> i64,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [s, needle, offset] = take(args)?;
    let (s, needle, offset) = (
        string_arg(function, &*s)?,
        string_arg(function, &*needle)?,
        int_arg(function, &*offset)?,
    );
    let len = s.chars().count() as i64;
    if offset < 0 {
        return Err(out_of_range(function, offset));
    }
    if needle.is_empty() {
        return Ok(int(offset.min(len)));
    }
    if offset >= len {
        return Err(out_of_range(function, offset));
    }
    let start = byte_offset(s, offset as usize).unwrap_or(s.len());
    Ok(int(search(s, needle, start)))
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let [target, needle] = take(args)?;
    if let Some(list) = target.as_iterable() {
        let mut items = list.iter();
        let (mut i, mut last) = (0, -1);
        while let Some(item) = items.next() {
            if item.equals(&*needle) {
                last = i;
            }
            i += 1;
        }
        return Ok(int(last));
    }
    let (s, needle) = (
        string_arg("lastIndexOf", &*target)?,
        string_arg("lastIndexOf", &*needle)?,
    );
    Ok(int(s.rfind(needle).map_or(-1, |b| chars_before(s, b))))
}

fn last_index_of_offset<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    from_offset("lastIndexOf", args, |s, needle, start| {
        // A match starting at or before the offset ends at most a needle's
        // length after it; a match cannot end inside a code point.
        let mut end = (start + needle.len()).min(s.len());
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].rfind(needle).map_or(-1, |b| chars_before(s, b))
    })
}
