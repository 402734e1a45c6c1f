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
//!   two). Callers charge both to their budget before or as the work is done.
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
    /// and one per 4 bytes of the automaton built.
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
}

/// A pattern that did not compile: the sentence, and what finding that out cost.
#[derive(Clone, Debug)]
pub struct Refused {
    pub message: Arc<str>,
    pub units: u64,
}

type Entry = Result<Arc<Compiled>, Refused>;

static CACHED: LazyLock<Mutex<HashMap<Box<str>, Entry>>> = LazyLock::new(Mutex::default);

/// What a lookup found, and whether it was compiled just now (and so costs its
/// compile units) or found compiled.
pub struct Lookup {
    pub pattern: Entry,
    pub fresh: bool,
}

/// `pattern`, compiled or from the cache.
pub fn lookup(pattern: &str) -> Lookup {
    let lock = || CACHED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(found) = lock().get(pattern) {
        return Lookup {
            pattern: found.clone(),
            fresh: false,
        };
    }
    let compiled = compile(pattern);
    let mut cache = lock();
    // Bounded by construction: a full cache starts again, which costs the patterns
    // still in use one compile each, charged to whoever uses them next.
    if cache.len() >= CACHE {
        cache.clear();
    }
    cache.insert(pattern.into(), compiled.clone());
    Lookup {
        pattern: compiled,
        fresh: true,
    }
}

/// The units of a lookup: its compile when fresh (or the refusal's), else what
/// reading its text costs.
pub fn lookup_units(pattern: &str, found: &Lookup) -> u64 {
    match (&found.pattern, found.fresh) {
        (Ok(c), true) => c.compile_units(),
        (Err(r), true) => r.units,
        (_, false) => 1 + pattern.len() as u64 / 16,
    }
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
                compile_units: text_units + size / 4,
                search_factor: 1 + size / PROGRAM_BYTES_PER_FACTOR,
            }))
        }
        Err(e) => Err(Refused {
            message: describe(pattern, &e).into(),
            // What it built before it gave up is bounded by the size limit; a
            // refusal is priced as the largest compile, so a budget pays for few.
            units: text_units + MAX_PROGRAM as u64 / 4,
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
