//! The JSONPath parser: a query's text to its tree, in one pass over the text
//! (linear in its length), with the nesting and descendant limits checked as it
//! goes and the functions' arguments type-checked (RFC 9535 §2.4.3).
//!
//! This file is the query, its segments and their selectors (names, indices,
//! slices, string literals); [`filter`] parses a filter selector's expression and
//! [`call`] a function call in it.

use super::*;

mod call;
mod filter;

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
}
