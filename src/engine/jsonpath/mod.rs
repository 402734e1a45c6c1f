//! JSONPath (RFC 9535), parsed and evaluated here under a [`Budget`].
//!
//! The query is a stranger's and so is the document: `$..*..*..*` over a 3.6 KB
//! document selects hundreds of millions of nodes, and `$[*,*][*,*]…` doubles its
//! node list at every segment. Evaluation therefore counts every node it touches and
//! every value it produces against a budget, and stops with [`Exceeded`] instead of
//! growing without bound. (The `serde_json_path` crate, used before, evaluates
//! eagerly with no way to bound or inspect a query, so this module owns the parser
//! and the evaluator; the tests check it against that crate on generated queries.)
//!
//! Everything in RFC 9535 is here: child and descendant segments; name, wildcard,
//! index, slice and filter selectors; comparisons, `&&`, `||`, `!`, existence tests;
//! and the functions `length`, `count`, `match`, `search` and `value`, type-checked
//! at parse time as §2.4.3 requires. Object members are visited in the order
//! `serde_json` keeps them (sorted by key), as the RFC leaves it to implementations.
//!
//! The query's tree, its limits and its budget are here; the parser is in `parse`,
//! the evaluator in `eval`.
//!
//! Pure: no I/O, no clock.

use std::fmt;

use serde_json::{Number, Value};

mod eval;
mod parse;

/// Most nodes one evaluation may touch (selected, examined by a wildcard or a
/// filter, or passed on the way down a descendant segment).
pub const MAX_NODES: u64 = 100_000;
/// Most bytes of values one evaluation may produce (state values as text).
pub const MAX_BYTES: u64 = 1024 * 1024;
/// How deeply filters, parentheses, function calls and the queries in filters may
/// nest, counted together. Every recursion of the parser passes through one of
/// these four, and so does every recursion of the evaluator but those down the
/// document (a descendant segment, comparing two values), whose depth
/// `serde_json` bounds at 128: so this bounds the stack both take for a stranger's
/// query. `&&` and `||` chains are loops, and `!` takes only a query, a call or a
/// parenthesis, so neither adds depth of its own.
pub const MAX_NESTING: usize = 32;
/// Most descendant (`..`) segments in one query, nested queries included: two are
/// already quadratic in the document; more are refused when the wait is created.
pub const MAX_DESCENDANTS: usize = 2;

/// What one evaluation may still spend. One budget covers everything a poll
/// evaluates (the state path and the error path).
#[derive(Clone, Debug)]
pub struct Budget {
    nodes: u64,
    bytes: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            nodes: MAX_NODES,
            bytes: MAX_BYTES,
        }
    }
}

/// Why an evaluation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exceeded {
    Nodes,
    Bytes,
}

impl fmt::Display for Exceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exceeded::Nodes => write!(
                f,
                "evaluating the path touched more than 100,000 nodes of the response, the most one poll may"
            ),
            Exceeded::Bytes => write!(
                f,
                "the path selected more than {} MiB of values, the most one poll may",
                MAX_BYTES / (1024 * 1024)
            ),
        }
    }
}

impl Budget {
    /// Spends `n` nodes.
    pub fn nodes(&mut self, n: u64) -> Result<(), Exceeded> {
        self.nodes = self.nodes.checked_sub(n).ok_or(Exceeded::Nodes)?;
        Ok(())
    }

    /// Spends `n` bytes of produced values.
    pub fn bytes(&mut self, n: u64) -> Result<(), Exceeded> {
        self.bytes = self.bytes.checked_sub(n).ok_or(Exceeded::Bytes)?;
        Ok(())
    }

    /// Bytes still allowed.
    pub fn bytes_left(&self) -> u64 {
        self.bytes
    }
}

/// A parsed query: `$` (the root) or `@` (the current node, inside filters) and
/// its segments.
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    relative: bool,
    segments: Vec<Segment>,
}

#[derive(Clone, Debug, PartialEq)]
struct Segment {
    descendant: bool,
    selectors: Vec<Selector>,
}

#[derive(Clone, Debug, PartialEq)]
enum Selector {
    Name(String),
    Wildcard,
    Index(i64),
    Slice {
        start: Option<i64>,
        end: Option<i64>,
        step: Option<i64>,
    },
    Filter(Logical),
}

#[derive(Clone, Debug, PartialEq)]
enum Logical {
    Or(Vec<Logical>),
    And(Vec<Logical>),
    Not(Box<Logical>),
    Compare(Comparable, Op, Comparable),
    /// An existence test: the query selects at least one node.
    Exists(Query),
    /// A function returning a logical value (`match`, `search`).
    Call(Call),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Clone, Debug, PartialEq)]
enum Comparable {
    Literal(Value),
    /// A singular query: at most one node.
    Query(Query),
    Call(Call),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Func {
    Length,
    Count,
    Match,
    Search,
    Value,
}

/// The three types of RFC 9535 §2.4.1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Type {
    Value,
    Logical,
    Nodes,
}

impl Func {
    fn named(name: &str) -> Option<Func> {
        Some(match name {
            "length" => Func::Length,
            "count" => Func::Count,
            "match" => Func::Match,
            "search" => Func::Search,
            "value" => Func::Value,
            _ => return None,
        })
    }

    fn params(self) -> &'static [Type] {
        match self {
            Func::Length => &[Type::Value],
            Func::Count | Func::Value => &[Type::Nodes],
            Func::Match | Func::Search => &[Type::Value, Type::Value],
        }
    }

    fn result(self) -> Type {
        match self {
            Func::Length | Func::Count | Func::Value => Type::Value,
            Func::Match | Func::Search => Type::Logical,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Func::Length => "length",
            Func::Count => "count",
            Func::Match => "match",
            Func::Search => "search",
            Func::Value => "value",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Call {
    func: Func,
    args: Vec<Arg>,
}

#[derive(Clone, Debug, PartialEq)]
enum Arg {
    Literal(Value),
    Query(Query),
    Logical(Logical),
    Call(Call),
}

/// A parse failure: what is wrong, and the byte offset where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub at: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.at)
    }
}

impl Query {
    /// Parses a whole query (`$…`).
    pub fn parse(text: &str) -> Result<Query, ParseError> {
        parse::query(text)
    }

    /// Whether it selects at most one node: names and indexes, no descendants.
    fn is_singular(&self) -> bool {
        self.segments.iter().all(|s| {
            !s.descendant
                && matches!(
                    s.selectors.as_slice(),
                    [Selector::Name(_)] | [Selector::Index(_)]
                )
        })
    }

    /// The nodes the query selects from `root`, in order.
    pub fn select<'a>(
        &self,
        root: &'a Value,
        budget: &mut Budget,
    ) -> Result<Vec<&'a Value>, Exceeded> {
        eval::select(self, root, budget)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sel(path: &str, doc: &Value) -> Vec<Value> {
        Query::parse(path)
            .unwrap_or_else(|e| panic!("{path}: {e}"))
            .select(doc, &mut Budget::default())
            .unwrap()
            .into_iter()
            .cloned()
            .collect()
    }

    #[test]
    fn the_rfc_examples_select_what_the_rfc_says() {
        // RFC 9535 §1.5's bookstore, and a few of its tables.
        let doc = json!({"store": {
            "book": [
                {"category": "reference", "author": "Nigel Rees", "title": "Sayings of the Century", "price": 8.95},
                {"category": "fiction", "author": "Evelyn Waugh", "title": "Sword of Honour", "price": 12.99},
                {"category": "fiction", "author": "Herman Melville", "title": "Moby Dick", "isbn": "0-553-21311-3", "price": 8.99},
                {"category": "fiction", "author": "J. R. R. Tolkien", "title": "The Lord of the Rings", "isbn": "0-395-19395-8", "price": 22.99}
            ],
            "bicycle": {"color": "red", "price": 399}
        }});
        assert_eq!(sel("$.store.book[*].author", &doc).len(), 4);
        assert_eq!(sel("$..author", &doc).len(), 4);
        assert_eq!(sel("$.store..price", &doc).len(), 5);
        assert_eq!(
            sel("$..book[2].author", &doc),
            vec![json!("Herman Melville")]
        );
        assert_eq!(
            sel("$..book[-1].title", &doc),
            vec![json!("The Lord of the Rings")]
        );
        assert_eq!(sel("$..book[:2]", &doc).len(), 2);
        assert_eq!(sel("$..book[?@.isbn]", &doc).len(), 2);
        assert_eq!(sel("$..book[?@.price<10].title", &doc).len(), 2);
        assert_eq!(
            sel(
                "$..book[?(@.price < 10 && @.category == 'fiction')].title",
                &doc
            ),
            vec![json!("Moby Dick")]
        );
        assert_eq!(sel("$..book[?length(@.title) > 20].title", &doc).len(), 2);
        assert_eq!(
            sel("$..book[?match(@.author, 'J.*')].author", &doc),
            vec![json!("J. R. R. Tolkien")]
        );
        assert_eq!(
            sel("$..book[?search(@.author, 'Mel')].author", &doc),
            vec![json!("Herman Melville")]
        );
        assert_eq!(sel("$.store.book[?count(@.*) == 5].title", &doc).len(), 2);
        assert_eq!(sel("$..*", &doc).len(), 27);
        let arr = json!(["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(sel("$[1:3]", &arr), vec![json!("b"), json!("c")]);
        assert_eq!(sel("$[5:]", &arr), vec![json!("f"), json!("g")]);
        assert_eq!(sel("$[1:5:2]", &arr), vec![json!("b"), json!("d")]);
        assert_eq!(sel("$[5:1:-2]", &arr), vec![json!("f"), json!("d")]);
        assert_eq!(sel("$[::-1]", &arr).len(), 7);
        assert_eq!(sel("$[0,0]", &arr), vec![json!("a"), json!("a")]);
    }

    #[test]
    fn comparisons_follow_rfc_table_11_where_other_implementations_differ() {
        // RFC 9535 Table 11, evaluated as filters on a one-element array.
        let doc = json!({"obj": {"x": "y"}, "arr": [2, 3]});
        let holds = |expr: &str| !sel(&format!("$[?{expr}]"), &json!([doc.clone()])).is_empty();
        assert!(holds("$[0].absent1 == $[0].absent2"));
        assert!(holds("$[0].absent1 <= $[0].absent2"), "== implies <=");
        assert!(!holds("$[0].absent == 'g'"));
        assert!(!holds("$[0].absent1 != $[0].absent2"));
        assert!(holds("$[0].absent != 'g'"));
        assert!(holds("1 <= 2"));
        assert!(!holds("1 > 2"));
        assert!(!holds("13 == '13'"));
        assert!(holds("'a' <= 'b'"));
        assert!(!holds("'a' > 'b'"));
        assert!(holds("$[0].obj == $[0].obj"));
        assert!(!holds("$[0].obj != $[0].obj"));
        assert!(holds("$[0].arr == $[0].arr"));
        assert!(!holds("$[0].obj == 17"));
        assert!(holds("$[0].obj != 17"));
        assert!(!holds("$[0].obj <= $[0].arr"));
        assert!(!holds("$[0].obj < $[0].arr"));
        assert!(holds("$[0].obj <= $[0].obj"));
        assert!(!holds("1 <= $[0].arr"));
        assert!(!holds("1 >= $[0].arr"));
        assert!(holds("true <= true"), "== implies <=");
        assert!(!holds("true > true"));
        // A singular query's negative index counts from the end, as anywhere else.
        assert_eq!(sel("$[?@ == $[-1]]", &json!([1, 2, 3])), vec![json!(3)]);
        // Blanks may stand between segments, a descendant one too.
        assert_eq!(sel("$ ..a", &json!({"a": 1})), vec![json!(1)]);
    }

    #[test]
    fn ill_typed_and_malformed_queries_are_refused_with_a_position() {
        for bad in [
            "",
            "$.",
            "$[",
            "$[01]",
            "$[-0]",
            "$['a'",
            "$.a ",
            "$[?@.a==]",
            "$[?length(@.*) == 1]",
            "$[?length(@.a)]",
            "$[?count(@.a) == 1 == 2]",
            "$[?match(@.a)]",
            "$[?1]",
            "$[?foo(@.a)]",
            "$[?@.* == 1]",
            "$[9007199254740992]",
            "$..a..b..c",
            "$.1a",
            "$['\\x']",
        ] {
            assert!(Query::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn comparing_large_values_for_every_node_stops_at_the_budget() {
        // Each of 2,000 children compares two 60,000-entry arrays, or counts or
        // compares a 900 KB string: hundreds of millions of steps if comparing
        // were free.
        let big: Vec<Value> = (0..60_000).map(|i| json!(i)).collect();
        let doc = json!({"x": big, "y": big, "s": "x".repeat(900_000), "items": vec![0; 2_000]});
        for q in [
            "$.items[?$.x == $.y]",
            "$.items[?$.x != $.y]",
            "$.items[?length($.s) > 1]",
            "$.items[?$.s == $.s]",
            "$.items[?$.s <= $.s]",
        ] {
            let got = Query::parse(q)
                .unwrap()
                .select(&doc, &mut Budget::default());
            assert_eq!(got, Err(Exceeded::Nodes), "{q}");
        }
        // Small values compare as before: a node per entry, nothing per scalar.
        assert_eq!(
            sel(
                "$[?@.a == $[0].a]",
                &json!([{"a": [1, 2]}, {"a": [1, 2]}, {"a": [2]}])
            )
            .len(),
            2
        );
    }

    #[test]
    fn an_explosive_query_stops_at_its_budget_instead_of_growing() {
        // A 120-deep object, three keys a level: `$..*..*` alone selects ~65,000 nodes.
        let mut doc = json!("leaf");
        for _ in 0..120 {
            doc = json!({"a": doc, "b": 1, "c": 2});
        }
        let q = Query::parse("$..*..*").unwrap();
        let mut budget = Budget::default();
        let got = q.select(&doc, &mut budget);
        assert!(
            matches!(got, Ok(ref v) if v.len() > 20_000),
            "{:?}",
            got.as_ref().map(Vec::len)
        );
        let q = Query::parse(
            "$[*,*,*,*][*,*,*,*][*,*,*,*][*,*,*,*][*,*,*,*][*,*,*,*][*,*,*,*][*,*,*,*][*,*,*,*]",
        )
        .unwrap();
        let wide = json!([[[[[[[[[1]]]]]]]]]);
        assert_eq!(
            q.select(&wide, &mut Budget::default()),
            Err(Exceeded::Nodes)
        );
        let flat = Value::Array(vec![json!(1); 200_000]);
        let q = Query::parse("$..*").unwrap();
        assert_eq!(
            q.select(&flat, &mut Budget::default()),
            Err(Exceeded::Nodes)
        );
    }
}
