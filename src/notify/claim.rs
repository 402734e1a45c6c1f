//! The claim loop: takes due deliveries from the outbox under a lease, as many as
//! there are free slots and in the tenants' turns, and starts their attempts.
//!
//! It wakes on the deliveries notice ([`super::doorbell`]: deliveries inserted),
//! when a retry it scheduled falls due, at once when a retry is written, an end
//! with another delivery of its webhook behind it is written, or a redelivery is
//! queued ([`super::Deliverer::wake`]), when an attempt ends and the last claim
//! may have left a due delivery for want of a slot, when a receiver is about to
//! stall, and at least every [`IDLE`].

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinSet;

use super::attempt::outcome;
use super::doorbell::Doorbell;
use super::share::{Admit, Key, Permit, Share, receiver};
use super::{IDLE, Running};
use crate::model::DeliveryStatus;
use crate::outbound::Client;
use crate::store::{Due, Turns};

/// Rings are claimed at once while they come no faster than one per this gap on
/// average, with a burst of [`CLAIM_BURST`] allowed; faster than that, a ring waits
/// until this long has passed since the one before it, so that however fast events
/// come, the rings that come meanwhile are one claim. A claim that anything else
/// started does not count: attempts end no faster than they are claimed, and such
/// a claim cannot have seen what the ring announces.
const CLAIM_GAP: Duration = Duration::from_millis(5);

/// Rings claimed back to back before [`CLAIM_GAP`] paces them: a few tenants'
/// events, which come at random moments, are each claimed at once.
const CLAIM_BURST: u32 = 4;

/// The pace of the claims rings start: a bucket of [`CLAIM_BURST`] gaps' credit,
/// one gap spent by each ring and earned back with time.
struct RingPace {
    credit: Duration,
    at: tokio::time::Instant,
}

impl RingPace {
    fn new(now: tokio::time::Instant) -> RingPace {
        RingPace {
            credit: CLAIM_GAP * CLAIM_BURST,
            at: now,
        }
    }

    /// How long a ring heard at `now` waits before its claim (charged to the pace).
    fn wait(&mut self, now: tokio::time::Instant) -> Duration {
        let earned = now.saturating_duration_since(self.at);
        self.credit = (self.credit + earned).min(CLAIM_GAP * CLAIM_BURST);
        self.at = now.max(self.at);
        if self.credit >= CLAIM_GAP {
            self.credit -= CLAIM_GAP;
            return Duration::ZERO;
        }
        let wait = CLAIM_GAP - self.credit;
        self.credit = Duration::ZERO;
        self.at += wait;
        wait
    }
}

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
        left_behind: false,
        stalled: HashSet::new(),
    };
    let me = tasks.me.clone();
    let mut pace = RingPace::new(tokio::time::Instant::now());
    // Whether something may be due that no claim has looked for since.
    let mut owed = true;
    let mut last_gauge = tokio::time::Instant::now() - IDLE;
    tokio::pin!(stop);
    loop {
        // Every task already done frees its slot before the claim counts them.
        while let Some(done) = tasks.flying.try_join_next() {
            owed |= tasks.reap(done);
        }
        for (d, after) in tasks.share.shed() {
            tasks.put_back(d, after);
        }
        let free = me.cfg.concurrency.saturating_sub(tasks.flying.len());
        let mut full = false;
        if free > 0 && owed {
            full = tasks.claim(free).await == free;
            owed = false;
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
            _ = tokio::time::sleep(idle), if !full => owed = true,
            _ = std::future::ready(()), if full && free > 0 => owed = true,
            _ = me.wake.notified() => owed = true,
            _ = bell.rung() => {
                let pause = pace.wait(tokio::time::Instant::now());
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
                bell.hush();
                owed = true;
            }
            // A slot freed is worth a claim only where the last one left due
            // deliveries for want of it.
            Some(done) = tasks.flying.join_next(), if !tasks.flying.is_empty() => {
                owed |= tasks.reap(done);
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
    /// The last claim may have left due deliveries in the store for want of a
    /// slot: it took all it asked for, or a tenant reached its share (or it failed).
    left_behind: bool,
    /// The receivers whose deliveries the last claim left in the store as stalled:
    /// an attempt of one that ends is worth a claim.
    stalled: HashSet<Key>,
}

impl Tasks {
    /// Claims up to `free` due deliveries and starts or queues each; how many came.
    async fn claim(&mut self, free: usize) -> usize {
        let now = Utc::now();
        if self.soonest.is_some_and(|t| t <= now) {
            self.soonest = None;
        }
        let me = &self.me;
        let stalled = self.share.stalled();
        let claimed = me
            .outbox
            .claim(
                me.owner,
                now,
                me.cfg.lease_ttl,
                free as i64,
                &Turns {
                    per_tenant: self.share.per_tenant() as i64,
                    taken: &self.share.taken(),
                    stalled: &stalled,
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
                self.left_behind = n == free || self.share.any_at_share();
                self.stalled = stalled
                    .iter()
                    .map(|(tenant, url)| Key {
                        tenant: tenant.clone(),
                        receiver: receiver(url),
                    })
                    .collect();
                n
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot claim webhook deliveries");
                self.left_behind = true;
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
    /// is given back). Whether the slot it freed is worth a claim: the last claim
    /// left due deliveries for want of one, or left this receiver's as stalled.
    fn reap(&mut self, done: Result<Done, tokio::task::JoinError>) -> bool {
        let Ok(done) = done else { return false };
        if let Some(next) = done.next {
            self.soonest = Some(self.soonest.map_or(next, |s| s.min(next)));
        }
        let Some((key, took, permit)) = done.sent else {
            return false;
        };
        let stale = self.me.cfg.lease_ttl / 2;
        for next in self.share.finished(&key, took, stale, permit) {
            self.start(key.clone(), next);
        }
        self.left_behind || self.stalled.contains(&key)
    }
}

impl Running {
    /// The store-wide figures `/metrics` shows: the oldest pending delivery's age,
    /// and the deliveries each bound dropped.
    async fn read_gauges(&self) {
        if let Ok(oldest) = self.outbox.oldest_pending().await {
            let age = oldest.map_or(0, |t| (Utc::now() - t).num_milliseconds().max(0));
            self.metrics.webhook_oldest_pending_ms.store(age, Relaxed);
        }
        if let Ok(dropped) = self.outbox.dropped().await {
            for (gauge, n) in self.metrics.webhook_dropped.iter().zip(dropped) {
                gauge.store(n, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_rings_is_claimed_at_once_and_a_storm_one_gap_apart() {
        let t = tokio::time::Instant::now();
        let mut pace = RingPace::new(t);
        for i in 0..CLAIM_BURST {
            assert_eq!(pace.wait(t), Duration::ZERO, "ring {i} of a burst waited");
        }
        // Past the burst, a ring of a storm is claimed a gap after the one before.
        let ms = Duration::from_millis;
        assert_eq!(pace.wait(t), CLAIM_GAP, "claimed at +5 ms");
        assert_eq!(pace.wait(t + ms(6)), ms(4), "claimed at +10 ms");
        assert_eq!(pace.wait(t + ms(10)), CLAIM_GAP, "claimed at +15 ms");
        // After a quiet spell as long as the burst's gaps, a burst goes at once again.
        let t = t + ms(15) + CLAIM_GAP * CLAIM_BURST;
        for i in 0..CLAIM_BURST {
            assert_eq!(
                pace.wait(t),
                Duration::ZERO,
                "ring {i} after the quiet waited"
            );
        }
        assert!(pace.wait(t) > Duration::ZERO);
    }

    #[test]
    fn rings_that_come_a_gap_apart_never_wait() {
        let mut t = tokio::time::Instant::now();
        let mut pace = RingPace::new(t);
        for _ in 0..1000 {
            assert_eq!(pace.wait(t), Duration::ZERO);
            t += CLAIM_GAP;
        }
    }
}
