//! Generated conditions past every limit: chains of every operator, member, index,
//! call and macro, nested and chained to any depth and up to past the length limit.
//! Each is refused at creation with a sentence naming the field, or compiles and
//! evaluates to an end (a bool, CEL's error, or the budget) on a hostile body, in
//! bounded time. What the run reached is printed (`--nocapture`).
//!
//! Everything goes through the public surface: `Spec::from_request` is what the API
//! runs on a create, `probe::judge` what a poll runs on a response.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use waitd::engine::condition::{self, Condition, MAX_LEN, MAX_TREE};
use waitd::engine::{Limits, Observation, Spec};
use waitd::probe::judge;

/// A link of a chain: what it puts before and after the expression it wraps, or
/// after it alone (an operator and its right operand).
const WRAPS: &[(&str, &str)] = &[
    ("(", ")"),
    ("!", ""),
    ("-", ""),
    ("[", "]"),
    ("{'k': ", "}"),
    ("size(", ")"),
    ("string(", ")"),
    ("int(", ")"),
    ("has(body.", ")"),
    ("optional.of(", ").orValue(1)"),
    ("body.items.all(x, ", ")"),
    ("body.items.exists(x, ", ")"),
    ("body.items.exists_one(x, ", ")"),
    ("body.items.map(x, ", ")"),
    ("body.items.filter(x, ", ")"),
    ("body.items.map(x, x > 0, ", ")"),
    ("true ? ", " : false"),
    ("false ? 1 : ", ""),
    ("'a'.matches(string(", "))"),
];

const CHAINS: &[&str] = &[
    " + 1",
    " - 1",
    " * 1",
    " / 1",
    " % 2",
    " < 1",
    " <= 1",
    " > 1",
    " >= 1",
    " == 1",
    " != 1",
    " in [1]",
    " && true",
    " || false",
    ".a",
    ".?a",
    "[0]",
    "['a']",
    "[?0]",
    ".size()",
    ".contains('a')",
    ".startsWith('a')",
    ".endsWith('a')",
    ".matches('a+')",
    " ? 1 : 2",
];

const LEAVES: &[&str] = &[
    "1",
    "body",
    "body.s",
    "body.items",
    "status",
    "headers",
    "state",
    "'a'",
    "x",
];

/// One expression: a leaf, then links drawn at random, wrapping or chained.
fn chain() -> impl Strategy<Value = String> {
    let link = prop_oneof![
        (0..WRAPS.len()).prop_map(|i| (true, i)),
        (0..CHAINS.len()).prop_map(|i| (false, i)),
    ];
    (
        0..LEAVES.len(),
        // Short chains, which mostly compile, and long ones, which mostly do not.
        prop_oneof![
            prop::collection::vec(link.clone(), 1..24),
            prop::collection::vec(link, 1..700)
        ],
        any::<bool>(),
    )
        .prop_map(|(leaf, links, repeat_one)| {
            let mut e = LEAVES[leaf].to_string();
            // Half the cases repeat their first link: the deepest chains of one kind.
            let first = links[0];
            for (i, &(wrap, k)) in links.iter().enumerate() {
                let (wrap, k) = if repeat_one && i > 0 {
                    first
                } else {
                    (wrap, k)
                };
                if wrap {
                    e = format!("{}{e}{}", WRAPS[k].0, WRAPS[k].1);
                } else {
                    e.push_str(CHAINS[k]);
                }
                if e.len() > MAX_LEN + 200 {
                    break;
                }
            }
            e
        })
}

fn limits() -> Limits {
    Limits {
        min_poll_interval: Duration::from_millis(1),
        ..Limits::default()
    }
}

fn hostile_body() -> impl Strategy<Value = Value> {
    (0usize..2000, 0usize..50_000).prop_map(|(n, s)| {
        json!({"items": vec![json!({"a": "b", "c": [1, 2, 3]}); n], "s": "y".repeat(s), "a": {"a": 1}})
    })
}

/// What the run reached, printed at its end.
#[derive(Default, Debug)]
struct Reached {
    cases: u64,
    refused: u64,
    evaluated: u64,
    longest_bytes: usize,
    most_links_accepted: usize,
    slowest_create: Duration,
    slowest_evaluation: Duration,
}

#[test]
fn every_generated_condition_is_refused_or_evaluates_to_an_end() {
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 400,
        ..ProptestConfig::default()
    });
    let reached = RefCell::new(Reached::default());
    let result = runner.run(&(chain(), hostile_body()), |(e, body)| {
        let mut r = reached.borrow_mut();
        let links = e
            .matches([
                '(', '.', '[', '+', '-', '*', '/', '%', '<', '>', '=', '!', '&', '|', '?',
            ])
            .count();
        let request = json!({"target": {"url": "http://127.0.0.1:9/x"}, "success_condition": e});
        let t = crate::support::thread_cpu();
        let created = Spec::from_request(&request, &limits());
        let create = crate::support::thread_cpu() - t;
        // Parsing 2 KiB of any shape takes milliseconds of CPU; the bound is wide
        // for a debug build, and CPU time is not stretched by the tests beside it.
        prop_assert!(create < Duration::from_secs(2), "{create:?} for {e}");
        r.cases += 1;
        r.longest_bytes = r.longest_bytes.max(e.len());
        r.slowest_create = r.slowest_create.max(create);
        let spec = match created {
            Err(errs) => {
                prop_assert_eq!(&errs[0].field, "success_condition");
                prop_assert!(!errs[0].message.is_empty());
                r.refused += 1;
                return Ok(());
            }
            Ok(spec) => spec,
        };
        prop_assert!(e.len() <= MAX_LEN);
        let headers = BTreeMap::from([("x-a".to_string(), "b".to_string())]);
        let t = crate::support::thread_cpu();
        let obs = judge(
            &spec,
            200,
            &headers,
            Some(&body),
            Observation::Answered { status: 200 },
        );
        let took = crate::support::thread_cpu() - t;
        prop_assert!(took < Duration::from_secs(3), "{took:?} for {e}");
        prop_assert!(
            matches!(
                obs,
                Observation::Judged { .. }
                    | Observation::Missing { .. }
                    | Observation::Permanent { .. }
            ),
            "{obs:?}"
        );
        r.evaluated += 1;
        r.most_links_accepted = r.most_links_accepted.max(links);
        r.slowest_evaluation = r.slowest_evaluation.max(took);
        Ok(())
    });
    eprintln!("generated conditions: {:?}", reached.borrow());
    if let Err(e) = result {
        panic!("{e}");
    }
    let r = reached.borrow();
    assert!(r.refused > 0 && r.evaluated > 0, "{r:?}");
    assert!(r.longest_bytes > MAX_LEN, "{r:?}");
}

/// Each operator, member, index and macro chained past [`MAX_TREE`]: refused at
/// creation, whatever the link, and the same chain one link shorter than the limit
/// compiles. C1 (640 comparisons, 1,281 bytes) among them.
#[test]
fn a_chain_past_the_tree_depth_is_refused_whatever_its_operator() {
    let c1 = format!("1{}", "<1".repeat(640));
    let e = Condition::compile(&c1).unwrap_err();
    assert!(e.contains("nests at least 641 levels deep"), "{e}");
    // Read from its tokens, before the parse builds it.
    assert_eq!(Condition::depths(&c1).0, 641);
    for link in CHAINS {
        let long = format!("body{}", link.repeat(MAX_TREE + 1));
        if long.len() > MAX_LEN {
            continue;
        }
        let compiled = Condition::compile(&format!("{long} == 1"));
        if link.contains("&&") || link.contains("||") {
            // The parser builds these chains as balanced trees: 65 links are 8 deep.
            assert!(compiled.is_ok(), "{link}: {compiled:?}");
            continue;
        }
        let e = compiled.unwrap_err();
        assert!(
            e.contains("levels deep") || e.contains("nests deeper"),
            "{link}: {e}"
        );
    }
    let fine = format!("body{} == 1", ".a".repeat(MAX_TREE - 4));
    Condition::compile(&fine).unwrap();
}

/// Tokens in any order, mostly not CEL: message literals with dotted names, unary
/// runs, root-scoped names and every bracket among the chains.
fn token_soup() -> impl Strategy<Value = String> {
    const TOKENS: &[&str] = &[
        "1",
        "-1",
        "x",
        "body",
        ".a",
        ".f()",
        "a.b.C{}",
        "a.b.C{f: 1}",
        "[0]",
        "[",
        "]",
        "(",
        ")",
        "{",
        "}",
        "{'k': 1}",
        "!",
        "-",
        "+",
        "*",
        "<",
        "==",
        "in",
        "&&",
        "||",
        "?",
        ":",
        ",",
        ".",
        "'s'",
        "size(",
        "[?0]",
        ".?a",
        "a.b.f(1)",
        ".all(i, i)",
        "cel.bind(v, 1, v)",
    ];
    prop::collection::vec(prop::sample::select(TOKENS), 1..400)
        .prop_map(|t| t.join(" ").replace("( ", "(").replace(" )", ")"))
}

/// The bound read from the tokens before the parse is never above the depth of the
/// tree the parser builds, for generated chains of every kind and for token soup:
/// it refuses only what the parse would refuse for its depth.
#[test]
fn the_depth_read_from_the_tokens_is_never_above_the_trees() {
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 600,
        ..ProptestConfig::default()
    });
    // Parsed, refused before the parse, the deepest tree parsed, the highest bound.
    let reached = RefCell::new((0u64, 0u64, 0usize, 0usize));
    let strategy = prop_oneof![chain(), token_soup()];
    let result = runner.run(&strategy, |e| {
        let (least, depth) = Condition::depths(&e);
        let mut r = reached.borrow_mut();
        r.3 = r.3.max(least);
        if least > MAX_TREE {
            r.1 += 1;
        }
        if let Some(depth) = depth {
            r.0 += 1;
            r.2 = r.2.max(depth);
            prop_assert!(
                least <= depth,
                "bound {least} above the tree's {depth}: {e}"
            );
        }
        Ok(())
    });
    let (parsed, refused, deepest, highest) = *reached.borrow();
    eprintln!(
        "depth from tokens: {parsed} parsed (deepest tree {deepest}), {refused} refused before the parse (highest bound {highest})"
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        parsed > 0 && refused > 0 && deepest > MAX_TREE,
        "{parsed} {refused} {deepest}"
    );
}

/// A stored condition (written by another version, or by hand) past the limits
/// does not decode, on an ordinary thread: a claim ends such a wait in error
/// rather than walking the tree.
#[test]
fn a_stored_condition_past_the_limits_does_not_decode() {
    let stored = json!({"target": {"url": "http://127.0.0.1:9/x", "headers": {}}, "success_condition": format!("1{}", "<1".repeat(640))});
    let decoded = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            serde_json::from_value::<Condition>(stored["success_condition"].clone()).map(|_| ())
        })
        .unwrap()
        .join()
        .unwrap();
    let e = decoded.unwrap_err().to_string();
    assert!(e.contains("levels deep"), "{e}");
}

/// H1: a pattern taken from the body, used for each of 3,000 items, compiles once
/// (or fails once) and the evaluation ends in well under a second; 3,000 distinct
/// patterns end on the budget.
#[test]
fn patterns_from_the_body_are_compiled_once_and_paid_for() {
    let headers = BTreeMap::new();
    let items: Vec<Value> = (0..3000).map(|i| json!({"p": format!("^v{i}$")})).collect();
    for (p, expr) in [
        (r"(?:\w{50}){50}", "body.items.all(i, !'a'.matches(body.p))"),
        (r"^a+$", "body.items.all(i, !'b'.matches(body.p))"),
        ("", "body.items.all(i, !'a'.matches(i.p))"),
    ] {
        let body = json!({"p": p, "items": items});
        let c = Condition::compile(expr).unwrap();
        let vars = condition::Vars::new(Some(&body), 200, &headers, None);
        let mut budget = condition::Budget::default();
        let t = crate::support::thread_cpu();
        let got = c.evaluate(&vars, &mut budget);
        let took = crate::support::thread_cpu() - t;
        eprintln!(
            "{expr} with {p:?}: {got:?} after {took:?}, {} units",
            budget.spent()
        );
        assert!(took < Duration::from_secs(1), "{expr}: {took:?}");
    }
}
