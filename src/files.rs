//! The operator's files (API tokens, credentials and their tokens, secrets and
//! certificate authorities), read off the async runtime's threads and within a
//! time.
//!
//! A file can block: a FIFO no one writes, a network mount that hangs. Read on a
//! runtime thread, it would stop every task that thread runs (the API, the other
//! waits, the shutdown). So each read or look at a file runs on a thread of its
//! own, and its caller waits at most [`READ_WITHIN`] for it; a read still under way
//! then fails with a sentence, and the thread is left to finish (or to end with the
//! process: it is not the runtime's, so shutdown never waits for it).
//!
//! It must never start a thread per poll of a file that blocks: a caller that asks
//! for a file a read of which is under way joins that read (and fails at once when
//! it has already run past its time), and at most [`MAX_AT_ONCE`] reads are under
//! way at once.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

/// The longest a caller waits for one read of a file.
pub const READ_WITHIN: Duration = Duration::from_secs(5);

/// The most reads under way at once (each a thread, which a file that blocks
/// holds until it is written or the process ends).
pub const MAX_AT_ONCE: usize = 32;

/// When a file was last changed and how long it is: what tells that it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub modified: Option<SystemTime>,
    pub len: u64,
}

/// Why a file gave nothing: each is the end of a sentence that begins with the
/// file's name ("the tokens file /etc/waitd/tokens …").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    /// The system refused (no such file, no permission…).
    #[error("could not be read ({0})")]
    Unreadable(String),
    /// Larger than its reader takes.
    #[error("is larger than {} KiB", .0 / 1024)]
    TooLarge(usize),
    /// Its read did not end in time (or one begun before has not).
    #[error(
        "could not be read within {} s: reading it blocks (a FIFO no one writes, or a network mount that hangs?)",
        READ_WITHIN.as_secs()
    )]
    Blocked,
    /// Too many reads of the operator's files are under way.
    #[error(
        "could not be read: {MAX_AT_ONCE} reads of the operator's files are under way, each blocked"
    )]
    Busy,
}

/// What is read: the file's stamp alone, or its bytes (at most so many).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ask {
    Stamp,
    Bytes(usize),
}

#[derive(Clone, Debug)]
enum Got {
    Stamp(Stamp),
    Bytes(Arc<[u8]>),
}

type Outcome = Option<Result<Got, FileError>>;

/// A read under way: when it began, and where its outcome arrives.
struct Flight {
    id: u64,
    began: Instant,
    rx: watch::Receiver<Outcome>,
}

/// Numbers the reads, so that a read's thread lets go of its own flight only.
static NEXT: AtomicU64 = AtomicU64::new(0);

static FLIGHTS: LazyLock<Mutex<HashMap<(PathBuf, Ask), Flight>>> = LazyLock::new(Mutex::default);

/// The file's stamp (its modification time and length).
pub async fn stamp(path: &Path) -> Result<Stamp, FileError> {
    match fly(path, Ask::Stamp).await? {
        Got::Stamp(s) => Ok(s),
        Got::Bytes(_) => Err(FileError::Unreadable("a read answered a look".into())),
    }
}

/// The file's bytes, when there are at most `limit` of them.
pub async fn read(path: &Path, limit: usize) -> Result<Arc<[u8]>, FileError> {
    match fly(path, Ask::Bytes(limit)).await? {
        Got::Bytes(b) => Ok(b),
        Got::Stamp(_) => Err(FileError::Unreadable("a look answered a read".into())),
    }
}

/// The file's text, when it is UTF-8 of at most `limit` bytes.
pub async fn read_text(path: &Path, limit: usize) -> Result<String, FileError> {
    let bytes = read(path, limit).await?;
    String::from_utf8(bytes.to_vec())
        .map_err(|_| FileError::Unreadable("it is not UTF-8 text".into()))
}

async fn fly(path: &Path, ask: Ask) -> Result<Got, FileError> {
    let (mut rx, began) = {
        let mut flights = FLIGHTS.lock().unwrap_or_else(|p| p.into_inner());
        let key = (path.to_path_buf(), ask);
        match flights.get(&key) {
            Some(f) => (f.rx.clone(), f.began),
            None => {
                if flights.len() >= MAX_AT_ONCE {
                    return Err(FileError::Busy);
                }
                let (tx, rx) = watch::channel(None);
                let began = Instant::now();
                let id = NEXT.fetch_add(1, Relaxed);
                let owned = key.0.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name("waitd-file".into())
                        .spawn(move || {
                            let outcome = run(&owned, ask);
                            // Gone from the flights before the outcome is told, so a
                            // caller told of it that asks again starts a fresh read.
                            let mut flights = FLIGHTS.lock().unwrap_or_else(|p| p.into_inner());
                            if flights
                                .get(&(owned.clone(), ask))
                                .is_some_and(|f| f.id == id)
                            {
                                flights.remove(&(owned, ask));
                            }
                            drop(flights);
                            tx.send_replace(Some(outcome));
                        });
                if let Err(e) = spawned {
                    return Err(FileError::Unreadable(format!("no thread to read it: {e}")));
                }
                flights.insert(
                    key,
                    Flight {
                        id,
                        began,
                        rx: rx.clone(),
                    },
                );
                (rx, began)
            }
        }
    };
    let outcome = tokio::time::timeout_at(began + READ_WITHIN, rx.wait_for(Option::is_some)).await;
    match outcome {
        Ok(Ok(got)) => got.clone().unwrap_or(Err(FileError::Blocked)),
        // The thread ended without a word (it panicked): nothing was read.
        Ok(Err(_)) => Err(FileError::Unreadable(
            "its read ended without an answer".into(),
        )),
        Err(_) => Err(FileError::Blocked),
    }
}

/// The blocking part, on the reading thread.
fn run(path: &Path, ask: Ask) -> Result<Got, FileError> {
    let unreadable = |e: std::io::Error| FileError::Unreadable(e.to_string());
    match ask {
        Ask::Stamp => {
            let meta = std::fs::metadata(path).map_err(unreadable)?;
            Ok(Got::Stamp(Stamp {
                modified: meta.modified().ok(),
                len: meta.len(),
            }))
        }
        Ask::Bytes(limit) => {
            let mut buf = Vec::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut buf))
                .map_err(unreadable)?;
            if buf.len() > limit {
                return Err(FileError::TooLarge(limit));
            }
            Ok(Got::Bytes(buf.into()))
        }
    }
}
