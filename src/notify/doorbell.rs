//! The deliveries notice: what tells the claim that the outbox may hold something
//! new, so that it need not hear every message on the bus.
//!
//! The store sends it from where deliveries are made due: the statement that
//! inserts them (with the event they announce) or queues one again. On Postgres it
//! is a `pg_notify` on `waitd_deliveries` in that transaction, which every
//! replica's LISTEN adapter puts on its bus at the commit; on SQLite, the store's
//! own wake after the commit. Either is [`BusMsg::Deliveries`]. A wait's news and
//! work to poll never ring; word that messages may have been missed does. The
//! relay hears the bus once for the whole loop and rings the bell; rings that come
//! while the claim runs are one ring. A redelivery does not ring: it wakes the
//! claim at once.

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

/// Rings `bell` for each deliveries notice of the bus (and when notices may have
/// been missed), until the bus closes; a redelivery, one client's request rather
/// than a burst of events, wakes the claim at once (`now`).
pub async fn relay(bus: &Bus, bell: Doorbell, now: &Notify) {
    let mut rx = bus.subscribe();
    loop {
        match rx.recv().await {
            Ok(BusMsg::Deliveries { requeued: true }) => now.notify_one(),
            Ok(BusMsg::Deliveries { requeued: false })
            | Ok(BusMsg::Resync)
            | Err(RecvError::Lagged(_)) => bell.ring(),
            Ok(BusMsg::Notice(_)) | Ok(BusMsg::Work) | Ok(BusMsg::Nudge(_)) => {}
            Err(RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::{Notice, NoticeKind};

    #[tokio::test(start_paused = true)]
    async fn deliveries_ring_and_news_of_a_wait_or_work_to_poll_do_not() {
        let bus = Bus::new();
        let bell = Doorbell::default();
        let now = Arc::new(Notify::new());
        let relay = tokio::spawn({
            let (bus, bell, now) = (bus.clone(), bell.clone(), now.clone());
            async move { relay(&bus, bell, &now).await }
        });
        tokio::task::yield_now().await;
        bus.publish(BusMsg::Work);
        bus.publish(BusMsg::Notice(Notice {
            wait_id: uuid::Uuid::now_v7(),
            seq: 2,
            gid: 7,
            kind: NoticeKind::Other,
            events: None,
        }));
        tokio::task::yield_now().await;
        assert!(
            bell.rung().now_or_never().is_none(),
            "work or a wait's news rang the bell"
        );
        bus.publish(BusMsg::Deliveries { requeued: true });
        tokio::task::yield_now().await;
        assert!(
            bell.rung().now_or_never().is_none(),
            "a redelivery rang the bell rather than waking the claim at once"
        );
        now.notified().await;
        bus.publish(BusMsg::Deliveries { requeued: false });
        bus.publish(BusMsg::Resync);
        tokio::task::yield_now().await;
        bell.rung().await;
        bell.hush();
        assert!(bell.rung().now_or_never().is_none(), "two rings were two");
        relay.abort();
    }
}
