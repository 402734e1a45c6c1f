//! The claim loop: takes due deliveries from the outbox under a lease, as many as
//! there are free slots and in the tenants' turns, and starts their attempts.
//!
//! It wakes on the deliveries notice ([`super::doorbell`]: deliveries inserted),
//! when a retry it scheduled falls due, at once when a retry is written, an end
//! with another delivery of its webhook behind it is written, or a redelivery is
//! queued ([`super::Deliverer::wake`]), when an attempt ends, when a receiver is
//! about to stall, and at least every [`IDLE`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

use super::attempt::outcome;
use super::doorbell::Doorbell;
use super::share::{Admit, Key, Permit, Share};
use super::{IDLE, Running};
use crate::model::DeliveryStatus;
use crate::outbound::Client;
use crate::store::{Due, Turns};

/// A ring is claimed at once, unless the last claim a ring started ended less than
/// this long ago: then once this long has passed, so that however fast events come,
/// the rings that come meanwhile (a burst) are one claim. A claim that an attempt's
/// end or a wake started does not count: attempts end no faster than they are
/// claimed, and such a claim cannot have seen what the ring announces.
const CLAIM_GAP: Duration = Duration::from_millis(5);

/// What a task of the loop came to: the next attempt's time when the delivery stays
/// pending, and, for an attempt, its tenant's receiver, how long it took and the
/// places it held.
struct Done {
    next: Option<DateTime<Utc>>,
    sent: Option<(Key, Duration, Permit)>,
}

/// Claims and starts attempts until `stop` resolves; attempts in flight then
/// have 5 s to finish (what waits in the queues keeps its lease until it runs
/// out).
pub(super) async fn run(
    me: Arc<Running>,
    client: Client,
    bell: Doorbell,
    stop: impl Future<Output = ()>,
) {
    let mut tasks = Tasks {
        share: Share::new(me.cfg.per_tenant.min(me.cfg.concurrency)),
        me,
        client,
        flying: JoinSet::new(),
        soonest: None,
    };
    let me = tasks.me.clone();
    // When the last claim a ring started ended, and whether the next one is one.
    let mut last_ring_claim = tokio::time::Instant::now();
    let mut rung = false;
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
            full = tasks.claim(free).await == free;
            if rung {
                last_ring_claim = tokio::time::Instant::now();
            }
        }
        rung = false;
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
            _ = bell.rung() => {
                let pause = CLAIM_GAP.saturating_sub(last_ring_claim.elapsed());
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                bell.hush();
                rung = true;
            }
            Some(done) = tasks.flying.join_next(), if !tasks.flying.is_empty() => {
                tasks.reap(done);
            }
        }
    }
    let Tasks { mut flying, .. } = tasks;
    let drain = async { while flying.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(5), drain)
        .await
        .is_err()
    {
        flying.abort_all();
    }
}

/// The loop's tasks (attempts, and deliveries being given back) and what decides
/// which claimed delivery goes when.
struct Tasks {
    me: Arc<Running>,
    client: Client,
    flying: JoinSet<Done>,
    share: Share,
    /// The soonest retry this replica scheduled.
    soonest: Option<DateTime<Utc>>,
}

impl Tasks {
    /// Claims up to `free` due deliveries and starts or queues each; how many came.
    async fn claim(&mut self, free: usize) -> usize {
        let now = Utc::now();
        if self.soonest.is_some_and(|t| t <= now) {
            self.soonest = None;
        }
        let me = &self.me;
        let claimed = me
            .store
            .claim_deliveries(
                me.owner,
                now,
                me.cfg.lease_ttl,
                free as i64,
                &Turns {
                    per_tenant: self.share.per_tenant() as i64,
                    taken: &self.share.taken(),
                    stalled: &self.share.stalled(),
                    stalled_until: now + IDLE,
                },
            )
            .await;
        match claimed {
            Ok(due) => {
                let n = due.len();
                for d in due {
                    let key = Key::of(&d);
                    let admitted = self.share.admit(key.clone(), d);
                    self.start(key, admitted);
                }
                n
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot claim webhook deliveries");
                0
            }
        }
    }

    fn start(&mut self, key: Key, admitted: Admit) {
        match admitted {
            Admit::Send(d, permit) => {
                let (me, client) = (self.me.clone(), self.client.clone());
                self.flying.spawn(async move {
                    let started = tokio::time::Instant::now();
                    let next = me.attempt(&client, d).await;
                    Done {
                        next,
                        sent: Some((key, started.elapsed(), permit)),
                    }
                });
            }
            Admit::Queued => {}
            Admit::PutBack(d, after) => self.put_back(d, after),
        }
    }

    /// Gives a claimed delivery back unsent, due `after` from now (its receiver's
    /// slots are taken, and as many wait as it can answer soon).
    fn put_back(&mut self, d: Due, after: Duration) {
        let me = self.me.clone();
        self.flying.spawn(async move {
            let next = Utc::now() + chrono::Duration::from_std(after).unwrap_or_default();
            me.write(outcome(d, DeliveryStatus::Pending, Some(next), None))
                .await;
            Done {
                next: Some(next),
                sent: None,
            }
        });
    }

    /// A task is done: when it was an attempt, its places are free, and its
    /// receiver's next waiting delivery goes (one that waited past half its lease
    /// is given back).
    fn reap(&mut self, done: Result<Done, tokio::task::JoinError>) {
        let Ok(done) = done else { return };
        if let Some(next) = done.next {
            self.soonest = Some(self.soonest.map_or(next, |s| s.min(next)));
        }
        let Some((key, took, permit)) = done.sent else {
            return;
        };
        let stale = self.me.cfg.lease_ttl / 2;
        for next in self.share.finished(&key, took, stale, permit) {
            self.start(key.clone(), next);
        }
    }
}

impl Running {
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
