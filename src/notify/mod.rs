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
//! Attempts are shared ([`share`]): a tenant has at most its share of them in
//! flight, and each of its receivers half of that, so a receiver that hangs costs
//! its own tenant some slots and no other tenant any.
//!
//! The loop wakes on the event bus (an event of this replica's, or of any replica
//! on Postgres, may owe a delivery), when its own retries fall due, when a client
//! asks for a redelivery, and at least every [`IDLE`].

mod attempt;
mod share;
mod writer;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use uuid::Uuid;

pub use attempt::{DEFAULT_RETRY_BASE, MAX_RESPONSE, SCHEDULE, payload, retry_delay, sign};

use crate::bus::Bus;
use crate::metrics::Metrics;
use crate::model::DeliveryStatus;
use crate::probe::{Guard, GuardedResolver};
use crate::store::{Due, Outcome, Store, Turns};
use share::{Admit, Key, Share};

/// After a burst of events wakes the loop, it claims at most this often.
const CLAIM_GAP: Duration = Duration::from_millis(20);

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
    pub guard: Guard,
    pub resolve_overrides: Vec<(String, SocketAddr)>,
}

/// What a task of the loop came to: the next attempt's time when the delivery stays
/// pending, and, for an attempt, its tenant's receiver and how long it took.
struct Done {
    next: Option<DateTime<Utc>>,
    sent: Option<(Key, Duration)>,
}

/// One replica's delivery loop.
pub struct Deliverer {
    pub store: Store,
    pub bus: Bus,
    pub metrics: Arc<Metrics>,
    pub owner: Uuid,
    pub cfg: NotifyConfig,
    /// Notified when a client queues a redelivery.
    pub wake: Arc<Notify>,
}

impl Deliverer {
    /// Runs until `stop` resolves; attempts in flight then have 5 s to finish and be
    /// written (one cut short keeps its lease, and is sent again once it runs out).
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let client = match crate::probe::guarded_client(
            GuardedResolver::new(
                Arc::new(self.cfg.guard.clone()),
                &self.cfg.resolve_overrides,
            ),
            self.cfg.timeout,
        )
        .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %crate::probe::error_chain(&e), "cannot build the HTTP client for webhooks; no deliveries from this replica");
                return;
            }
        };
        let (writes, rx) = tokio::sync::mpsc::channel(4 * writer::WRITE_BATCH);
        let written = tokio::spawn(writer::writer(
            self.store.clone(),
            self.owner,
            rx,
            self.wake.clone(),
        ));
        let me = Arc::new(Running { d: self, writes });
        let mut bus = me.bus.subscribe();
        let mut tasks = Tasks {
            me: me.clone(),
            client,
            flying: JoinSet::new(),
            share: Share::new(me.cfg.per_tenant.min(me.cfg.concurrency)),
            soonest: None,
        };
        let mut last_claim = tokio::time::Instant::now();
        let mut last_gauge = tokio::time::Instant::now() - IDLE;
        tokio::pin!(stop);
        loop {
            // Every task already done frees its slot before the claim counts them.
            while let Some(done) = tasks.flying.try_join_next() {
                tasks.reap(done);
            }
            for (d, after) in tasks.share.shed() {
                tasks.put_back(d, after);
            }
            let free = me.cfg.concurrency.saturating_sub(tasks.flying.len());
            let mut full = false;
            if free > 0 {
                let now = Utc::now();
                if tasks.soonest.is_some_and(|t| t <= now) {
                    tasks.soonest = None;
                }
                last_claim = tokio::time::Instant::now();
                match me
                    .store
                    .claim_deliveries(
                        me.owner,
                        now,
                        me.cfg.lease_ttl,
                        free as i64,
                        &Turns {
                            per_tenant: tasks.share.per_tenant() as i64,
                            taken: &tasks.share.taken(),
                            stalled: &tasks.share.stalled(),
                        },
                    )
                    .await
                {
                    Ok(due) => {
                        full = due.len() == free;
                        for d in due {
                            let key = Key::of(&d);
                            let admitted = tasks.share.admit(key.clone(), d);
                            tasks.start(key, admitted);
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot claim webhook deliveries"),
                }
            }
            if last_gauge.elapsed() >= IDLE {
                last_gauge = tokio::time::Instant::now();
                me.read_gauges().await;
            }
            // A retry that came due while the claim above ran is claimed at once.
            let idle = tasks
                .soonest
                .map(|t| (t - Utc::now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(IDLE)
                .min(IDLE)
                .min(tasks.share.next_stall().unwrap_or(IDLE));
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(idle), if !full => {}
                _ = std::future::ready(()), if full && free > 0 => {}
                _ = me.wake.notified() => {}
                r = bus.recv() => {
                    if matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                        break;
                    }
                    // Events come in bursts: take what a few milliseconds bring at once,
                    // and claim no more often than CLAIM_GAP.
                    let gap = CLAIM_GAP.saturating_sub(last_claim.elapsed());
                    tokio::time::sleep(gap.max(Duration::from_millis(5))).await;
                    while bus.try_recv().is_ok() {}
                }
                Some(done) = tasks.flying.join_next(), if !tasks.flying.is_empty() => {
                    tasks.reap(done);
                }
            }
        }
        let Tasks {
            mut flying,
            me: also_me,
            ..
        } = tasks;
        // What waits in the queues keeps its lease until it runs out.
        let drain = async { while flying.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .is_err()
        {
            flying.abort_all();
        }
        // The last outcomes are written before the store closes (once every sender
        // is gone).
        drop((me, also_me));
        let _ = written.await;
    }
}

/// The loop's tasks (attempts, and deliveries being given back) and what decides
/// which claimed delivery goes when.
struct Tasks {
    me: Arc<Running>,
    client: reqwest::Client,
    flying: JoinSet<Done>,
    share: Share,
    /// The soonest retry this replica scheduled.
    soonest: Option<DateTime<Utc>>,
}

impl Tasks {
    fn start(&mut self, key: Key, admitted: Admit) {
        match admitted {
            Admit::Send(d) => {
                let (me, client) = (self.me.clone(), self.client.clone());
                self.flying.spawn(async move {
                    let started = tokio::time::Instant::now();
                    let next = me.attempt(&client, d).await;
                    Done {
                        next,
                        sent: Some((key, started.elapsed())),
                    }
                });
            }
            Admit::Queued => {}
            Admit::PutBack(d, after) => self.put_back(d, after),
        }
    }

    fn put_back(&mut self, d: Due, after: Duration) {
        let me = self.me.clone();
        self.flying
            .spawn(async move { me.put_back(d, after).await });
    }

    /// A task is done: when it was an attempt, its receiver's slot is free, and its
    /// next waiting delivery goes (one that waited past half its lease is given
    /// back).
    fn reap(&mut self, done: Result<Done, tokio::task::JoinError>) {
        let Ok(done) = done else { return };
        if let Some(next) = done.next {
            self.soonest = Some(self.soonest.map_or(next, |s| s.min(next)));
        }
        let Some((key, took)) = done.sent else { return };
        for next in self.share.finished(&key, took, self.me.cfg.lease_ttl / 2) {
            self.start(key.clone(), next);
        }
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
    /// Gives a claimed delivery back unsent, due `after` from now (its receiver's
    /// slots are taken, and as many wait as it can answer soon).
    async fn put_back(&self, due: Due, after: Duration) -> Done {
        let next = Utc::now() + chrono::Duration::from_std(after).unwrap_or_default();
        let outcome = Outcome {
            id: due.delivery.id,
            epoch: due.epoch,
            wait_id: due.wait_id,
            endpoint: due.delivery.endpoint,
            status: DeliveryStatus::Pending,
            next_attempt_at: Some(next),
            tries: due.tries,
            attempts: due.delivery.attempts,
            attempted: false,
        };
        self.write(outcome).await;
        Done {
            next: Some(next),
            sent: None,
        }
    }

    /// The store-wide figures `/metrics` shows: the oldest pending delivery's age,
    /// and the deliveries each bound dropped.
    async fn read_gauges(&self) {
        if let Ok(oldest) = self.store.oldest_pending_delivery().await {
            let age = oldest.map_or(0, |t| (Utc::now() - t).num_milliseconds().max(0));
            self.metrics.webhook_oldest_pending_ms.store(age, Relaxed);
        }
        if let Ok(dropped) = self.store.dropped_deliveries().await {
            for (gauge, n) in self.metrics.webhook_dropped.iter().zip(dropped) {
                gauge.store(n, Relaxed);
            }
        }
    }
}
