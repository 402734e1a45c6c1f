//! A wait as its tenant reads it: its row, its groups when it has some, and the
//! progress of it the worker on this replica holds now (design §2.3).

use std::collections::HashMap;

use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ApiResult};
use crate::bus::live::Progress;
use crate::model::Wait;

pub(super) fn no_such_wait(id: Uuid) -> ApiError {
    ApiError::not_found(crate::retention::no_such_wait(id))
}

/// One wait as its tenant reads it: its row (which says whether it is in a group)
/// and what the worker holds of it, asked for at once; its groups only when it
/// has some.
pub(super) async fn read(s: &AppState, tenant: &str, id: Uuid) -> ApiResult<Wait> {
    let ids = [id];
    let (got, live) = tokio::join!(s.store.waits().read(tenant, id), s.live.progress(&ids));
    let (mut wait, grouped) = got?.ok_or_else(|| no_such_wait(id))?;
    if grouped {
        s.store
            .groups()
            .annotate(std::slice::from_mut(&mut wait))
            .await?;
    }
    apply_live(std::slice::from_mut(&mut wait), &live);
    Ok(wait)
}

/// Gives the running waits this replica polls their progress as it is now, rather
/// than as last recorded (design §2.3).
pub(super) async fn current(s: &AppState, waits: &mut [Wait]) {
    let running: Vec<Uuid> = waits
        .iter()
        .filter(|w| w.is_running())
        .map(|w| w.id)
        .collect();
    if running.is_empty() {
        return;
    }
    let live = s.live.progress(&running).await;
    apply_live(waits, &live);
}

/// Puts the progress the worker holds (`live`) on those of `waits` still running.
fn apply_live(waits: &mut [Wait], live: &HashMap<Uuid, Progress>) {
    if live.is_empty() {
        return;
    }
    let now = chrono::Utc::now();
    for wait in waits.iter_mut().filter(|w| w.is_running()) {
        let Some(p) = live.get(&wait.id) else {
            continue;
        };
        let polls = i32::try_from(p.polls).unwrap_or(i32::MAX);
        // What the worker holds is never behind the row; should a write be on its
        // way while it answers, the row's figures stand.
        if polls < wait.polls {
            continue;
        }
        wait.polls = polls;
        wait.retries = i32::try_from(p.retries).unwrap_or(i32::MAX);
        wait.next_poll_at = Some(p.next_poll_at);
        wait.last_poll = p.last_poll;
        wait.progress_at = now;
    }
}
