//! One poll: the probe, run as a task under the pool's bound on probes in flight,
//! and the engine step on what it observed, which decides what is written.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::time::Instant;
use uuid::Uuid;

use super::{Loop, Msg, Phase};
use crate::engine::{self, Context, Decision, End, Observation};
use crate::model::{EventBody, LastPoll};
use crate::probe::Polled;
use crate::store::{Ended, Progress, WaitEpoch};

/// A probe still in flight at its wait's deadline is cut this long after it, so
/// the poll the engine schedules at the deadline itself still gets an answer, and
/// a target that never answers ends the wait `timed_out` within a moment of it.
const DEADLINE_GRACE: Duration = Duration::from_millis(250);

/// Why a callback wait that heard nothing by its deadline ended.
pub const CALLBACK_DEADLINE: &str = "the deadline passed before a callback completed the wait";

impl Loop {
    pub(super) fn start_probe(&mut self, id: Uuid, g: u64) {
        let Some(h) = self.held.get(&id) else {
            return;
        };
        if h.spec.callback.is_some() {
            self.callback_due(id, g);
            return;
        }
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
        let span = self.w.prober.client().traces().poll(
            h.trace.as_deref(),
            id,
            h.engine.polls.saturating_add(1),
        );
        let polled = target.as_ref().ok().cloned();
        let flight = super::timers::Flight::start(&self.in_flight);
        let task = tokio::spawn(async move {
            let _flight = flight;
            let probe = async {
                // The prober itself bounds the probes in flight per target host.
                let _p = probes.acquire_owned().await;
                match target {
                    // Boxed: the request's state machine is a few KiB, and the
                    // task's own future is moved whole at every step of a spawn.
                    Ok(target) => {
                        Box::pin(w.prober.probe_memo(id, &spec, &target, &mut memo)).await
                    }
                    Err(error) => Polled::Observed(Observation::Permanent { error: error.0 }, None),
                }
            };
            let started = Instant::now();
            let answered = match &span {
                Some(cx) => {
                    use opentelemetry::context::FutureExt as _;
                    tokio::time::timeout_at(cut, probe.with_context(cx.clone())).await
                }
                None => tokio::time::timeout_at(cut, probe).await,
            };
            let obs = answered.unwrap_or_else(|_| {
                Polled::Observed(
                    Observation::Transient {
                    error: if polled.as_ref().is_some_and(|t| t.minting()) {
                        "the token endpoint of the target's credential had not answered by the wait's deadline"
                    } else {
                        "the target had not answered by the wait's deadline"
                    }
                    .into(),
                    retry_after: None,
                },
                    None,
                )
            });
            if let Polled::Observed(obs, _) = &obs {
                if let Some(cx) = &span {
                    let came = polled.and_then(|t| t.last_poll()).map(LastPoll::as_str);
                    crate::traces::polled(cx, obs, came);
                }
                w.metrics.probe_latency.observe(started.elapsed());
                w.metrics.poll(obs);
            }
            let _ = tx.send(Msg::Probed {
                id,
                generation: g,
                obs,
                memo,
                at: clock.now(),
            });
        });
        if let Some(h) = self.held.get_mut(&id) {
            h.polling = Some(super::Polling(task.abort_handle()));
        }
    }

    /// A callback wait has nothing to poll: it is held like any other wait, and its
    /// one "poll", at its deadline, ends it `timed_out` (a callback that came
    /// first ended it already, and this write then lands nowhere).
    fn callback_due(&mut self, id: Uuid, g: u64) {
        let now = self.clock.now();
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        if now < h.engine.deadline {
            h.phase = Phase::Idle;
            let t = h.engine.deadline;
            self.schedule(id, t);
            return;
        }
        h.phase = Phase::Writing;
        let progress = Progress {
            id,
            epoch: h.epoch,
            engine: h.engine.clone(),
            next_poll_at: None,
            events: Vec::new(),
            end: Some(Ended {
                status: crate::model::Status::TimedOut,
                reason: CALLBACK_DEADLINE.into(),
                error_detail: None,
                output: None,
            }),
        };
        self.pending.push((progress, g));
    }

    /// A probe came back: keep what its conditions decided, and step the engine.
    pub(super) fn probed(
        &mut self,
        id: Uuid,
        generation: u64,
        obs: Polled,
        memo: Option<crate::probe::Memo>,
        at: DateTime<Utc>,
    ) {
        // A poll completed: this replica survived it.
        self.settled_one(id);
        if let Some(h) = self.held.get_mut(&id) {
            if h.generation == generation {
                // Its task is over: the handle would keep the task's memory (a
                // few KiB) allocated until the next poll.
                h.polling = None;
            }
            // A memo with a verdict is there when the conditions decided the
            // response (not when it never reached them, or they failed on it).
            if let Some(m) = memo.filter(|m| m.judged()) {
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

    fn observed(&mut self, id: Uuid, generation: u64, polled: Polled, at: DateTime<Utc>) {
        let floor = self.w.cfg.floor;
        let Some(h) = self.held.get_mut(&id) else {
            return;
        };
        if h.generation != generation {
            return;
        }
        let mut output = None;
        let (step, held) = match polled {
            Polled::Observed(obs, taken) => {
                output = taken;
                let cx = Context {
                    now: at,
                    floor,
                    jitter: fastrand::f64() * 2.0 - 1.0,
                };
                (engine::step(&h.spec, &mut h.engine, obs, cx), false)
            }
            Polled::Held(pause) => {
                let before = h.engine.paused.as_ref().map(|p| p.until);
                let step = engine::hold(&mut h.engine, pause.paused(), at);
                // Written when it begins (or grows), so that every replica's
                // read shows it; a poll held again by the same pause changes
                // nothing.
                (step, before != h.engine.paused.as_ref().map(|p| p.until))
            }
        };
        let events: Vec<EventBody> = step.events.iter().map(EventBody::from).collect();
        let (next, end) = match step.decision {
            Decision::PollAt(t) => (Some(t), None),
            Decision::End(o) => (
                None,
                Some(Ended {
                    status: o.end.into(),
                    reason: o.reason,
                    error_detail: o.error_detail,
                    // What the response that ended it gives; a deadline or a
                    // retry budget ends with none.
                    output: output.filter(|_| matches!(o.end, End::Succeeded | End::Failed)),
                }),
            ),
        };
        if let Some(t) = next {
            h.next = t;
        }
        if events.is_empty() && end.is_none() && !held {
            // Nothing changed: keep it in memory, checkpoint later.
            h.dirty = true;
            if h.phase == Phase::FirstPoll {
                // The first poll since the claim (of a wait polled before: a
                // wait's very first poll always writes an event, its first state
                // or a retry): the store only learns that it completed, which
                // clears its count of polls begun.
                h.phase = Phase::Confirming;
                let at = WaitEpoch { id, epoch: h.epoch };
                let next = self.clock.instant_at(h.next);
                self.confirm((at, generation), next);
                return;
            }
            h.phase = Phase::Idle;
            let t = h.next;
            self.schedule(id, t);
            return;
        }
        h.phase = Phase::Writing;
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
}
