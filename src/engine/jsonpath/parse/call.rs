//! A function call in a filter (RFC 9535 §2.4): the function named, each of its
//! arguments parsed once whatever it turns out to be, and checked against the
//! type of its parameter (§2.4.3).

use super::filter::Operand;
use super::*;

impl Parser<'_> {
    pub(super) fn call(&mut self) -> Result<Call, ParseError> {
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
