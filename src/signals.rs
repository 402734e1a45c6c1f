//! What the worker, the webhook deliverer, the retention sweep and the token
//! watcher report as they work, for tests to await rather than poll for: a claim
//! came back, a wait's progress is in the store, a renewal came back, the leases
//! were released, a webhook attempt's outcome is in the store, a sweep's batch is
//! deleted, the API tokens were reloaded (or refused), a blocked request holds on
//! a wait.
//!
//! It sits below every part that sends or hears a signal (the worker, the
//! deliverer, the sweep, the token watcher, the API), so none of them imports
//! another for it.
//!
//! The channel exists only with the `test-signals` feature (and in this crate's own
//! tests): a build without it has no sender, and every send is a branch on `None`.
//! A signal is sent after the loop has taken in what it reports, so a test that
//! hears one may rely on it.

use uuid::Uuid;

use crate::model::DeliveryStatus;

/// One thing the worker, the deliverer, the sweep, the token watcher or the API did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// A claim came back with these waits, now held.
    Claimed(Vec<Uuid>),
    /// A wait's progress (or its end) is in the store.
    Recorded { id: Uuid, ended: bool },
    /// A lease renewal came back, and whether it succeeded.
    Renewed { ok: bool },
    /// On shutdown, this many held waits were released.
    Released(u64),
    /// A webhook attempt's outcome is in the store: the delivery's number (as
    /// `GET /waits/{id}/deliveries` shows it) and its status after the attempt.
    Attempted {
        wait_id: Uuid,
        delivery: i64,
        status: DeliveryStatus,
    },
    /// A delivery's outcome is in the store without an attempt: given back unsent
    /// (its receiver's slots were taken) or stopped unsent (its webhook was
    /// stopped meanwhile).
    Returned {
        wait_id: Uuid,
        delivery: i64,
        status: DeliveryStatus,
    },
    /// A batch of the retention sweep is deleted: this many ended waits.
    Swept { waits: u64 },
    /// The API tokens were looked at again (SIGHUP, a changed file): whether the
    /// new ones are in force.
    TokensReloaded { ok: bool },
    /// A blocked request (`?wait=`) holds on this wait: it listens for the wait's
    /// end, and read it running after it began to listen.
    Holding(Uuid),
}

/// Where the parts send their [`Signal`]s. Cloning is shallow; the default sends
/// nowhere.
#[derive(Clone, Debug, Default)]
pub struct Signals {
    #[cfg(any(test, feature = "test-signals"))]
    tx: Option<tokio::sync::broadcast::Sender<Signal>>,
}

impl Signals {
    /// A channel that keeps the latest 4,096 signals for each receiver.
    #[cfg(any(test, feature = "test-signals"))]
    pub fn channel() -> Signals {
        Signals {
            tx: Some(tokio::sync::broadcast::channel(4096).0),
        }
    }

    /// The signals sent from now on; `None` from a [`Signals`] that sends nowhere.
    #[cfg(any(test, feature = "test-signals"))]
    pub fn subscribe(&self) -> Option<tokio::sync::broadcast::Receiver<Signal>> {
        self.tx.as_ref().map(|tx| tx.subscribe())
    }

    /// Sends what `signal` makes, made only when someone may listen.
    #[inline]
    pub(crate) fn send(&self, signal: impl FnOnce() -> Signal) {
        #[cfg(any(test, feature = "test-signals"))]
        if let Some(tx) = &self.tx {
            let _ = tx.send(signal());
        }
        #[cfg(not(any(test, feature = "test-signals")))]
        let _ = signal;
    }
}
