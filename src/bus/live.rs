//! Reads of a wait's progress from the replica that polls it.
//!
//! The API holds the asking side ([`Live`]), the worker the answering side
//! ([`Inbox`]): the two meet here, and neither imports the other.
//!
//! A quiet wait's `polls`, `retries` and `next_poll_at` reach the store only with
//! its checkpoints (up to ten lease TTLs apart, docs/replicas.md §6.4), so the row alone can
//! show a running wait as if it had stopped. The worker holds the current figures in
//! memory; a read on the replica that holds the wait asks it for them. The channel
//! is bounded and the answer awaited briefly: a busy loop or a flood of reads costs
//! the read its current figures (it shows the recorded ones), never memory or time.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// Questions waiting for the loop at most; more are answered from the store.
const QUEUE: usize = 256;
/// How long a read waits for the loop's answer.
const ANSWER_WITHIN: Duration = Duration::from_millis(50);
/// Most ids one question names (a page of a list).
pub const MAX_IDS: usize = 1_000;

/// A held wait's progress as the loop knows it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub polls: u32,
    pub retries: u32,
    pub next_poll_at: DateTime<Utc>,
    /// How its last poll's response came; `None` before the first poll.
    pub last_poll: Option<crate::model::LastPoll>,
}

/// One read's question: the waits it asks about, and where the answer goes.
#[derive(Debug)]
pub struct Question {
    ids: Vec<Uuid>,
    reply: oneshot::Sender<HashMap<Uuid, Progress>>,
}

impl Question {
    /// The waits asked about.
    pub fn ids(&self) -> &[Uuid] {
        &self.ids
    }

    /// Answers with the progress of those of them the worker holds.
    pub fn answer(self, found: HashMap<Uuid, Progress>) {
        let _ = self.reply.send(found);
    }
}

/// The API's side: cheap to clone.
#[derive(Clone, Debug)]
pub struct Live {
    tx: mpsc::Sender<Question>,
}

/// The worker's side, taken by its loop.
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::Receiver<Question>,
}

pub fn channel() -> (Live, Inbox) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Live { tx }, Inbox { rx })
}

/// The next question, for the loop's `select!`; never, without an inbox.
pub async fn next(inbox: &mut Option<Inbox>) -> Option<Question> {
    match inbox {
        Some(inbox) => inbox.rx.recv().await,
        None => std::future::pending().await,
    }
}

impl Live {
    /// The current progress of those of `ids` this replica's worker holds. Waits it
    /// does not hold, and every wait when the loop is busy or gone, are absent.
    pub async fn progress(&self, ids: &[Uuid]) -> HashMap<Uuid, Progress> {
        if ids.is_empty() || ids.len() > MAX_IDS {
            return HashMap::new();
        }
        let (reply, answer) = oneshot::channel();
        let question = Question {
            ids: ids.to_vec(),
            reply,
        };
        if self.tx.try_send(question).is_err() {
            return HashMap::new();
        }
        match tokio::time::timeout(ANSWER_WITHIN, answer).await {
            Ok(Ok(found)) => found,
            _ => HashMap::new(),
        }
    }
}
