//! A filter selector's expression (RFC 9535 §2.3.5): `||` and `&&` chains (loops,
//! so a long chain costs no depth), `!`, parentheses, comparisons, existence tests,
//! the queries in them and the literals they compare.

use super::*;

impl Parser<'_> {
    pub(super) fn logical(&mut self) -> Result<Logical, ParseError> {
        let first = self.and()?;
        self.logical_from(first)
    }

    /// The rest of a `||` chain whose first operand is parsed. A loop, not a
    /// recursion: a long chain costs no depth.
    pub(super) fn logical_from(&mut self, first: Logical) -> Result<Logical, ParseError> {
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
    pub(super) fn and_from(&mut self, first: Logical) -> Result<Logical, ParseError> {
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
    pub(super) fn basic_from(
        &mut self,
        start: usize,
        left: Operand,
    ) -> Result<Logical, ParseError> {
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
    pub(super) fn comparable_or_test(&mut self) -> Result<Operand, ParseError> {
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
}

pub(super) enum Operand {
    Comparable(Comparable),
    Test(Logical),
}
