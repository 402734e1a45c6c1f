//! The replica's LISTEN connection: what other replicas announce on Postgres
//! (notices of new events, word of work to claim or of deliveries due, hosts that
//! asked for quiet, nudges) onto the in-process bus.
//!
//! A listener that reconnects has missed whatever was sent while it was away, so
//! it publishes [`BusMsg::Resync`] and subscribers read the table again.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::bus::HostPause;
use crate::bus::{Bus, BusMsg, Notice};
use crate::store::postgres::{
    DELIVERIES_CHANNEL, EVENTS_CHANNEL, NUDGE_CHANNEL, PAUSE_CHANNEL, WORK_CHANNEL,
};

/// Runs until `shutdown` resolves, reconnecting with a short backoff while the
/// database is away.
pub async fn run(pool: PgPool, bus: Bus, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let mut delay = Duration::from_millis(100);
    let mut first = true;
    loop {
        let connected = async {
            let mut l = PgListener::connect_with(&pool).await?;
            l.listen_all([
                EVENTS_CHANNEL,
                WORK_CHANNEL,
                DELIVERIES_CHANNEL,
                PAUSE_CHANNEL,
                NUDGE_CHANNEL,
            ])
            .await?;
            Ok::<_, sqlx::Error>(l)
        };
        let mut listener = tokio::select! {
            _ = &mut shutdown => return,
            r = connected => match r {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "event listener cannot connect; retrying");
                    tokio::select! {
                        _ = &mut shutdown => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(Duration::from_secs(5));
                    continue;
                }
            },
        };
        delay = Duration::from_millis(100);
        if !first {
            tracing::info!("event listener reconnected");
            bus.publish(BusMsg::Resync);
        }
        first = false;
        loop {
            let next = tokio::select! {
                _ = &mut shutdown => return,
                n = listener.try_recv() => n,
            };
            match next {
                Ok(Some(n)) if n.channel() == WORK_CHANNEL => bus.publish(BusMsg::Work),
                Ok(Some(n)) if n.channel() == DELIVERIES_CHANNEL => {
                    bus.publish(BusMsg::Deliveries {
                        requeued: n.payload() == "redelivered",
                    })
                }
                Ok(Some(n)) if n.channel() == PAUSE_CHANNEL => {
                    if let Some(p) = HostPause::decode(n.payload()) {
                        bus.publish_pause(p);
                    }
                }
                Ok(Some(n)) if n.channel() == NUDGE_CHANNEL => {
                    if let Ok(id) = n.payload().parse() {
                        bus.publish(BusMsg::Nudge(id));
                    }
                }
                Ok(Some(n)) => {
                    tracing::trace!(bytes = n.payload().len(), "notice received");
                    // One notice a line: a sequencer run reports many waits.
                    for notice in n.payload().lines().filter_map(Notice::decode) {
                        bus.publish(BusMsg::Notice(notice));
                    }
                }
                Ok(None) => {
                    // The connection dropped; anything sent meanwhile is lost.
                    tracing::warn!("event listener lost its connection");
                    bus.publish(BusMsg::Resync);
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "event listener failed");
                    bus.publish(BusMsg::Resync);
                    break;
                }
            }
        }
    }
}
