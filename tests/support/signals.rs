//! What waitd reports as it works (the `test-signals` feature, which the tests
//! turn on): a test subscribes before it acts, then awaits the signal that says
//! the thing it waits for is done, rather than polling for its effect.

use std::time::Duration;

use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;
pub use waitd::model::DeliveryStatus;
pub use waitd::worker::{Signal, Signals};

/// The signals sent since [`Heard::from`] subscribed.
pub struct Heard(Receiver<Signal>);

impl Heard {
    pub fn from(signals: &Signals) -> Heard {
        Heard(
            signals
                .subscribe()
                .expect("the tests build waitd with test-signals"),
        )
    }

    /// The next signal `want` accepts, or `None` once `within` passes (or the app
    /// has stopped).
    pub async fn next(
        &mut self,
        within: Duration,
        mut want: impl FnMut(&Signal) -> bool,
    ) -> Option<Signal> {
        let rx = &mut self.0;
        let heard = async {
            loop {
                match rx.recv().await {
                    Ok(s) if want(&s) => return Some(s),
                    Ok(_) | Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return None,
                }
            }
        };
        tokio::time::timeout(within, heard).await.ok().flatten()
    }

    /// The next signal `want` accepts; fails the test, saying `what` was awaited,
    /// after [`BOUND`].
    pub async fn expect(&mut self, what: &str, want: impl FnMut(&Signal) -> bool) -> Signal {
        match self.next(BOUND, want).await {
            Some(s) => s,
            None => panic!("not heard within {BOUND:?}: {what}"),
        }
    }

    /// Until progress of the wait `id` (a new state, an error, a checkpoint or its
    /// end) is in the store.
    pub async fn recorded(&mut self, id: &str) {
        let id = wait_id(id);
        self.expect(
            &format!("progress of {id} recorded"),
            |s| matches!(s, Signal::Recorded { id: i, .. } if *i == id),
        )
        .await;
    }

    /// Until progress of the wait `id` has been recorded `n` times (counting from
    /// the subscription).
    pub async fn recorded_times(&mut self, id: &str, n: usize) {
        for _ in 0..n {
            self.recorded(id).await;
        }
    }

    /// Until progress of every wait of `ids` has been recorded at least `n` times.
    pub async fn all_recorded(&mut self, ids: &[String], n: usize) {
        let want: Vec<uuid::Uuid> = ids.iter().map(|id| wait_id(id)).collect();
        let mut seen = vec![0usize; want.len()];
        while seen.iter().any(|c| *c < n) {
            let left = seen.iter().filter(|c| **c < n).count();
            let s = self
                .expect(
                    &format!("{left} of {} waits recorded {n} times", want.len()),
                    |s| matches!(s, Signal::Recorded { id, .. } if want.contains(id)),
                )
                .await;
            if let Signal::Recorded { id, .. } = s {
                let i = want.iter().position(|w| *w == id).unwrap();
                seen[i] += 1;
            }
        }
    }

    /// Until the end of the wait `id` is in the store.
    pub async fn ended(&mut self, id: &str) {
        let id = wait_id(id);
        self.expect(
            &format!("the end of {id} recorded"),
            |s| matches!(s, Signal::Recorded { id: i, ended: true } if *i == id),
        )
        .await;
    }

    /// Until an attempt for the wait `id` is in the store with `status`: the
    /// delivery's number.
    pub async fn attempted(&mut self, id: &str, status: DeliveryStatus) -> i64 {
        let id = wait_id(id);
        let s = self
            .expect(
                &format!("an attempt for {id} written {status:?}"),
                |s| matches!(s, Signal::Attempted { wait_id, status: st, .. } if *wait_id == id && *st == status),
            )
            .await;
        match s {
            Signal::Attempted { delivery, .. } => delivery,
            _ => unreachable!(),
        }
    }

    /// The status of the next written attempt for the wait `id`.
    pub async fn attempt(&mut self, id: &str) -> DeliveryStatus {
        let id = wait_id(id);
        match self
            .expect(
                &format!("an attempt for {id} written"),
                |s| matches!(s, Signal::Attempted { wait_id, .. } if *wait_id == id),
            )
            .await
        {
            Signal::Attempted { status, .. } => status,
            _ => unreachable!(),
        }
    }

    /// Until the retention sweep has deleted `n` ended waits (counting from the
    /// subscription).
    pub async fn swept(&mut self, n: u64) {
        let mut deleted = 0;
        while deleted < n {
            if let Signal::Swept { waits } = self
                .expect(
                    &format!("{n} waits swept ({deleted} so far)"),
                    |s| matches!(s, Signal::Swept { waits } if *waits > 0),
                )
                .await
            {
                deleted += waits;
            }
        }
    }

    /// Until `n` lease renewals have succeeded (counting from the subscription);
    /// each writes the checkpoints due.
    pub async fn renewed(&mut self, n: usize) {
        for i in 0..n {
            self.expect(&format!("{n} renewals ({i} so far)"), |s| {
                matches!(s, Signal::Renewed { ok: true })
            })
            .await;
        }
    }

    /// Until a blocked request (`?wait=`) holds on the wait `id`: it listens for
    /// the wait's end, so an end from now on wakes it.
    pub async fn holding(&mut self, id: &str) {
        let id = wait_id(id);
        self.expect(
            &format!("a request holding on {id}"),
            |s| matches!(s, Signal::Holding(i) if *i == id),
        )
        .await;
    }

    /// Whether the waits' claim brought `id` within `within`.
    pub async fn claimed(&mut self, id: &str, within: Duration) -> bool {
        let id = wait_id(id);
        self.next(
            within,
            |s| matches!(s, Signal::Claimed(ids) if ids.contains(&id)),
        )
        .await
        .is_some()
    }
}

/// How long a helper of [`Heard`] waits for its signal before the test fails: a
/// failure message, not a pace (the signal comes as soon as the thing is done).
pub const BOUND: Duration = Duration::from_secs(20);

fn wait_id(id: &str) -> uuid::Uuid {
    id.parse().expect("a wait id")
}
