//! Writing how far open groups are (`2 of 3 succeeded`) off the path of their
//! decisions.
//!
//! A round of the watcher decides the groups it can and hands the progress of
//! the others to one writer task, which writes the newest state of each group in
//! batches, one batch at a time (so a group's state never goes back), while the
//! next round decides. A progress write is conditional on the group still
//! running, so one that lands after the group's end changes nothing; one that
//! fails is written again by the next sweep, which finds the state differs.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::store::Groups;
use crate::store::groups::Group;

/// Groups whose progress one write carries. The write holds their rows until it
/// commits, and a group's end waits for it: small writes keep that wait short.
const BATCH: usize = 64;

/// The progress waiting to be written: for each group, the group as it was read
/// when it was first queued (its stored state is the event's `from`) and its
/// newest state.
#[derive(Clone, Default)]
pub struct Queue {
    pending: Arc<Mutex<HashMap<Uuid, (Group, String)>>>,
    wake: Arc<Notify>,
}

impl Queue {
    /// Queues the newest state of each group; the writer takes it soon.
    pub fn push(&self, moved: impl IntoIterator<Item = (Group, String)>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mut any = false;
        for (g, state) in moved {
            any = true;
            match pending.get_mut(&g.id) {
                // Not written yet: the stored state is still the one first read.
                Some(queued) => queued.1 = state,
                None => {
                    pending.insert(g.id, (g, state));
                }
            }
        }
        drop(pending);
        if any {
            self.wake.notify_one();
        }
    }

    /// Drops what is queued for groups just decided: their end makes it moot,
    /// and a progress write would only hold their rows while the end waits.
    pub fn forget(&self, decided: impl IntoIterator<Item = Uuid>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for id in decided {
            pending.remove(&id);
        }
    }

    fn take(&self) -> Vec<(Group, String)> {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        pending.drain().map(|(_, v)| v).collect()
    }

    /// Writes what is queued, one batch at a time, for as long as it runs.
    pub async fn write(self, store: Groups) {
        loop {
            self.wake.notified().await;
            loop {
                let batch = self.take();
                if batch.is_empty() {
                    break;
                }
                for chunk in batch.chunks(BATCH) {
                    let writes: Vec<(&Group, String)> =
                        chunk.iter().map(|(g, s)| (g, s.clone())).collect();
                    if let Err(e) = store.progress_many(&writes, Utc::now()).await {
                        tracing::warn!(error = %e, groups = writes.len(), "could not record groups' progress; the next sweep tries again");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{GroupMode, Status};

    fn group(id: Uuid) -> Group {
        Group {
            id,
            tenant: "t".into(),
            mode: GroupMode::All,
            keep_running: false,
            status: Status::Running,
            deadline: Utc::now(),
            state: None,
            members: vec![],
        }
    }

    #[test]
    fn the_newest_state_is_kept_and_a_decided_group_is_dropped() {
        let q = Queue::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        q.push([(group(a), "1 of 3 succeeded".into())]);
        q.push([
            (group(a), "2 of 3 succeeded".into()),
            (group(b), "1 of 2 succeeded".into()),
        ]);
        q.forget([b]);
        let taken: Vec<(Uuid, String)> = q.take().into_iter().map(|(g, s)| (g.id, s)).collect();
        assert_eq!(taken, vec![(a, "2 of 3 succeeded".to_string())]);
        assert!(q.take().is_empty());
    }
}
