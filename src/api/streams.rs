//! Caps on what a client can hold open: event streams and blocked requests each
//! keep a connection, a bus subscription and a task for as long as they last, so a
//! tenant that opens thousands could take a replica's memory and descriptors from
//! everyone else. Each one takes a [`Slot`] here first; past either cap the answer
//! is a 429 with a sentence and `Retry-After`.

use std::sync::Arc;

use axum::http::StatusCode;

use super::error::ApiError;
use crate::outbound::{Full, KeyedSlots};

/// The caps, and what is open now: places per tenant, and in all. Shared by every
/// handler.
#[derive(Debug)]
pub struct StreamLimits {
    open: Arc<KeyedSlots<String>>,
}

/// One open stream or blocked request; frees its place when dropped.
pub type Slot = crate::outbound::Slot<String>;

impl StreamLimits {
    pub fn new(per_replica: usize, per_tenant: usize) -> Arc<StreamLimits> {
        Arc::new(StreamLimits {
            open: KeyedSlots::with_total(per_tenant, per_replica),
        })
    }

    /// A place for one more stream of `tenant`, or the 429 that refuses it.
    pub fn acquire(&self, tenant: &str) -> Result<Slot, ApiError> {
        self.open.try_acquire(tenant.to_string()).map_err(|full| {
            let detail = match full {
                Full::Key(mine) => format!(
                    "this tenant already holds {mine} event streams and blocked requests open on this server, the most it allows; close some first"
                ),
                Full::Total(all) => format!(
                    "this server already holds {all} event streams and blocked requests open, the most it allows; try again shortly"
                ),
            };
            ApiError {
                retry_after: Some(5),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "Too many streams", detail)
            }
        })
    }

    /// Streams and blocked requests open now.
    pub fn open(&self) -> usize {
        self.open.total_held()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_and_the_replica_each_have_a_cap_and_a_closed_stream_frees_its_place() {
        let limits = StreamLimits::new(3, 2);
        let a1 = limits.acquire("a").unwrap();
        let _a2 = limits.acquire("a").unwrap();
        let e = limits.acquire("a").unwrap_err();
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(e.detail.contains("this tenant"), "{}", e.detail);
        let _b1 = limits.acquire("b").unwrap();
        let e = limits.acquire("b").unwrap_err();
        assert!(e.detail.contains("this server"), "{}", e.detail);
        drop(a1);
        assert_eq!(limits.open(), 2);
        let _b2 = limits.acquire("b").unwrap();
        assert_eq!(limits.open(), 3);
    }
}
