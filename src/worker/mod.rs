//! The worker pool of one replica: claims due waits from the store under a lease,
//! keeps them in an in-memory timer queue, probes them with bounded concurrency (the
//! prober adds a per-host bound), feeds each observation to the engine, and writes
//! back only what changed.
//!
//! One task owns all the state (no locks); probes and writes run as tasks that report
//! back over a channel. It never talks to the API: the two meet in the store and on
//! the event bus.
//!
//! Write discipline: a new state, a retry or the end is written at once (fenced by
//! owner and epoch), batched with whatever else changed meanwhile into one
//! transaction; unchanged polls only mark the wait dirty. Every third of the lease
//! TTL a renewal extends this replica's lease (one row on Postgres, however many
//! waits it holds); every third renewal also checkpoints, in chunks, the dirty waits
//! whose engine state changed in more than its poll count, and any dirty wait last
//! written ten TTLs ago.
//! When the lease cannot be renewed in time, polling pauses until it is.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, broadcast, mpsc};
use tokio::time::Instant;
use uuid::Uuid;

pub mod clock;

use crate::bus::{Bus, BusMsg};
use crate::engine::{self, Context, Decision, EngineState, Event, Observation, Spec};
use crate::metrics::Metrics;
use crate::model::{EventBody, Status};
use crate::probe::Prober;
use crate::store::{Checkpoint, Claimed, Ended, MAX_CLAIMS, Progress, Renewal, Store, StoreError};
use clock::Clock;

/// Below this many held waits every lease renewal names them all (see
/// [`Loop::renew`]).
const FULL_BELOW: usize = 10_000;

/// Above FULL_BELOW, every this many checkpoint rounds a renewal names every held
/// wait (and whenever a wait may have been lost).
const FULL_EVERY: u64 = 10;

/// Held waits a renewal's pass goes over in one turn of the loop: about a
/// millisecond, so that no timer waits for a pass over a million waits.
const STEP: usize = 4096;

/// A probe still in flight at its wait's deadline is cut this long after it, so
/// the poll the engine schedules at the deadline itself still gets an answer, and
/// a target that never answers ends the wait `timed_out` within a moment of it.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);

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
    pub store: Store,
    pub prober: Prober,
    pub bus: Bus,
    pub cfg: WorkerConfig,
    pub metrics: Arc<Metrics>,
    pub owner: Uuid,
}

struct Held {
    spec: Arc<Spec>,
    /// The target as every poll needs it, made once rather than at every poll.
    target: Result<Arc<crate::probe::Target>, String>,
    engine: EngineState,
    epoch: i64,
    next: DateTime<Utc>,
    /// Bumped whenever the wait is rescheduled: stale timer entries are skipped.
    generation: u64,
    /// A probe or a write is in flight.
    busy: bool,
    /// Polled since the last write.
    dirty: bool,
    /// What the store holds of the engine state, but for the poll count (see
    /// [`fingerprint`]), and when it was written.
    written: u64,
    written_at: Instant,
    /// The store knows that a poll of this wait began since it was claimed.
    marked: bool,
    /// What the wait's conditions decided on its last response.
    memo: Option<crate::probe::Memo>,
    /// A poll of this wait completed and was written since it was claimed: until
    /// then the first poll is written even if it changed nothing, which clears the
    /// store's count of polls begun and not completed ([`MAX_CLAIMS`]).
    confirmed: bool,
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

/// What became of one wait's progress write.
#[derive(Clone, Debug)]
enum Written {
    Yes,
    /// The wait is no longer this replica's (taken over, canceled, ended elsewhere).
    NotOwned,
    /// The store refused what the target answered; the wait was ended in `error`
    /// instead.
    Abandoned,
    /// The store could not be reached: let the wait go.
    Failed(String),
}

enum Msg {
    Claimed(Result<Vec<Claimed>, StoreError>),
    Probed {
        id: Uuid,
        generation: u64,
        obs: Observation,
        memo: Option<crate::probe::Memo>,
        at: DateTime<Utc>,
    },
    Recorded {
        /// (id, generation, the status it ended with) of every wait in the batch,
        /// and what became of its write.
        batch: Vec<(Uuid, u64, Option<Status>, Written)>,
    },
    /// First polls since their claim that changed nothing, recorded as completed
    /// (or not): (id, generation).
    Confirmed {
        batch: Vec<(Uuid, u64)>,
        result: Result<Vec<Uuid>, StoreError>,
    },
    /// First polls since their claim, recorded as begun (or not).
    Marked {
        first: Vec<(Uuid, i64, u64)>,
        result: Result<Vec<Uuid>, StoreError>,
    },
    Renewed(Renewed),
}

/// What a lease renewal reports back.
struct Renewed {
    started: Instant,
    /// It named every held wait, and its answer says which are no longer this
    /// replica's and which it owns without holding (else it renewed the lease and
    /// wrote checkpoints only).
    full: bool,
    /// (id, epoch) of every wait a full renewal named.
    named: Vec<(Uuid, i64)>,
    checkpointed: Vec<Uuid>,
    /// Whether a claim was on its way when the renewal started: its waits may
    /// show as owned and not yet held.
    claiming: bool,
    result: Result<Renewal, StoreError>,
    /// Waits let go that could not be given back: try again next time.
    unreleased: Vec<Checkpoint>,
}

/// A renewal's pass over the held waits, a share per turn of the loop: the waits
/// to name (a full renewal) and the checkpoints to write.
struct Sweep {
    /// The held waits when the pass began.
    keys: Vec<Uuid>,
    at: usize,
    full: bool,
    write_checkpoints: bool,
    named: Vec<(Uuid, i64)>,
    checkpoints: Vec<Checkpoint>,
    checkpointed: Vec<Uuid>,
}

/// A full renewal's answer, compared with the held waits a share per turn.
struct Reconcile {
    named: Vec<(Uuid, i64)>,
    at: usize,
    /// Named, and no longer this replica's under the epoch named.
    lost: std::collections::HashSet<Uuid>,
}

struct Loop {
    w: Arc<Worker>,
    /// The one clock every time in here is read from.
    clock: Clock,
    /// Boxed: the table holds a pointer a slot, so that growing it moves 24 bytes a
    /// wait rather than the whole state, and its empty slots cost little.
    held: HashMap<Uuid, Box<Held>>,
    timers: BinaryHeap<Reverse<(DateTime<Utc>, u64, Uuid)>>,
    tx: mpsc::UnboundedSender<Msg>,
    generation: u64,
    claiming: bool,
    claim_again: bool,
    renewing: bool,
    probes: Arc<Semaphore>,
    /// The tenants of the waits held, each name once for all their waits.
    tenants: std::collections::HashSet<Arc<str>>,
    /// Progress waiting to be written: each batch is one transaction.
    pending: Vec<(Progress, u64)>,
    /// First polls since a claim that completed and changed nothing: (id, epoch,
    /// generation), to be recorded as completed (one statement a batch, in a write
    /// slot like progress).
    confirming: Vec<(Uuid, i64, u64)>,
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
    sweep: Option<Sweep>,
    reconcile: Option<Reconcile>,
}

impl Worker {
    /// Runs until `shutdown` resolves; then stops claiming, lets in-flight probes
    /// finish (bounded by `drain_timeout`), checkpoints and releases every lease.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let w = Arc::new(self);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut bus_rx = w.bus.subscribe();
        let mut lp = Loop {
            clock: Clock::new(),
            probes: Arc::new(Semaphore::new(w.cfg.concurrency.max(1))),
            tenants: std::collections::HashSet::new(),
            pending: Vec::new(),
            confirming: Vec::new(),
            writing: 0,
            let_go: Vec::new(),
            lease_until: Instant::now(),
            paused: false,
            renewals: 0,
            need_full: true,
            strays: HashMap::new(),
            sweep: None,
            reconcile: None,
            w: w.clone(),
            // Not sized for the capacity up front: inserts into a table that large
            // touch a page each, and a few thousand waits would cost megabytes. (Its
            // rehash at 460,000 waits holds the loop for 0.9 s; BENCHMARKS.md.)
            held: HashMap::new(),
            timers: BinaryHeap::new(),
            tx,
            generation: 0,
            claiming: false,
            claim_again: true,
            renewing: false,
        };
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
            // the biased select above takes them first. During a renewal's pass (a
            // share of it each turn) that held every poll due back until the pass
            // ended: 0.4 s, every checkpoint round, at 1,000,000 waits.
            if lp.timers_due() {
                lp.fire_due();
            }
            lp.flush_writes();
        }
        // A pass not finished sends nothing: the release below names every wait.
        if lp.sweep.take().is_some() {
            lp.renewing = false;
        }
        while lp.reconcile.is_some() {
            lp.step();
        }

        // Drain: no new probes or claims; let the in-flight ones report back.
        tracing::info!(held = lp.held.len(), "worker pool stopping");
        let drain_until = Instant::now() + w.cfg.drain_timeout;
        while lp.held.values().any(|h| h.busy) || lp.claiming || lp.renewing {
            tokio::select! {
                Some(msg) = rx.recv() => lp.handle_draining(msg),
                _ = tokio::time::sleep_until(drain_until) => break,
            }
            lp.flush_writes();
        }
        let mut checkpoints: Vec<Checkpoint> = lp
            .held
            .iter()
            .filter(|(_, h)| !h.busy)
            .map(|(id, h)| checkpoint(*id, h, true))
            .collect();
        checkpoints.append(&mut lp.let_go);
        w.metrics.write();
        match w.store.release(w.owner, &checkpoints).await {
            Ok(n) => tracing::info!(released = n, "leases released"),
            Err(e) => {
                tracing::warn!(error = %e, "could not release leases; they expire after the TTL")
            }
        }
        w.metrics.held.store(0, Relaxed);
    }
}

/// The wait and its epoch, with no state to write: a lease renewal only.
fn lease_only(id: Uuid, h: &Held) -> Checkpoint {
    named_only(id, h.epoch)
}

/// A wait under an epoch, with no state to write (given back, or only named).
fn named_only(id: Uuid, epoch: i64) -> Checkpoint {
    Checkpoint {
        id,
        epoch,
        engine: None,
        next_poll_at: None,
    }
}

fn checkpoint(id: Uuid, h: &Held, force: bool) -> Checkpoint {
    let write = force || h.dirty;
    Checkpoint {
        id,
        epoch: h.epoch,
        engine: write.then(|| h.engine.clone()),
        next_poll_at: write.then_some(h.next),
    }
}

/// A held wait's deadline (now, for one no longer held).
fn h_deadline(held: &HashMap<Uuid, Box<Held>>, id: Uuid, clock: &Clock) -> DateTime<Utc> {
    held.get(&id)
        .map_or_else(|| clock.now(), |h| h.engine.deadline)
}

impl Loop {
    /// True when the lease may run out before a poll started now could be written:
    /// another replica may take these waits, and polling them could double polls.
    fn lease_stale(&self) -> bool {
        let safety = (self.w.cfg.lease_ttl / 5).min(Duration::from_secs(2));
        !self.held.is_empty() && Instant::now() + safety >= self.lease_until
    }

    fn next_wake(&self) -> Instant {
        if self.lease_stale() {
            // Paused: look again shortly (a renewal may have come through).
            return Instant::now() + Duration::from_millis(50);
        }
        match self.timers.peek() {
            Some(Reverse((t, _, _))) => self.clock.instant_at(*t),
            None => Instant::now() + Duration::from_secs(3600),
        }
    }

    /// True when the earliest timer is due (and polling is not paused).
    fn timers_due(&self) -> bool {
        !self.timers.is_empty() && self.next_wake() <= Instant::now()
    }

    fn schedule(&mut self, id: Uuid, at: DateTime<Utc>) {
        self.generation += 1;
        let g = self.generation;
        if let Some(h) = self.held.get_mut(&id) {
            h.next = at;
            h.generation = g;
            self.timers.push(Reverse((at, g, id)));
        }
    }

    fn claim(&mut self) {
        self.claim_again = false;
        let free = self.w.cfg.capacity.saturating_sub(self.held.len());
        if free == 0 {
            return;
        }
        self.claiming = true;
        let w = self.w.clone();
        let tx = self.tx.clone();
        let lookahead = (w.cfg.lease_ttl / 2).min(Duration::from_secs(5));
        tokio::spawn(async move {
            let limit = free.min(1000) as i64;
            let started = Instant::now();
            let r = w
                .store
                .claim(w.owner, w.cfg.lease_ttl, lookahead, limit)
                .await;
            tracing::debug!(
                n = r.as_ref().map_or(0, Vec::len),
                ms = started.elapsed().as_millis() as u64,
                "claim"
            );
            w.metrics.write();
            let _ = tx.send(Msg::Claimed(r));
        });
    }

    fn renew(&mut self) {
        if let Some(step) = self.clock.resync() {
            tracing::warn!(
                step_ms = step.num_milliseconds(),
                "the system clock stepped; schedules and deadlines follow it"
            );
        }
        if self.renewing {
            return;
        }
        // What the last full renewal left to compare is finished first: the next
        // one's answer must not meet it half done.
        while self.reconcile.is_some() {
            self.step();
        }
        self.renewing = true;
        self.renewals += 1;
        // Checkpoints of unchanged polls go once a lease TTL (every third renewal),
        // and only for waits whose engine state changed in more than its poll count
        // (a growing interval, say), or was last written ten TTLs ago: they only
        // save a takeover some early polls and keep `polls` and `next_poll_at` fresh.
        let write_checkpoints = self.renewals.is_multiple_of(3);
        // On Postgres a lease is one row per replica: renewing it needs nothing of
        // the held waits, and for a replica holding many, naming them all (and
        // reading back all it owns) every time would cost this loop and Postgres a
        // pass over all of them. A full renewal, which finds waits lost or stray,
        // comes every FULL_EVERY checkpoint rounds, after anything that may have
        // lost a wait (a renewal or claim that failed, a pause, a refused mark), and
        // always below FULL_BELOW waits.
        let big = self.w.store.postgres().is_some() && self.held.len() >= FULL_BELOW;
        let full = !big || self.need_full || self.renewals.is_multiple_of(3 * FULL_EVERY);
        let sweep = Sweep {
            keys: if full || write_checkpoints {
                self.held.keys().copied().collect()
            } else {
                Vec::new()
            },
            at: 0,
            full,
            write_checkpoints,
            named: Vec::new(),
            checkpoints: Vec::new(),
            checkpointed: Vec::new(),
        };
        self.sweep = Some(sweep);
        // A few thousand waits are gone over at once; more, a share per turn of
        // the loop (`step`), so that no timer waits for the whole pass.
        self.step();
    }

    /// True while a renewal's pass over the held waits, or the comparison of its
    /// answer with them, is under way.
    fn stepping(&self) -> bool {
        self.sweep.is_some() || self.reconcile.is_some()
    }

    /// One turn's share (STEP waits) of the pass a renewal makes over the held
    /// waits, or of the comparison of a full renewal's answer with them.
    fn step(&mut self) {
        if let Some(mut s) = self.sweep.take() {
            let stale_after = self.w.cfg.lease_ttl * 10;
            let end = (s.at + STEP).min(s.keys.len());
            for id in &s.keys[s.at..end] {
                // Gone since the pass began: ended, or lost.
                let Some(h) = self.held.get_mut(id) else {
                    continue;
                };
                if s.full {
                    s.named.push((*id, h.epoch));
                }
                // A busy wait's progress is being written right now; it is named
                // only, so an older checkpoint cannot land after the newer write.
                if !s.write_checkpoints || h.busy || !h.dirty {
                    continue;
                }
                let fp = fingerprint(&h.engine);
                if fp == h.written && h.written_at.elapsed() < stale_after {
                    continue;
                }
                s.checkpoints.push(checkpoint(*id, h, false));
                s.checkpointed.push(*id);
                h.dirty = false;
                h.written = fp;
                h.written_at = Instant::now();
            }
            s.at = end;
            if s.at < s.keys.len() {
                self.sweep = Some(s);
            } else {
                self.send_renewal(s);
            }
            return;
        }
        if let Some(mut r) = self.reconcile.take() {
            let end = (r.at + STEP).min(r.named.len());
            for &(id, epoch) in &r.named[r.at..end] {
                // Still this replica's in the store, but let go while the renewal
                // was on its way: give it back.
                if !self.held.contains_key(&id) && !r.lost.contains(&id) {
                    self.let_go.push(named_only(id, epoch));
                }
            }
            r.at = end;
            if r.at < r.named.len() {
                self.reconcile = Some(r);
            }
        }
    }

    fn send_renewal(&mut self, s: Sweep) {
        let Sweep {
            full,
            named,
            checkpoints,
            checkpointed,
            ..
        } = s;
        let let_go = std::mem::take(&mut self.let_go);
        let claiming = self.claiming;
        let w = self.w.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = if full {
                w.store
                    .renew(w.owner, w.cfg.lease_ttl, &named, &checkpoints)
                    .await
            } else if checkpoints.is_empty() {
                w.store
                    .renew_lease(w.owner, w.cfg.lease_ttl)
                    .await
                    .map(|()| Renewal::default())
            } else {
                w.store
                    .checkpoint(w.owner, w.cfg.lease_ttl, &checkpoints)
                    .await
                    .map(|()| Renewal::default())
            };
            w.metrics.write();
            drop(checkpoints);
            // Give back the waits let go (fenced by epoch: one already taken over
            // is untouched); what cannot be given back now goes with the next try.
            let mut unreleased = let_go;
            if r.is_ok() && !unreleased.is_empty() {
                w.metrics.write();
                match w.store.release(w.owner, &unreleased).await {
                    Ok(n) => {
                        tracing::debug!(n, "gave back waits let go");
                        unreleased.clear();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not give back waits let go; trying again")
                    }
                }
            }
            if let Err(e) = w.store.maintain().await {
                tracing::debug!(error = %e, "store housekeeping failed");
            }
            let _ = tx.send(Msg::Renewed(Renewed {
                started,
                full,
                named,
                checkpointed,
                claiming,
                result: r,
                unreleased,
            }));
        });
    }

    /// A claim whose answer was lost (the connection broke after its commit) leaves
    /// waits this replica owns in the store but does not hold: nobody polls them,
    /// and its live lease keeps every other replica off them. Found by two renewals
    /// in a row (a claim's answer takes milliseconds, not a third of a lease), they
    /// are given back, fenced by epoch, and claimed again like any other.
    fn give_back_strays(&mut self, strays: Vec<(Uuid, i64)>) {
        let mut now = HashMap::with_capacity(strays.len());
        for (id, epoch) in strays {
            if self.held.contains_key(&id) {
                continue;
            }
            if self.strays.get(&id) == Some(&epoch) {
                tracing::warn!(wait_id = %id, "a wait this replica owns but does not hold (a claim's answer was lost); giving it back");
                self.let_go.push(named_only(id, epoch));
                self.claim_again = true;
            } else {
                now.insert(id, epoch);
            }
        }
        self.strays = now;
    }

    fn bus(&mut self, msg: Result<BusMsg, broadcast::error::RecvError>) {
        match msg {
            Ok(BusMsg::Notice(n)) => {
                if n.is_terminal() {
                    // Ended elsewhere (a cancel, another replica): stop polling it.
                    if self.held.remove(&n.wait_id).is_some() {
                        self.w.metrics.held.store(self.held.len() as i64, Relaxed);
                    }
                }
            }
            Ok(BusMsg::Work) | Ok(BusMsg::Resync) => self.claim_again = true,
            Err(broadcast::error::RecvError::Lagged(_)) => {
                // Missed notices: the next renewal finds any wait we lost.
                self.claim_again = true;
            }
            Err(broadcast::error::RecvError::Closed) => {}
        }
    }

    fn fire_due(&mut self) {
        if self.lease_stale() {
            if !self.paused {
                tracing::warn!(
                    held = self.held.len(),
                    "lease not renewed in time; polling paused until it is"
                );
                self.paused = true;
                self.need_full = true;
            }
            return;
        }
        if self.paused {
            tracing::info!("lease renewed; polling resumed");
            self.paused = false;
        }
        let now = self.clock.now();
        let mut first_polls = Vec::new();
        while let Some(Reverse((at, g, id))) = self.timers.peek().copied() {
            if at > now {
                break;
            }
            self.timers.pop();
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            if h.generation != g || h.busy {
                continue;
            }
            h.busy = true;
            self.w
                .metrics
                .schedule_lag
                .observe((now - at).to_std().unwrap_or_default());
            if h.marked {
                self.start_probe(id, g);
            } else {
                first_polls.push((id, h.epoch, g));
            }
        }
        if !first_polls.is_empty() {
            self.mark(first_polls);
        }
        self.w.metrics.held.store(self.held.len() as i64, Relaxed);
    }

    /// Records in the store that the first polls of these waits since their claim
    /// begin, then starts them: if a poll takes the replica down, the next claimer
    /// finds it counted ([`MAX_CLAIMS`]). One write for every first poll due at once.
    fn mark(&mut self, first: Vec<(Uuid, i64, u64)>) {
        let w = self.w.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let ids: Vec<(Uuid, i64)> = first.iter().map(|(id, e, _)| (*id, *e)).collect();
            let result = w.store.mark_polling(w.owner, &ids).await;
            w.metrics.write();
            let _ = tx.send(Msg::Marked { first, result });
        });
    }

    fn start_probe(&mut self, id: Uuid, g: u64) {
        let Some(h) = self.held.get(&id) else {
            return;
        };
        let spec = h.spec.clone();
        let target = h.target.clone();
        let mut memo = h.memo;
        let probes = self.probes.clone();
        let w = self.w.clone();
        let tx = self.tx.clone();
        // The deadline wins over the probe timeout: a probe still in flight just
        // after it is cut, and the engine ends the wait `timed_out`.
        let cut = self.clock.instant_at(h.engine.deadline) + DEADLINE_GRACE;
        let clock = self.clock;
        tokio::spawn(async move {
            let probe = async {
                // The prober itself bounds the probes in flight per target host.
                let _p = probes.acquire_owned().await;
                match target {
                    Ok(target) => w.prober.probe_memo(id, &spec, &target, &mut memo).await,
                    Err(error) => Observation::Permanent { error },
                }
            };
            let started = Instant::now();
            let obs = match tokio::time::timeout_at(cut, probe).await {
                Ok(obs) => obs,
                Err(_) => Observation::Transient {
                    error: "the target had not answered by the wait's deadline".into(),
                    retry_after: None,
                },
            };
            w.metrics.probe_latency.observe(started.elapsed());
            w.metrics.poll(&obs);
            let _ = tx.send(Msg::Probed {
                id,
                generation: g,
                obs,
                memo,
                at: clock.now(),
            });
        });
    }

    fn handle_draining(&mut self, msg: Msg) {
        match msg {
            // Finish what was observed, but schedule nothing new.
            Msg::Probed { .. } | Msg::Recorded { .. } | Msg::Confirmed { .. } | Msg::Renewed(_) => {
                self.handle(msg)
            }
            // Marked while stopping: start nothing new.
            Msg::Marked { first, .. } => {
                for (id, _, g) in first {
                    if let Some(h) = self.held.get_mut(&id)
                        && h.generation == g
                    {
                        h.busy = false;
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

    fn insert(&mut self, c: Claimed) {
        let looped = c.claims >= MAX_CLAIMS;
        let spec = Arc::new(c.spec);
        let tenant = match self.tenants.get(c.tenant.as_str()) {
            Some(t) => t.clone(),
            None => {
                let t: Arc<str> = Arc::from(c.tenant.as_str());
                self.tenants.insert(t.clone());
                t
            }
        };
        let held = Held {
            target: self.w.prober.target_of(&spec, tenant).map(Arc::new),
            spec,
            written: fingerprint(&c.engine),
            written_at: Instant::now(),
            engine: c.engine,
            epoch: c.epoch,
            next: c.next_poll_at,
            generation: 0,
            busy: false,
            dirty: false,
            marked: false,
            memo: None,
            confirmed: false,
        };
        self.held.insert(c.id, Box::new(held));
        if looped {
            // Every replica that polled it since its last completed poll died
            // meanwhile: end it rather than be the next.
            tracing::error!(wait_id = %c.id, polls_begun = c.claims, "a wait's polls keep taking their replica down; ending it in error");
            self.generation += 1;
            let g = self.generation;
            let h = self.held.get_mut(&c.id).expect("just inserted");
            h.busy = true;
            h.generation = g;
            let progress = Progress::abandon(
                c.id,
                h.epoch,
                &h.engine,
                format!(
                    "waitd ended this wait because a poll of it did not complete {} times in a row: each time, the replica polling it stopped (it crashed, was killed or ran out of memory); it is not polled again so that it cannot take down another replica",
                    c.claims
                ),
            );
            self.pending.push((progress, g));
            return;
        }
        self.schedule(c.id, c.next_poll_at);
    }

    fn handle(&mut self, msg: Msg) {
        let started = std::time::Instant::now();
        let what = match &msg {
            Msg::Claimed(_) => "a claim",
            Msg::Probed { .. } => "a probe",
            Msg::Recorded { .. } => "a progress write",
            Msg::Marked { .. } => "first polls marked",
            Msg::Confirmed { .. } => "first polls confirmed",
            Msg::Renewed(_) => "a renewal",
        };
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
            } => {
                if let Some(h) = self.held.get_mut(&id) {
                    // A memo is there when the conditions decided the response
                    // (not when it never reached them, or they failed on it).
                    if let Some(m) = memo {
                        let counter = if m.reused() {
                            &self.w.metrics.conditions_reused
                        } else {
                            &self.w.metrics.conditions_evaluated
                        };
                        counter.fetch_add(1, Relaxed);
                    }
                    h.memo = memo;
                }
                self.observed(id, generation, obs, at)
            }
            Msg::Marked { first, result } => self.marked(first, result),
            Msg::Recorded { batch } => {
                self.writing -= 1;
                self.w.metrics.write();
                for (id, generation, end, written) in batch {
                    self.recorded(id, generation, end, written);
                }
                self.w.metrics.held.store(self.held.len() as i64, Relaxed);
            }
            Msg::Confirmed { batch, result } => {
                self.writing -= 1;
                self.w.metrics.write();
                self.confirmed(batch, result);
            }
            Msg::Renewed(r) => self.renewed(r),
        }
    }

    /// First polls that changed nothing were recorded as completed (or not).
    fn confirmed(&mut self, batch: Vec<(Uuid, u64)>, result: Result<Vec<Uuid>, StoreError>) {
        let done: std::collections::HashSet<Uuid> = match &result {
            Ok(ids) => ids.iter().copied().collect(),
            Err(_) => Default::default(),
        };
        for (id, generation) in batch {
            if self
                .held
                .get(&id)
                .is_none_or(|h| h.generation != generation)
            {
                continue;
            }
            if done.contains(&id) {
                let h = self.held.get_mut(&id).expect("held");
                h.busy = false;
                h.confirmed = true;
                let next = h.next;
                self.schedule(id, next);
            } else if let Err(e) = &result {
                // As for progress that cannot be written: let it go, and another
                // claim resumes it from its last checkpoint.
                tracing::warn!(wait_id = %id, error = %e, "could not record that a poll completed; letting the wait go");
                if let Some(h) = self.held.remove(&id) {
                    self.let_go.push(lease_only(id, &h));
                }
            } else {
                // No longer this replica's.
                self.held.remove(&id);
            }
        }
        self.w.metrics.held.store(self.held.len() as i64, Relaxed);
    }

    /// A claim came back: hold what it claimed.
    fn claimed(&mut self, result: Result<Vec<Claimed>, StoreError>) {
        self.claiming = false;
        match result {
            Ok(claimed) => {
                if claimed.len() >= 1000 {
                    self.claim_again = true;
                }
                if !claimed.is_empty() {
                    tracing::debug!(n = claimed.len(), "claimed waits");
                }
                // Held before (its epoch counts claims), by an earlier run of
                // this replica or by another.
                let resumed = claimed.iter().filter(|c| c.epoch > 1).count();
                if resumed > 0 {
                    tracing::info!(
                        resumed,
                        "resumed waits polled before by another replica or an earlier run"
                    );
                }
                for c in claimed {
                    self.insert(c);
                }
                self.w.metrics.held.store(self.held.len() as i64, Relaxed);
            }
            Err(e) => {
                // Its answer may have been lost after the claim committed: the next
                // renewal compares what this replica owns with what it holds.
                self.need_full = true;
                tracing::warn!(error = %e, "claiming waits failed")
            }
        }
    }

    /// First polls were recorded as begun (or not): start those that were.
    fn marked(&mut self, first: Vec<(Uuid, i64, u64)>, result: Result<Vec<Uuid>, StoreError>) {
        let marked: std::collections::HashSet<Uuid> = match result {
            Ok(ids) => ids.into_iter().collect(),
            Err(e) => {
                tracing::warn!(error = %e, "could not record that polls begin; trying again shortly");
                Default::default()
            }
        };
        for (id, epoch, g) in first {
            let Some(h) = self.held.get_mut(&id) else {
                continue;
            };
            if h.generation != g || h.epoch != epoch {
                continue;
            }
            if marked.contains(&id) {
                h.marked = true;
                self.start_probe(id, g);
            } else {
                // Not this replica's any more, or the store is away: the next
                // renewal finds out which; look again in a second.
                self.need_full = true;
                h.busy = false;
                let again = self.clock.now() + chrono::TimeDelta::seconds(1);
                self.schedule(id, again.min(h_deadline(&self.held, id, &self.clock)));
            }
        }
    }

    /// A renewal came back: extend the lease, and drop what it says is no longer ours.
    fn renewed(&mut self, r: Renewed) {
        let Renewed {
            started,
            full,
            named,
            checkpointed,
            claiming,
            result,
            unreleased,
        } = r;
        self.renewing = false;
        self.let_go.extend(unreleased);
        tracing::debug!(
            full,
            named = named.len(),
            checkpoints = checkpointed.len(),
            ms = started.elapsed().as_millis() as u64,
            ok = result.is_ok(),
            "lease renewal"
        );
        match result {
            Ok(Renewal { lost, strays }) => {
                self.lease_until = self.lease_until.max(started + self.w.cfg.lease_ttl);
                if !full {
                    return;
                }
                self.need_full = false;
                if !claiming {
                    self.give_back_strays(strays);
                }
                // A stray is given back when two full renewals in a row find it:
                // the next one is full too.
                if !self.strays.is_empty() {
                    self.need_full = true;
                }
                for &(id, epoch) in &lost {
                    if self
                        .held
                        .get(&id)
                        .is_some_and(|h| !h.busy && h.epoch == epoch)
                    {
                        // Taken over or ended elsewhere. (Under another epoch it
                        // was claimed again since the renewal left: the answer is
                        // about an older lease, so keep it.)
                        tracing::debug!(wait_id = %id, "lease lost");
                        self.held.remove(&id);
                    }
                }
                self.reconcile = Some(Reconcile {
                    named,
                    at: 0,
                    lost: lost.into_iter().map(|(id, _)| id).collect(),
                });
                if self.held.len() <= STEP {
                    self.step();
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "renewing leases failed");
                self.need_full = true;
                for id in checkpointed {
                    if let Some(h) = self.held.get_mut(&id) {
                        h.dirty = true;
                        h.written = 0;
                    }
                }
            }
        }
        self.w.metrics.held.store(self.held.len() as i64, Relaxed);
    }

    fn observed(&mut self, id: Uuid, generation: u64, obs: Observation, at: DateTime<Utc>) {
        let floor = self.w.cfg.floor;
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        if h.generation != generation {
            return;
        }
        let cx = Context {
            now: at,
            floor,
            jitter: fastrand::f64() * 2.0 - 1.0,
        };
        let step = engine::step(&h.spec, &mut h.engine, obs, cx);
        let events: Vec<EventBody> = step.events.iter().map(event_body).collect();
        let (next, end) = match step.decision {
            Decision::PollAt(t) => (Some(t), None),
            Decision::End(o) => (
                None,
                Some(Ended {
                    status: o.end.into(),
                    reason: o.reason,
                    error_detail: o.error_detail,
                }),
            ),
        };
        if let Some(t) = next {
            h.next = t;
        }
        if events.is_empty() && end.is_none() {
            // Nothing changed: keep it in memory, checkpoint later.
            h.dirty = true;
            if !h.confirmed {
                // The first poll since the claim (of a wait polled before: a
                // wait's very first poll always writes an event, its first state
                // or a retry): the store only learns that it completed, which
                // clears its count of polls begun.
                self.confirming.push((id, h.epoch, generation));
                return;
            }
            h.busy = false;
            let t = h.next;
            self.schedule(id, t);
            return;
        }
        let progress = Progress {
            id,
            epoch: h.epoch,
            engine: h.engine.clone(),
            next_poll_at: next,
            events,
            end,
        };
        self.pending.push((progress, generation));
    }

    /// Starts writing the pending progress, all of it in one batch, unless as many
    /// batches as allowed are already on their way: then it waits for the next free
    /// slot and grows meanwhile, so a burst becomes a few large transactions.
    fn flush_writes(&mut self) {
        const MAX_BATCH: usize = 1000;
        while !self.pending.is_empty() && self.writing < self.w.cfg.max_writes.max(1) {
            let take = self.pending.len().min(MAX_BATCH);
            let (progress, generations): (Vec<Progress>, Vec<u64>) =
                self.pending.drain(..take).unzip();
            self.writing += 1;
            let w = self.w.clone();
            let tx = self.tx.clone();
            let clock = self.clock;
            tokio::spawn(async move {
                let started = Instant::now();
                let written = write_progress(&w, clock, &progress).await;
                tracing::debug!(
                    n = progress.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "progress written"
                );
                let batch = progress
                    .into_iter()
                    .zip(generations)
                    .zip(written)
                    .map(|((p, g), written)| (p.id, g, p.end.map(|e| e.status), written))
                    .collect();
                let _ = tx.send(Msg::Recorded { batch });
            });
        }
        // Then confirmations: progress (ends, new states) is what followers wait for.
        while !self.confirming.is_empty() && self.writing < self.w.cfg.max_writes.max(1) {
            let take = self.confirming.len().min(MAX_BATCH);
            let mut ids = Vec::with_capacity(take);
            let mut batch = Vec::with_capacity(take);
            for (id, epoch, g) in self.confirming.drain(..take) {
                ids.push((id, epoch));
                batch.push((id, g));
            }
            self.writing += 1;
            let w = self.w.clone();
            let tx = self.tx.clone();
            tokio::spawn(async move {
                let result = w.store.confirm_polled(w.owner, &ids).await;
                let _ = tx.send(Msg::Confirmed { batch, result });
            });
        }
    }

    fn recorded(&mut self, id: Uuid, generation: u64, end: Option<Status>, written: Written) {
        // Counted here, once the end is in the store: never twice, never for an end
        // that another replica or a cancel got to first, and even when the wait's
        // own terminal notice came back first and it is no longer held.
        match (&written, &end) {
            (Written::Yes, Some(status)) => self.w.metrics.ended(*status),
            (Written::Abandoned, _) => self.w.metrics.ended(Status::Error),
            _ => {}
        }
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        if h.generation != generation {
            return;
        }
        match written {
            Written::Yes if end.is_none() => {
                h.busy = false;
                h.dirty = false;
                h.confirmed = true;
                h.written = fingerprint(&h.engine);
                h.written_at = Instant::now();
                let next = h.next;
                self.schedule(id, next);
            }
            Written::Yes | Written::Abandoned | Written::NotOwned => {
                self.held.remove(&id);
            }
            Written::Failed(e) => {
                // Give it back with the next renewal: another claim resumes from the
                // last checkpoint (at-least-once polling, exactly-once ending).
                tracing::warn!(wait_id = %id, error = %e, "could not record progress; letting the wait go");
                if let Some(h) = self.held.remove(&id) {
                    self.let_go.push(lease_only(id, &h));
                }
            }
        }
    }
}

/// Writes a batch of progress in one transaction. When the store refuses the batch
/// for what it holds rather than for being away (a byte Postgres will not store,
/// say), the waits are written one at a time, and each one the store still refuses
/// is ended in `error` instead: a wait must end by its deadline, not be let go and
/// polled again forever.
async fn write_progress(w: &Worker, clock: Clock, progress: &[Progress]) -> Vec<Written> {
    let refused = match w.store.record_many(w.owner, clock.now(), progress).await {
        Ok(done) => {
            return done
                .into_iter()
                .map(|ok| if ok { Written::Yes } else { Written::NotOwned })
                .collect();
        }
        Err(e @ StoreError::Unavailable(_)) => {
            return vec![Written::Failed(e.to_string()); progress.len()];
        }
        Err(e) => e,
    };
    tracing::warn!(error = %refused, n = progress.len(), "the store refused a batch of progress; writing it one wait at a time");
    let mut out = Vec::with_capacity(progress.len());
    for p in progress {
        w.metrics.write();
        let why = match w.store.record(w.owner, clock.now(), p).await {
            Ok(true) => {
                out.push(Written::Yes);
                continue;
            }
            Ok(false) => {
                out.push(Written::NotOwned);
                continue;
            }
            Err(e @ StoreError::Unavailable(_)) => {
                out.push(Written::Failed(e.to_string()));
                continue;
            }
            Err(e) => e,
        };
        tracing::warn!(wait_id = %p.id, error = %why, "the store refused this wait's progress; ending it in error");
        let end = Progress::abandon(
            p.id,
            p.epoch,
            &p.engine,
            format!("could not store what the target answered: {why}"),
        );
        w.metrics.write();
        out.push(match w.store.record(w.owner, clock.now(), &end).await {
            Ok(true) => Written::Abandoned,
            Ok(false) => Written::NotOwned,
            Err(e) => Written::Failed(e.to_string()),
        });
    }
    out
}

fn event_body(e: &Event) -> EventBody {
    match e {
        Event::State { from, to } => EventBody::State {
            from: from.clone(),
            to: to.clone(),
        },
        Event::Retry {
            error,
            attempt,
            delay,
        } => EventBody::Retry {
            error: error.clone(),
            attempt: *attempt,
            delay: engine::duration::format(*delay),
        },
    }
}
