//! This replica's lease and its renewals.
//!
//! A lease is one row a replica, whatever the store: renewing it needs nothing of
//! the held waits. Every third of the lease TTL a renewal extends it; every third
//! renewal also checkpoints the dirty waits worth it; and a full renewal names
//! every held wait, so that the store can say which were lost (taken over, ended
//! elsewhere) and which this replica owns without holding (strays, from a claim
//! whose answer was lost). When the lease cannot be renewed in time, polling pauses
//! until it is.
//!
//! The pass over the held waits that a renewal makes, and the comparison of a full
//! renewal's answer with them, run a share at a time ([`STEP`] waits a turn of the
//! loop), so that no timer waits for a pass over a million waits.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{Held, Loop, Msg, Signal, fingerprint};
use crate::store::{Checkpoint, Renewal, StoreError, WaitEpoch};

/// Below this many held waits every lease renewal names them all (see
/// [`Loop::renew`]).
const FULL_BELOW: usize = 10_000;

/// Above FULL_BELOW, every this many checkpoint rounds a renewal names every held
/// wait (and whenever a wait may have been lost).
const FULL_EVERY: u64 = 10;

/// Held waits a renewal's pass goes over in one turn of the loop: about a
/// millisecond, so that no timer waits for a pass over a million waits.
pub(super) const STEP: usize = 4096;

/// What a lease renewal reports back.
pub(super) struct Renewed {
    pub(super) started: Instant,
    /// It named every held wait, and its answer says which are no longer this
    /// replica's and which it owns without holding (else it renewed the lease and
    /// wrote checkpoints only).
    pub(super) full: bool,
    /// Every wait a full renewal named.
    pub(super) named: Vec<WaitEpoch>,
    pub(super) checkpointed: Vec<Uuid>,
    /// Whether a claim was on its way when the renewal started: its waits may
    /// show as owned and not yet held.
    pub(super) claiming: bool,
    pub(super) result: Result<Renewal, StoreError>,
    /// Waits let go that could not be given back: try again next time.
    pub(super) unreleased: Vec<Checkpoint>,
}

/// A renewal's pass over the held waits, a share per turn of the loop: the waits
/// to name (a full renewal) and the checkpoints to write.
pub(super) struct Sweep {
    /// The held waits when the pass began.
    keys: Vec<Uuid>,
    at: usize,
    full: bool,
    write_checkpoints: bool,
    named: Vec<WaitEpoch>,
    checkpoints: Vec<Checkpoint>,
    checkpointed: Vec<Uuid>,
}

/// A full renewal's answer, compared with the held waits a share per turn.
pub(super) struct Reconcile {
    named: Vec<WaitEpoch>,
    at: usize,
    /// Named, and no longer this replica's under the epoch named.
    lost: HashSet<Uuid>,
}

/// A wait under an epoch, with no state to write (given back, or only named).
pub(super) fn named_only(w: WaitEpoch) -> Checkpoint {
    Checkpoint {
        id: w.id,
        epoch: w.epoch,
        engine: None,
        next_poll_at: None,
    }
}

/// A held wait's checkpoint: its state when it changed since it was last written
/// (or always, with `force`), else its name only.
pub(super) fn checkpoint(id: Uuid, h: &Held, force: bool) -> Checkpoint {
    let write = force || h.dirty;
    Checkpoint {
        id,
        epoch: h.epoch,
        engine: write.then(|| h.engine.clone()),
        next_poll_at: write.then_some(h.next),
    }
}

impl Loop {
    /// True when the lease may run out before a poll started now could be written:
    /// another replica may take these waits, and polling them could double polls.
    pub(super) fn lease_stale(&self) -> bool {
        let safety = (self.w.cfg.lease_ttl / 5).min(Duration::from_secs(2));
        !self.held.is_empty() && Instant::now() + safety >= self.lease_until
    }

    pub(super) fn renew(&mut self) {
        if let Some(step) = self.clock.resync() {
            tracing::warn!(
                step_ms = step.num_milliseconds(),
                "the system clock stepped; schedules and deadlines follow it"
            );
        }
        if self.renewing {
            // The last renewal is still writing checkpoints (seconds of them
            // after a takeover or a restart): the lease goes on without it.
            self.lease_alone();
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
        // Renewing the lease needs nothing of the held waits, and for a replica
        // holding many, naming them all (and reading back all it owns) every time
        // would cost this loop and the store a pass over all of them. A full
        // renewal, which finds waits lost or stray, comes every FULL_EVERY
        // checkpoint rounds, after anything that may have lost a wait (a renewal or
        // claim that failed, a pause, a refused mark), and always below FULL_BELOW
        // waits.
        let big = self.held.len() >= FULL_BELOW;
        let full = !big || self.need_full || self.renewals.is_multiple_of(3 * FULL_EVERY);
        self.sweep = Some(Sweep {
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
        });
        // A few thousand waits are gone over at once; more, a share per turn of
        // the loop (`step`), so that no timer waits for the whole pass.
        self.step();
    }

    /// True while a renewal's pass over the held waits, or the comparison of its
    /// answer with them, is under way.
    pub(super) fn stepping(&self) -> bool {
        self.sweep.is_some() || self.reconcile.is_some()
    }

    /// One turn's share (STEP waits) of the pass a renewal makes over the held
    /// waits, or of the comparison of a full renewal's answer with them.
    pub(super) fn step(&mut self) {
        if let Some(mut s) = self.sweep.take() {
            let stale_after = self.w.cfg.lease_ttl * 10;
            let end = (s.at + STEP).min(s.keys.len());
            for id in &s.keys[s.at..end] {
                // Gone since the pass began: ended, or lost.
                let Some(h) = self.held.get_mut(id) else {
                    continue;
                };
                if s.full {
                    s.named.push(WaitEpoch {
                        id: *id,
                        epoch: h.epoch,
                    });
                }
                // A busy wait's progress is being written right now; it is named
                // only, so an older checkpoint cannot land after the newer write.
                if !s.write_checkpoints || h.busy() || !h.dirty {
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
            for &w in &r.named[r.at..end] {
                // Still this replica's in the store, but let go while the renewal
                // was on its way: give it back.
                if !self.held.contains_key(&w.id) && !r.lost.contains(&w.id) {
                    self.let_go.push(named_only(w));
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
        let w = Arc::clone(&self.w);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let (owner, ttl) = (w.owner, w.cfg.lease_ttl);
            // The lease first, on its own: checkpoints after a takeover or a
            // restart may take seconds to write, and the lease must not wait
            // for them.
            let r = match w.leases.renew_lease(owner, ttl).await {
                Err(e) => Err(e),
                Ok(()) => {
                    let _ = tx.send(Msg::Leased {
                        started,
                        ok: true,
                        alone: false,
                    });
                    if full {
                        w.leases.compare(owner, &named, &checkpoints).await
                    } else {
                        w.leases
                            .write_checkpoints(owner, &checkpoints)
                            .await
                            .map(|()| Renewal::default())
                    }
                }
            };
            w.metrics.write();
            drop(checkpoints);
            // Give back the waits let go (fenced by epoch: one already taken over
            // is untouched); what cannot be given back now goes with the next try.
            let mut unreleased = let_go;
            if r.is_ok() && !unreleased.is_empty() {
                w.metrics.write();
                match w.leases.release(owner, &unreleased).await {
                    Ok(n) => {
                        tracing::debug!(n, "gave back waits let go");
                        unreleased.clear();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not give back waits let go; trying again")
                    }
                }
            }
            if let Err(e) = w.leases.maintain().await {
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

    /// Renews the lease row alone, unless such a renewal is on its way already.
    fn lease_alone(&mut self) {
        if self.leasing {
            return;
        }
        self.leasing = true;
        let w = Arc::clone(&self.w);
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = w.leases.renew_lease(w.owner, w.cfg.lease_ttl).await;
            w.metrics.write();
            if let Err(e) = &r {
                tracing::warn!(error = %e, "renewing the lease failed");
            }
            let _ = tx.send(Msg::Leased {
                started,
                ok: r.is_ok(),
                alone: true,
            });
        });
    }

    /// The lease row was renewed (or not): the lease runs a TTL from when the
    /// renewal began.
    pub(super) fn leased(&mut self, started: Instant, ok: bool, alone: bool) {
        if alone {
            self.leasing = false;
        }
        if ok {
            self.lease_until = self.lease_until.max(started + self.w.cfg.lease_ttl);
        }
    }

    /// A renewal came back: extend the lease, and drop what it says is no longer ours.
    pub(super) fn renewed(&mut self, r: Renewed) {
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
        let ok = result.is_ok();
        tracing::debug!(
            full,
            named = named.len(),
            checkpoints = checkpointed.len(),
            ms = started.elapsed().as_millis() as u64,
            ok,
            "lease renewal"
        );
        self.take_renewal(started, full, named, checkpointed, claiming, result);
        self.note_held();
        self.w.signals.send(|| Signal::Renewed { ok });
    }

    fn take_renewal(
        &mut self,
        started: Instant,
        full: bool,
        named: Vec<WaitEpoch>,
        checkpointed: Vec<Uuid>,
        claiming: bool,
        result: Result<Renewal, StoreError>,
    ) {
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
                for w in &lost {
                    if self
                        .held
                        .get(&w.id)
                        .is_some_and(|h| !h.busy() && h.epoch == w.epoch)
                    {
                        // Taken over or ended elsewhere. (Under another epoch it
                        // was claimed again since the renewal left: the answer is
                        // about an older lease, so keep it.)
                        tracing::debug!(wait_id = %w.id, "lease lost");
                        self.settled_one(w.id);
                        self.held.remove(&w.id);
                    }
                }
                self.reconcile = Some(Reconcile {
                    named,
                    at: 0,
                    lost: lost.into_iter().map(|w| w.id).collect(),
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
    }

    /// A claim whose answer was lost (the connection broke after its commit) leaves
    /// waits this replica owns in the store but does not hold: nobody polls them,
    /// and its live lease keeps every other replica off them. Found by two renewals
    /// in a row (a claim's answer takes milliseconds, not a third of a lease), they
    /// are given back, fenced by epoch, and claimed again like any other.
    fn give_back_strays(&mut self, strays: Vec<WaitEpoch>) {
        let mut now = HashMap::with_capacity(strays.len());
        for w in strays {
            if self.held.contains_key(&w.id) {
                continue;
            }
            if self.strays.get(&w.id) == Some(&w.epoch) {
                tracing::warn!(wait_id = %w.id, "a wait this replica owns but does not hold (a claim's answer was lost); giving it back");
                self.let_go.push(named_only(w));
                self.claim_again = true;
            } else {
                now.insert(w.id, w.epoch);
            }
        }
        self.strays = now;
    }
}
