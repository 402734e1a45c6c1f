//! The deliverer's one writer: attempts' outcomes, in batches.

use std::sync::Arc;

use chrono::Utc;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::model::DeliveryStatus;
use crate::store::{Outcome, Store};
use crate::worker::{Signal, Signals};

/// Outcomes written in one transaction at most.
pub const WRITE_BATCH: usize = 256;

/// Writes the outcomes `rx` brings, as many at once as have come (one statement on
/// Postgres), until every sender is gone. The loop is woken once a batch is
/// written that holds a retry, or an end with another delivery of its webhook
/// behind it: before the outcome's write commits, a claim finds the delivery still
/// leased (and its successor not yet first in line), and the next claim may be a
/// second away (the loop sleeps until the soonest retry it scheduled, or idles).
pub async fn writer(
    store: Store,
    owner: Uuid,
    mut rx: tokio::sync::mpsc::Receiver<Outcome>,
    wake: Arc<Notify>,
    signals: Signals,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        match store.finish_deliveries(owner, Utc::now(), &batch).await {
            Ok(finished) => {
                let written = finished.written;
                if finished.next_in_line
                    || batch
                        .iter()
                        .zip(&written)
                        .any(|(o, ok)| *ok && o.status == DeliveryStatus::Pending)
                {
                    wake.notify_one();
                }
                for (o, ok) in batch.iter().zip(written) {
                    if ok {
                        signals.send(|| {
                            let (wait_id, delivery, status) = (o.wait_id, o.id, o.status);
                            if o.attempted {
                                Signal::Attempted {
                                    wait_id,
                                    delivery,
                                    status,
                                }
                            } else {
                                Signal::Returned {
                                    wait_id,
                                    delivery,
                                    status,
                                }
                            }
                        });
                    }
                    if !ok {
                        tracing::info!(
                            delivery = o.id,
                            "a webhook delivery's lease passed to another replica before its outcome was written"
                        );
                    }
                }
            }
            Err(e) => {
                // Their leases run out and they are taken again: at least once.
                tracing::warn!(deliveries = batch.len(), error = %e, "cannot record webhook deliveries' outcomes");
            }
        }
        batch.clear();
    }
}
