//! Taking waits in and letting them go: the claim (a task, its limit larger while
//! a backlog lasts), what it returns held, and a wait given back to the store.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use super::{
    Claimed, Held, Loop, MAX_CLAIMS, Msg, Phase, Signal, StoreError, WaitEpoch, fingerprint, lease,
    nudge,
};

/// How far ahead a claim takes unowned waits: a backlog due over the next minute
/// (an import, a fleet started after an outage) is held within seconds, not as each
/// falls due, and a held wait costs memory only.
const CLAIM_AHEAD: Duration = Duration::from_secs(60);

/// Waits a claim asks for; twice this while the claim before came back full (a
/// backlog), which the store may split over two statements at once.
const CLAIM_BATCH: usize = 1000;

impl Loop {
    pub(super) fn claim(&mut self) {
        self.claim_again = false;
        let free = self.w.cfg.capacity.saturating_sub(self.held.len());
        if free == 0 {
            return;
        }
        self.claiming = true;
        let w = self.w.clone();
        let tx = self.tx.clone();
        let lookahead = CLAIM_AHEAD;
        let backlog = self.backlog;
        tokio::spawn(async move {
            let limit = free.min(CLAIM_BATCH * if backlog { 2 } else { 1 }) as i64;
            let started = Instant::now();
            let r = w
                .leases
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

    /// A claim came back: hold what it claimed.
    pub(super) fn claimed(&mut self, result: Result<Vec<Claimed>, StoreError>) {
        self.claiming = false;
        match result {
            Ok(claimed) => {
                self.backlog = claimed.len() >= CLAIM_BATCH;
                if self.backlog {
                    self.claim_again = true;
                }
                if !claimed.is_empty() {
                    tracing::debug!(n = claimed.len(), "claimed waits");
                }
                // Held before (its epoch counts claims), by an earlier run of
                // this replica or by another.
                let resumed = claimed.iter().filter(|c| c.resumed).count();
                if resumed > 0 {
                    tracing::info!(
                        resumed,
                        "resumed waits polled before by another replica or an earlier run"
                    );
                }
                let ids: Vec<Uuid> = claimed.iter().map(|c| c.id).collect();
                for c in claimed {
                    self.insert(c);
                }
                self.note_held();
                self.w.signals.send(|| Signal::Claimed(ids));
            }
            Err(e) => {
                // Its answer may have been lost after the claim committed: the next
                // renewal compares what this replica owns with what it holds.
                self.need_full = true;
                tracing::warn!(error = %e, "claiming waits failed")
            }
        }
    }

    /// Holds a claimed wait: schedules its next poll, or ends it when its polls
    /// keep taking their replica down.
    pub(super) fn insert(&mut self, c: Claimed) {
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
            phase: if c.counted {
                Phase::Counted
            } else if c.count_first_poll {
                Phase::Claimed
            } else {
                Phase::Idle
            },
            dirty: false,
            memo: None,
            trace: c.trace.filter(|_| self.w.prober.client().traces().is_on()),
            polling: None,
            nudge: nudge::Nudge::None,
        };
        self.held.insert(c.id, Box::new(held));
        self.settled_one(c.id);
        if let Some(slot) = c.settles {
            self.unsettled.insert(c.id, slot);
            *self.settling.entry(slot).or_insert(0) += 1;
        }
        if c.claims >= MAX_CLAIMS {
            self.end_crash_loop(c.id, c.claims);
            return;
        }
        self.schedule(c.id, c.next_poll_at);
    }

    /// Lets a held wait go: given back with the next renewal, so that another
    /// claim resumes it from its last checkpoint.
    pub(super) fn let_go(&mut self, id: Uuid) {
        self.settled_one(id);
        if let Some(h) = self.held.remove(&id) {
            self.let_go
                .push(lease::named_only(WaitEpoch { id, epoch: h.epoch }));
        }
    }

    pub(super) fn note_held(&self) {
        self.w.metrics.held.store(self.held.len() as i64, Relaxed);
    }
}
