//! What an expression reads of a response, found once at its compile: the fields of
//! `body` it names (so only those are converted for it), and whether it names
//! `headers`, `state`, `now` or `elapsed`.

use std::collections::BTreeMap;

use cel::common::ast::{Expr, IdedExpr, operators};

use crate::engine::cel::check::children;

/// What an expression reads of a response: the parts of `body` it names (so only
/// those are converted for it), and whether it names `headers` and `state`.
#[derive(Debug, Default)]
pub(super) struct Reads {
    pub(super) body: Fields,
    pub(super) headers: bool,
    pub(super) state: bool,
    pub(super) now: bool,
    pub(super) elapsed: bool,
}

/// The fields read under one JSON node: `whole` when the node itself is used as a
/// value (compared, iterated, sized, passed), else by name the fields selected on it.
#[derive(Debug, Default)]
pub(super) struct Fields {
    pub(super) whole: bool,
    pub(super) named: BTreeMap<String, Fields>,
}

impl Fields {
    pub(super) fn add(&mut self, path: &[&str]) {
        match path.split_first() {
            None => self.whole = true,
            Some((first, rest)) => self.named.entry(first.to_string()).or_default().add(rest),
        }
    }
}

/// The path of `e` when it is `body` followed by field selections (`.a`, `.?a`,
/// `['a']`, `has(….a)`).
pub(super) fn body_path(e: &IdedExpr) -> Option<Vec<&str>> {
    fn literal(x: &IdedExpr) -> Option<&str> {
        match &x.expr {
            Expr::Literal(cel::common::ast::LiteralValue::String(s)) => Some(s.inner()),
            _ => None,
        }
    }
    match &e.expr {
        Expr::Ident(n) if n == "body" => Some(Vec::new()),
        Expr::Select(sel) => {
            let mut p = body_path(&sel.operand)?;
            p.push(&sel.field);
            Some(p)
        }
        Expr::Call(c)
            if c.target.is_none()
                && c.args.len() == 2
                && (c.func_name == operators::OPT_SELECT || c.func_name == operators::INDEX) =>
        {
            let field = literal(&c.args[1])?;
            let mut p = body_path(&c.args[0])?;
            p.push(field);
            Some(p)
        }
        _ => None,
    }
}

/// Adds what `e` reads to `reads`. (A comprehension variable named like a
/// variable only makes this read more.)
pub(super) fn collect_reads(e: &IdedExpr, reads: &mut Reads) {
    if let Some(path) = body_path(e) {
        reads.body.add(&path);
        return;
    }
    match &e.expr {
        Expr::Ident(n) if n == "headers" => reads.headers = true,
        Expr::Ident(n) if n == "state" => reads.state = true,
        Expr::Ident(n) if n == "now" => reads.now = true,
        Expr::Ident(n) if n == "elapsed" => reads.elapsed = true,
        _ => children(e, |c| collect_reads(c, reads)),
    }
}
