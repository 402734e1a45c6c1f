//! Rows: what the dialects read and write, in one shape for both, and how the
//! store's own types become them (a new wait's stored parts, a poll's progress,
//! a checkpoint) and come back from them (a wait, an event).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::columns::{Json, Time, from_row};
use super::secrets;
use super::{Checkpoint, Ended, Ending, Event, EventBody, Progress, Status, StoreError, Wait};
use crate::engine::spec::{Notify, Target};
use crate::engine::{EngineState, Spec};

from_row! {
/// A wait as both dialects read it back.
pub(crate) struct WaitRow {
    id: Uuid,
    status: String,
    state: Option<String>,
    reason: Option<String>,
    error_detail: Option<Json>,
    last_error: Option<String>,
    output: Option<Json>,
    polls: i32,
    retries: i32,
    created_at: Time,
    updated_at: Time,
    deadline: Time,
    next_poll_at: Option<Time>,
    finished_at: Option<Time>,
    labels: Json,
    spec: Json,
    paused: Option<Json>,
}
}

from_row! {
/// A wait read on its own, and whether it is a group or a member of one.
pub(crate) struct GotRow {
    grouped: bool,
    ..wait: WaitRow,
}
}

/// The `grouped` column: whether the wait `w` is a group or a member of one (two
/// probes by index), so that its groups are looked up only when it has some.
pub(crate) const GROUPED_COLUMN: &str = "(EXISTS (SELECT 1 FROM group_members m WHERE m.member_id = w.id) \
     OR EXISTS (SELECT 1 FROM group_members m WHERE m.group_id = w.id)) AS grouped";

/// The columns a [`WaitRow`] reads, from `waits w JOIN wait_specs s`.
pub(crate) const WAIT_COLUMNS: &str = "w.id, w.status, w.state, w.reason, w.error_detail, w.last_error, w.output, w.polls, w.retries, \
     w.created_at, w.updated_at, w.deadline, w.next_poll_at, w.finished_at, w.labels, s.spec, \
     w.engine -> 'paused' AS paused";

impl WaitRow {
    pub(super) fn into_wait(self) -> Result<Wait, StoreError> {
        // The pause the engine last wrote, while it holds the running wait back.
        let paused = self
            .paused
            .filter(|_| self.status == "running")
            .and_then(|j| serde_json::from_value::<crate::engine::Paused>(j.0).ok())
            .and_then(|p| crate::model::Paused::of(&p, chrono::Utc::now()));
        Ok(Wait {
            id: self.id,
            status: self.status.parse().map_err(|e| StoreError::Decode {
                what: "status",
                why: format!("{e}"),
            })?,
            state: self.state,
            reason: self.reason,
            error_detail: self.error_detail.map(|j| j.0),
            last_error: self.last_error,
            output: self.output.map(|j| j.0),
            polls: self.polls,
            retries: self.retries,
            created_at: self.created_at.0,
            updated_at: self.updated_at.0,
            deadline: self.deadline.0,
            next_poll_at: self.next_poll_at.map(|t| t.0),
            progress_at: self.updated_at.0,
            last_poll: None,
            finished_at: self.finished_at.map(|t| t.0),
            labels: serde_json::from_value(self.labels.0).unwrap_or_default(),
            spec: self.spec.0,
            grouping: crate::model::Grouping {
                paused,
                ..Default::default()
            },
        })
    }
}

from_row! {
/// An event as both dialects read it back (`id` is the global cursor: Postgres's
/// `gid`, SQLite's row id).
pub(crate) struct EventRow {
    id: Option<i64>,
    seq: i32,
    wait_id: Uuid,
    kind: String,
    at: Time,
    data: Json,
}
}

impl EventRow {
    pub(super) fn into_event(self) -> Result<Event, StoreError> {
        Ok(Event {
            id: self.id,
            seq: self.seq,
            wait_id: self.wait_id,
            at: self.at.0,
            body: EventBody::from_parts(&self.kind, self.data.0).map_err(|e| {
                StoreError::Decode {
                    what: "event",
                    why: e.to_string(),
                }
            })?,
        })
    }
}

from_row! {
/// A feed entry as both dialects read it back.
pub(crate) struct FeedRow {
    tenant: String,
    labels: Json,
    ..event: EventRow,
}
}

from_row! {
/// A claimed row's stored parts.
pub(crate) struct ClaimRow {
    id: Uuid,
    epoch: i64,
    claims: i32,
    tenant: String,
    engine: Json,
    next_poll_at: Option<Time>,
    // The engine's deadline, or an earlier one a group's deadline capped it to.
    deadline: Time,
    spec: Json,
    headers: Json,
    trace: Option<String>,
    // The slot taken over whole that the row was read from (Postgres), and how
    // many times in a row that slot was taken from a holder that died; `None`
    // for a wait claimed on its own.
    slot: Option<Uuid>,
    slot_claims: i32,
    // Its first poll counted by the claim itself (Postgres: a wait claimed on
    // its own that is already due).
    counted: bool,
}
}

/// Everything a new wait's rows need, computed once for every backend.
pub(crate) struct NewWait {
    pub id: Uuid,
    pub engine: EngineState,
    pub first_poll: DateTime<Utc>,
    /// The spec as stored and shown: header values redacted.
    pub spec: Value,
    /// The header values, kept apart.
    pub headers: Value,
    pub labels: Value,
    pub engine_json: Value,
    /// The `created` event: kind and fields.
    pub created: (&'static str, Value),
    /// Its webhooks, secrets sealed.
    pub notify: Vec<NotifyRow>,
    /// The `traceparent` its polls and webhook attempts join.
    pub trace: Option<String>,
    /// Where it is held among the replicas ([`placement`]); `None` for a group.
    pub placement: Option<i64>,
}

/// The placement of a wait of `tenant` polling `url`: a number the same for
/// every wait of the tenant on that URL, so the replicas claim all of them on
/// one replica (docs/replicas.md §6.2) and their polls are shared. Only placement: which
/// waits share a request is decided byte for byte where they are held, so two
/// requests that differ in a header share a placement and nothing else. No
/// header value goes into it.
pub(crate) fn placement(tenant: &str, url: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((tenant.len() as u64).to_le_bytes());
    h.update(tenant.as_bytes());
    h.update(url.as_bytes());
    let d = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    (u64::from_le_bytes(b) >> 1) as i64
}

/// What one progress entry writes, computed once for every backend.
pub(crate) struct ProgressRow {
    pub id: Uuid,
    pub epoch: i64,
    pub status: &'static str,
    pub state: Option<String>,
    pub reason: Option<String>,
    pub detail: Option<Value>,
    /// The wait's `output`, when it ends with one.
    pub output: Option<Value>,
    pub last_error: Option<String>,
    pub polls: i32,
    pub retries: i32,
    pub engine: String,
    /// `None` once it ends.
    pub next_poll_at: Option<DateTime<Utc>>,
    pub ended: bool,
    /// The events to append, in order: kind and fields.
    pub events: Vec<(&'static str, Value)>,
}

/// What one checkpoint writes. A checkpoint lands only when it is newer (more
/// polls) than what the row holds, so a progress write that committed while it was
/// on its way wins; a checkpoint without an engine state renews only.
pub(crate) struct CheckpointRow {
    pub id: Uuid,
    pub epoch: i64,
    pub engine: Option<String>,
    pub polls: Option<i32>,
    pub retries: Option<i32>,
    pub next_poll_at: Option<DateTime<Utc>>,
}

impl From<&Checkpoint> for CheckpointRow {
    fn from(c: &Checkpoint) -> CheckpointRow {
        CheckpointRow {
            id: c.id,
            epoch: c.epoch,
            engine: c
                .engine
                .as_ref()
                .and_then(|e| serde_json::to_string(e).ok()),
            polls: c.engine.as_ref().map(|e| e.polls as i32),
            retries: c.engine.as_ref().map(|e| e.retries as i32),
            next_poll_at: c.next_poll_at,
        }
    }
}

/// How a create counts the tenant's running waits, decided from the cached count.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Admission {
    /// Far under the limit (or no limit): insert without counting.
    Free,
    /// Count in the insert's transaction; within `LIMIT_MARGIN` of `max`, count
    /// again under the tenant's lock.
    Count { max: i64 },
}

/// The answer of a dialect's insert.
pub(crate) enum Inserted {
    /// The wait is in; `counted` is the tenant's running count when one was taken.
    Yes { counted: Option<i64> },
    /// Another request with this idempotency key won the race.
    KeyTaken,
    /// The tenant has this many running waits, the most allowed.
    Full(i64),
}

/// Below `max_active_waits - LIMIT_MARGIN` running waits, creates skip the per-tenant
/// lock: more concurrent creates than this (connections across all replicas) would
/// be needed to overshoot the limit.
pub(crate) const LIMIT_MARGIN: i64 = 256;

fn to_json<T: Serialize>(v: &T, what: &'static str) -> Result<Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Decode {
        what,
        why: e.to_string(),
    })
}

impl NewWait {
    pub(super) fn prepare(
        spec: &Spec,
        now: DateTime<Utc>,
        cipher: &secrets::Cipher,
        trace: Option<&str>,
    ) -> Result<NewWait, StoreError> {
        let (engine, first_poll) = EngineState::start(spec, now);
        // A callback wait has nothing to poll: its worker looks at it only at its
        // deadline (docs/design.md §2.15).
        let first_poll = if spec.callback.is_some() {
            engine.deadline
        } else {
            first_poll
        };
        let created = EventBody::Created {
            deadline: engine.deadline,
        };
        Ok(NewWait {
            id: Uuid::now_v7(),
            first_poll,
            spec: to_json(&spec.redacted(), "spec")?,
            headers: cipher
                .seal(
                    &spec
                        .target
                        .as_ref()
                        .map(Target::secrets)
                        .unwrap_or_default(),
                )
                .map_err(|why| StoreError::Decode {
                    what: "target headers",
                    why: why.0,
                })?,
            labels: to_json(&spec.labels, "labels")?,
            engine_json: to_json(&engine, "engine state")?,
            created: created.to_parts(),
            notify: NotifyRow::of(&spec.notify, cipher)?,
            engine,
            trace: trace.map(str::to_owned),
            placement: None,
        })
    }

    /// The wait as it reads back right after its insert, built without a read.
    pub(super) fn wait(&self, now: DateTime<Utc>) -> Wait {
        Wait {
            id: self.id,
            status: Status::Running,
            state: None,
            reason: None,
            error_detail: None,
            last_error: None,
            output: None,
            polls: 0,
            retries: 0,
            created_at: now,
            updated_at: now,
            deadline: self.engine.deadline,
            next_poll_at: Some(self.first_poll),
            progress_at: now,
            last_poll: None,
            finished_at: None,
            labels: serde_json::from_value(self.labels.clone()).unwrap_or_default(),
            spec: self.spec.clone(),
            grouping: Default::default(),
        }
    }
}

impl Progress {
    /// What this progress writes: its columns, and its events (the observed ones,
    /// then the terminal one if it ended).
    pub(super) fn row(&self) -> Result<ProgressRow, StoreError> {
        let mut events: Vec<(&'static str, Value)> =
            self.events.iter().map(EventBody::to_parts).collect();
        if let Some(end) = &self.end {
            let terminal = EventBody::end(
                end.status,
                Ending {
                    reason: end.reason.clone(),
                    state: self.engine.state.clone(),
                    error_detail: end.error_detail.clone(),
                    last_error: self.engine.last_error.clone(),
                    output: end.output.clone(),
                },
            );
            events.push(terminal.to_parts());
        }
        Ok(ProgressRow {
            id: self.id,
            epoch: self.epoch,
            status: self
                .end
                .as_ref()
                .map_or(Status::Running, |e| e.status)
                .as_str(),
            state: self.engine.state.clone(),
            reason: self.end.as_ref().map(|e| e.reason.clone()),
            detail: self.end.as_ref().and_then(|e| e.error_detail.clone()),
            output: self.end.as_ref().and_then(|e| e.output.clone()),
            last_error: self.engine.last_error.clone(),
            polls: self.engine.polls as i32,
            retries: self.engine.retries as i32,
            engine: serde_json::to_string(&self.engine).map_err(|e| StoreError::Decode {
                what: "engine state",
                why: e.to_string(),
            })?,
            next_poll_at: if self.end.is_some() {
                None
            } else {
                self.next_poll_at
            },
            ended: self.end.is_some(),
            events,
        })
    }

    /// Progress that ends a held wait in `error` with `reason`, keeping its counters
    /// but nothing the target said: for a wait whose polls keep killing the replica
    /// polling it, or whose progress the store refuses to take.
    pub fn abandon(id: Uuid, epoch: i64, engine: &EngineState, reason: String) -> Progress {
        let mut engine = engine.clone();
        engine.state = None;
        engine.last_error = None;
        Progress {
            id,
            epoch,
            engine,
            next_poll_at: None,
            events: vec![],
            end: Some(Ended {
                status: Status::Error,
                reason: crate::engine::bound::text(&reason, crate::engine::bound::MAX_REASON)
                    .into_owned(),
                error_detail: None,
                output: None,
            }),
        }
    }

    /// Progress that ends a wait this version cannot read, rather than spin on it.
    pub(super) fn undecodable(id: Uuid, epoch: i64, why: String) -> Progress {
        let engine = EngineState {
            deadline: Utc::now(),
            polls: 0,
            retries: 0,
            budget_used: 0,
            poll_interval_ms: 0,
            retry_delay_ms: 0,
            transition_seen: false,
            hits: 0,
            state: None,
            last_error: None,
            paused: None,
        };
        let reason = format!("waitd could not read this wait's stored spec: {why}");
        let mut progress = Progress::abandon(id, epoch, &engine, reason);
        progress.engine.last_error = Some(why);
        progress
    }
}

/// A `notify` entry as stored: its index, URL, event kinds, and sealed secret.
pub(crate) struct NotifyRow {
    pub endpoint: i32,
    pub url: String,
    pub kinds: i32,
    pub secret: Value,
}

impl NotifyRow {
    pub(crate) fn of(
        notify: &[Notify],
        cipher: &secrets::Cipher,
    ) -> Result<Vec<NotifyRow>, StoreError> {
        notify
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let secret = cipher
                    .seal(&BTreeMap::from([("secret".to_string(), n.secret.clone())]))
                    .map_err(|why| StoreError::Decode {
                        what: "webhook secret",
                        why: why.0,
                    })?;
                Ok(NotifyRow {
                    endpoint: i as i32,
                    url: n.url.clone(),
                    kinds: n.kinds(),
                    secret,
                })
            })
            .collect()
    }
}
