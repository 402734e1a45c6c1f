//! The retention sweep: every replica runs it, one at a time sweeps (the store
//! sees to that), deleting ended waits that have been ended longer than
//! `--retention`, in batches of [`BATCH`] waits with a pause of [`PAUSE`] between
//! them so that the sweep never holds the store for long. It never deletes a
//! running wait or a wait with a pending delivery.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use chrono::Utc;

use crate::signals::{Signal, Signals};
use crate::store::Retention;
use crate::store::retention::Swept;

/// Waits one batch deletes at most (with their events, deliveries, spec, webhooks
/// and idempotency key): one transaction of a few thousand rows.
pub const BATCH: i64 = 500;

/// The pause between two batches of one round.
pub const PAUSE: Duration = Duration::from_millis(50);

/// The least time between two vacuums of the swept tables.
pub const VACUUM_EVERY: Duration = Duration::from_secs(30);

/// The longest time between two rounds.
pub const MAX_ROUND: Duration = Duration::from_secs(60);

/// The sentence of a `404` for a wait: ended waits are deleted after a while.
pub fn no_such_wait(id: uuid::Uuid) -> String {
    format!(
        "there is no wait {id}; ended waits are kept for the server's retention \
         (--retention, 30 days unless set) and then deleted"
    )
}

/// What the sweep has done, for `/metrics`.
#[derive(Default)]
pub struct Stats {
    deleted: [AtomicU64; 6],
    /// Seconds since the oldest ended wait ended; -1 when unknown or none.
    oldest_ended_age: AtomicI64,
}

impl Stats {
    fn add(&self, swept: &Swept) {
        for (i, (_, n)) in swept.by_table().iter().enumerate() {
            self.deleted[i].fetch_add(*n, Relaxed);
        }
    }

    /// The sweep's lines of `/metrics`.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "# HELP waitd_retention_deleted_rows_total Rows the retention sweep deleted, by table.\n\
             # TYPE waitd_retention_deleted_rows_total counter"
        );
        for (i, (table, _)) in Swept::default().by_table().iter().enumerate() {
            let _ = writeln!(
                out,
                "waitd_retention_deleted_rows_total{{table=\"{table}\"}} {}",
                self.deleted[i].load(Relaxed)
            );
        }
        let age = self.oldest_ended_age.load(Relaxed);
        if age >= 0 {
            let _ = writeln!(
                out,
                "# HELP waitd_oldest_ended_wait_age_seconds Seconds since the wait that ended longest ago (and is still kept) ended.\n\
                 # TYPE waitd_oldest_ended_wait_age_seconds gauge\n\
                 waitd_oldest_ended_wait_age_seconds {age}"
            );
        }
    }
}

/// How often a round runs: a tenth of the retention, between a second and
/// [`MAX_ROUND`].
pub fn round_every(retention: Duration) -> Duration {
    (retention / 10).clamp(Duration::from_secs(1), MAX_ROUND)
}

/// Sweeps until `stopped`; nothing when `retention` is zero (keep everything).
pub async fn run(
    store: Retention,
    retention: Duration,
    stats: Arc<Stats>,
    signals: Signals,
    stopped: impl Future<Output = ()>,
) {
    stats.oldest_ended_age.store(-1, Relaxed);
    if retention.is_zero() {
        return;
    }
    let Ok(keep) = chrono::Duration::from_std(retention) else {
        return;
    };
    let mut stopped = std::pin::pin!(stopped);
    let mut tick = tokio::time::interval(round_every(retention));
    let mut unvacuumed = 0u64;
    let mut vacuumed = tokio::time::Instant::now();
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {}
        }
        let round = async {
            loop {
                match store.sweep_ended(Utc::now() - keep, BATCH).await {
                    Ok(Some(swept)) => {
                        stats.add(&swept);
                        signals.send(|| Signal::Swept { waits: swept.waits });
                        unvacuumed += swept.waits;
                        if swept.waits > 0 {
                            tracing::debug!(
                                waits = swept.waits,
                                events = swept.wait_events,
                                "retention deleted ended waits"
                            );
                        }
                        if (swept.waits as i64) < BATCH {
                            break;
                        }
                    }
                    // Another replica is sweeping.
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "the retention sweep failed; it tries again next round");
                        break;
                    }
                }
                tokio::time::sleep(PAUSE).await;
            }
            if unvacuumed > 0 && vacuumed.elapsed() >= VACUUM_EVERY {
                if let Err(e) = store.vacuum_swept().await {
                    tracing::warn!(error = %e, "vacuuming the swept tables failed");
                }
                (unvacuumed, vacuumed) = (0, tokio::time::Instant::now());
            }
            if let Ok(oldest) = store.oldest_ended().await {
                let age = oldest.map_or(-1, |t| (Utc::now() - t).num_seconds().max(0));
                stats.oldest_ended_age.store(age, Relaxed);
            }
        };
        tokio::select! {
            _ = &mut stopped => return,
            _ = round => {}
        }
    }
}

/// How often expired source events are deleted.
pub const SOURCE_EVENTS_EVERY: Duration = Duration::from_secs(10);

/// Deletes the events event sources keep once their lookback window has passed
/// (docs/design.md §2.18), until `stopped`, whatever `--retention` says: a
/// source's window is its own. Reads already leave expired events out; this
/// gives their room back.
pub async fn expire_source_events(store: crate::store::Sources, stopped: impl Future<Output = ()>) {
    let mut stopped = std::pin::pin!(stopped);
    let mut tick = tokio::time::interval(SOURCE_EVENTS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tick.tick() => {}
        }
        loop {
            match store.sweep(Utc::now(), BATCH).await {
                Ok(n) if (n as i64) < BATCH => break,
                Ok(_) => tokio::time::sleep(PAUSE).await,
                Err(e) => {
                    tracing::warn!(error = %e, "deleting expired source events failed; it tries again next round");
                    break;
                }
            }
        }
    }
}
