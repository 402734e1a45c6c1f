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
//! Pure: no I/O, no clock.

use std::fmt;

use serde_json::{Number, Value};

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
        let mut p = Parser {
            s: text.as_bytes(),
            text,
            i: 0,
            depth: 0,
            descendants: 0,
        };
        if !p.eat(b'$') {
            return Err(p.error("a JSONPath starts with \"$\""));
        }
        let segments = p.segments()?;
        if p.i != p.s.len() {
            return Err(p.error("unexpected text; a segment starts with \".\", \"..\" or \"[\""));
        }
        if p.descendants > MAX_DESCENDANTS {
            return Err(ParseError {
                at: 0,
                message: format!(
                    "it has {} descendant (\"..\") segments; at most {MAX_DESCENDANTS} are allowed, since each one multiplies the work by the size of the document",
                    p.descendants
                ),
            });
        }
        Ok(Query {
            relative: false,
            segments,
        })
    }

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
        super::pattern::begin_evaluation();
        let mut cx = Eval { root, budget };
        cx.query(self, root)
    }
}

struct Parser<'t> {
    s: &'t [u8],
    text: &'t str,
    i: usize,
    depth: usize,
    descendants: usize,
}

fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl Parser<'_> {
    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError {
            at: self.i,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn eat(&mut self, b: u8) -> bool {
        if self.peek() == Some(b) {
            self.i += 1;
            true
        } else {
            false
        }
    }

    fn eat_str(&mut self, s: &str) -> bool {
        if self.s[self.i..].starts_with(s.as_bytes()) {
            self.i += s.len();
            true
        } else {
            false
        }
    }

    fn blanks(&mut self) {
        while self.peek().is_some_and(is_blank) {
            self.i += 1;
        }
    }

    fn expect(&mut self, b: u8, what: &str) -> Result<(), ParseError> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(self.error(format!("expected {what}")))
        }
    }

    fn nest(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.error(format!(
                "filters, parentheses, function calls and the queries in filters nest more than {MAX_NESTING} levels deep here; at most {MAX_NESTING} levels are allowed"
            )));
        }
        Ok(())
    }

    /// `*(S segment)`: blanks are consumed only when a segment follows them.
    fn segments(&mut self) -> Result<Vec<Segment>, ParseError> {
        let mut out = Vec::new();
        loop {
            let save = self.i;
            self.blanks();
            match self.peek() {
                Some(b'.') | Some(b'[') => out.push(self.segment()?),
                _ => {
                    self.i = save;
                    return Ok(out);
                }
            }
        }
    }

    fn segment(&mut self) -> Result<Segment, ParseError> {
        if self.eat_str("..") {
            self.descendants += 1;
            let selectors = match self.peek() {
                Some(b'[') => self.bracketed()?,
                Some(b'*') => {
                    self.i += 1;
                    vec![Selector::Wildcard]
                }
                _ => vec![Selector::Name(self.member_name()?)],
            };
            return Ok(Segment {
                descendant: true,
                selectors,
            });
        }
        if self.eat(b'.') {
            let selectors = if self.eat(b'*') {
                vec![Selector::Wildcard]
            } else {
                vec![Selector::Name(self.member_name()?)]
            };
            return Ok(Segment {
                descendant: false,
                selectors,
            });
        }
        Ok(Segment {
            descendant: false,
            selectors: self.bracketed()?,
        })
    }

    /// `member-name-shorthand`: ALPHA / "_" / non-ASCII first, then those or digits.
    fn member_name(&mut self) -> Result<String, ParseError> {
        let rest = &self.text[self.i..];
        let mut end = 0;
        for (k, c) in rest.char_indices() {
            let ok = c.is_ascii_alphabetic()
                || c == '_'
                || (c as u32 >= 0x80)
                || (k > 0 && c.is_ascii_digit());
            if !ok {
                break;
            }
            end = k + c.len_utf8();
        }
        if end == 0 {
            return Err(self.error(
                "expected a member name (letters, digits, \"_\"; not starting with a digit), \"*\" or \"[\"",
            ));
        }
        self.i += end;
        Ok(rest[..end].to_string())
    }

    fn bracketed(&mut self) -> Result<Vec<Selector>, ParseError> {
        self.expect(b'[', "\"[\"")?;
        let mut out = Vec::new();
        loop {
            self.blanks();
            out.push(self.selector()?);
            self.blanks();
            if self.eat(b',') {
                continue;
            }
            self.expect(b']', "\",\" or \"]\" after a selector")?;
            return Ok(out);
        }
    }

    fn selector(&mut self) -> Result<Selector, ParseError> {
        match self.peek() {
            Some(b'\'') | Some(b'"') => Ok(Selector::Name(self.string()?)),
            Some(b'*') => {
                self.i += 1;
                Ok(Selector::Wildcard)
            }
            Some(b'?') => {
                self.i += 1;
                self.blanks();
                self.nest()?;
                let f = self.logical()?;
                self.depth -= 1;
                Ok(Selector::Filter(f))
            }
            _ => self.index_or_slice(),
        }
    }

    fn index_or_slice(&mut self) -> Result<Selector, ParseError> {
        let start = self.opt_int()?;
        self.blanks();
        if !self.eat(b':') {
            return match start {
                Some(i) => Ok(Selector::Index(i)),
                None => Err(self.error(
                    "expected a selector: a quoted name, \"*\", an index, a slice or a filter \"?…\"",
                )),
            };
        }
        self.blanks();
        let end = self.opt_int()?;
        self.blanks();
        let mut step = None;
        if self.eat(b':') {
            self.blanks();
            step = self.opt_int()?;
        }
        Ok(Selector::Slice { start, end, step })
    }

    fn opt_int(&mut self) -> Result<Option<i64>, ParseError> {
        match self.peek() {
            Some(b'-') | Some(b'0'..=b'9') => self.int().map(Some),
            _ => Ok(None),
        }
    }

    /// `int = "0" / (["-"] DIGIT1 *DIGIT)`, within I-JSON's exact range.
    fn int(&mut self) -> Result<i64, ParseError> {
        let start = self.i;
        let neg = self.eat(b'-');
        let digits_at = self.i;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        let digits = &self.text[digits_at..self.i];
        if digits.is_empty() {
            return Err(self.error("expected digits"));
        }
        if digits.starts_with('0') && (digits.len() > 1 || neg) {
            self.i = start;
            return Err(self.error("an integer has no leading zeros (and no \"-0\")"));
        }
        const LIMIT: i64 = (1 << 53) - 1;
        match self.text[start..self.i].parse::<i64>() {
            Ok(n) if (-LIMIT..=LIMIT).contains(&n) => Ok(n),
            _ => {
                self.i = start;
                Err(self.error(format!("an integer must be within ±{LIMIT}")))
            }
        }
    }

    /// A single- or double-quoted string literal, with JSON-like escapes.
    fn string(&mut self) -> Result<String, ParseError> {
        let quote = self.peek().ok_or_else(|| self.error("expected a string"))?;
        self.i += 1;
        let mut out = String::new();
        loop {
            let rest = &self.text[self.i..];
            let Some(c) = rest.chars().next() else {
                return Err(self.error("the string is not closed"));
            };
            if c as u32 == quote as u32 {
                self.i += 1;
                return Ok(out);
            }
            if c == '\\' {
                self.i += 1;
                let e = self
                    .peek()
                    .ok_or_else(|| self.error("the string is not closed"))?;
                self.i += 1;
                match e {
                    b'b' => out.push('\u{8}'),
                    b'f' => out.push('\u{c}'),
                    b'n' => out.push('\n'),
                    b'r' => out.push('\r'),
                    b't' => out.push('\t'),
                    b'/' => out.push('/'),
                    b'\\' => out.push('\\'),
                    b'\'' | b'"' if e == quote => out.push(e as char),
                    b'u' => out.push(self.unicode_escape()?),
                    _ => {
                        self.i -= 1;
                        return Err(self.error("not a valid escape in a string"));
                    }
                }
                continue;
            }
            if (c as u32) < 0x20 {
                return Err(self.error("a control character must be escaped in a string"));
            }
            out.push(c);
            self.i += c.len_utf8();
        }
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let h = self
            .text
            .get(self.i..self.i + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| self.error("\\u needs four hexadecimal digits"))?;
        self.i += 4;
        Ok(u32::from_str_radix(h, 16).unwrap_or(0))
    }

    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let hi = self.hex4()?;
        if (0xDC00..0xE000).contains(&hi) {
            return Err(self.error("a lone low surrogate is not a character"));
        }
        if (0xD800..0xDC00).contains(&hi) {
            if !self.eat_str("\\u") {
                return Err(self.error("a high surrogate must be followed by a low one"));
            }
            let lo = self.hex4()?;
            if !(0xDC00..0xE000).contains(&lo) {
                return Err(self.error("a high surrogate must be followed by a low one"));
            }
            let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
            return char::from_u32(c).ok_or_else(|| self.error("not a character"));
        }
        char::from_u32(hi).ok_or_else(|| self.error("not a character"))
    }

    fn logical(&mut self) -> Result<Logical, ParseError> {
        let first = self.and()?;
        self.logical_from(first)
    }

    /// The rest of a `||` chain whose first operand is parsed. A loop, not a
    /// recursion: a long chain costs no depth.
    fn logical_from(&mut self, first: Logical) -> Result<Logical, ParseError> {
        let mut ors = vec![first];
        loop {
            let save = self.i;
            self.blanks();
            if self.eat_str("||") {
                self.blanks();
                ors.push(self.and()?);
            } else {
                self.i = save;
                break;
            }
        }
        Ok(if ors.len() == 1 {
            ors.pop().expect("one")
        } else {
            Logical::Or(ors)
        })
    }

    fn and(&mut self) -> Result<Logical, ParseError> {
        let first = self.basic()?;
        self.and_from(first)
    }

    /// The rest of a `&&` chain whose first operand is parsed (a loop, as `||`).
    fn and_from(&mut self, first: Logical) -> Result<Logical, ParseError> {
        let mut ands = vec![first];
        loop {
            let save = self.i;
            self.blanks();
            if self.eat_str("&&") {
                self.blanks();
                ands.push(self.basic()?);
            } else {
                self.i = save;
                break;
            }
        }
        Ok(if ands.len() == 1 {
            ands.pop().expect("one")
        } else {
            Logical::And(ands)
        })
    }

    /// `paren-expr / comparison-expr / test-expr`.
    fn basic(&mut self) -> Result<Logical, ParseError> {
        if self.peek() == Some(b'!') {
            self.i += 1;
            self.blanks();
            if self.peek() == Some(b'(') {
                return Ok(Logical::Not(Box::new(self.paren()?)));
            }
            let test = self.test()?;
            return Ok(Logical::Not(Box::new(test)));
        }
        if self.peek() == Some(b'(') {
            return self.paren();
        }
        let start = self.i;
        // A comparison starts with a comparable; a test with a query or a call.
        let left = self.comparable_or_test()?;
        self.basic_from(start, left)
    }

    /// A comparison or a test whose first operand, begun at `start`, is parsed.
    fn basic_from(&mut self, start: usize, left: Operand) -> Result<Logical, ParseError> {
        let save = self.i;
        self.blanks();
        if let Some(op) = self.op() {
            self.blanks();
            let left = match left {
                Operand::Comparable(c) => c,
                Operand::Test(_) => {
                    self.i = start;
                    return Err(self.error(
                        "only a literal, a singular query (one name or index per segment) or a function returning a value can be compared",
                    ));
                }
            };
            let right_at = self.i;
            let right = match self.comparable_or_test()? {
                Operand::Comparable(c) => c,
                Operand::Test(_) => {
                    self.i = right_at;
                    return Err(self.error(
                        "only a literal, a singular query (one name or index per segment) or a function returning a value can be compared",
                    ));
                }
            };
            return Ok(Logical::Compare(left, op, right));
        }
        self.i = save;
        match left {
            Operand::Test(t) => Ok(t),
            Operand::Comparable(Comparable::Query(q)) => Ok(Logical::Exists(q)),
            Operand::Comparable(Comparable::Literal(_)) => {
                self.i = start;
                Err(self.error("a literal on its own is not a test; compare it with something"))
            }
            Operand::Comparable(Comparable::Call(c)) => {
                self.i = start;
                Err(self.error(format!(
                    "{}() returns a value, not true or false; compare it, e.g. {}(…) == 1",
                    c.func.name(),
                    c.func.name()
                )))
            }
        }
    }

    fn paren(&mut self) -> Result<Logical, ParseError> {
        self.expect(b'(', "\"(\"")?;
        self.nest()?;
        self.blanks();
        let inner = self.logical()?;
        self.blanks();
        self.expect(b')', "\")\"")?;
        self.depth -= 1;
        Ok(inner)
    }

    /// A test expression after `!`: a query or a logical function.
    fn test(&mut self) -> Result<Logical, ParseError> {
        let start = self.i;
        match self.comparable_or_test()? {
            Operand::Test(t) => Ok(t),
            Operand::Comparable(Comparable::Query(q)) => Ok(Logical::Exists(q)),
            _ => {
                self.i = start;
                Err(self.error("\"!\" must be followed by a query, a test function or \"(\""))
            }
        }
    }

    fn op(&mut self) -> Option<Op> {
        for (text, op) in [
            ("==", Op::Eq),
            ("!=", Op::Ne),
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("<", Op::Lt),
            (">", Op::Gt),
        ] {
            if self.eat_str(text) {
                return Some(op);
            }
        }
        None
    }

    /// A literal, a query or a function call; queries that are not singular and
    /// logical calls can only be tests.
    fn comparable_or_test(&mut self) -> Result<Operand, ParseError> {
        match self.peek() {
            Some(b'@') | Some(b'$') => {
                let q = self.filter_query()?;
                Ok(if q.is_singular() {
                    Operand::Comparable(Comparable::Query(q))
                } else {
                    Operand::Test(Logical::Exists(q))
                })
            }
            Some(b'a'..=b'z') if !self.at_keyword() => {
                let call = self.call()?;
                Ok(match call.func.result() {
                    Type::Value => Operand::Comparable(Comparable::Call(call)),
                    _ => Operand::Test(Logical::Call(call)),
                })
            }
            _ => Ok(Operand::Comparable(Comparable::Literal(self.literal()?))),
        }
    }

    fn at_keyword(&self) -> bool {
        ["true", "false", "null"].iter().any(|k| {
            self.s[self.i..].starts_with(k.as_bytes())
                && !self
                    .s
                    .get(self.i + k.len())
                    .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
        })
    }

    fn filter_query(&mut self) -> Result<Query, ParseError> {
        let relative = match self.peek() {
            Some(b'@') => true,
            Some(b'$') => false,
            _ => return Err(self.error("expected \"@\" or \"$\"")),
        };
        self.i += 1;
        self.nest()?;
        let segments = self.segments()?;
        self.depth -= 1;
        Ok(Query { relative, segments })
    }

    fn literal(&mut self) -> Result<Value, ParseError> {
        match self.peek() {
            Some(b'\'') | Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b'-') | Some(b'0'..=b'9') => self.number(),
            _ => {
                for (k, v) in [
                    ("true", Value::Bool(true)),
                    ("false", Value::Bool(false)),
                    ("null", Value::Null),
                ] {
                    if self.at_keyword() && self.eat_str(k) {
                        return Ok(v);
                    }
                }
                Err(self.error(
                    "expected a literal (a string, number, true, false or null), a query (@… or $…) or a function",
                ))
            }
        }
    }

    /// `number = (int / "-0") [ frac ] [ exp ]`.
    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.i;
        self.eat(b'-');
        let digits_at = self.i;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        let digits = &self.text[digits_at..self.i];
        if digits.is_empty() || (digits.starts_with('0') && digits.len() > 1) {
            self.i = start;
            return Err(self.error("not a valid number"));
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.i += 1;
            let at = self.i;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.i += 1;
            }
            if self.i == at {
                return Err(self.error("a fraction needs digits after \".\""));
            }
            float = true;
        }
        if matches!(self.peek(), Some(b'e') | Some(b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'-') | Some(b'+')) {
                self.i += 1;
            }
            let at = self.i;
            while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                self.i += 1;
            }
            if self.i == at {
                return Err(self.error("an exponent needs digits"));
            }
            float = true;
        }
        let text = &self.text[start..self.i];
        if !float
            && text != "-0"
            && let Ok(n) = text.parse::<i64>()
        {
            return Ok(Value::Number(n.into()));
        }
        text.parse::<f64>()
            .ok()
            .and_then(Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| {
                self.i = start;
                self.error("the number is out of range")
            })
    }

    fn call(&mut self) -> Result<Call, ParseError> {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            self.i += 1;
        }
        let name = &self.text[start..self.i];
        let func = Func::named(name).ok_or_else(|| ParseError {
            at: start,
            message: format!(
                "\"{name}\" is not a function; the functions are length, count, match, search and value"
            ),
        })?;
        self.expect(b'(', "\"(\" after the function name")?;
        self.nest()?;
        let mut args = Vec::new();
        self.blanks();
        if self.peek() != Some(b')') {
            loop {
                let at = self.i;
                let arg = self.argument()?;
                let want = func.params().get(args.len()).copied();
                let Some(want) = want else {
                    self.i = at;
                    return Err(self.error(format!(
                        "{}() takes {} argument{}",
                        func.name(),
                        func.params().len(),
                        if func.params().len() == 1 { "" } else { "s" }
                    )));
                };
                if !arg_fits(&arg, want) {
                    self.i = at;
                    return Err(self.error(format!(
                        "argument {} of {}() must be {}",
                        args.len() + 1,
                        func.name(),
                        match want {
                            Type::Value =>
                                "a value: a literal, a singular query or a function returning a value",
                            Type::Nodes => "a query",
                            Type::Logical => "a logical expression",
                        }
                    )));
                }
                args.push(arg);
                self.blanks();
                if self.eat(b',') {
                    self.blanks();
                    continue;
                }
                break;
            }
        }
        self.expect(b')', "\",\" or \")\" in the function call")?;
        self.depth -= 1;
        if args.len() != func.params().len() {
            return Err(ParseError {
                at: start,
                message: format!(
                    "{}() takes {} argument{}",
                    func.name(),
                    func.params().len(),
                    if func.params().len() == 1 { "" } else { "s" }
                ),
            });
        }
        Ok(Call { func, args })
    }

    /// `literal / filter-query / logical-expr / function-expr`.
    ///
    /// Every reading but a parenthesised or negated expression begins with one
    /// operand (a literal, a query or a call), so that operand is parsed once and
    /// what follows it decides the reading: the end of the argument leaves it
    /// standing alone, anything else continues it as a logical expression. Trying
    /// one reading and re-parsing for the other would parse a call nested n deep
    /// 2^n times.
    fn argument(&mut self) -> Result<Arg, ParseError> {
        let logical = if matches!(self.peek(), Some(b'!' | b'(')) {
            self.logical()?
        } else {
            let start = self.i;
            let first = self.comparable_or_test()?;
            let save = self.i;
            self.blanks();
            let ends = matches!(self.peek(), Some(b',' | b')'));
            self.i = save;
            if ends {
                return Ok(match first {
                    Operand::Comparable(Comparable::Literal(v)) => Arg::Literal(v),
                    Operand::Comparable(Comparable::Query(q))
                    | Operand::Test(Logical::Exists(q)) => Arg::Query(q),
                    Operand::Comparable(Comparable::Call(c)) | Operand::Test(Logical::Call(c)) => {
                        Arg::Call(c)
                    }
                    Operand::Test(other) => Arg::Logical(other),
                });
            }
            let basic = self.basic_from(start, first)?;
            let and = self.and_from(basic)?;
            self.logical_from(and)?
        };
        Ok(match logical {
            Logical::Exists(q) => Arg::Query(q),
            Logical::Call(c) => Arg::Call(c),
            other => Arg::Logical(other),
        })
    }
}

enum Operand {
    Comparable(Comparable),
    Test(Logical),
}

/// Whether an argument has (or converts to) the parameter's type (§2.4.3).
fn arg_fits(arg: &Arg, want: Type) -> bool {
    match (arg, want) {
        (Arg::Literal(_), Type::Value) => true,
        (Arg::Query(q), Type::Value) => q.is_singular(),
        (Arg::Query(_), Type::Nodes | Type::Logical) => true,
        (Arg::Logical(_), Type::Logical) => true,
        (Arg::Call(c), want) => match (c.func.result(), want) {
            (r, w) if r == w => true,
            (Type::Nodes, Type::Logical) => true,
            _ => false,
        },
        _ => false,
    }
}

/// The result of a function: a value (or nothing), or a truth value. (No
/// standard function returns nodes.)
enum Out<'a> {
    Value(Option<std::borrow::Cow<'a, Value>>),
    Logical(bool),
}

struct Eval<'a, 'b> {
    root: &'a Value,
    budget: &'b mut Budget,
}

impl<'a> Eval<'a, '_> {
    fn query(&mut self, q: &Query, current: &'a Value) -> Result<Vec<&'a Value>, Exceeded> {
        let start = if q.relative { current } else { self.root };
        self.budget.nodes(1)?;
        let mut nodes = vec![start];
        for seg in &q.segments {
            let mut next = Vec::new();
            for node in nodes {
                if seg.descendant {
                    self.descend(seg, node, &mut next)?;
                } else {
                    self.apply(&seg.selectors, node, &mut next)?;
                }
            }
            nodes = next;
        }
        Ok(nodes)
    }

    /// The selectors applied to `node` and then to every descendant, in document order.
    /// It recurses once per level of the document, not of the query: documents come
    /// from `serde_json`, which refuses JSON nested deeper than 128.
    fn descend(
        &mut self,
        seg: &Segment,
        node: &'a Value,
        out: &mut Vec<&'a Value>,
    ) -> Result<(), Exceeded> {
        self.apply(&seg.selectors, node, out)?;
        match node {
            Value::Array(items) => {
                for v in items {
                    self.budget.nodes(1)?;
                    self.descend(seg, v, out)?;
                }
            }
            Value::Object(map) => {
                for v in map.values() {
                    self.budget.nodes(1)?;
                    self.descend(seg, v, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn push(&mut self, out: &mut Vec<&'a Value>, v: &'a Value) -> Result<(), Exceeded> {
        self.budget.nodes(1)?;
        out.push(v);
        Ok(())
    }

    fn apply(
        &mut self,
        selectors: &[Selector],
        node: &'a Value,
        out: &mut Vec<&'a Value>,
    ) -> Result<(), Exceeded> {
        for sel in selectors {
            match sel {
                Selector::Name(name) => {
                    if let Some(v) = node.as_object().and_then(|m| m.get(name)) {
                        self.push(out, v)?;
                    }
                }
                Selector::Wildcard => match node {
                    Value::Array(items) => {
                        for v in items {
                            self.push(out, v)?;
                        }
                    }
                    Value::Object(map) => {
                        for v in map.values() {
                            self.push(out, v)?;
                        }
                    }
                    _ => {}
                },
                Selector::Index(i) => {
                    if let Some(items) = node.as_array() {
                        let len = items.len() as i64;
                        let at = if *i < 0 { len + i } else { *i };
                        if (0..len).contains(&at) {
                            self.push(out, &items[at as usize])?;
                        }
                    }
                }
                Selector::Slice { start, end, step } => {
                    if let Some(items) = node.as_array() {
                        for at in slice_indices(items.len() as i64, *start, *end, *step) {
                            self.push(out, &items[at as usize])?;
                        }
                    }
                }
                Selector::Filter(f) => {
                    let children: Vec<&'a Value> = match node {
                        Value::Array(items) => items.iter().collect(),
                        Value::Object(map) => map.values().collect(),
                        _ => Vec::new(),
                    };
                    for child in children {
                        self.budget.nodes(1)?;
                        if self.test(f, child)? {
                            self.push(out, child)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn test(&mut self, f: &Logical, current: &'a Value) -> Result<bool, Exceeded> {
        Ok(match f {
            Logical::Or(fs) => {
                for f in fs {
                    if self.test(f, current)? {
                        return Ok(true);
                    }
                }
                false
            }
            Logical::And(fs) => {
                for f in fs {
                    if !self.test(f, current)? {
                        return Ok(false);
                    }
                }
                true
            }
            Logical::Not(f) => !self.test(f, current)?,
            Logical::Exists(q) => !self.query(q, current)?.is_empty(),
            Logical::Call(c) => match self.call(c, current)? {
                Out::Logical(b) => b,
                Out::Value(_) => false,
            },
            Logical::Compare(l, op, r) => {
                let l = self.comparable(l, current)?;
                let r = self.comparable(r, current)?;
                compare(l.as_deref(), *op, r.as_deref(), self.budget)?
            }
        })
    }

    fn comparable(
        &mut self,
        c: &Comparable,
        current: &'a Value,
    ) -> Result<Option<std::borrow::Cow<'a, Value>>, Exceeded> {
        Ok(match c {
            Comparable::Literal(v) => Some(std::borrow::Cow::Owned(v.clone())),
            Comparable::Query(q) => self
                .query(q, current)?
                .first()
                .map(|v| std::borrow::Cow::Borrowed(*v)),
            Comparable::Call(call) => match self.call(call, current)? {
                Out::Value(v) => v,
                _ => None,
            },
        })
    }

    fn value_arg(
        &mut self,
        arg: &Arg,
        current: &'a Value,
    ) -> Result<Option<std::borrow::Cow<'a, Value>>, Exceeded> {
        Ok(match arg {
            Arg::Literal(v) => Some(std::borrow::Cow::Owned(v.clone())),
            Arg::Query(q) => self
                .query(q, current)?
                .first()
                .map(|v| std::borrow::Cow::Borrowed(*v)),
            Arg::Call(c) => match self.call(c, current)? {
                Out::Value(v) => v,
                _ => None,
            },
            Arg::Logical(_) => None,
        })
    }

    fn nodes_arg(&mut self, arg: &Arg, current: &'a Value) -> Result<Vec<&'a Value>, Exceeded> {
        Ok(match arg {
            Arg::Query(q) => self.query(q, current)?,
            // Type checking lets only queries through (no function returns nodes).
            _ => Vec::new(),
        })
    }

    fn call(&mut self, c: &Call, current: &'a Value) -> Result<Out<'a>, Exceeded> {
        Ok(match c.func {
            Func::Length => {
                let v = self.value_arg(&c.args[0], current)?;
                if let Some(Value::String(s)) = v.as_deref() {
                    // Counting characters reads the whole string.
                    self.budget.nodes(s.len() as u64 / 1024)?;
                }
                Out::Value(
                    match v.as_deref() {
                        Some(Value::String(s)) => Some(s.chars().count()),
                        Some(Value::Array(a)) => Some(a.len()),
                        Some(Value::Object(o)) => Some(o.len()),
                        _ => None,
                    }
                    .map(|n| std::borrow::Cow::Owned(Value::from(n))),
                )
            }
            Func::Count => {
                let n = self.nodes_arg(&c.args[0], current)?.len();
                Out::Value(Some(std::borrow::Cow::Owned(Value::from(n))))
            }
            Func::Value => {
                let nodes = self.nodes_arg(&c.args[0], current)?;
                Out::Value(match nodes.as_slice() {
                    [one] => Some(std::borrow::Cow::Borrowed(*one)),
                    _ => None,
                })
            }
            Func::Match | Func::Search => {
                let s = self.value_arg(&c.args[0], current)?;
                let r = self.value_arg(&c.args[1], current)?;
                let (Some(Value::String(s)), Some(Value::String(r))) = (s.as_deref(), r.as_deref())
                else {
                    return Ok(Out::Logical(false));
                };
                // Patterns may come from the document, one per node: each is
                // compiled once into the bounded cache of `pattern`, and the
                // compile and the scan are charged (a node for each ten of its
                // units, the conditions' budget being ten times this one).
                let pattern = if c.func == Func::Match {
                    format!("(?R)^({r})$")
                } else {
                    format!("(?R)({r})")
                };
                use super::pattern;
                self.budget.nodes(1 + pattern::read_units(&pattern) / 10)?;
                let found = match pattern::cached(&pattern) {
                    Some(found) => found,
                    None => {
                        // A compile starts only when the budget can pay its worst.
                        if self.budget.nodes < 1 + pattern::worst_compile_units(&pattern) / 10 {
                            return Err(Exceeded::Nodes);
                        }
                        let (found, units) = pattern::compile_cached(&pattern);
                        self.budget.nodes(1 + units / 10)?;
                        found
                    }
                };
                // An invalid pattern matches nothing (RFC 9535 §2.4.6).
                let Ok(compiled) = found else {
                    return Ok(Out::Logical(false));
                };
                self.budget.nodes(1 + compiled.search_units(s.len()) / 10)?;
                Out::Logical(compiled.is_match(s))
            }
        })
    }
}

/// The indices a slice selects, in order (RFC 9535 §2.3.4.2.2).
fn slice_indices(len: i64, start: Option<i64>, end: Option<i64>, step: Option<i64>) -> Vec<i64> {
    let step = step.unwrap_or(1);
    if step == 0 {
        return Vec::new();
    }
    let norm = |i: i64| if i >= 0 { i } else { len + i };
    let mut out = Vec::new();
    if step > 0 {
        let start = norm(start.unwrap_or(0));
        let end = norm(end.unwrap_or(len));
        let lower = start.clamp(0, len);
        let upper = end.clamp(0, len);
        let mut i = lower;
        while i < upper {
            out.push(i);
            i = i.saturating_add(step);
        }
    } else {
        let start = norm(start.unwrap_or(len - 1));
        let end = norm(end.unwrap_or(-len - 1));
        let upper = start.clamp(-1, len - 1);
        let lower = end.clamp(-1, len - 1);
        let mut i = upper;
        while lower < i {
            out.push(i);
            i = i.saturating_add(step);
        }
    }
    out
}

/// Comparing is charged like reading, since a filter compares once per node it
/// tests and the values compared may be large: a string a node per KiB (as `match`
/// charges its subject), an array or object a node per entry. Scalars cost nothing
/// more than the query that found them.
fn compare(
    l: Option<&Value>,
    op: Op,
    r: Option<&Value>,
    budget: &mut Budget,
) -> Result<bool, Exceeded> {
    Ok(match op {
        Op::Eq => equal(l, r, budget)?,
        Op::Ne => !equal(l, r, budget)?,
        Op::Lt => less(l, r, budget)?,
        Op::Le => less(l, r, budget)? || equal(l, r, budget)?,
        Op::Gt => less(r, l, budget)?,
        Op::Ge => less(r, l, budget)? || equal(l, r, budget)?,
    })
}

fn equal(l: Option<&Value>, r: Option<&Value>, budget: &mut Budget) -> Result<bool, Exceeded> {
    Ok(match (l, r) {
        (None, None) => true,
        (Some(a), Some(b)) => json_eq(a, b, budget)?,
        _ => false,
    })
}

/// Recurses once per level of the values, which come from the document (nested at
/// most 128 deep, as `serde_json` reads it) or are literals (never nested).
fn json_eq(a: &Value, b: &Value, budget: &mut Budget) -> Result<bool, Exceeded> {
    Ok(match (a, b) {
        (Value::Number(x), Value::Number(y)) => num_eq(x, y),
        (Value::String(x), Value::String(y)) => {
            budget.nodes(x.len().min(y.len()) as u64 / 1024)?;
            x == y
        }
        (Value::Array(x), Value::Array(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (a, b) in x.iter().zip(y) {
                budget.nodes(1)?;
                if !json_eq(a, b, budget)? {
                    return Ok(false);
                }
            }
            true
        }
        (Value::Object(x), Value::Object(y)) => {
            if x.len() != y.len() {
                return Ok(false);
            }
            for (k, v) in x {
                budget.nodes(1)?;
                match y.get(k) {
                    Some(w) if json_eq(v, w, budget)? => {}
                    _ => return Ok(false),
                }
            }
            true
        }
        _ => a == b,
    })
}

fn num_eq(x: &Number, y: &Number) -> bool {
    match (x.as_i64(), y.as_i64()) {
        (Some(a), Some(b)) => a == b,
        _ => match (x.as_u64(), y.as_u64()) {
            (Some(a), Some(b)) => a == b,
            _ => x.as_f64() == y.as_f64(),
        },
    }
}

fn less(l: Option<&Value>, r: Option<&Value>, budget: &mut Budget) -> Result<bool, Exceeded> {
    Ok(match (l, r) {
        (Some(Value::Number(x)), Some(Value::Number(y))) => match (x.as_i64(), y.as_i64()) {
            (Some(a), Some(b)) => a < b,
            _ => match (x.as_f64(), y.as_f64()) {
                (Some(a), Some(b)) => a < b,
                _ => false,
            },
        },
        (Some(Value::String(x)), Some(Value::String(y))) => {
            budget.nodes(x.len().min(y.len()) as u64 / 1024)?;
            x < y
        }
        _ => false,
    })
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
