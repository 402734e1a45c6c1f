//! What is checked of an expression before any response exists: its size, the
//! depth of the tree it parses to (first a lower bound from its tokens, before the
//! parse; then measured without recursion, before anything else walks it), the
//! names it uses, and whether it can be a bool.
//!
//! Pure: no I/O, no clock.

use cel::common::ast::{EntryExpr, Expr, IdedExpr, operators};

use crate::engine::condition::{
    ConditionError, FUNCTIONS, MAX_DEPTH, MAX_LEN, MAX_TREE, TYPES, VARIABLES,
};

/// `source` parsed and checked: its size, its tree's depth, the names it uses
/// (the variables, `variables` besides, the functions waitd provides) and, when
/// `boolean`, that it can be a bool.
pub(in crate::engine) fn parse_checked(
    source: &str,
    variables: &[String],
    boolean: bool,
) -> Result<IdedExpr, ConditionError> {
    if source.trim().is_empty() {
        return Err("is empty; write a CEL expression such as status == 200".into());
    }
    if source.len() > MAX_LEN {
        return Err(format!("is {} bytes long; the limit is {MAX_LEN}", source.len()).into());
    }
    if source.contains('\0') {
        return Err("contains a NUL character (\\u0000), which waitd does not store".into());
    }
    // A chain past the limit is refused from its tokens, before the parse builds it.
    let least = super::chains::depth_at_least(source);
    if least > MAX_TREE {
        return Err(too_deep(&format!("at least {least}")).into());
    }
    let expr = parse(source)
        .ok_or("could not be parsed (the CEL parser failed on it)")?
        .map_err(|errors| parse_message(source, &errors))?;
    let depth = tree_depth(&expr);
    if depth > MAX_TREE {
        return Err(too_deep(&depth.to_string()).into());
    }
    let mut problems = Vec::new();
    check(&expr, &mut variables.to_vec(), &mut problems);
    if let Some(kind) = not_a_bool(&expr).filter(|_| boolean) {
        problems.push(format!(
            "always evaluates to {kind}, never a bool; compare it, e.g. \"… == …\" or \"… > 0\""
        ));
    }
    if let Some(first) = problems.into_iter().next() {
        return Err(first.into());
    }
    Ok(expr)
}

fn too_deep(depth: &str) -> String {
    format!(
        "nests {depth} levels deep, and the limit is {MAX_TREE} (every operator, call, member, index and macro counts as a level, chained or bracketed alike); split it, or write a chain of comparisons as a list, e.g. x in [1, 2, 3]"
    )
}

/// The lower bound [`parse_checked`] reads from the tokens of `source`, and the
/// depth of the tree it parses to (none when it does not parse), for the test that
/// holds the one under the other. Parses on the calling thread.
pub(in crate::engine) fn depths(source: &str) -> (usize, Option<usize>) {
    let least = super::chains::depth_at_least(source);
    let depth = parse(source).and_then(Result::ok).map(|e| tree_depth(&e));
    (least, depth)
}

/// `source` parsed, within the parser's own recursion limit. The parser is a
/// stranger's input's first reader: a panic in it is none, not a lost worker.
fn parse(source: &str) -> Option<Result<IdedExpr, cel::ParseErrors>> {
    let parser = super::ENV.parser().max_recursion_depth(MAX_DEPTH);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parser.parse(source))).ok()
}

/// The depth of `e`'s tree, every node counted, measured without recursion so that
/// it can measure any tree the parser built.
fn tree_depth(e: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut todo: Vec<(&IdedExpr, usize)> = vec![(e, 1)];
    while let Some((e, d)) = todo.pop() {
        deepest = deepest.max(d);
        children(e, |c| todo.push((c, d + 1)));
    }
    deepest
}

/// Calls `f` on each direct sub-expression of `e`, in evaluation order.
pub(in crate::engine) fn children<'e>(e: &'e IdedExpr, mut f: impl FnMut(&'e IdedExpr)) {
    match &e.expr {
        Expr::Call(c) => {
            c.target.iter().for_each(|t| f(t));
            c.args.iter().for_each(f);
        }
        Expr::Comprehension(c) => {
            for part in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                f(part);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(f),
        Expr::Map(m) => {
            for entry in &m.entries {
                if let EntryExpr::MapEntry(me) = &entry.expr {
                    f(&me.key);
                    f(&me.value);
                }
            }
        }
        Expr::Select(sel) => f(&sel.operand),
        Expr::Struct(st) => {
            for entry in &st.entries {
                if let EntryExpr::StructField(field) = &entry.expr {
                    f(&field.value);
                }
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// "at line 1, column 8: mismatched input…", the first of the parser's errors.
fn parse_message(source: &str, errors: &cel::ParseErrors) -> String {
    let Some(e) = errors.errors.first() else {
        return "could not be parsed".into();
    };
    let (line, column) = e.pos;
    let shown: String = source.chars().take(120).collect();
    if e.msg.contains("Recursion limit") {
        return format!(
            "nests deeper than {MAX_DEPTH} levels (parentheses, lists, maps, calls and operators) at line {line}; flatten it"
        );
    }
    format!(
        "is not a valid CEL expression: at line {line}, column {}: {} (in \"{shown}\")",
        column + 1,
        e.msg
    )
}

/// What the whole expression evaluates to when that is known without a response
/// and is not a bool.
fn not_a_bool(e: &IdedExpr) -> Option<&'static str> {
    use cel::common::ast::LiteralValue as L;
    match &e.expr {
        Expr::Literal(L::Boolean(_)) => None,
        Expr::Literal(L::Int(_) | L::UInt(_)) => Some("a number"),
        Expr::Literal(L::Double(_)) => Some("a double"),
        Expr::Literal(L::String(_)) => Some("a string"),
        Expr::Literal(L::Bytes(_)) => Some("bytes"),
        Expr::Literal(L::Null) => Some("null"),
        Expr::List(_) => Some("a list"),
        Expr::Map(_) => Some("a map"),
        Expr::Call(c) => match c.func_name.as_str() {
            operators::ADD
            | operators::SUBSTRACT
            | operators::MULTIPLY
            | operators::DIVIDE
            | operators::MODULO
            | operators::NEGATE
            | "size"
            | "int"
            | "uint"
            | "double" => Some("a number"),
            "string" => Some("a string"),
            "bytes" => Some("bytes"),
            "type" => Some("a type"),
            _ => None,
        },
        // `map` and `filter` build a list.
        Expr::Comprehension(c) if matches!(&c.accu_init.expr, Expr::List(_)) => Some("a list"),
        _ => None,
    }
}

/// Names that are neither a variable, a bound comprehension variable nor a known
/// function, reported as sentences.
fn check(e: &IdedExpr, bound: &mut Vec<String>, problems: &mut Vec<String>) {
    match &e.expr {
        Expr::Select(_) if dotted(e).is_some_and(|n| TYPES.contains(&n.as_str())) => {}
        Expr::Ident(name) => {
            if !VARIABLES.contains(&name.as_str())
                && !TYPES.contains(&name.as_str())
                && !bound.iter().any(|b| b == name)
            {
                problems.push(format!(
                    "names {name}, which is not a variable{}; the variables are body, status, headers, state and now",
                    hint(&VARIABLES, name)
                ));
            }
        }
        Expr::Call(call)
            if call.target.as_deref().and_then(dotted).is_some_and(|ns| {
                FUNCTIONS.contains(&format!("{ns}.{}", call.func_name).as_str())
            }) =>
        {
            // A namespaced function (`optional.of(x)`, `strings.quote(s)`): the
            // namespace is not a variable.
            call.args.iter().for_each(|a| check(a, bound, problems));
        }
        Expr::Call(call) => {
            let name = call.func_name.as_str();
            let builtin = name.starts_with('_')
                || name.starts_with('@')
                || name == operators::LOGICAL_NOT
                || name == operators::NEGATE;
            if !builtin && !FUNCTIONS.contains(&name) {
                problems.push(format!(
                    "calls {name}(), which is not a function waitd provides{}; docs/conditions.md lists them",
                    hint(FUNCTIONS, name)
                ));
            }
            children(e, |c| check(c, bound, problems));
        }
        Expr::Comprehension(c) => {
            // The range and the start are outside the comprehension's scope.
            check(&c.iter_range, bound, problems);
            check(&c.accu_init, bound, problems);
            let before = bound.len();
            bound.push(c.iter_var.clone());
            bound.extend(c.iter_var2.clone());
            bound.push(c.accu_var.clone());
            for part in [&c.loop_cond, &c.loop_step, &c.result] {
                check(part, bound, problems);
            }
            bound.truncate(before);
        }
        Expr::Struct(_) => problems.push(
            "builds a message (struct) literal, which waitd's conditions have no types for".into(),
        ),
        _ => children(e, |c| check(c, bound, problems)),
    }
}

/// `a.b.c` when `e` is that chain of names.
fn dotted(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => dotted(&s.operand).map(|o| format!("{o}.{}", s.field)),
        _ => None,
    }
}

/// " (did you mean x?)" when one of `known` is a likely typo of `name`.
fn hint(known: &[&str], name: &str) -> String {
    known
        .iter()
        .find(|k| crate::engine::spec::close(k, name))
        .map(|k| format!(" (did you mean {k}?)"))
        .unwrap_or_default()
}
