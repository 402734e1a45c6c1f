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
//!   list compiles once. The cache is shared, so a flood of distinct patterns (one
//!   tenant's, or the same evaluation's) can clear it; each evaluation therefore
//!   also keeps the patterns it has used, at most [`CACHE`] of them, until the next
//!   evaluation on its thread begins ([`begin_evaluation`]). So an evaluation pays
//!   for a pattern at most once, whatever runs beside it: never more than it would
//!   on a cold cache.
//! - **Price.** A compile costs [`Compiled::compile_units`] (its text, and the size
//!   of what it built), a search costs the haystack's length times a factor that
//!   grows with the automaton's size (a search's worst case is the product of the
//!   two). Callers charge both to their budget, and start a compile only while
//!   the budget left could pay for the largest ([`worst_compile_units`]). That
//!   holds an evaluation's budget of 1,000,000 units to about a tenth of a second
//!   of a core however its patterns are chosen.
//!
//! Pure: no I/O, no clock.

use std::cell::RefCell;
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

thread_local! {
    /// The patterns the evaluation running on this thread has used.
    static OWN: RefCell<HashMap<Box<str>, Entry>> = RefCell::default();
}

/// Starts an evaluation on this thread: the patterns the one before used are no
/// longer kept for it.
pub fn begin_evaluation() {
    OWN.with(|own| own.borrow_mut().clear());
}

/// Keeps `entry` for the evaluation on this thread, while it has used fewer than
/// [`CACHE`] patterns.
fn keep(pattern: &str, entry: &Entry) {
    OWN.with(|own| {
        let mut own = own.borrow_mut();
        if own.len() < CACHE {
            own.insert(pattern.into(), entry.clone());
        }
    });
}

/// `pattern` as compiled before (or refused before), if this evaluation used it
/// or it still is in the cache. Reading its text costs [`read_units`].
pub fn cached(pattern: &str) -> Option<Entry> {
    if let Some(entry) = OWN.with(|own| own.borrow().get(pattern).cloned()) {
        return Some(entry);
    }
    let entry = CACHED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(pattern)
        .cloned()?;
    keep(pattern, &entry);
    Some(entry)
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
    drop(cache);
    keep(pattern, &compiled);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Fills the shared cache past its bound from another thread, as another
    /// tenant's evaluation would: everything in it before is gone.
    fn flood_from_another_thread(tag: &str) {
        let tag = tag.to_string();
        std::thread::spawn(move || {
            begin_evaluation();
            for i in 0..CACHE + 1 {
                let _ = compile_cached(&format!("{tag}{i}"));
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_evaluation_keeps_the_patterns_it_used_whatever_clears_the_shared_cache() {
        let used = r"^own-[a-z]{40}$";
        let refused = r"(?:\w{50}){50}";
        begin_evaluation();
        let (compiled, units) = compile_cached(used);
        assert!(compiled.is_ok() && units > 1_000);
        let (not_compiled, _) = compile_cached(refused);
        assert!(not_compiled.is_err(), "the refused pattern compiled");
        flood_from_another_thread("flood-a-");
        let again = cached(used).expect("the evaluation lost a pattern it had paid for");
        assert!(Arc::ptr_eq(&again.unwrap(), &compiled.unwrap()));
        assert!(cached(refused).expect("a refusal was lost").is_err());

        // The next evaluation has only what the shared cache still holds.
        begin_evaluation();
        assert!(
            cached(used).is_none(),
            "the shared cache kept it through the flood"
        );
        // What it finds in the shared cache it keeps too.
        let (_, _) = compile_cached(used);
        begin_evaluation();
        assert!(cached(used).is_some());
        flood_from_another_thread("flood-b-");
        assert!(
            cached(used).is_some(),
            "a pattern found in the cache was not kept"
        );

        // However many it uses, it keeps at most as many as the cache holds.
        begin_evaluation();
        for i in 0..CACHE + 10 {
            let _ = compile_cached(&format!("own-{i}"));
        }
        assert_eq!(OWN.with(|own| own.borrow().len()), CACHE);
        begin_evaluation();
        assert_eq!(OWN.with(|own| own.borrow().len()), 0);
    }
}
