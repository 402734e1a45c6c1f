//! Regular expressions whose text a stranger chose: compiled within a size bound,
//! kept in a bounded cache, and priced so that an evaluation's budget pays for
//! them.
//!
//! A pattern can come from a request (`matches('^v2')`) or from the target's body
//! (`s.matches(body.p)`, JSONPath's `match(@.a, @.p)`), so one evaluation may meet
//! thousands of distinct patterns. Three things keep that bounded:
//!
//! - **Size.** A pattern compiles to at most [`MAX_PROGRAM`] bytes of automaton; past
//!   that it is an error, found in time proportional to the bound, not to what the
//!   pattern would have grown to.
//! - **Cache.** Compiled patterns (and the errors of those that did not compile) are
//!   kept by text, at most [`CACHE`] of them, so a pattern used over every item of a
//!   list compiles once.
//! - **Price.** A compile costs [`Compiled::compile_units`] (its text, and the size
//!   of what it built), a search costs the haystack's length times a factor that
//!   grows with the automaton's size (a search's worst case is the product of the
//!   two). Callers charge both to their budget, and start a compile only while
//!   the budget left could pay for the largest ([`worst_compile_units`]). That
//!   holds an evaluation's budget of 1,000,000 units to about a tenth of a second
//!   of a core however its patterns are chosen.
//!
//! Pure: no I/O, no clock.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use regex_automata::meta;
use regex_automata::util::syntax;

/// The most bytes of automaton one pattern may compile to.
pub const MAX_PROGRAM: usize = 256 * 1024;
/// The most patterns kept compiled.
pub const CACHE: usize = 512;
/// Units a byte of a pattern's text costs to compile (see [`Compiled::compile_units`]).
const TEXT_UNITS_PER_BYTE: u64 = 16;
/// Units a byte of automaton costs to build: the largest compile costs about
/// 790,000 of a budget of 1,000,000 units.
const COMPILE_UNITS_PER_BYTE: u64 = 3;
/// Bytes of automaton that add one to a search's price per 16 bytes of haystack.
const PROGRAM_BYTES_PER_FACTOR: u64 = 16 * 1024;

/// A pattern compiled, with what it costs to use.
#[derive(Debug)]
pub struct Compiled {
    regex: meta::Regex,
    compile_units: u64,
    search_factor: u64,
}

impl Compiled {
    /// What compiling it cost, in budget units: a thousand, 16 a byte of its text,
    /// and 3 a byte of the automaton built (building one costs up to about 300 ns a
    /// byte, and a unit is priced at about 100 ns: see the module's text).
    pub fn compile_units(&self) -> u64 {
        self.compile_units
    }

    /// The units one search of `haystack_len` bytes costs.
    pub fn search_units(&self, haystack_len: usize) -> u64 {
        (1 + haystack_len as u64 / 16).saturating_mul(self.search_factor)
    }

    /// Whether the pattern matches anywhere in `haystack`.
    pub fn is_match(&self, haystack: &str) -> bool {
        self.regex.is_match(haystack)
    }

    /// The first match in `haystack`, as a byte range.
    pub fn find(&self, haystack: &str) -> Option<std::ops::Range<usize>> {
        self.regex.find(haystack).map(|m| m.range())
    }

    /// The successive non-overlapping matches in `haystack`, as byte ranges.
    pub fn find_iter<'h>(
        &'h self,
        haystack: &'h str,
    ) -> impl Iterator<Item = std::ops::Range<usize>> + 'h {
        self.regex.find_iter(haystack).map(|m| m.range())
    }
}

/// A pattern that did not compile: the sentence, and what finding that out cost.
#[derive(Clone, Debug)]
pub struct Refused {
    pub message: Arc<str>,
    pub units: u64,
}

type Entry = Result<Arc<Compiled>, Refused>;

static CACHED: LazyLock<Mutex<HashMap<Box<str>, Entry>>> = LazyLock::new(Mutex::default);

/// `pattern` as compiled before (or refused before), if it still is in the cache.
/// Reading its text costs [`read_units`].
pub fn cached(pattern: &str) -> Option<Entry> {
    CACHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(pattern)
        .cloned()
}

/// What reading a pattern's text costs, compiled or not.
pub fn read_units(pattern: &str) -> u64 {
    1 + pattern.len() as u64 / 16
}

/// The most a compile of `pattern` can cost: a caller starts one only when its
/// budget can pay this, so that a spent budget never pays for a compile after the
/// fact.
pub fn worst_compile_units(pattern: &str) -> u64 {
    1_000 + pattern.len() as u64 * TEXT_UNITS_PER_BYTE + MAX_PROGRAM as u64 * COMPILE_UNITS_PER_BYTE
}

/// Compiles `pattern` into the cache: the compiled pattern or its refusal, and
/// what the compile cost (at most [`worst_compile_units`]).
pub fn compile_cached(pattern: &str) -> (Entry, u64) {
    let compiled = compile(pattern);
    let units = match &compiled {
        Ok(c) => c.compile_units(),
        Err(r) => r.units,
    };
    let mut cache = CACHED.lock().unwrap_or_else(|p| p.into_inner());
    // Bounded by construction: a full cache starts again, which costs the patterns
    // still in use one compile each, charged to whoever uses them next.
    if cache.len() >= CACHE {
        cache.clear();
    }
    cache.insert(pattern.into(), compiled.clone());
    (compiled, units)
}

fn compile(pattern: &str) -> Entry {
    // Every compile costs at least a thousand units, so one evaluation compiles at
    // most a thousand patterns, however small.
    let text_units = 1_000 + pattern.len() as u64 * TEXT_UNITS_PER_BYTE;
    let built = meta::Regex::builder()
        .syntax(syntax::Config::new().nest_limit(64))
        .configure(
            meta::Config::new()
                .nfa_size_limit(Some(MAX_PROGRAM))
                .onepass_size_limit(Some(MAX_PROGRAM))
                .dfa_size_limit(Some(MAX_PROGRAM)),
        )
        .build(pattern);
    match built {
        Ok(regex) => {
            let size = regex.memory_usage() as u64;
            Ok(Arc::new(Compiled {
                regex,
                compile_units: text_units + size * COMPILE_UNITS_PER_BYTE,
                search_factor: 1 + size / PROGRAM_BYTES_PER_FACTOR,
            }))
        }
        Err(e) => Err(Refused {
            message: describe(pattern, &e).into(),
            // What it built before it gave up is bounded by the size limit; a
            // refusal is priced as the largest compile.
            units: text_units + MAX_PROGRAM as u64 * COMPILE_UNITS_PER_BYTE,
        }),
    }
}

fn describe(pattern: &str, e: &regex_automata::meta::BuildError) -> String {
    let shown: String = pattern.chars().take(64).collect();
    let more = if shown.len() < pattern.len() {
        "…"
    } else {
        ""
    };
    if e.size_limit().is_some() {
        format!(
            "the pattern '{shown}{more}' compiles to more than {} KiB, the most waitd builds for one pattern; simplify its repetitions",
            MAX_PROGRAM / 1024
        )
    } else {
        format!("'{shown}{more}' is not a valid regular expression: {e}")
    }
}
