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

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use uuid::Uuid;

use super::{decide, progress};
use crate::bus::{Bus, BusMsg};
use crate::metrics::Metrics;
use crate::model::Status;
use crate::store::groups::{GroupEnd, member_cancel_reason, member_deadline_reason};
use crate::store::{Store, StoreError};

/// Members ended at once: each holds one database connection at a time.
const CANCELING: usize = 8;
/// Groups read and written together: one read of their rows, one of their
/// members, one transaction for their ends and one for their progress.
const BATCH: usize = 500;
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

/// Looks at one group again: decides it, or records how far it is; ends the
/// running members of a decided group. Safe to run on several replicas at once.
pub async fn settle(store: &Store, metrics: &Metrics, id: Uuid) -> Result<(), StoreError> {
    settle_all(store, metrics, &[id]).await
}

/// [`settle`] for many groups at once: a burst of member ends costs a few
/// statements per batch of groups, not a few per group.
pub async fn settle_all(store: &Store, metrics: &Metrics, ids: &[Uuid]) -> Result<(), StoreError> {
    // A batch that fails leaves the others to go on; the sweep retries it.
    let mut first = Ok(());
    for chunk in ids.chunks(BATCH) {
        if let Err(e) = settle_batch(store, metrics, chunk).await
            && first.is_ok()
        {
            first = Err(e);
        }
    }
    first
}

async fn settle_batch(store: &Store, metrics: &Metrics, ids: &[Uuid]) -> Result<(), StoreError> {
    let groups = store.groups(ids).await?;
    let now = Utc::now();
    let mut ends = Vec::new();
    let mut moved = Vec::new();
    let mut states = Vec::with_capacity(groups.len());
    for g in &groups {
        states.push(progress(&g.members));
    }
    let mut decisions = Vec::new();
    for (g, state) in groups.iter().zip(&states) {
        if g.status != Status::Running {
            continue;
        }
        match decide(g.mode, &g.members, g.deadline, now) {
            Some(d) => decisions.push((g, d, state)),
            None => moved.push((g, state.clone())),
        }
    }
    for (g, d, state) in &decisions {
        ends.push(GroupEnd {
            group: g,
            status: d.status,
            reason: &d.reason,
            state,
        });
    }
    // The decisions first: a group's end does not wait for others' progress.
    let ended: HashSet<Uuid> = store.end_groups(&ends, now).await?.into_iter().collect();
    for e in &ends {
        if ended.contains(&e.group.id) {
            metrics.ended(e.status);
            metrics.group_ended(e.status);
            tracing::info!(group_id = %e.group.id, status = %e.status, "group decided");
        }
    }
    store.groups_progress(&moved, now).await?;
    // Another replica, or a cancel, ended these first: their end stands.
    let lost: Vec<Uuid> = ends
        .iter()
        .map(|e| e.group.id)
        .filter(|id| !ended.contains(id))
        .collect();
    let again: HashMap<Uuid, Status> = store
        .groups(&lost)
        .await?
        .into_iter()
        .map(|g| (g.id, g.status))
        .collect();
    let capped_at = chrono::Duration::from_std(CAPPED_GRACE).unwrap_or_default();
    let mut member_ends = Vec::new();
    for g in &groups {
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

/// Decides groups as their members end, until `stop`.
pub async fn run(store: Store, bus: Bus, metrics: Arc<Metrics>, stop: impl Future<Output = ()>) {
    let mut rx = bus.subscribe();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ticks: u64 = 0;
    tokio::pin!(stop);
    loop {
        let mut ended: Vec<Uuid> = Vec::new();
        let mut sweep: Option<bool> = None;
        let mut heard = |m: Result<BusMsg, RecvError>, sweep: &mut Option<bool>| match m {
            Ok(BusMsg::Notice(n)) if n.is_terminal() => {
                ended.push(n.wait_id);
                true
            }
            Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => {
                *sweep = Some(true);
                true
            }
            Ok(_) => true,
            Err(RecvError::Closed) => false,
        };
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {
                ticks += 1;
                sweep = Some(ticks % FULL_SWEEP_EVERY == 1);
            }
            m = rx.recv() => {
                if !heard(m, &mut sweep) {
                    return;
                }
            }
        }
        // Whatever else is waiting joins this round: a burst of ends is looked up at once.
        loop {
            match rx.try_recv() {
                Ok(m) => {
                    heard(Ok(m), &mut sweep);
                }
                Err(TryRecvError::Lagged(n)) => {
                    heard(Err(RecvError::Lagged(n)), &mut sweep);
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        if let Err(e) = round(&store, &metrics, &ended, sweep).await {
            tracing::warn!(error = %e, "could not decide groups; the next sweep tries again");
        }
    }
}

async fn round(
    store: &Store,
    metrics: &Metrics,
    ended: &[Uuid],
    sweep: Option<bool>,
) -> Result<(), StoreError> {
    let mut due = BTreeSet::new();
    for chunk in ended.chunks(500) {
        due.extend(store.groups_touching(chunk).await?);
    }
    if let Some(all) = sweep {
        let recent = chrono::Duration::from_std(RECENT).unwrap_or_default();
        due.extend(
            store
                .groups_to_settle(Utc::now(), all, recent, SWEEP)
                .await?,
        );
    }
    let due: Vec<Uuid> = due.into_iter().collect();
    settle_all(store, metrics, &due).await
}
