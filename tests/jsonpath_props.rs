//! waitd's own JSONPath evaluator (RFC 9535, with a budget) against the
//! `serde_json_path` crate on generated queries and documents: both accept the same
//! queries, and select the same nodes in the same order. Then paths built deep and
//! long on purpose, past the nesting and length limits: each is parsed in time
//! linear in its length, and is refused or evaluated to an end within the budget.

use std::cell::RefCell;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use waitd::engine::jsonpath::{Budget, MAX_DESCENDANTS, MAX_NESTING, Query};
use waitd::engine::{Limits, ValuePath};

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c".to_string()),
        Just("_x".to_string()),
        Just("é".to_string()),
    ]
}

fn literal() -> impl Strategy<Value = String> {
    prop_oneof![
        (-3i64..4).prop_map(|n| n.to_string()),
        Just("1.5".to_string()),
        Just("-0".to_string()),
        Just("1e1".to_string()),
        Just("'a'".to_string()),
        Just("\"b\"".to_string()),
        Just("'x\\u0041'".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("null".to_string()),
    ]
}

/// Indices here are not negative: in a singular query the crate finds nothing at a
/// negative index, where RFC 9535 counts from the end, as ours does (unit tests).
fn singular() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("@"), Just("$")],
        prop::collection::vec(
            prop_oneof![
                name().prop_map(|n| format!(".{n}")),
                name().prop_map(|n| format!("['{n}']")),
                (0i64..3).prop_map(|i| format!("[{i}]")),
            ],
            0..3,
        ),
    )
        .prop_map(|(root, segs)| format!("{root}{}", segs.concat()))
}

fn comparable() -> impl Strategy<Value = String> {
    prop_oneof![
        literal(),
        singular(),
        singular().prop_map(|q| format!("length({q})")),
        Just("count(@.*)".to_string()),
        Just("count(@..a)".to_string()),
        Just("value(@..b)".to_string()),
    ]
}

/// `<=` and `>=` are left out: the crate answers `Nothing <= Nothing` false, where
/// RFC 9535 (Table 11) says true, as ours does (see the unit tests). `>` is left
/// out too: the crate reads `a > b` as "same type, neither less nor equal", so it
/// answers `true > false` (and any two unequal arrays, objects) true, where RFC 9535
/// orders only numbers and strings. Both sides come from the same set, so `<`
/// alone covers ordering in both directions.
fn op() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("=="), Just("!="), Just("<")]
}

fn basic() -> impl Strategy<Value = String> {
    prop_oneof![
        (comparable(), op(), comparable()).prop_map(|(l, o, r)| format!("{l} {o} {r}")),
        singular(),
        Just("@.*".to_string()),
        Just("@..c".to_string()),
        Just("!@.a".to_string()),
        singular().prop_map(|q| format!("match({q}, 'a.*')")),
        singular().prop_map(|q| format!("search({q}, '[bc]')")),
        Just("!match(@, '1')".to_string()),
        Just("@[?@ > 1]".to_string()),
    ]
}

fn logical() -> impl Strategy<Value = String> {
    basic().prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} && {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}||{b}")),
            inner.clone().prop_map(|a| format!("({a})")),
            inner.prop_map(|a| format!("!({a})")),
        ]
    })
}

fn selector() -> impl Strategy<Value = String> {
    prop_oneof![
        name().prop_map(|n| format!("'{n}'")),
        Just("*".to_string()),
        (-3i64..4).prop_map(|i| i.to_string()),
        (
            prop::option::of(-3i64..4),
            prop::option::of(-3i64..4),
            prop::option::of(-2i64..3)
        )
            .prop_map(|(a, b, c)| {
                let f = |x: Option<i64>| x.map(|v| v.to_string()).unwrap_or_default();
                match c {
                    Some(_) => format!("{}:{}:{}", f(a), f(b), f(c)),
                    None => format!("{}:{}", f(a), f(b)),
                }
            }),
        logical().prop_map(|f| format!("?{f}")),
    ]
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        name().prop_map(|n| format!(".{n}")),
        Just(".*".to_string()),
        name().prop_map(|n| format!("..{n}")),
        Just("..*".to_string()),
        prop::collection::vec(selector(), 1..3).prop_map(|s| format!("[{}]", s.join(","))),
        selector().prop_map(|s| format!("..[{s}]")),
    ]
}

fn query() -> impl Strategy<Value = String> {
    prop::collection::vec(segment(), 0..4).prop_map(|s| format!("${}", s.concat()))
}

/// The query with one byte changed, inserted or removed: mostly invalid queries.
fn mutated() -> impl Strategy<Value = String> {
    (
        query(),
        any::<prop::sample::Index>(),
        prop::sample::select(vec![
            "", "[", "]", "'", "\"", "(", ")", ".", "..", "?", "@", "$", " ", "!", "=", "<", ",",
            ":", "-", "0", "01", "\\",
        ]),
        any::<bool>(),
    )
        .prop_map(|(q, at, ins, remove)| {
            let mut b = q.into_bytes();
            let i = at.index(b.len() + 1);
            if remove && i < b.len() {
                b.remove(i);
            }
            let i = i.min(b.len());
            b.splice(i..i, ins.bytes());
            String::from_utf8(b).unwrap_or_default()
        })
}

fn document() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-3i64..4).prop_map(|n| json!(n)),
        Just(json!(1.5)),
        prop::sample::select(vec!["a", "ab", "b", "1", "xA", "é"]).prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(4, 40, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(name(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Queries on which the two differ on purpose: more descendant segments than ours
/// allows, blanks before a descendant segment (RFC 9535 allows them, as
/// `segments = *(S segment)`; the crate refuses them), and a `>` whose right side is
/// not a number (a mutation can make one; `op` says why the crate differs there).
fn known_difference(q: &str) -> bool {
    q.matches("..").count() > MAX_DESCENDANTS
        || [" ..", "\t..", "\n..", "\r.."]
            .iter()
            .any(|b| q.contains(b))
        || q.match_indices('>').any(|(i, _)| {
            let rest = q[i + 1..].trim_start_matches(['=', ' ']);
            !rest.starts_with(|c: char| c.is_ascii_digit() || c == '-')
        })
}

fn check(q: &str, doc: &Value) -> Result<(), TestCaseError> {
    let ours = Query::parse(q);
    let theirs = serde_json_path::JsonPath::parse(q);
    if known_difference(q) {
        return Ok(());
    }
    match (&ours, &theirs) {
        (Ok(ours), Ok(theirs)) => {
            let got = ours
                .select(doc, &mut Budget::default())
                .map_err(|e| TestCaseError::fail(format!("{q}: over budget: {e}")))?;
            let want = theirs.query(doc).all();
            prop_assert_eq!(got, want, "{} on {}", q, doc);
        }
        (Err(_), Err(_)) => {}
        (Ok(_), Err(e)) => prop_assert!(false, "{q:?}: ours parsed, the crate did not: {e}"),
        (Err(e), Ok(_)) => prop_assert!(false, "{q:?}: the crate parsed, ours did not: {e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn generated_queries_select_what_serde_json_path_selects(q in query(), doc in document()) {
        check(&q, &doc)?;
    }

    #[test]
    fn mutated_queries_are_accepted_or_refused_alike(q in mutated(), doc in document()) {
        check(&q, &doc)?;
    }
}

// Paths built deep and long on purpose.

/// The most one parse may take per 512 bytes of path (the API's limit on a path).
/// In a debug build a parse of about 500 bytes takes under 0.1 ms on average and
/// at most a few ms while the machine is busy compiling (the generated test below
/// prints both); a parser that re-reads each level once per way of reading it
/// takes over 10 s at 31 levels of calls, doubling with each further level. The
/// margin is for a loaded 2-core machine.
const PARSE_BOUND: Duration = Duration::from_millis(50);
/// A parse still running after this long is reported instead of waited for.
const HANG: Duration = Duration::from_secs(10);

/// The sentence a path nested past the limit is refused with.
const TOO_DEEP: &str = "nest more than 32 levels deep";

fn parse_bound(len: usize) -> Duration {
    PARSE_BOUND * len.div_ceil(512).max(1) as u32
}

/// Parses `text` as the API parses `state` and `error`, on a thread of its own,
/// and measures the parse. When it is over the bound it is measured up to four
/// more times and the best time kept, so that a thread descheduled on a busy
/// machine does not read as a slow parser. A parse still running after [`HANG`]
/// fails the test rather than hanging it (its thread is left to the process's
/// exit).
fn parse_timed(text: &str) -> Result<(Result<ValuePath, String>, Duration), String> {
    let bound = parse_bound(text.len());
    let mut best: Option<(Result<ValuePath, String>, Duration)> = None;
    for _ in 0..5 {
        let (tx, rx) = mpsc::channel();
        let owned = text.to_string();
        std::thread::spawn(move || {
            let t = Instant::now();
            let parsed = ValuePath::parse(&owned);
            let _ = tx.send((parsed, t.elapsed()));
        });
        let (parsed, took) = rx.recv_timeout(HANG).map_err(|_| {
            format!(
                "parsing a {}-byte path did not end within {HANG:?}: {text}",
                text.len()
            )
        })?;
        if best.as_ref().is_none_or(|(_, b)| took < *b) {
            best = Some((parsed, took));
        }
        if took <= bound {
            break;
        }
    }
    Ok(best.expect("measured at least once"))
}

/// What a piece of a filter is, as far as what may wrap it is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sort {
    /// A singular query: a value, or a test that something is there.
    Singular,
    /// A function's value: length, count or value.
    Value,
    /// A logical expression, or a query selecting any number of nodes.
    Logical,
}

impl Sort {
    fn fits(self, wanted: Sort) -> bool {
        self == Sort::Singular || self == wanted
    }
}

/// One level wrapped around the inside of a filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    Paren,
    Not,
    Filter,
    RootFilter,
    DescendantFilter,
    Length,
    Count,
    ValueOf,
    Match,
    Search,
    Compare,
    And,
    Or,
}

const LEVELS: [Level; 13] = [
    Level::Paren,
    Level::Not,
    Level::Filter,
    Level::RootFilter,
    Level::DescendantFilter,
    Level::Length,
    Level::Count,
    Level::ValueOf,
    Level::Match,
    Level::Search,
    Level::Compare,
    Level::And,
    Level::Or,
];

impl Level {
    fn wrap(self, x: &str) -> String {
        match self {
            Level::Paren => format!("({x})"),
            Level::Not => format!("!({x})"),
            Level::Filter => format!("@[?{x}]"),
            Level::RootFilter => format!("$.a[?{x}]"),
            Level::DescendantFilter => format!("@..[?{x}]"),
            Level::Length => format!("length({x})"),
            Level::Count => format!("count(@[?{x}])"),
            Level::ValueOf => format!("value(@.*[?{x}])"),
            Level::Match => format!("match({x}, 'a.*')"),
            Level::Search => format!("search({x},'[ab]')"),
            Level::Compare => format!("{x} == 1"),
            Level::And => format!("{x} && @.b"),
            Level::Or => format!("@.c||{x}"),
        }
    }

    /// What it takes, what it makes, and how many levels of nesting it opens
    /// (a filter, a parenthesis, a call, a query inside a filter: one each).
    fn sorts(self) -> (Sort, Sort, usize) {
        use Sort::{Logical, Value};
        match self {
            Level::Paren | Level::Not => (Logical, Logical, 1),
            Level::Filter | Level::RootFilter | Level::DescendantFilter => (Logical, Logical, 2),
            Level::Length => (Value, Value, 1),
            Level::Count | Level::ValueOf => (Logical, Value, 3),
            Level::Match | Level::Search => (Value, Logical, 1),
            Level::Compare => (Value, Logical, 0),
            Level::And | Level::Or => (Logical, Logical, 0),
        }
    }

    fn descendants(self) -> usize {
        usize::from(self == Level::DescendantFilter)
    }
}

/// The innermost piece of a filter.
#[derive(Clone, Debug)]
struct Core {
    text: String,
    sort: Sort,
    /// Levels it opens itself.
    nesting: usize,
    descendants: usize,
    /// Refused wherever it stands.
    poisoned: bool,
}

fn core_of(text: String, sort: Sort, nesting: usize) -> Core {
    Core {
        descendants: text.matches("..").count(),
        text,
        sort,
        nesting,
        poisoned: false,
    }
}

fn core() -> impl Strategy<Value = Core> {
    let selectors = ["'a'", "0", "*", "1:3", "-1", "::2", "\"b\"", "?@.a", "-2:"];
    prop_oneof![
        Just(core_of("@.a".into(), Sort::Singular, 1)),
        Just(core_of("$.b[0]".into(), Sort::Singular, 1)),
        prop::collection::vec(name(), 1..160).prop_map(|n| core_of(
            format!("@.{}", n.join(".")),
            Sort::Singular,
            1
        )),
        prop::collection::vec(prop_oneof![Just(" && "), Just("||")], 1..100).prop_map(|ops| {
            let mut t = "@.a".to_string();
            for op in ops {
                t.push_str(op);
                t.push_str("@.b");
            }
            core_of(t, Sort::Logical, 1)
        }),
        (2usize..120).prop_map(move |k| {
            let sel: Vec<&str> = selectors.iter().copied().cycle().take(k).collect();
            // `?@.a` among them opens a filter and a query.
            let nesting = if k > 7 { 3 } else { 1 };
            core_of(format!("@[{}]", sel.join(",")), Sort::Logical, nesting)
        }),
        (0usize..8).prop_map(|k| {
            let mut c = core_of(
                format!("{}@.a", "!".repeat(k)),
                if k == 0 {
                    Sort::Singular
                } else {
                    Sort::Logical
                },
                1,
            );
            // RFC 9535 allows one "!" before a test, not two.
            c.poisoned = k > 1;
            c
        }),
        Just(core_of("@..a".into(), Sort::Logical, 1)),
        Just(core_of("match(@.a, 'a.*')".into(), Sort::Logical, 2)),
        prop::sample::select(vec![
            "@.a ==",
            "nope(@.a)",
            "\"open",
            "@[01]",
            "@.",
            "@.a ]"
        ])
        .prop_map(|t| Core {
            text: t.into(),
            sort: Sort::Singular,
            nesting: 1,
            descendants: 0,
            poisoned: true,
        }),
    ]
}

/// A segment outside the filter: the path's long and wide parts.
fn outer_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(".a".to_string()),
        Just("[*]".to_string()),
        Just("..b".to_string()),
        prop::collection::vec(name(), 1..120).prop_map(|n| format!(".{}", n.join("."))),
        prop::collection::vec(
            prop_oneof![
                name().prop_map(|n| format!("'{n}'")),
                (-3i64..4).prop_map(|i| i.to_string()),
                Just("*".to_string()),
                Just("1:2".to_string()),
            ],
            1..120
        )
        .prop_map(|s| format!("[{}]", s.join(","))),
    ]
}

/// A generated path and what it is known to be.
#[derive(Clone, Debug)]
struct Deep {
    text: String,
    /// The deepest nesting anywhere in it.
    nesting: usize,
    /// The nesting reached before the core is.
    outer: usize,
    descendants: usize,
    poisoned: bool,
    /// A level took what it may not, unconverted: refused, or (where precedence
    /// lets the text mean something else) accepted.
    ill_typed: bool,
}

/// `$`, the outer segments, a filter holding `levels` wrapped around `core` (the
/// first level innermost), then the trailing segments. Unless `loose`, a level
/// that takes a value gets one (`count(@[?…])`) and one that takes a logical
/// expression gets one (`… == 1`).
fn build(
    outer: &[String],
    levels: &[Level],
    core: &Core,
    loose: bool,
    trailing: &[String],
) -> Deep {
    let mut x = core.text.clone();
    let mut sort = core.sort;
    let mut opened = 1;
    let mut descendants = core.descendants;
    let mut ill_typed = false;
    let mut convert = |x: &mut String, sort: Sort, wanted: Sort, opened: &mut usize| {
        if sort.fits(wanted) {
            return;
        }
        if loose {
            ill_typed = true;
        } else if wanted == Sort::Value {
            *x = Level::Count.wrap(x);
            *opened += 3;
        } else {
            *x = Level::Compare.wrap(x);
        }
    };
    for level in levels {
        let (takes, makes, opens) = level.sorts();
        convert(&mut x, sort, takes, &mut opened);
        x = level.wrap(&x);
        opened += opens;
        descendants += level.descendants();
        sort = makes;
    }
    convert(&mut x, sort, Sort::Logical, &mut opened);
    for s in outer.iter().chain(trailing) {
        descendants += s.matches("..").count();
    }
    Deep {
        text: format!("${}[?{x}]{}", outer.concat(), trailing.concat()),
        nesting: opened + core.nesting,
        outer: opened,
        descendants,
        poisoned: core.poisoned,
        ill_typed,
    }
}

/// Levels in runs of one kind, since a parser that re-reads a level re-reads all
/// the levels of its kind inside it, and a mix hides that.
fn levels() -> impl Strategy<Value = Vec<Level>> {
    let level = prop::sample::select(LEVELS.to_vec());
    let runs = |n: std::ops::Range<usize>, run: std::ops::Range<usize>| {
        prop::collection::vec((level.clone(), run), n).prop_map(|runs| {
            runs.into_iter()
                .flat_map(|(level, k)| std::iter::repeat_n(level, k))
                .collect::<Vec<_>>()
        })
    };
    prop_oneof![runs(0..12, 1..2), runs(1..4, 1..40), runs(0..6, 1..20)]
}

fn deep_path() -> impl Strategy<Value = Deep> {
    (
        prop::collection::vec(outer_segment(), 0..4),
        levels(),
        core(),
        prop::bool::weighted(0.15),
        prop::collection::vec(outer_segment(), 0..2),
    )
        .prop_map(|(outer, levels, core, loose, trailing)| {
            build(&outer, &levels, &core, loose, &trailing)
        })
}

/// A document of about 15,000 nodes, arrays of eight and objects over the
/// generated names, alternating four levels down: large enough that nested filters
/// and descendant segments over it run into the budget.
fn large_document() -> Value {
    fn level(depth: usize) -> Value {
        match depth {
            0 => json!(["a", 1, "ab", 2.5, null, true, "b", 0]),
            d if d % 2 == 0 => Value::Array((0..8).map(|_| level(d - 1)).collect()),
            d => Value::Object(
                ["a", "b", "c", "_x", "é"]
                    .iter()
                    .map(|k| (k.to_string(), level(d - 1)))
                    .collect(),
            ),
        }
    }
    level(4)
}

/// What the generated test saw, printed at its end.
#[derive(Debug, Default)]
struct Seen {
    cases: usize,
    refused_nesting: usize,
    refused_descendants: usize,
    refused_otherwise: usize,
    evaluated: usize,
    over_budget: usize,
    over_length: usize,
    deepest_generated: usize,
    deepest_accepted: usize,
    longest: usize,
    slowest_parse: Duration,
    slowest_parse_len: usize,
    parsing: Duration,
    parsed_bytes: usize,
    slowest_evaluation: Duration,
}

/// Checks one generated path: parsed within the bound, refused or accepted as its
/// construction says, and when accepted, evaluated to an end.
fn check_deep(d: &Deep, doc: &Value, seen: &RefCell<Seen>) -> Result<(), TestCaseError> {
    let (parsed, took) = parse_timed(&d.text).map_err(TestCaseError::fail)?;
    let len = d.text.len();
    {
        let mut s = seen.borrow_mut();
        s.cases += 1;
        s.over_length += usize::from(len > Limits::default().max_path_len);
        s.deepest_generated = s.deepest_generated.max(d.nesting);
        s.longest = s.longest.max(len);
        s.parsing += took;
        s.parsed_bytes += len;
        if took > s.slowest_parse {
            s.slowest_parse = took;
            s.slowest_parse_len = len;
        }
    }
    prop_assert!(
        took <= parse_bound(len),
        "parsing {len} bytes took {took:?}: {}",
        d.text
    );
    // A poisoned core may be refused for its poison before it opens its level.
    let too_deep = d.outer > MAX_NESTING || (d.nesting > MAX_NESTING && !d.poisoned);
    match &parsed {
        Err(e) if e.contains(TOO_DEEP) => {
            prop_assert!(
                d.nesting > MAX_NESTING,
                "{} refused as too deep: {e}",
                d.text
            );
            seen.borrow_mut().refused_nesting += 1;
        }
        _ if too_deep => prop_assert!(false, "{} (nesting {}): {parsed:?}", d.text, d.nesting),
        Err(e) if e.contains("descendant") => {
            prop_assert!(d.descendants > MAX_DESCENDANTS, "{}: {e}", d.text);
            seen.borrow_mut().refused_descendants += 1;
        }
        Err(e) => {
            prop_assert!(d.poisoned || d.ill_typed, "{} refused: {e}", d.text);
            seen.borrow_mut().refused_otherwise += 1;
        }
        Ok(path) => {
            prop_assert!(!d.poisoned, "{} accepted", d.text);
            prop_assert!(d.descendants <= MAX_DESCENDANTS, "{} accepted", d.text);
            let t = Instant::now();
            let got = path.select(doc, &mut Budget::default());
            let took = t.elapsed();
            let mut s = seen.borrow_mut();
            s.evaluated += 1;
            s.over_budget += usize::from(got.is_err());
            s.deepest_accepted = s.deepest_accepted.max(d.nesting);
            s.slowest_evaluation = s.slowest_evaluation.max(took);
        }
    }
    Ok(())
}

#[test]
fn deep_and_long_paths_are_refused_or_evaluated_and_parse_in_linear_time() {
    let mut runner = TestRunner::new(Config {
        cases: 3_000,
        source_file: Some(file!()),
        ..Config::default()
    });
    let seen = RefCell::new(Seen::default());
    let large = large_document();
    let documents = prop_oneof![4 => document(), 1 => Just(large)];
    let result = runner.run(&(deep_path(), documents), |(d, doc)| {
        check_deep(&d, &doc, &seen)
    });
    let s = seen.into_inner();
    eprintln!(
        "deep paths: {} cases; refused {} (nesting {}, descendants {}, otherwise {}); evaluated {} ({} over budget); {} over the {}-byte limit; deepest generated {}, deepest accepted {} (limit {MAX_NESTING}); longest {} bytes; parsing took {:?} a case on average ({} bytes), the slowest {:?} ({} bytes); slowest evaluation {:?}",
        s.cases,
        s.refused_nesting + s.refused_descendants + s.refused_otherwise,
        s.refused_nesting,
        s.refused_descendants,
        s.refused_otherwise,
        s.evaluated,
        s.over_budget,
        s.over_length,
        Limits::default().max_path_len,
        s.deepest_generated,
        s.deepest_accepted,
        s.longest,
        s.parsing / s.cases.max(1) as u32,
        s.parsed_bytes / s.cases.max(1),
        s.slowest_parse,
        s.slowest_parse_len,
        s.slowest_evaluation,
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    assert_eq!(
        s.deepest_accepted, MAX_NESTING,
        "the limit itself was reached"
    );
    assert!(s.refused_nesting > 0 && s.over_length > 0, "{s:?}");
}

/// `$[?length(length(…(@.v)…))>0]`, the function nested `depth` deep.
fn nested_lengths(depth: usize) -> String {
    format!("$[?{}@.v{}>0]", "length(".repeat(depth), ")".repeat(depth))
}

/// Parses within the bound, or panics saying how long it took.
fn parse_quickly(text: &str) -> Result<ValuePath, String> {
    let (parsed, took) = parse_timed(text).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        took <= parse_bound(text.len()),
        "parsing {} bytes took {took:?}: {text}",
        text.len()
    );
    eprintln!("{} bytes parsed in {took:?}", text.len());
    parsed
}

#[test]
fn a_function_nested_past_the_limit_is_refused_in_linear_time() {
    // A filter (1), 30 calls, the query inside them (1): 32 levels, the most.
    assert!(parse_quickly(&nested_lengths(30)).is_ok());
    for depth in [31, 32, 33, 64] {
        let e = parse_quickly(&nested_lengths(depth)).unwrap_err();
        assert!(e.contains(TOO_DEEP), "{depth}: {e}");
    }
    let mut longest = nested_lengths(62);
    longest = longest.replacen("@.v", &format!("@.{}", "v".repeat(8)), 1);
    assert_eq!(longest.len(), 512);
    let e = parse_quickly(&longest).unwrap_err();
    assert!(e.contains(TOO_DEEP), "{e}");
}

#[test]
fn an_error_at_the_bottom_of_a_deep_call_is_found_in_linear_time() {
    // At 30 calls the nesting is allowed, so the parser reaches the bottom and
    // must give up there once, not once per way of reading each level above.
    for bottom in [
        "@.v]",
        "@.v ==",
        "nope(@.v)",
        "'open",
        "@.",
        "@[01]",
        "!!@.v",
    ] {
        let text = nested_lengths(30).replacen("@.v", bottom, 1);
        assert!(parse_quickly(&text).is_err(), "{text}");
    }
    // Each level compared, which makes each argument a logical expression that
    // length() refuses; the refusal comes from the bottom up.
    let compared = format!("$[?{}@.v{}>0]", "length(".repeat(30), ") == 1".repeat(30));
    let e = parse_quickly(&compared).unwrap_err();
    assert!(e.contains("argument 1 of length()"), "{e}");
}

#[test]
fn inputs_the_generated_test_once_failed_on_are_answered_in_linear_time() {
    // Eight calls whose innermost argument is a logical expression match() does
    // not take: a parser that read each argument twice took 63 ms on it.
    let calls = format!(
        "$[?{}@.a && @.b||@.b && @.b||@.b && @.b && @.b && @.b && @.b && @.b||@.b && @.b||@.b||@.b||@.b && @.b && @.b||@.b||@.b||@.b && @.b||@.b && @.b && @.b||@.b||@.b && @.b||@.b && @.b||@.b||@.b||@.b{}]",
        "match(".repeat(8),
        ", 'a.*')".repeat(8)
    );
    assert!(
        parse_quickly(&calls)
            .unwrap_err()
            .contains("argument 1 of match()")
    );
    // A broken core whose own query would be the 33rd level: refused either way.
    assert!(parse_quickly("$[?count(@[?match(count(@[?match(count(@[?match(count(@[?(match(count(@[?@[?@[?count(@[?(@[?(@.a ==)])]) == 1]]]), 'a.*'))]), 'a.*')]), 'a.*')]), 'a.*')]) == 1]").is_err());
}

/// The path with as many of `level` around `core` as the nesting limit allows,
/// and the path with one more.
fn at_the_limit(level: Level, outer: &[String], core: &Core) -> (Deep, Deep) {
    let with = |k: usize| build(outer, &vec![level; k], core, false, &[]);
    let mut k = 0;
    while with(k + 1).nesting <= MAX_NESTING {
        k += 1;
    }
    (with(k), with(k + 1))
}

#[test]
fn every_construct_counts_toward_the_nesting_limit() {
    let core = core_of("@.a".into(), Sort::Singular, 1);
    for level in LEVELS {
        if level.sorts().2 == 0 {
            continue;
        }
        let (deepest, past) = at_the_limit(level, &[], &core);
        if deepest.descendants <= MAX_DESCENDANTS {
            assert!(
                parse_quickly(&deepest.text).is_ok(),
                "{level:?}: {}",
                deepest.text
            );
        }
        let e = parse_quickly(&past.text).unwrap_err();
        assert!(e.contains(TOO_DEEP), "{level:?}: {e}");
        let far = build(&[], &[level; 4 * MAX_NESTING], &core, false, &[]);
        let e = parse_quickly(&far.text).unwrap_err();
        assert!(e.contains(TOO_DEEP), "{level:?}: {e}");
    }
}

#[test]
fn long_chains_of_operators_and_segments_add_no_depth() {
    let doc: Value = serde_json::from_str(r#"[{"a": 1, "b": [1, 2]}, {"a": 2}]"#).unwrap();
    let ands = format!("$[?@.a{}]", " && @.a".repeat(70));
    let ors = format!("$[?@.x{}||@.a]", "||@.x".repeat(90));
    let members = format!("$.a{}", ".b".repeat(250));
    let selectors = format!("$[{}]", vec!["0"; 250].join(","));
    for text in [&ands, &ors, &members, &selectors] {
        assert!(text.len() <= 512, "{}", text.len());
        let path = parse_quickly(text).unwrap_or_else(|e| panic!("{e}"));
        assert!(path.select(&doc, &mut Budget::default()).is_ok());
    }
    // "!" takes a test, not another "!": refused, however many.
    assert!(parse_quickly(&format!("$[?{}@.a]", "!".repeat(500))).is_err());
    // Far past the length limit (which the API checks first) the parse stays linear.
    let huge = format!("$[?@.a{}]", " && @.a".repeat(20_000));
    assert!(parse_quickly(&huge).is_ok());
    let huge = format!("$[?{}@.a{}]", "(".repeat(20_000), ")".repeat(20_000));
    assert!(parse_quickly(&huge).unwrap_err().contains(TOO_DEEP));
}

#[test]
fn the_deepest_accepted_paths_evaluate_to_an_end_on_the_deepest_documents() {
    // 127 levels: as deep as serde_json reads.
    let arrays: Value =
        serde_json::from_str(&format!("{}1{}", "[".repeat(127), "]".repeat(127))).unwrap();
    let objects: Value =
        serde_json::from_str(&format!("{}1{}", r#"{"a": ["#.repeat(63), "]}".repeat(63))).unwrap();
    let outer = ["..*".to_string()];
    let core = core_of("@..a".into(), Sort::Logical, 1);
    for level in LEVELS {
        let (deepest, _) = if level == Level::DescendantFilter {
            // One of them, holding plain filters: its ".." is the second.
            let mut levels = vec![Level::Filter; (MAX_NESTING - 2) / 2 - 1];
            levels.push(level);
            let d = build(
                &outer,
                &levels,
                &core_of("@.a".into(), Sort::Singular, 1),
                false,
                &[],
            );
            assert_eq!(d.nesting, MAX_NESTING);
            (d.clone(), d)
        } else if matches!(level, Level::And | Level::Or) {
            let d = build(&outer, &[level; 60], &core, false, &[]);
            (d.clone(), d)
        } else {
            at_the_limit(level, &outer, &core)
        };
        let path = parse_quickly(&deepest.text).unwrap_or_else(|e| panic!("{level:?}: {e}"));
        for doc in [&arrays, &objects] {
            let t = Instant::now();
            let got = path.select(doc, &mut Budget::default());
            eprintln!(
                "{level:?}, nesting {}: evaluated in {:?} ({})",
                deepest.nesting,
                t.elapsed(),
                if got.is_ok() { "ended" } else { "over budget" }
            );
        }
    }
}
