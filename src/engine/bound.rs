//! Bounds on what a target's answer can put into a wait.
//!
//! A target is a stranger: its status string may be 500 KB, its error detail a
//! megabyte of nested JSON, and either may hold NUL characters, which Postgres
//! refuses in text and JSON. Everything the engine keeps of an answer (the shown
//! state, the last error, the end's reason and error detail) passes through here
//! first, so what is stored, listed and streamed is small and storable, and is the
//! same on every store. Matching itself uses the values as the target sent them.
//!
//! Pure: no I/O.

use std::borrow::Cow;

use serde_json::{Map, Value};

/// "1 MiB", "64 KiB", "100 bytes".
pub fn format_size(bytes: usize) -> String {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else if bytes == 1 {
        "1 byte".to_string()
    } else {
        format!("{bytes} bytes")
    }
}

/// The most bytes of a wait's `state`.
pub const MAX_STATE: usize = 2 * 1024;
/// The most bytes of `last_error` (and of a retry event's error).
pub const MAX_ERROR: usize = 2 * 1024;
/// The most bytes of an end's `reason`.
pub const MAX_REASON: usize = 4 * 1024;
/// The most bytes of `error_detail` as JSON text.
pub const MAX_DETAIL: usize = 8 * 1024;
/// An unrecognised state quoted inside an error sentence.
pub const MAX_QUOTED: usize = 256;

/// What NUL becomes (the replacement character), on every store alike.
const NUL_STANDIN: char = '\u{FFFD}';

/// `s` with NUL replaced and cut to at most `max` bytes at a character boundary;
/// a cut text ends with `… (cut from N bytes)`.
pub fn text(s: &str, max: usize) -> Cow<'_, str> {
    let clean: Cow<str> = if s.contains('\0') {
        Cow::Owned(s.replace('\0', &NUL_STANDIN.to_string()))
    } else {
        Cow::Borrowed(s)
    };
    if clean.len() <= max {
        return clean;
    }
    let marker = format!("… (cut from {} bytes)", clean.len());
    let keep = floor_boundary(&clean, max.saturating_sub(marker.len()));
    Cow::Owned(format!("{}{marker}", &clean[..keep]))
}

/// `values` joined by `sep` as [`text`] would show the whole, without building
/// more than `max` bytes of it.
pub fn join(values: &[String], sep: &str, max: usize) -> String {
    let total: usize =
        values.iter().map(String::len).sum::<usize>() + sep.len() * values.len().saturating_sub(1);
    if total <= max {
        let joined = values.join(sep);
        return match text(&joined, max) {
            Cow::Borrowed(_) => joined,
            Cow::Owned(clean) => clean,
        };
    }
    let mut out = String::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.push_str(v);
        if out.len() > max {
            break;
        }
    }
    // The marker names the size of the whole.
    let marker = format!("… (cut from {total} bytes)");
    let keep = floor_boundary(&out, max.saturating_sub(marker.len()));
    out.truncate(keep);
    let mut out = text(&out, usize::MAX).into_owned();
    out.push_str(&marker);
    out
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    if i >= s.len() {
        return s.len();
    }
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Strings in an error detail are cut to this many bytes.
const DETAIL_STRING: usize = 512;
/// Arrays and objects in an error detail keep this many entries.
const DETAIL_ENTRIES: usize = 32;
/// Nesting below this depth is replaced by a marker.
const DETAIL_DEPTH: usize = 8;

/// An error detail small enough to store and show: NUL replaced in keys and
/// strings; long strings, long arrays and objects, and deep nesting shortened; and
/// if it is still over [`MAX_DETAIL`], a preview of its JSON text in its place.
pub fn detail(v: &Value) -> Value {
    let pruned = prune(v, 0);
    let len = serde_json::to_string(&pruned).map_or(usize::MAX, |s| s.len());
    if len <= MAX_DETAIL {
        return pruned;
    }
    let whole = serde_json::to_string(v).unwrap_or_default();
    // The preview's quotes and backslashes are escaped again in the detail's own
    // text, which may double it: cut it by what the whole is over.
    let mut keep = MAX_DETAIL / 2;
    loop {
        let cut = serde_json::json!({
            "cut": format!("the error detail was {} bytes of JSON, more than the {} waitd keeps; preview holds its beginning", whole.len(), MAX_DETAIL),
            "bytes": whole.len(),
            "preview": text(&whole, keep),
        });
        let len = serde_json::to_string(&cut).map_or(0, |s| s.len());
        if len <= MAX_DETAIL || keep == 0 {
            return cut;
        }
        keep = keep.saturating_sub(len - MAX_DETAIL);
    }
}

/// The most bytes of a wait's `output` as JSON text.
pub const MAX_OUTPUT: usize = 64 * 1024;
/// Nesting in an output below this depth is replaced by a marker.
const OUTPUT_DEPTH: usize = 64;

/// An output as waitd keeps it: NUL replaced in keys and strings and nesting past
/// 64 levels marked, whole up to [`MAX_OUTPUT`] bytes of JSON; past that, a
/// preview of its JSON text in its place.
pub fn output(v: &Value) -> Value {
    let clean = unnul(v, 0);
    let whole = serde_json::to_string(&clean).unwrap_or_default();
    if whole.len() <= MAX_OUTPUT {
        return clean;
    }
    // Escaped inside a string, the preview's text may grow (a quote takes two
    // bytes, a control character six): it is halved until the whole fits.
    let mut keep = MAX_OUTPUT / 2;
    loop {
        let cut = serde_json::json!({
            "cut": format!("the output was {} bytes of JSON, more than the {} waitd keeps; preview holds its beginning", whole.len(), MAX_OUTPUT),
            "bytes": whole.len(),
            "preview": text(&whole, keep),
        });
        if keep < 64 || serde_json::to_string(&cut).map_or(0, |t| t.len()) <= MAX_OUTPUT {
            return cut;
        }
        keep /= 2;
    }
}

fn unnul(v: &Value, depth: usize) -> Value {
    match v {
        Value::String(s) => Value::String(text(s, usize::MAX).into_owned()),
        Value::Array(_) | Value::Object(_) if depth >= OUTPUT_DEPTH => {
            Value::String(format!("… (nested deeper than {OUTPUT_DEPTH} levels)"))
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| unnul(x, depth + 1)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (text(k, usize::MAX).into_owned(), unnul(x, depth + 1)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn prune(v: &Value, depth: usize) -> Value {
    match v {
        Value::String(s) => Value::String(text(s, DETAIL_STRING).into_owned()),
        Value::Array(_) | Value::Object(_) if depth >= DETAIL_DEPTH => {
            let n = match v {
                Value::Array(a) => a.len(),
                Value::Object(o) => o.len(),
                _ => 0,
            };
            Value::String(format!("… ({n} entries nested too deep, cut)"))
        }
        Value::Array(items) => {
            let mut out: Vec<Value> = items
                .iter()
                .take(DETAIL_ENTRIES)
                .map(|x| prune(x, depth + 1))
                .collect();
            if items.len() > DETAIL_ENTRIES {
                out.push(Value::String(format!(
                    "… ({} more entries cut)",
                    items.len() - DETAIL_ENTRIES
                )));
            }
            Value::Array(out)
        }
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, x) in map.iter().take(DETAIL_ENTRIES) {
                out.insert(text(k, DETAIL_STRING).into_owned(), prune(x, depth + 1));
            }
            if map.len() > DETAIL_ENTRIES {
                out.insert(
                    "…".to_string(),
                    Value::String(format!("{} more entries cut", map.len() - DETAIL_ENTRIES)),
                );
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sizes_read_as_a_person_writes_them() {
        assert_eq!(format_size(1024 * 1024), "1 MiB");
        assert_eq!(format_size(64 * 1024), "64 KiB");
        assert_eq!(format_size(100), "100 bytes");
        assert_eq!(format_size(1500), "1500 bytes");
    }

    #[test]
    fn short_text_is_kept_and_long_text_is_cut_with_its_size() {
        assert_eq!(text("on", 10), "on");
        let long = "é".repeat(10_000);
        let cut = text(&long, MAX_STATE);
        assert!(cut.len() <= MAX_STATE, "{}", cut.len());
        assert!(cut.ends_with("… (cut from 20000 bytes)"), "{cut}");
        assert_eq!(text("a\0b", 10), "a\u{FFFD}b");
    }

    #[test]
    fn a_join_of_many_values_is_bounded_without_joining_them_all() {
        let values: Vec<String> = (0..100_000).map(|i| format!("v{i}")).collect();
        let shown = join(&values, ", ", MAX_STATE);
        assert!(shown.len() <= MAX_STATE);
        assert!(shown.starts_with("v0, v1, v2"));
        assert!(shown.contains("cut from"));
        assert_eq!(join(&["a".into(), "b\0".into()], ", ", 100), "a, b\u{FFFD}");
    }

    #[test]
    fn an_error_detail_is_pruned_then_previewed() {
        let small = json!({"code": "SkuNotAvailable", "message": "no"});
        assert_eq!(detail(&small), small);
        let nul = json!({"k\u{0}": "v\u{0}"});
        assert_eq!(detail(&nul), json!({"k\u{FFFD}": "v\u{FFFD}"}));
        let wide = json!({"items": (0..1000).collect::<Vec<_>>(), "s": "x".repeat(100_000)});
        let d = detail(&wide);
        assert!(serde_json::to_string(&d).unwrap().len() <= MAX_DETAIL);
        assert_eq!(d["items"].as_array().unwrap().len(), DETAIL_ENTRIES + 1);
        let mut deep = json!(1);
        for _ in 0..50 {
            deep = json!({"a": deep, "b": "x".repeat(400)});
        }
        let d = detail(&deep);
        let len = serde_json::to_string(&d).unwrap().len();
        assert!(len <= MAX_DETAIL, "{len}");
        // Quotes and backslashes, escaped once in the preview's source and again
        // in the preview.
        let escaped: serde_json::Map<String, Value> = (0..64)
            .map(|i| {
                (
                    format!("{i}{}", "\\\"".repeat(300)),
                    json!(["\\".repeat(300)]),
                )
            })
            .collect();
        let d = detail(&Value::Object(escaped));
        let len = serde_json::to_string(&d).unwrap().len();
        assert!(d["preview"].is_string(), "{d}");
        assert!(len <= MAX_DETAIL, "{len}");
    }
}
