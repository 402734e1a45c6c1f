//! A lower bound on the depth of the tree an expression parses to, read from its
//! tokens in one pass, so that a chain past [`crate::engine::condition::MAX_TREE`]
//! is refused before the parser spends milliseconds building it (about 8 µs an
//! operator: `1<1<…` of 2 KiB took 5 ms).
//!
//! The parser builds a chain of one kind of operator, written without brackets, as
//! a left-deep tree: `a < b < c` is `(a < b) < c`, `a + b - c` is `(a + b) - c`,
//! `a.b.c[0]` selects and indexes one step at a time. `k` links of one such chain
//! are `k + 1` levels however deep its operands are. The bound is the longest
//! chain of each kind anywhere, where a chain ends at anything of lower precedence
//! (for a comparison: `&&`, `||`, `?`, `:`, a comma or a bracket). What the parser
//! builds otherwise is not counted: `&&` and `||` chains (balanced trees), unary
//! `!` and `-` (an even run of them may fold away), the conditional, brackets.
//! So the bound is never above the tree's depth, which `tests/conditions_props.rs`
//! checks on generated expressions against the tree the parser builds.
//!
//! Pure: no I/O, no clock. Linear in the tokens, with no recursion and a stack
//! of one small record per open bracket.

use cel::parser::pratt_parser::{Lexer, TokenKind};

/// The chains of the bracket level being read.
#[derive(Default)]
struct Level {
    /// Comparisons (`==`, `!=`, `<`, `<=`, `>`, `>=`, `in`) since the last `&&`,
    /// `||`, `?`, `:` or comma.
    relations: usize,
    /// `+` and binary `-` since the last comparison or lower.
    sums: usize,
    /// `*`, `/` and `%` since the last `+`, `-` or lower.
    products: usize,
    /// Selections, member calls and indexes on one operand, in a row. Counted once
    /// the chain ends: the dotted name of a message literal (`a.b.C{…}`) is one
    /// node, not a chain.
    steps: usize,
    /// Whether an operand was just read (so `-` is binary, `.` and `[` are steps).
    after_operand: bool,
}

/// Reads the tokens, keeping the longest chain seen.
#[derive(Default)]
struct Scan {
    open: Vec<Level>,
    level: Level,
    longest: usize,
}

impl Scan {
    /// The step chain of this level ends (it counts), and an operand follows.
    fn end_steps(&mut self) {
        self.longest = self.longest.max(self.level.steps);
        self.level.steps = 0;
        self.level.after_operand = false;
    }

    /// A binary operator or a delimiter.
    fn between(&mut self) {
        self.end_steps();
        let l = &self.level;
        self.longest = self.longest.max(l.relations).max(l.sums).max(l.products);
    }

    /// `&&`, `||`, `?`, `:`, a comma, or anything not counted: every chain of this
    /// level ends here.
    fn reset(&mut self) {
        self.between();
        self.level.relations = 0;
        self.level.sums = 0;
        self.level.products = 0;
    }

    /// A bracket opens: a level of its own.
    fn push(&mut self) {
        self.open.push(std::mem::take(&mut self.level));
    }

    /// A bracket closes: its level's chains end; the level outside goes on after
    /// an operand. False when nothing was open.
    fn pop(&mut self) -> bool {
        self.reset();
        let Some(outer) = self.open.pop() else {
            return false;
        };
        self.level = outer;
        self.level.after_operand = true;
        true
    }
}

/// At least how many levels deep the tree `source` parses to is (1 for a lone
/// operand). Of an expression the lexer cannot read, or that is not CEL, what came
/// before the fault is counted.
pub(in crate::engine) fn depth_at_least(source: &str) -> usize {
    let mut lexer = Lexer::new(source);
    let mut s = Scan::default();
    loop {
        let token = lexer.lex();
        let after_operand = s.level.after_operand;
        match token.kind {
            TokenKind::TokEnd | TokenKind::TokError => break,
            TokenKind::TokWhitespace | TokenKind::TokComment => {}
            TokenKind::TokEqualEqual
            | TokenKind::TokExclamationEqual
            | TokenKind::TokLess
            | TokenKind::TokLessEqual
            | TokenKind::TokGreater
            | TokenKind::TokGreaterEqual
            | TokenKind::TokIn => {
                s.between();
                s.level.relations += 1;
                s.level.sums = 0;
                s.level.products = 0;
            }
            TokenKind::TokPlus | TokenKind::TokMinus if after_operand => {
                s.between();
                s.level.sums += 1;
                s.level.products = 0;
            }
            TokenKind::TokAsterisk | TokenKind::TokSlash | TokenKind::TokPercent => {
                s.between();
                s.level.products += 1;
            }
            // Unary `-` and `!`, and the leading dot of a root-scoped name, belong to
            // the operand that follows: the chains around it go on.
            TokenKind::TokMinus | TokenKind::TokExclamation | TokenKind::TokDot
                if !after_operand => {}
            TokenKind::TokDot => {
                s.level.steps += 1;
                // The name selected (or called) follows: still this operand's.
                s.level.after_operand = false;
            }
            TokenKind::TokLeftBracket if after_operand => {
                s.level.steps += 1;
                s.push();
            }
            TokenKind::TokLeftParen => {
                // A call's arguments (after a member's name, the steps go on after
                // them) or a grouping.
                s.push();
            }
            TokenKind::TokLeftBrace if after_operand => {
                // A message literal: its dotted name is one node.
                s.level.steps = 0;
                s.push();
            }
            TokenKind::TokLeftBracket | TokenKind::TokLeftBrace => {
                s.end_steps();
                s.push();
            }
            TokenKind::TokRightBracket | TokenKind::TokRightBrace | TokenKind::TokRightParen => {
                if !s.pop() {
                    break;
                }
            }
            TokenKind::TokIdent
            | TokenKind::TokInt
            | TokenKind::TokUint
            | TokenKind::TokFloat
            | TokenKind::TokString
            | TokenKind::TokBytes
            | TokenKind::TokNull
            | TokenKind::TokTrue
            | TokenKind::TokFalse => {
                if after_operand {
                    // Two operands in a row: not CEL; nothing more is counted.
                    break;
                }
                s.level.after_operand = true;
            }
            _ => s.reset(),
        }
    }
    s.reset();
    while s.pop() {}
    s.longest + 1
}
