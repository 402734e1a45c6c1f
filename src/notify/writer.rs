//! The deliverer's one writer: attempts' outcomes, in batches.

use std::sync::Arc;

use chrono::Utc;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::model::DeliveryStatus;
use crate::signals::{Signal, Signals};
use crate::store::{Outbox, Outcome};

/// Outcomes written in one transaction at most.
pub const WRITE_BATCH: usize = 256;

/// Writes the outcomes `rx` brings, as many at once as have come (one statement on
/// Postgres), until every sender is gone. The loop is woken once a batch is
/// written that holds a retry, or an end with another delivery of its webhook
/// behind it: before the outcome's write commits, a claim finds the delivery still
/// leased (and its successor not yet first in line), and the next claim may be a
/// second away (the loop sleeps until the soonest retry it scheduled, or idles).
pub async fn writer(
    outbox: Outbox,
    owner: Uuid,
    mut rx: tokio::sync::mpsc::Receiver<Outcome>,
    wake: Arc<Notify>,
    signals: Signals,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        match outbox.finish(owner, Utc::now(), &batch).await {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::FutureExt;

    use super::*;
    use crate::notify::attempt::outcome;
    use crate::notify::fixtures;

    #[tokio::test]
    async fn the_loop_is_woken_when_a_delivered_outcome_puts_the_next_in_line() {
        let store = fixtures::store().await;
        let spec = fixtures::spec(&["created", "canceled"]);
        let t0 = Utc::now() - chrono::Duration::seconds(60);
        let id = store
            .waits()
            .create("a", &spec, t0, None)
            .await
            .unwrap()
            .wait
            .id;
        store
            .waits()
            .cancel("a", id, t0 + chrono::Duration::seconds(1))
            .await
            .unwrap()
            .expect("canceled");
        let owner = Uuid::now_v7();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let wake = Arc::new(Notify::new());
        let done = tokio::spawn(writer(
            store.outbox().clone(),
            owner,
            rx,
            wake.clone(),
            Signals::default(),
        ));

        // `created` is first in line; `canceled` waits behind it until its outcome
        // is written, and then the loop hears of it.
        let first = fixtures::due(&store, owner, 10).await;
        assert_eq!(first.len(), 1);
        let woken = wake.notified();
        tx.send(outcome(
            first.into_iter().next().unwrap(),
            DeliveryStatus::Delivered,
            None,
            None,
        ))
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(30), woken)
            .await
            .expect("the writer woke the loop");
        let next = fixtures::due(&store, owner, 10).await;
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].event.seq, 2);

        // The last one: nothing behind it, so no wake.
        let woken = wake.notified();
        tx.send(outcome(
            next.into_iter().next().unwrap(),
            DeliveryStatus::Delivered,
            None,
            None,
        ))
        .await
        .unwrap();
        // The writer ends once its sender is gone, after writing what it had.
        drop(tx);
        done.await.unwrap();
        assert!(woken.now_or_never().is_none(), "woken with nothing behind");
    }
}
