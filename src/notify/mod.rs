//! Webhooks: each replica's delivery loop.
//!
//! The store's outbox holds one delivery per event and webhook (see
//! [`crate::store::Due`]), bounded per webhook, wait and tenant. Every replica runs
//! a [`Deliverer`]: it takes due deliveries under a lease, tenants in turn, POSTs
//! each to its webhook in the Standard Webhooks format ([`sign`], [`payload`]), and
//! writes the outcome fenced by its lease. A 2xx is delivered; 410 Gone stops the
//! webhook; anything else is tried again on [`SCHEDULE`], honouring `Retry-After`,
//! and after the last attempt the delivery is failed. A replica that dies
//! mid-attempt loses its lease, and another replica sends the same delivery again
//! with the same `webhook-id`: at least once.
//!
//! The parts, one a file: the claim loop ([`claim`]), woken by the deliveries
//! notice ([`doorbell`]: deliveries inserted or queued again, on any replica), by
//! its own retries falling due and at least every [`IDLE`]; one attempt and the one way its outcome is made ([`attempt`],
//! over [`crate::outbound`]); the outcome writer ([`writer`]); and how attempts
//! are shared ([`share`]): a tenant has at most its share of them in flight, and
//! each of its receivers half of that, so a receiver that hangs costs its own
//! tenant some slots and no other tenant any.

mod attempt;
mod claim;
mod doorbell;
#[cfg(test)]
mod fixtures;
mod message;
mod share;
mod writer;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use uuid::Uuid;

pub use attempt::{DEFAULT_RETRY_BASE, MAX_RESPONSE, SCHEDULE, retry_delay};
pub use message::{payload, sign};

use crate::bus::Bus;
use crate::metrics::Metrics;
use crate::outbound::Client;
use crate::signals::Signals;
use crate::store::{Outbox, Outcome};

/// The loop looks for due deliveries at least this often (another replica's
/// retries, a missed notice).
pub const IDLE: Duration = Duration::from_secs(1);

/// How the deliverer is set up.
#[derive(Clone, Debug)]
pub struct NotifyConfig {
    /// The bound on one attempt, from connecting to the last byte read.
    pub timeout: Duration,
    /// [`SCHEDULE`]'s unit.
    pub retry_base: Duration,
    /// How long a replica holds a delivery it took (longer than `timeout`).
    pub lease_ttl: Duration,
    /// Most attempts in flight at once.
    pub concurrency: usize,
    /// Most attempts in flight at once for one tenant (at most `concurrency`); a
    /// tenant's receiver gets half of it.
    pub per_tenant: usize,
    /// The outbound client (the prober's: one pool, one guard).
    pub client: Client,
}

/// One replica's delivery loop.
pub struct Deliverer {
    pub outbox: Outbox,
    pub bus: Bus,
    pub metrics: Arc<Metrics>,
    pub owner: Uuid,
    pub cfg: NotifyConfig,
    /// Wakes the claim at once: a retry written, a redelivery queued (deliveries
    /// inserted ring the [`doorbell`] instead).
    pub wake: Arc<Notify>,
    /// Where each attempt's written outcome is reported (see
    /// [`crate::signals::Signal::Attempted`]).
    pub signals: Signals,
}

impl Deliverer {
    /// Runs until `stop` resolves; attempts in flight then have 5 s to finish and be
    /// written (one cut short keeps its lease, and is sent again once it runs out).
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let client = self.cfg.client.clone();
        let (writes, rx) = tokio::sync::mpsc::channel(4 * writer::WRITE_BATCH);
        let written = tokio::spawn(writer::writer(
            self.outbox.clone(),
            self.owner,
            rx,
            self.wake.clone(),
            self.signals.clone(),
        ));
        let bell = doorbell::Doorbell::default();
        let relay = tokio::spawn({
            let (bus, bell, now) = (self.bus.clone(), bell.clone(), self.wake.clone());
            async move { doorbell::relay(&bus, bell, &now).await }
        });
        let me = Arc::new(Running { d: self, writes });
        claim::run(me, client, bell, stop).await;
        relay.abort();
        let _ = relay.await;
        // The last outcomes are written before the store closes (once every sender
        // is gone, which the loop's end made so).
        let _ = written.await;
    }
}

/// A running deliverer: its settings, and where its outcomes go to be written in
/// batches.
struct Running {
    d: Deliverer,
    writes: tokio::sync::mpsc::Sender<Outcome>,
}

impl std::ops::Deref for Running {
    type Target = Deliverer;

    fn deref(&self) -> &Deliverer {
        &self.d
    }
}

impl Running {
    /// Hands an outcome to the writer (the attempt's slot is free meanwhile).
    async fn write(&self, outcome: Outcome) {
        let _ = self.writes.send(outcome).await;
    }
}
