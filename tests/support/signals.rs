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

    /// Whether progress of the wait `id` (`ended`: its end) was written within
    /// `within`.
    pub async fn recorded(&mut self, id: &str, ended: bool, within: Duration) -> bool {
        let id: uuid::Uuid = id.parse().expect("a wait id");
        self.next(
            within,
            |s| matches!(s, Signal::Recorded { id: i, ended: e } if *i == id && (*e || !ended)),
        )
        .await
        .is_some()
    }

    /// The status of the next written attempt for the wait `id` within `within`.
    pub async fn attempted(&mut self, id: &str, within: Duration) -> Option<DeliveryStatus> {
        let id: uuid::Uuid = id.parse().expect("a wait id");
        match self
            .next(
                within,
                |s| matches!(s, Signal::Attempted { wait_id, .. } if *wait_id == id),
            )
            .await
        {
            Some(Signal::Attempted { status, .. }) => Some(status),
            _ => None,
        }
    }

    /// Whether the waits' claim brought `id` within `within`.
    pub async fn claimed(&mut self, id: &str, within: Duration) -> bool {
        let id: uuid::Uuid = id.parse().expect("a wait id");
        self.next(
            within,
            |s| matches!(s, Signal::Claimed(ids) if ids.contains(&id)),
        )
        .await
        .is_some()
    }
}
