//! Deciding groups on every replica.
//!
//! Every replica hears every terminal notice (the bus). When a wait ends, the
//! groups it is a member of are looked at again: decided when [`super::decide`]
//! says so, or their `state` brought up to date (`2 of 3 succeeded`). A decided
//! group's running members are canceled (unless it keeps them running). Since the
//! end of a group is a conditional update, replicas deciding at once write one
//! end; a replica that dies after a member's end and before the decision loses
//! nothing, since every other replica heard the same notice, and a sweep looks at
//! every open group again (each second for those past their deadline, every ten
//! seconds for all, and after the bus says notices may have been missed).
//!
//! The time from a member's end to its group's end is spent in three places: the
//! notice reaching the bus (the sequencer numbers the end, LISTEN brings it), the
//! round it joins (reads of the groups and their members, the rule), and the
//! write of the end. So a round only reads and decides: a task of its own hears
//! the bus meanwhile (a slow round never makes it drop notices, which would cost
//! a sweep of every open group; it hears the ends this replica writes as they
//! commit, ahead of their notices), the ends are written by up to [`WRITING`] tasks
//! while the next round reads, and the progress of the groups still open by one
//! writer ([`super::states`]) off that path.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, Semaphore, broadcast};
use uuid::Uuid;

use super::states;
use super::{Decision, decide, progress};
use crate::bus::{Bus, BusMsg};
use crate::metrics::Metrics;
use crate::model::Status;
use crate::store::groups::{Group, GroupEnd};
use crate::store::{Groups, StoreError};

/// Members one batch of ends ends at once: each holds one database connection
/// at a time. Canceling members is off the path of the group's end.
const CANCELING: usize = 2;
/// Groups read and written together: one read of their rows, one of their
/// members, one transaction for their ends and one for their progress.
const BATCH: usize = 500;
/// Batches of ends a replica writes at once, while its next round reads (with
/// [`CANCELING`], at most 8 of the replica's database connections). A round
/// waits for a free one, so in a burst of ends (where a batch may wait for
/// another's rows) more of them keep the rounds going.
const WRITING: usize = 4;
/// Ends heard and not yet looked at that a replica keeps; past it, the next round
/// is a sweep.
const MAX_HEARD: usize = 100_000;
/// Groups looked at in one sweep.
const SWEEP: i64 = 1000;
/// Every this many seconds a sweep looks at every open group, not only at those
/// past their deadline.
const FULL_SWEEP_EVERY: u64 = 10;
/// A member still running this long after the deadline of a group that keeps
/// its members running is ended `timed_out` here: the group's deadline caps
/// its own, and a member given by id that its replica held when the group was
/// created polls on under the deadline it had (a new claim takes the cap). The
/// grace leaves a member's last poll at the deadline to its own replica.
pub const CAPPED_GRACE: Duration = Duration::from_secs(2);
/// Each second's sweep looks again at the groups that keep their members
/// running whose deadline passed this recently; the full sweep at all of them.
const RECENT: Duration = Duration::from_secs(60);

/// The sentence a canceled member records.
pub fn member_cancel_reason(group: Uuid, status: Status) -> String {
    match status {
        Status::Canceled => format!("canceled with its group {group}, which was canceled"),
        s => format!("canceled because its group {group} ended {s}"),
    }
}

/// The sentence a member records when its group's deadline, which caps its own,
/// ends it.
pub fn member_deadline_reason(group: Uuid) -> String {
    format!("the deadline of its group {group}, which caps its own, passed")
}

/// Looks at one group again: decides it, or records how far it is; ends the
/// running members of a decided group. Safe to run on several replicas at once.
pub async fn settle(store: &Groups, metrics: &Arc<Metrics>, id: Uuid) -> Result<(), StoreError> {
    settle_all(store, metrics, &[id], None).await
}

/// [`settle`] for many groups at once: a burst of member ends costs a few
/// statements per batch of groups, not a few per group. With `deferred`, only
/// the reads and the rule run before this returns: the progress of the groups
/// still open goes to the queue's writer, and the ends (of groups, and of the
/// members a decision ends) to tasks of their own.
pub async fn settle_all(
    store: &Groups,
    metrics: &Arc<Metrics>,
    ids: &[Uuid],
    deferred: Option<&Deferred>,
) -> Result<(), StoreError> {
    // A batch that fails leaves the others to go on; the sweep retries it.
    let mut first = Ok(());
    for chunk in ids.chunks(BATCH) {
        if let Err(e) = settle_batch(store, metrics, chunk, deferred).await
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    first
}

/// Where a round of the watcher leaves the writes its decisions call for.
#[derive(Clone)]
pub struct Deferred {
    states: states::Queue,
    /// Batches of ends being written at once.
    writing: Arc<Semaphore>,
}

/// A batch of groups as read, with the decisions the rule made of them.
struct Decided {
    groups: Vec<Group>,
    /// (index in `groups`, decision, state).
    ends: Vec<(usize, Decision, String)>,
}

async fn settle_batch(
    store: &Groups,
    metrics: &Arc<Metrics>,
    ids: &[Uuid],
    deferred: Option<&Deferred>,
) -> Result<(), StoreError> {
    let groups = store.read_many(ids).await?;
    let now = Utc::now();
    let mut ends = Vec::new();
    let mut moved = Vec::new();
    for (i, g) in groups.iter().enumerate() {
        if g.status != Status::Running {
            continue;
        }
        let state = progress(&g.members);
        match decide(g.mode, &g.members, g.deadline, now) {
            Some(d) => ends.push((i, d, state)),
            None => moved.push((i, state)),
        }
    }
    let Some(deferred) = deferred else {
        let progress: Vec<(&Group, String)> =
            moved.into_iter().map(|(i, s)| (&groups[i], s)).collect();
        let written = write_ends(
            store,
            metrics,
            Decided {
                groups: groups.clone(),
                ends,
            },
        )
        .await;
        store.progress_many(&progress, Utc::now()).await?;
        return written;
    };
    // Rounds run one at a time, so the progress queued here is never older than
    // what an earlier round queued.
    deferred
        .states
        .push(moved.into_iter().map(|(i, s)| (groups[i].clone(), s)));
    deferred
        .states
        .forget(ends.iter().map(|(i, _, _)| groups[*i].id));
    let decided = Decided { groups, ends };
    if decided.ends.is_empty() && decided.groups.iter().all(|g| g.status == Status::Running) {
        return Ok(());
    }
    // Several batches of ends may be written at once: each end is conditional
    // on its group still running, so a group two of them decide ends once.
    let permit = deferred.writing.clone().acquire_owned().await;
    let (store, metrics) = (store.clone(), metrics.clone());
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(e) = write_ends(&store, &metrics, decided).await {
            tracing::warn!(error = %e, "could not end groups; the next sweep tries again");
        }
    });
    Ok(())
}

/// Writes the ends of the decided groups, then ends the running members of
/// every ended group of the batch (canceled; or, past the deadline of a group
/// that keeps them running, timed out).
async fn write_ends(store: &Groups, metrics: &Metrics, d: Decided) -> Result<(), StoreError> {
    // Stamped when written: a group ends when its end is written, not read.
    let now = Utc::now();
    let groups = &d.groups;
    let ends: Vec<GroupEnd<'_>> = d
        .ends
        .iter()
        .map(|(i, decision, state)| GroupEnd {
            group: &groups[*i],
            status: decision.status,
            reason: &decision.reason,
            state,
        })
        .collect();
    let ended: HashSet<Uuid> = store.end_many(&ends, now).await?.into_iter().collect();
    for e in &ends {
        if ended.contains(&e.group.id) {
            metrics.ended(e.status);
            metrics.group_ended(e.status);
            tracing::info!(group_id = %e.group.id, status = %e.status, "group decided");
        }
    }
    // Another replica, or a cancel, ended these first: their end stands.
    let lost: Vec<Uuid> = ends
        .iter()
        .map(|e| e.group.id)
        .filter(|id| !ended.contains(id))
        .collect();
    let again: HashMap<Uuid, Status> = store
        .read_many(&lost)
        .await?
        .into_iter()
        .map(|g| (g.id, g.status))
        .collect();
    let capped_at = chrono::Duration::from_std(CAPPED_GRACE).unwrap_or_default();
    let mut member_ends = Vec::new();
    for g in groups {
        let status = if ended.contains(&g.id) {
            ends.iter()
                .find(|e| e.group.id == g.id)
                .map_or(g.status, |e| e.status)
        } else {
            again.get(&g.id).copied().unwrap_or(g.status)
        };
        if !status.is_end() {
            continue;
        }
        let (end, reason) = if !g.keep_running {
            (Status::Canceled, member_cancel_reason(g.id, status))
        } else if now >= g.deadline + capped_at {
            (Status::TimedOut, member_deadline_reason(g.id))
        } else {
            continue;
        };
        for m in g.members.iter().filter(|m| m.status == Status::Running) {
            member_ends.push((g.tenant.as_str(), m.id, end, reason.clone()));
        }
    }
    futures_util::stream::iter(member_ends)
        .for_each_concurrent(CANCELING, |(tenant, id, end, reason)| async move {
            match store.end_member(tenant, id, now, end, &reason).await {
                Ok(true) => metrics.ended(end),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(wait_id = %id, error = %e, "could not end a group's member; the next sweep tries again")
                }
            }
        })
        .await;
    Ok(())
}

/// What the bus said since the last round: the waits that ended, and whether
/// notices may have been missed.
#[derive(Default)]
struct Heard {
    ended: Vec<Uuid>,
    /// When the earliest of those ends was written, as its notice says.
    earliest: Option<chrono::DateTime<Utc>>,
    resync: bool,
    closed: bool,
}

/// Listens to the bus without pause, so that a long round does not make the bus
/// drop notices for it (which would cost a sweep of every open group): what it
/// hears waits in `heard` for the next round. It also hears of the ends this
/// replica's own writes make as they commit ([`Groups::local_ends`]), ahead of
/// their notices, and skips the notice of an end it heard so.
async fn listen(
    mut rx: broadcast::Receiver<BusMsg>,
    mut local: broadcast::Receiver<Arc<[Uuid]>>,
    heard: Arc<std::sync::Mutex<Heard>>,
    wake: Arc<Notify>,
) {
    let mut early: HashSet<Uuid> = HashSet::new();
    let mut local_open = true;
    loop {
        let m = tokio::select! {
            m = rx.recv() => m,
            ids = local.recv(), if local_open => {
                match ids {
                    Ok(ids) => {
                        let mut h = heard.lock().unwrap_or_else(|e| e.into_inner());
                        if h.ended.len() + ids.len() > MAX_HEARD {
                            h.resync = true;
                        } else {
                            h.ended.extend(ids.iter().copied());
                        }
                        if early.len() + ids.len() > MAX_HEARD {
                            early.clear();
                        }
                        early.extend(ids.iter().copied());
                    }
                    // The notices bring what was missed.
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => {
                        local_open = false;
                        continue;
                    }
                }
                wake.notify_one();
                continue;
            }
        };
        {
            let mut h = heard.lock().unwrap_or_else(|e| e.into_inner());
            match m {
                Ok(BusMsg::Notice(n)) if n.is_terminal() && early.remove(&n.wait_id) => continue,
                // Past the bound, a sweep finds what the ends heard would have.
                Ok(BusMsg::Notice(n)) if n.is_terminal() && h.ended.len() >= MAX_HEARD => {
                    h.resync = true
                }
                Ok(BusMsg::Notice(n)) if n.is_terminal() => {
                    h.ended.push(n.wait_id);
                    if let Some(at) = n.events.as_ref().and_then(|e| e.last()).map(|e| e.at) {
                        h.earliest = Some(h.earliest.map_or(at, |t| t.min(at)));
                    }
                }
                Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => h.resync = true,
                Ok(_) => continue,
                Err(RecvError::Closed) => h.closed = true,
            }
            if h.closed {
                wake.notify_one();
                return;
            }
        }
        wake.notify_one();
    }
}

/// Decides groups as their members end, until `stop`.
pub async fn run(store: Groups, bus: Bus, metrics: Arc<Metrics>, stop: impl Future<Output = ()>) {
    let heard = Arc::new(std::sync::Mutex::new(Heard::default()));
    let wake = Arc::new(Notify::new());
    let listener = tokio::spawn(listen(
        bus.subscribe(),
        store.local_ends(),
        heard.clone(),
        wake.clone(),
    ));
    let deferred = Deferred {
        states: states::Queue::default(),
        writing: Arc::new(Semaphore::new(WRITING)),
    };
    let writer = tokio::spawn(deferred.states.clone().write(store.clone()));
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    tokio::pin!(stop);
    loop {
        let mut sweep: Option<bool> = None;
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                ticks += 1;
                sweep = Some(ticks % FULL_SWEEP_EVERY == 1);
            }
            _ = wake.notified() => {}
        }
        // Whatever else was heard meanwhile joins this round: a burst of ends is
        // looked up at once.
        let h = std::mem::take(&mut *heard.lock().unwrap_or_else(|e| e.into_inner()));
        if h.closed {
            break;
        }
        if h.resync {
            sweep = Some(true);
        }
        if let Some(at) = h.earliest {
            // How long after the earliest of these ends the round begins: the bus's
            // lag and the previous round's time (for debugging the group-end lag).
            tracing::debug!(
                ends = h.ended.len(),
                ms = (Utc::now() - at).num_milliseconds(),
                "ends heard"
            );
        }
        if let Err(e) = round(&store, &metrics, &deferred, &h.ended, sweep).await {
            tracing::warn!(error = %e, "could not decide groups; the next sweep tries again");
        }
    }
    listener.abort();
    writer.abort();
    // Both are gone before this returns, so none outlives the store it uses.
    let _ = listener.await;
    let _ = writer.await;
}

async fn round(
    store: &Groups,
    metrics: &Arc<Metrics>,
    deferred: &Deferred,
    ended: &[Uuid],
    sweep: Option<bool>,
) -> Result<(), StoreError> {
    let started = std::time::Instant::now();
    let mut due = BTreeSet::new();
    for chunk in ended.chunks(500) {
        due.extend(store.touching(chunk).await?);
    }
    if let Some(all) = sweep {
        let recent = chrono::Duration::from_std(RECENT).unwrap_or_default();
        due.extend(store.to_settle(Utc::now(), all, recent, SWEEP).await?);
    }
    let due: Vec<Uuid> = due.into_iter().collect();
    let looked_up = started.elapsed();
    let r = settle_all(store, metrics, &due, Some(deferred)).await;
    if !due.is_empty() {
        tracing::debug!(
            ended = ended.len(),
            groups = due.len(),
            lookup_ms = looked_up.as_millis() as u64,
            ms = started.elapsed().as_millis() as u64,
            "groups settled"
        );
    }
    r
}
