//! The JSONPath parser: a query's text to its tree, in one pass over the text
//! (linear in its length), with the nesting and descendant limits checked as it
//! goes and the functions' arguments type-checked (RFC 9535 §2.4.3).

use super::*;

/// Parses a whole query (`$…`).
pub(super) fn query(text: &str) -> Result<Query, ParseError> {
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
