//! The worker pool of one replica: claims due waits from the store under a lease,
//! keeps them in an in-memory timer queue, probes them with bounded concurrency (the
//! prober adds a per-host bound), feeds each observation to the engine, and writes
//! back only what changed.
//!
//! One task owns all the state (no locks); probes and writes run as tasks that report
//! back over a channel. It never talks to the API: the two meet in the store and on
//! the event bus.
//!
//! This file is the loop and its dispatch: what a message is and which role handles
//! it. The roles have files of their own: [`lease`] (renewals, what a renewal finds
//! lost or stray, the pause when the lease runs short), [`guard`] (the first poll
//! after a claim, and the crash-loop guard it feeds), [`timers`] (when each held wait
//! is polled next), [`nudge`] (polls brought forward by a nudge), [`poll`] (a
//! probe and the engine step after it), [`writes`] (progress, batched) and
//! [`claims`] (waits claimed, held and let go).

use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio::time::Instant;
use uuid::Uuid;

mod claims;
pub mod clock;
mod guard;
mod lease;
mod nudge;
mod poll;
#[cfg(test)]
mod tests;
mod timers;
mod writes;

use crate::bus::live::{self, Inbox, Question};
use crate::bus::{Bus, BusMsg};
use crate::engine::{EngineState, Spec};
use crate::metrics::Metrics;
use crate::probe::Prober;
pub use crate::signals::{Signal, Signals};
use crate::store::{
    Checkpoint, Claimed, Leases, MAX_CLAIMS, Progress, SlotToken, StoreError, WaitEpoch,
};
use clock::Clock;
use lease::{Reconcile, Renewed, Sweep};
use writes::Written;

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// How long a claim lasts without renewal.
    pub lease_ttl: Duration,
    /// The operator's floor under every delay.
    pub floor: Duration,
    /// Most waits this replica holds at once.
    pub capacity: usize,
    /// Most probes in flight at once.
    pub concurrency: usize,
    /// The fallback claim sweep (NOTIFY wakes the claimer sooner).
    pub claim_interval: Duration,
    /// How long shutdown waits for in-flight probes.
    pub drain_timeout: Duration,
    /// Most progress batches in flight at once (keep it under the connection pool);
    /// what changes meanwhile joins the next batch.
    pub max_writes: usize,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            lease_ttl: Duration::from_secs(30),
            floor: Duration::from_secs(1),
            capacity: 100_000,
            concurrency: 512,
            claim_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(5),
            max_writes: 8,
        }
    }
}

pub struct Worker {
    pub leases: Leases,
    pub prober: Prober,
    pub bus: Bus,
    pub cfg: WorkerConfig,
    pub metrics: Arc<Metrics>,
    pub owner: Uuid,
    /// What it reports as it works (see [`crate::signals`]).
    pub signals: Signals,
    /// Reads asking for the progress of the waits it holds (see [`live`]); `None`:
    /// nobody asks.
    pub live: Option<Inbox>,
}

/// Where a held wait is in its life on this replica. A wait has at most one probe
/// or write in flight: every phase but [`Phase::Claimed`], [`Phase::Counted`] and
/// [`Phase::Idle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Claimed, and no poll begun since: the next one is recorded as begun before
    /// it starts ([`guard`]).
    Claimed,
    /// Its first poll since the claim is recorded as begun ahead of time, with
    /// others due soon ([`guard`]): it starts when due, as a first poll.
    Counted,
    /// Recording that its first poll since the claim begins.
    Marking,
    /// Its first poll since the claim is in flight, and the store counts it.
    FirstPoll,
    /// That first poll changed nothing: recording only that it completed.
    Confirming,
    /// Between polls; a poll since the claim completed and is in the store.
    Idle,
    /// A poll in flight.
    Polling,
    /// What a poll changed (or the wait's end) is queued or being written.
    Writing,
}

impl Phase {
    fn busy(self) -> bool {
        !matches!(self, Phase::Claimed | Phase::Counted | Phase::Idle)
    }
}

struct Held {
    spec: Arc<Spec>,
    /// The target as every poll needs it, made once rather than at every poll.
    target: Result<Arc<crate::probe::Target>, crate::probe::TargetError>,
    engine: EngineState,
    epoch: i64,
    next: DateTime<Utc>,
    /// Bumped whenever the wait is rescheduled: stale timer entries are skipped.
    generation: u64,
    phase: Phase,
    /// Polled since the last write.
    dirty: bool,
    /// What the store holds of the engine state, but for the poll count (see
    /// [`fingerprint`]), and when it was written.
    written: u64,
    written_at: Instant,
    /// What the wait made of its last response ([`crate::probe::Memo`]).
    memo: Option<crate::probe::Memo>,
    /// The `traceparent` its polls join, kept only while traces are on.
    trace: Option<Box<str>>,
    /// Its poll's task, while one may be in flight.
    polling: Option<Polling>,
    /// What nudges asked of it ([`nudge`]).
    nudge: nudge::Nudge,
}

/// A poll's task, stopped when the wait it polls for is let go (ended elsewhere,
/// canceled, taken over, given back): a poll still waiting for its host's turn
/// is then never sent.
struct Polling(tokio::task::AbortHandle);

impl Drop for Polling {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Held {
    fn busy(&self) -> bool {
        self.phase.busy()
    }
}

/// The engine state but for its poll count: an unchanged poll of a fixed-interval
/// wait leaves it as it was, and is not worth a checkpoint of its own.
fn fingerprint(e: &EngineState) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        e.retries,
        e.budget_used,
        e.poll_interval_ms,
        e.retry_delay_ms,
        e.transition_seen,
        e.hits,
        &e.state,
        &e.last_error,
    )
        .hash(&mut h);
    h.finish()
}

/// What the tasks the loop spawns report back.
enum Msg {
    Claimed(Result<Vec<Claimed>, StoreError>),
    Probed {
        id: Uuid,
        generation: u64,
        obs: crate::probe::Polled,
        memo: Option<crate::probe::Memo>,
        at: DateTime<Utc>,
    },
    Recorded {
        /// (id, generation, the status it ended with) of every wait in the batch,
        /// and what became of its write.
        batch: Vec<(Uuid, u64, Option<crate::model::Status>, Written)>,
    },
    /// First polls since their claim that changed nothing, recorded as completed
    /// (or not), with the generation each was sent under.
    Confirmed {
        batch: Vec<(WaitEpoch, u64)>,
        result: Result<Vec<Uuid>, StoreError>,
    },
    /// First polls since their claim, recorded as begun (or not).
    Marked {
        marks: Vec<(WaitEpoch, u64)>,
        result: Result<Vec<Uuid>, StoreError>,
    },
    /// The lease row was renewed (`ok`), by a renewal whose checkpoints and
    /// comparison follow, or `alone` while such a renewal was still on its way:
    /// the lease runs from when the renewal began.
    Leased {
        started: Instant,
        ok: bool,
        alone: bool,
    },
    Renewed(Renewed),
}

impl Msg {
    /// What it answers, as a log line names it.
    fn what(&self) -> &'static str {
        match self {
            Msg::Claimed(_) => "a claim",
            Msg::Probed { .. } => "a probe",
            Msg::Recorded { .. } => "a progress write",
            Msg::Marked { .. } => "first polls marked",
            Msg::Confirmed { .. } => "first polls confirmed",
            Msg::Leased { .. } => "a lease renewed",
            Msg::Renewed(_) => "a renewal",
        }
    }
}

struct Loop {
    w: Arc<Worker>,
    /// The one clock every time in here is read from.
    clock: Clock,
    /// Boxed: the table holds a pointer a slot, so that growing it moves 24 bytes a
    /// wait rather than the whole state, and its empty slots cost little. Hashed
    /// with foldhash (seeded per process): a poll looks its wait up several times, and
    /// the ids are waitd's own.
    held: HashMap<Uuid, Box<Held>, foldhash::fast::RandomState>,
    timers: BinaryHeap<std::cmp::Reverse<timers::Due>>,
    /// The timers of the waits whose first poll since their claim is not yet
    /// recorded as begun ([`Phase::Claimed`]): recorded ahead, in batches.
    unmarked: BinaryHeap<std::cmp::Reverse<timers::Due>>,
    tx: mpsc::UnboundedSender<Msg>,
    generation: u64,
    claiming: bool,
    claim_again: bool,
    /// The last claim came back full: there is a backlog to take in.
    backlog: bool,
    renewing: bool,
    /// A lease-only renewal is on its way, sent while a renewal was still
    /// writing its checkpoints.
    leasing: bool,
    probes: Arc<Semaphore>,
    /// Polls started and not yet over (waiting for a probe's place or in
    /// flight): no more than [`timers::IN_FLIGHT`] times the concurrency are
    /// started, the rest wait in the timer queue.
    in_flight: Arc<std::sync::atomic::AtomicUsize>,
    /// The tenants of the waits held, each name once for all their waits.
    tenants: HashSet<Arc<str>>,
    /// Progress waiting to be written: each batch is one transaction.
    pending: Vec<(Progress, u64)>,
    /// First polls since a claim that completed and changed nothing, with their
    /// generation, to be recorded as completed (one statement a batch, in a write
    /// slot like progress), and when the batch is written at the latest
    /// ([`writes`]).
    confirming: Vec<(WaitEpoch, u64)>,
    confirm_by: Option<Instant>,
    /// Stopping: whatever is queued is written at once.
    stopping: bool,
    /// Batches being written.
    writing: usize,
    /// Waits this replica stopped polling while the store may still have them as
    /// its own: given back with the next renewal, so another replica can take them.
    /// (Its lease covers them for as long as it lives: they must not be forgotten.)
    let_go: Vec<Checkpoint>,
    /// When this replica's lease runs out, by its own clock (from the start of the
    /// last renewal that succeeded).
    lease_until: Instant,
    /// Polling is paused because the lease could not be renewed in time.
    paused: bool,
    /// Renewals started: every third also writes checkpoints.
    renewals: u64,
    /// The next renewal names every held wait (the last one failed, or polling
    /// paused: waits may have been taken over meanwhile).
    need_full: bool,
    /// Waits the last renewal found owned by this replica but not held (a claim
    /// whose answer was lost), with their epochs: given back when the next one
    /// finds them still so.
    strays: HashMap<Uuid, i64>,
    /// Waits taken over with a slot whose holder died, not polled since, and
    /// the slot; per slot, how many of them are left ([`guard`]).
    unsettled: HashMap<Uuid, SlotToken>,
    settling: HashMap<SlotToken, usize>,
    sweep: Option<Sweep>,
    reconcile: Option<Reconcile>,
}

impl Worker {
    /// Runs until `shutdown` resolves; then stops claiming, lets in-flight probes
    /// finish (bounded by `drain_timeout`), checkpoints and releases every lease.
    pub async fn run(mut self, shutdown: impl std::future::Future<Output = ()>) {
        let mut inbox = self.live.take();
        let w = Arc::new(self);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut bus_rx = w.bus.subscribe();
        let mut lp = Loop::new(w.clone(), tx);
        let mut claim_tick = tokio::time::interval(w.cfg.claim_interval);
        claim_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let renew_every = (w.cfg.lease_ttl / 3).max(Duration::from_millis(50));
        let mut renew_tick = tokio::time::interval(renew_every);
        renew_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);

        tracing::info!(owner = %w.owner, "worker pool started");
        loop {
            if lp.claim_again && !lp.claiming {
                lp.claim();
            }
            let wake = lp.next_wake();
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(msg) = rx.recv() => lp.handle(msg),
                msg = bus_rx.recv() => lp.bus(msg),
                Some(question) = live::next(&mut inbox) => lp.answer(question),
                _ = tokio::time::sleep_until(wake) => lp.fire_due(),
                _ = claim_tick.tick() => lp.claim_again = true,
                _ = renew_tick.tick() => {
                    let started = std::time::Instant::now();
                    lp.renew();
                    let took = started.elapsed();
                    if took > Duration::from_millis(20) {
                        tracing::debug!(ms = took.as_millis() as u64, what = "a renewal's start", held = lp.held.len(), "the worker loop was busy");
                    }
                }
                // Nothing else to do: go on with a renewal's pass.
                _ = std::future::ready(()), if lp.stepping() => {}
            }
            if lp.stepping() {
                lp.step();
            }
            // Timers that came due meanwhile fire now, not when nothing else is
            // ready: answers arrive every few microseconds at a high poll rate, and
            // the biased select above takes them first, so a renewal's pass in
            // shares would otherwise hold every poll due back until it ended.
            if lp.timers_due() {
                lp.fire_due();
            }
            lp.flush_writes();
        }
        lp.stop(&mut rx).await;
    }
}

impl Loop {
    fn new(w: Arc<Worker>, tx: mpsc::UnboundedSender<Msg>) -> Loop {
        Loop {
            clock: Clock::new(),
            probes: Arc::new(Semaphore::new(w.cfg.concurrency.max(1))),
            in_flight: Arc::default(),
            tenants: HashSet::new(),
            pending: Vec::new(),
            confirming: Vec::new(),
            confirm_by: None,
            stopping: false,
            writing: 0,
            let_go: Vec::new(),
            lease_until: Instant::now(),
            paused: false,
            renewals: 0,
            need_full: true,
            strays: HashMap::new(),
            unsettled: HashMap::new(),
            settling: HashMap::new(),
            sweep: None,
            reconcile: None,
            w,
            // Not sized for the capacity up front: inserts into a table that large
            // touch a page each, and a few thousand waits would cost megabytes.
            // (Its rehash at 460,000 waits holds the loop for 0.9 s.)
            held: HashMap::default(),
            timers: BinaryHeap::new(),
            unmarked: BinaryHeap::new(),
            tx,
            generation: 0,
            claiming: false,
            claim_again: true,
            backlog: false,
            renewing: false,
            leasing: false,
        }
    }

    /// Shutdown: no new probes or claims; the in-flight ones report back (for at
    /// most the drain timeout), then every held wait is released with a final
    /// checkpoint.
    async fn stop(mut self, rx: &mut mpsc::UnboundedReceiver<Msg>) {
        // A pass not finished sends nothing: the release below names every wait.
        if self.sweep.take().is_some() {
            self.renewing = false;
        }
        while self.reconcile.is_some() {
            self.step();
        }
        tracing::info!(held = self.held.len(), "worker pool stopping");
        self.stopping = true;
        let drain_until = Instant::now() + self.w.cfg.drain_timeout;
        while self.held.values().any(|h| h.busy()) || self.claiming || self.renewing {
            tokio::select! {
                Some(msg) = rx.recv() => self.handle_draining(msg),
                _ = tokio::time::sleep_until(drain_until) => break,
            }
            self.flush_writes();
        }
        let mut checkpoints: Vec<Checkpoint> = self
            .held
            .iter()
            .filter(|(_, h)| !h.busy())
            .map(|(id, h)| lease::checkpoint(*id, h, true))
            .collect();
        checkpoints.append(&mut self.let_go);
        let w = &self.w;
        w.metrics.write();
        match w.leases.hand_over(w.owner, &checkpoints).await {
            Ok(n) => {
                // Gone from the replicas alive: the others claim every wait
                // released, whatever its placement (§6.2).
                if let Err(e) = w.leases.retire(w.owner).await {
                    tracing::debug!(error = %e, "could not end this replica's lease");
                }
                tracing::info!(released = n, "leases released");
                w.signals.send(|| Signal::Released(n));
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not release leases; they expire after the TTL")
            }
        }
        w.metrics.held.store(0, Relaxed);
    }

    /// The current progress of the asked waits this loop holds.
    fn answer(&self, question: Question) {
        let found = question
            .ids()
            .iter()
            .filter_map(|id| {
                let h = self.held.get(id)?;
                Some((
                    *id,
                    live::Progress {
                        polls: h.engine.polls,
                        retries: h.engine.retries,
                        next_poll_at: h.next,
                        last_poll: h.target.as_ref().ok().and_then(|t| t.last_poll()),
                    },
                ))
            })
            .collect();
        question.answer(found);
    }

    fn bus(&mut self, msg: Result<BusMsg, broadcast::error::RecvError>) {
        match msg {
            Ok(BusMsg::Notice(n)) => {
                if n.is_terminal() {
                    // Ended elsewhere (a cancel, another replica): stop polling it.
                    self.settled_one(n.wait_id);
                    if self.held.remove(&n.wait_id).is_some() {
                        self.note_held();
                    }
                }
            }
            Ok(BusMsg::Work) | Ok(BusMsg::Resync) => self.claim_again = true,
            Ok(BusMsg::Nudge(id)) => self.nudged(id),
            Ok(BusMsg::Deliveries { .. }) => {}
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Missed notices: the next renewal finds any wait we lost.
                self.claim_again = true;
            }
            Err(broadcast::error::RecvError::Closed) => {}
        }
    }

    fn handle_draining(&mut self, msg: Msg) {
        match msg {
            // Finish what was observed, but schedule nothing new.
            Msg::Probed { .. }
            | Msg::Recorded { .. }
            | Msg::Confirmed { .. }
            | Msg::Leased { .. }
            | Msg::Renewed(_) => self.handle(msg),
            // Marked while stopping: start nothing new.
            Msg::Marked { marks, .. } => {
                for (at, g) in marks {
                    if let Some(h) = self.held.get_mut(&at.id)
                        && h.generation == g
                        && h.phase == Phase::Marking
                    {
                        h.phase = Phase::Claimed;
                    }
                }
            }
            Msg::Claimed(Ok(claimed)) => {
                self.claiming = false;
                // Claimed while stopping: hold them just long enough to release them.
                for c in claimed {
                    self.insert(c);
                }
            }
            Msg::Claimed(Err(_)) => self.claiming = false,
        }
    }

    fn handle(&mut self, msg: Msg) {
        let started = std::time::Instant::now();
        let what = msg.what();
        self.dispatch(msg);
        let took = started.elapsed();
        if took > Duration::from_millis(20) {
            tracing::debug!(
                ms = took.as_millis() as u64,
                what,
                held = self.held.len(),
                "the worker loop was busy"
            );
        }
    }

    fn dispatch(&mut self, msg: Msg) {
        match msg {
            Msg::Claimed(result) => self.claimed(result),
            Msg::Probed {
                id,
                generation,
                obs,
                memo,
                at,
            } => self.probed(id, generation, obs, memo, at),
            Msg::Marked { marks, result } => self.marked(marks, result),
            Msg::Recorded { batch } => self.recorded(batch),
            Msg::Confirmed { batch, result } => self.confirmed(batch, result),
            Msg::Leased { started, ok, alone } => self.leased(started, ok, alone),
            Msg::Renewed(r) => self.renewed(r),
        }
    }
}
