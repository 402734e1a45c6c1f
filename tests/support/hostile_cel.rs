//! Conditions a tenant may write whose work grows with what a target sends: each
//! builds or scans something a 1 MiB string or a large list from the body makes
//! huge, and must end on the evaluation budget. `tests/cel_library.rs` checks that
//! each does; the load benchmark times them on the release build.

use serde_json::{Value, json};

/// The body they are evaluated against.
pub fn body() -> Value {
    json!({
        "s": "ab,".repeat(350_000),
        "l": vec!["x".repeat(100); 3000],
        "items": (0..2000).collect::<Vec<_>>(),
        "f": "%.99999999f",
        "ints": (0..400_000).rev().collect::<Vec<_>>(),
    })
}

pub const CASES: &[&str] = &[
    "body.items.all(i, body.s.split(',').size() > 0)",
    "body.s.split('').size() > 0",
    "body.items.all(i, body.s.replace('a', 'aaaa').size() > 0)",
    "body.s.replace(',', body.s).size() > 0",
    "body.items.all(i, body.l.join(',').size() > 0)",
    "body.l.join(body.s).size() > 0",
    "body.items.all(i, '%s'.format([body.s]).size() > 0)",
    "body.f.format([1.0]).size() > 0",
    "body.items.all(i, body.s.findAll('a').size() > 0)",
    "body.s.findAll('').size() > 0",
    "body.items.all(i, body.s.upperAscii().size() > 0)",
    "body.items.all(i, body.s.indexOf('zz') < 0)",
    "body.items.all(i, body.items.distinct().size() > 0)",
    "body.items.all(i, strings.quote(body.s).size() > 0)",
    "body.items.all(i, body.items.map(j, duration('1s') + duration(string(j) + 's')).size() > 0)",
    "body.items.all(i, body.items.all(j, now - duration('1h') < now))",
    "body.ints.sort().size() > 0 && body.ints.sort().size() > 0",
    "body.ints.sortBy(x, -x).size() > 0",
];
