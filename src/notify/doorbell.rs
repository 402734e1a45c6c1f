//! The deliveries notice: what tells the claim that the outbox may hold something
//! new, so that it need not hear every message on the bus.
//!
//! A delivery is queued in the same transaction as the event it announces, so only
//! a wait's news (or word that news may have been missed) can owe one; work to
//! poll never does. The relay hears the bus once for the whole loop and rings the
//! bell; rings that come while the claim runs are one ring.

use std::sync::Arc;

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;

use crate::bus::{Bus, BusMsg};

/// The bell: rung by the relay, heard by the claim loop.
#[derive(Clone, Debug, Default)]
pub struct Doorbell(Arc<Notify>);

impl Doorbell {
    fn ring(&self) {
        self.0.notify_one();
    }

    /// Resolves at the next ring (or at once, for one that came since the last).
    pub async fn rung(&self) {
        self.0.notified().await
    }

    /// Forgets a ring that came meanwhile: the claim about to run sees what it
    /// announced.
    pub fn hush(&self) {
        let _ = self.0.notified().now_or_never();
    }
}

/// Rings `bell` for each message of the bus that may owe a delivery, until the bus
/// closes.
pub async fn relay(bus: &Bus, bell: Doorbell) {
    let mut rx = bus.subscribe();
    loop {
        match rx.recv().await {
            Ok(BusMsg::Notice(_)) | Ok(BusMsg::Resync) | Err(RecvError::Lagged(_)) => bell.ring(),
            Ok(BusMsg::Work) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::{Notice, NoticeKind};

    #[tokio::test(start_paused = true)]
    async fn news_of_a_wait_rings_and_work_to_poll_does_not() {
        let bus = Bus::new();
        let bell = Doorbell::default();
        let relay = tokio::spawn({
            let (bus, bell) = (bus.clone(), bell.clone());
            async move { relay(&bus, bell).await }
        });
        tokio::task::yield_now().await;
        bus.publish(BusMsg::Work);
        tokio::task::yield_now().await;
        assert!(bell.rung().now_or_never().is_none(), "work rang the bell");
        bus.publish(BusMsg::Notice(Notice {
            wait_id: uuid::Uuid::now_v7(),
            seq: 2,
            gid: 7,
            kind: NoticeKind::Other,
            events: None,
        }));
        bus.publish(BusMsg::Resync);
        tokio::task::yield_now().await;
        bell.rung().await;
        bell.hush();
        assert!(bell.rung().now_or_never().is_none(), "two rings were two");
        relay.abort();
    }
}
