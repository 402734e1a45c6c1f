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

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use uuid::Uuid;

use super::{decide, progress};
use crate::bus::{Bus, BusMsg};
use crate::model::Status;
use crate::store::groups::member_cancel_reason;
use crate::store::{Store, StoreError};

/// Groups settled at once: each holds one database connection at a time.
const SETTLING: usize = 8;
/// Groups looked at in one sweep.
const SWEEP: i64 = 1000;
/// Every this many seconds a sweep looks at every open group, not only at those
/// past their deadline.
const FULL_SWEEP_EVERY: u64 = 10;

/// Looks at one group again: decides it, or records how far it is; cancels the
/// running members of a decided group. Safe to run on several replicas at once.
pub async fn settle(store: &Store, id: Uuid) -> Result<(), StoreError> {
    let Some(g) = store.group(id).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut status = g.status;
    if status == Status::Running {
        let state = progress(&g.members);
        let Some(d) = decide(g.mode, &g.members, g.deadline, now) else {
            store.group_progress(&g, &state, now).await?;
            return Ok(());
        };
        if store
            .end_group(&g, d.status, &d.reason, &state, now)
            .await?
        {
            tracing::info!(group_id = %id, status = %d.status, "group decided");
            status = d.status;
        } else {
            // Another replica, or a cancel, ended it first: its end stands.
            match store.group(id).await? {
                Some(again) => status = again.status,
                None => return Ok(()),
            }
        }
    }
    if status.is_end() && !g.keep_running {
        let reason = member_cancel_reason(id, status);
        for m in g.members.iter().filter(|m| m.status == Status::Running) {
            store.end_member(&g.tenant, m.id, now, &reason).await?;
        }
    }
    Ok(())
}

/// Decides groups as their members end, until `stop`.
pub async fn run(store: Store, bus: Bus, stop: impl Future<Output = ()>) {
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
        if let Err(e) = round(&store, &ended, sweep).await {
            tracing::warn!(error = %e, "could not decide groups; the next sweep tries again");
        }
    }
}

async fn round(store: &Store, ended: &[Uuid], sweep: Option<bool>) -> Result<(), StoreError> {
    let mut due = BTreeSet::new();
    for chunk in ended.chunks(500) {
        due.extend(store.groups_touching(chunk).await?);
    }
    if let Some(all) = sweep {
        due.extend(store.groups_to_settle(Utc::now(), all, SWEEP).await?);
    }
    // Several at once: a burst of ends is a burst of groups, each a few statements.
    futures_util::stream::iter(due)
        .for_each_concurrent(SETTLING, |id| async move {
            if let Err(e) = settle(store, id).await {
                tracing::warn!(group_id = %id, error = %e, "could not decide a group; the next sweep tries again");
            }
        })
        .await;
    Ok(())
}
