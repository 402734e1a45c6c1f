//! Heartbeats of callback waits (docs/design.md §2.15): every replica looks, four
//! times a second, for running callback waits whose `callback.heartbeat` went by
//! without a beat or a completion, and ends each `failed` with a sentence saying
//! so. The end is conditional (docs/store.md §5.3), so replicas that find the same
//! silence at once, or a completion racing it, end the wait once.
//!
//! The deadline is the worker's, as for every wait: it holds a callback wait like
//! any other, and its one "poll", at the deadline, ends it `timed_out`.

use std::future::Future;
use std::time::Duration;

use chrono::Utc;

use crate::engine::duration;
use crate::model::Status;
use crate::store::{CallbackEnd, Callbacks, StoreError};

/// How often a replica looks for silent callback waits.
pub const EVERY: Duration = Duration::from_millis(250);
/// The most silent waits one look ends.
const BATCH: i64 = 256;

/// Why a silent callback wait ended.
pub fn silence_reason(heartbeat: Duration) -> String {
    format!(
        "no heartbeat or completion came to the callback URL for {} (the wait's callback.heartbeat)",
        duration::format(heartbeat)
    )
}

/// Ends the callback waits that fell silent, until `stopped`.
pub async fn run(store: Callbacks, stopped: impl Future<Output = ()>) {
    let mut stopped = std::pin::pin!(stopped);
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = end_silent(&store).await {
            tracing::warn!(error = %e, "could not end silent callback waits");
        }
    }
}

/// One look: ends the waits silent now; how many this replica ended.
pub async fn end_silent(store: &Callbacks) -> Result<usize, StoreError> {
    let now = Utc::now();
    let mut ended = 0;
    for cb in store.silent(now, BATCH).await? {
        let Some(heartbeat) = cb.heartbeat else {
            continue;
        };
        let end = CallbackEnd {
            status: Status::Failed,
            reason: silence_reason(heartbeat),
            error_detail: None,
            output: None,
        };
        if store.end(&cb.tenant, cb.wait_id, &end, now).await? {
            ended += 1;
        }
    }
    Ok(ended)
}
