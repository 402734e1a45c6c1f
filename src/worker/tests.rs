//! The worker's loop, driven one message at a time on SQLite in memory, for what
//! process tests otherwise reach only by killing replicas and cutting databases off:
//! a wait lost to another replica, a stray, a batch the store refuses, the end of a
//! crash loop, a renewal that fails.
//!
//! Tokio's clock is paused, and a task that only yields keeps the runtime from ever
//! being idle, so the clock moves only when a test advances it: SQLite answers from
//! a thread of its own, and an automatic advance while it works would fire the
//! pool's timeouts instead of waiting for it.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::*;
use crate::engine::Limits;
use crate::probe::ProbeConfig;
use crate::store::{EventBody, Status, Store};

/// A loop on a fresh store, with the receiving end of what its tasks report.
struct Rig {
    lp: Loop,
    rx: mpsc::UnboundedReceiver<Msg>,
    store: Store,
    keeper: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// A lease short enough that another replica may take a wait once it runs out in
/// real time.
const TTL: Duration = Duration::from_millis(300);

/// A lease no loaded machine outlives by accident during a test.
const LONG: Duration = Duration::from_secs(30);

async fn rig(lease_ttl: Duration) -> Rig {
    rig_with(lease_ttl, WorkerConfig::default().concurrency).await
}

async fn rig_with(lease_ttl: Duration, concurrency: usize) -> Rig {
    let bus = Bus::new();
    let store = Store::open("sqlite::memory:", 1, bus.clone()).unwrap();
    store.migrate().await.unwrap();
    tokio::time::pause();
    let keeper = tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
    let w = Arc::new(Worker {
        leases: store.leases().clone(),
        prober: Prober::new(ProbeConfig::default()).unwrap(),
        bus,
        cfg: WorkerConfig {
            lease_ttl,
            concurrency,
            ..WorkerConfig::default()
        },
        metrics: Arc::new(Metrics::default()),
        owner: Uuid::now_v7(),
        signals: Signals::channel(),
        live: None,
    });
    let (tx, rx) = mpsc::unbounded_channel();
    Rig {
        lp: Loop::new(w, tx),
        rx,
        store,
        keeper,
    }
}

impl Rig {
    /// A wait due now. Waits are created at the loop's wall time, not the real
    /// one: its clock stands still with tokio's while the real one runs on, so a
    /// wait created at the real time would be due later on the loop's clock by
    /// however long the machine took since the rig was built.
    async fn create(&self) -> Uuid {
        let spec = Spec::from_request(
            &json!({
                "target": {"url": "https://api.example.com/status"},
                "state": "/status",
                "want": ["on"],
                "timeout": "1h",
            }),
            &Limits::default(),
        )
        .unwrap();
        let created = self
            .store
            .waits()
            .create("t", &spec, self.lp.clock.now(), None)
            .await;
        created.unwrap().wait.id
    }

    /// A wait whose first poll is `delay` from now.
    async fn create_due_in(&self, delay: Duration) -> Uuid {
        let spec = Spec::from_request(
            &json!({
                "target": {"url": "https://api.example.com/status"},
                "state": "/status",
                "want": ["on"],
                "timeout": "1h",
                "poll": {"delay": format!("{}ms", delay.as_millis())},
            }),
            &Limits::default(),
        )
        .unwrap();
        let created = self
            .store
            .waits()
            .create("t", &spec, self.lp.clock.now(), None)
            .await;
        created.unwrap().wait.id
    }

    /// The next report of a task the loop spawned, handled as the loop would.
    async fn next(&mut self) -> &'static str {
        let msg = tokio::time::timeout(Duration::from_secs(60), self.rx.recv())
            .await
            .expect("a task reports back")
            .expect("the channel is open");
        let what = msg.what();
        self.lp.handle(msg);
        self.lp.flush_writes();
        what
    }

    /// A claim by the loop, answered.
    async fn claim(&mut self) {
        self.lp.claim();
        assert_eq!(self.next().await, "a claim");
    }

    /// A renewal by the loop, answered.
    async fn renew(&mut self) {
        self.lp.renew();
        while self.lp.stepping() && self.lp.sweep.is_some() {
            self.lp.step();
        }
        // The lease row first, then the rest of the renewal.
        let mut what = self.next().await;
        if what == "a lease renewed" {
            what = self.next().await;
        }
        assert_eq!(what, "a renewal");
    }

    fn phase(&self, id: Uuid) -> Option<Phase> {
        self.lp.held.get(&id).map(|h| h.phase)
    }

    /// The wait as the store has it.
    async fn read(&self, id: Uuid) -> crate::model::Wait {
        self.store
            .waits()
            .get("t", id)
            .await
            .unwrap()
            .expect("the wait")
    }
}

/// The lease of whoever holds a wait runs out by the store's clock (the wall clock).
fn outlive_the_lease() {
    std::thread::sleep(TTL + Duration::from_millis(100));
}

#[tokio::test]
async fn a_wait_another_replica_took_over_is_dropped_at_the_next_renewal() {
    let mut r = rig(TTL).await;
    let id = r.create().await;
    r.claim().await;
    assert_eq!(r.phase(id), Some(Phase::Claimed));
    outlive_the_lease();
    let other = Uuid::now_v7();
    let taken = r
        .store
        .leases()
        .claim(other, TTL, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "the lapsed lease lets another replica in");

    r.renew().await;
    assert_eq!(r.phase(id), None, "a lost wait is no longer held");
    assert!(
        r.lp.let_go.is_empty(),
        "a lost wait is not given back: it is another replica's"
    );
    assert!(!r.lp.need_full);
}

#[tokio::test]
async fn a_wait_owned_but_not_held_is_given_back_once_two_renewals_find_it() {
    let mut r = rig(LONG).await;
    let id = r.create().await;
    // Claimed for this replica, as a claim whose answer never came back.
    let owner = r.lp.w.owner;
    let claimed = r
        .store
        .leases()
        .claim(owner, LONG, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);

    r.renew().await;
    assert!(r.lp.strays.contains_key(&id), "seen once: noted");
    assert!(r.lp.let_go.is_empty(), "not given back after one renewal");
    assert!(r.lp.need_full, "the next renewal looks again");
    let other = Uuid::now_v7();
    assert!(
        r.store
            .leases()
            .claim(other, LONG, Duration::ZERO, 10)
            .await
            .unwrap()
            .is_empty(),
        "still this replica's"
    );

    r.renew().await;
    assert_eq!(r.lp.let_go.len(), 1, "seen twice: let go");
    assert!(r.lp.claim_again, "and claimed again like any other wait");
    // The renewal after gives it back, and another replica may take it at once.
    r.renew().await;
    assert!(r.lp.let_go.is_empty());
    let taken = r
        .store
        .leases()
        .claim(other, LONG, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "given back");
    assert_eq!(taken[0].id, id);
}

#[tokio::test]
async fn a_batch_the_store_refuses_ends_only_the_refused_wait_in_error() {
    let mut r = rig(LONG).await;
    let (poison, fine) = (r.create().await, r.create().await);
    r.claim().await;
    r.store
        .execute(
            "CREATE TRIGGER no_poison BEFORE UPDATE OF state ON waits
             WHEN NEW.state = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poison is refused'); END",
        )
        .await
        .unwrap();
    // What two polls observed, queued together: one batch.
    for (id, state) in [(poison, "poison"), (fine, "deploying")] {
        let h = r.lp.held.get_mut(&id).unwrap();
        h.phase = Phase::Writing;
        h.engine.state = Some(state.into());
        h.engine.polls = 1;
        let progress = Progress {
            id,
            epoch: h.epoch,
            engine: h.engine.clone(),
            next_poll_at: Some(Utc::now() + chrono::TimeDelta::minutes(1)),
            events: vec![EventBody::State {
                from: None,
                to: state.into(),
            }],
            end: None,
        };
        r.lp.pending.push((progress, h.generation));
    }
    r.lp.flush_writes();
    assert_eq!(r.lp.writing, 1, "one batch");
    assert_eq!(r.next().await, "a progress write");

    let refused = r.read(poison).await;
    assert_eq!(refused.status, Status::Error);
    let reason = refused.reason.unwrap_or_default();
    assert!(
        reason.starts_with("could not store what the target answered"),
        "{reason}"
    );
    assert_eq!(r.phase(poison), None, "an ended wait is no longer held");
    let written = r.read(fine).await;
    assert_eq!(written.status, Status::Running);
    assert_eq!(written.state.as_deref(), Some("deploying"));
    assert_eq!(r.phase(fine), Some(Phase::Idle), "its neighbour goes on");
    let errors = Status::ENDS
        .iter()
        .position(|s| *s == Status::Error)
        .unwrap();
    let ended = r.lp.w.metrics.ended[errors].load(Relaxed);
    assert_eq!(ended, 1, "counted once, when the store has the end");
}

#[tokio::test]
async fn a_wait_whose_polls_never_complete_is_ended_by_its_next_claimer_not_polled() {
    let mut r = rig(TTL).await;
    let id = r.create().await;
    // Three replicas in a row claim it, begin a poll, and die before it completes.
    for _ in 0..crate::store::MAX_CLAIMS {
        let dead = Uuid::now_v7();
        let c = r
            .store
            .leases()
            .claim(dead, TTL, Duration::ZERO, 10)
            .await
            .unwrap();
        let at = WaitEpoch {
            id,
            epoch: c[0].epoch,
        };
        assert_eq!(
            r.store.leases().mark_polling(dead, &[at]).await.unwrap(),
            vec![id]
        );
        outlive_the_lease();
    }
    let mut signals = r.lp.w.signals.subscribe().unwrap();
    r.claim().await;
    assert_eq!(signals.try_recv().unwrap(), Signal::Claimed(vec![id]));
    assert_eq!(r.phase(id), Some(Phase::Writing), "ended, not scheduled");
    assert!(r.lp.timers.is_empty(), "no poll is due");
    assert_eq!(r.next().await, "a progress write");
    let ended_signal = Signal::Recorded { id, ended: true };
    assert_eq!(signals.try_recv().unwrap(), ended_signal);
    let ended = r.read(id).await;
    assert_eq!(ended.status, Status::Error);
    let reason = ended.reason.unwrap_or_default();
    assert!(
        reason.contains("did not complete 3 times in a row"),
        "{reason}"
    );
    assert_eq!(r.phase(id), None);
}

#[tokio::test]
async fn a_renewal_that_fails_pauses_polling_once_the_lease_runs_short_until_one_succeeds() {
    let mut r = rig(LONG).await;
    let id = r.create().await;
    r.claim().await;
    r.renew().await;
    assert!(!r.lp.need_full);
    // A checkpoint that went with a renewal that failed is written again later.
    r.lp.held.get_mut(&id).unwrap().dirty = false;
    r.lp.renewing = true;
    r.lp.renewed(lease::Renewed {
        started: tokio::time::Instant::now(),
        full: true,
        named: vec![],
        checkpointed: vec![id],
        claiming: false,
        result: Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
        unreleased: vec![],
    });
    assert!(r.lp.need_full, "the next renewal names every wait");
    let h = &r.lp.held[&id];
    assert!(h.dirty && h.written == 0, "its checkpoint is due again");

    // The lease by the loop's own clock runs short: nothing is polled.
    tokio::time::advance(LONG).await;
    r.lp.fire_due();
    assert!(r.lp.paused);
    assert_eq!(r.phase(id), Some(Phase::Claimed), "not polled while paused");
    assert!(!r.lp.timers.is_empty(), "its poll is still due");

    // A renewal that succeeds lets polling go on.
    r.renew().await;
    r.lp.fire_due();
    assert!(!r.lp.paused);
    assert_eq!(r.phase(id), Some(Phase::Marking), "its first poll begins");
}

#[tokio::test]
async fn a_claimed_wait_whose_stored_spec_cannot_be_read_is_ended_in_error_not_held() {
    let mut r = rig(LONG).await;
    let id = r.create().await;
    r.store
        .execute("UPDATE wait_specs SET spec = '{\"not\": \"a spec\"}'")
        .await
        .unwrap();
    r.claim().await;
    assert_eq!(r.phase(id), None, "never held");
    let ended = r.read(id).await;
    assert_eq!(ended.status, Status::Error);
    let reason = ended.reason.unwrap_or_default();
    assert!(
        reason.starts_with("waitd could not read this wait's stored spec: spec:"),
        "{reason}"
    );
    assert!(ended.last_error.is_some_and(|e| e.starts_with("spec:")));
}

#[tokio::test]
async fn a_burst_of_due_waits_starts_twice_the_concurrency_and_the_rest_as_polls_end() {
    // What a takeover finds: every wait held due at once.
    let mut r = rig_with(LONG, 2).await;
    for _ in 0..20 {
        r.create().await;
    }
    r.claim().await;
    r.renew().await;
    assert_eq!(r.lp.held.len(), 20);
    let started = |r: &Rig| {
        r.lp.held
            .values()
            .filter(|h| h.phase == Phase::FirstPoll)
            .count()
    };
    tokio::time::advance(Duration::from_secs(1)).await;
    r.lp.fire_due();
    // Their first polls are recorded as begun, all in one statement; none
    // starts before.
    assert_eq!(started(&r), 0);
    assert_eq!(r.next().await, "first polls marked");
    assert!(r.lp.held.values().all(|h| h.phase == Phase::Counted));
    r.lp.fire_due();
    assert_eq!(started(&r), 4, "twice the concurrency begin");
    r.lp.fire_due();
    assert_eq!(started(&r), 4, "no more while they are on their way");
    assert!(
        !r.lp.timers_due(),
        "the loop does not spin on the ones left"
    );
    assert_eq!(r.lp.in_flight.load(Relaxed), 4);
    // They end (the host does not resolve here): room for the next four.
    for _ in 0..4 {
        assert_eq!(r.next().await, "a probe");
    }
    assert_eq!(r.lp.in_flight.load(Relaxed), 0);
    r.lp.fire_due();
    assert_eq!(started(&r), 4, "four more once four polls ended");
}

#[tokio::test]
async fn first_polls_that_changed_nothing_are_confirmed_together_not_one_by_one() {
    let mut r = rig(LONG).await;
    let ids = [r.create().await, r.create().await, r.create().await];
    r.claim().await;
    // Each first poll completes unchanged, a little apart; their waits poll
    // again in an hour, so only the delay decides when they are written.
    let an_hour =
        r.lp.clock
            .instant_at(r.lp.clock.now() + chrono::TimeDelta::hours(1));
    for id in ids {
        let h = r.lp.held.get_mut(&id).unwrap();
        h.phase = Phase::Confirming;
        let at = (WaitEpoch { id, epoch: h.epoch }, h.generation);
        r.lp.confirm(at, an_hour);
        r.lp.flush_writes();
        assert_eq!(r.lp.writing, 0, "held back to share a batch");
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    // The first waited its delay: all three go in one statement.
    tokio::time::advance(super::writes::CONFIRM_DELAY - Duration::from_millis(300)).await;
    r.lp.flush_writes();
    assert_eq!(r.lp.writing, 1, "one batch");
    assert_eq!(r.next().await, "first polls confirmed");
    assert_eq!(r.lp.writing, 0);
    for id in ids {
        assert_eq!(r.phase(id), Some(Phase::Idle), "confirmed, and scheduled");
    }
}

#[tokio::test]
async fn a_confirmation_is_written_by_the_time_its_wait_polls_again() {
    let mut r = rig(LONG).await;
    let id = r.create().await;
    r.claim().await;
    let h = r.lp.held.get_mut(&id).unwrap();
    h.phase = Phase::Confirming;
    let at = (WaitEpoch { id, epoch: h.epoch }, h.generation);
    let soon = tokio::time::Instant::now() + Duration::from_millis(50);
    r.lp.confirm(at, soon);
    r.lp.flush_writes();
    assert_eq!(r.lp.writing, 0);
    assert!(r.lp.next_wake() <= soon, "the loop wakes for it");
    tokio::time::advance(Duration::from_millis(50)).await;
    r.lp.flush_writes();
    assert_eq!(
        r.lp.writing, 1,
        "written when its wait is due, not after the delay"
    );
    assert_eq!(r.next().await, "first polls confirmed");
    assert_eq!(r.phase(id), Some(Phase::Idle));
}

#[tokio::test]
async fn first_polls_are_recorded_as_begun_ahead_together_and_start_when_due() {
    let mut r = rig(LONG).await;
    let soon = r.create_due_in(Duration::from_millis(1200)).await;
    let then = r.create_due_in(Duration::from_millis(1500)).await;
    let later = r.create_due_in(Duration::from_millis(3000)).await;
    r.claim().await;
    r.renew().await;
    for id in [soon, then, later] {
        assert_eq!(r.phase(id), Some(Phase::Claimed));
    }
    r.lp.fire_due();
    assert_eq!(
        r.phase(soon),
        Some(Phase::Claimed),
        "not due within half a second"
    );
    // Half a second before the first is due: it and every other due within a
    // second are recorded in one statement; none starts before it is due.
    tokio::time::advance(Duration::from_millis(750)).await;
    assert!(r.lp.next_wake() <= tokio::time::Instant::now());
    r.lp.fire_due();
    assert_eq!(r.phase(soon), Some(Phase::Marking));
    assert_eq!(r.phase(then), Some(Phase::Marking));
    assert_eq!(
        r.phase(later),
        Some(Phase::Claimed),
        "not due within a second"
    );
    assert_eq!(r.next().await, "first polls marked");
    assert_eq!(r.phase(soon), Some(Phase::Counted));
    assert_eq!(r.phase(then), Some(Phase::Counted));
    assert_eq!(r.lp.in_flight.load(Relaxed), 0, "none started early");
    // Due: it starts as a first poll, with no write of its own.
    tokio::time::advance(Duration::from_millis(500)).await;
    r.lp.fire_due();
    assert_eq!(r.phase(soon), Some(Phase::FirstPoll));
    assert_eq!(r.phase(then), Some(Phase::Counted));
    assert_eq!(r.lp.in_flight.load(Relaxed), 1);
}
