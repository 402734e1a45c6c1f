//! (10c): the conditions whose work grows with what a target sends
//! (`tests/support/hostile_cel.rs`), timed on the release build: each must end on
//! the evaluation budget, and the slowest in well under a second.

use std::collections::BTreeMap;
use std::time::Instant;

use waitd::engine::condition::{Budget, Condition, Failure, Vars};

use crate::support::hostile_cel::{CASES, body};

/// The slowest case's time to end on the budget, in ms, and the case.
pub fn slowest() -> (f64, &'static str) {
    let body = body();
    let headers = BTreeMap::new();
    let mut worst = (0.0, "");
    for &expr in CASES {
        let c = Condition::compile(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        let vars = Vars::new(Some(&body), 200, &headers, None).at(chrono::Utc::now());
        let t = Instant::now();
        let got = c.evaluate(&vars, &mut Budget::default());
        let ms = t.elapsed().as_secs_f64() * 1e3;
        assert!(matches!(got, Err(Failure::Budget)), "{expr}: {got:?}");
        if ms > worst.0 {
            worst = (ms, expr);
        }
    }
    worst
}
