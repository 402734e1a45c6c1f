//! Caps on what a client can hold open: event streams and blocked requests each
//! keep a connection, a bus subscription and a task for as long as they last, so a
//! tenant that opens thousands could take a replica's memory and descriptors from
//! everyone else. Each one takes a [`Slot`] here first; past either cap the answer
//! is a 429 with a sentence and `Retry-After`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;

use super::error::ApiError;

/// The caps, and what is open now. Shared by every handler.
#[derive(Debug)]
pub struct StreamLimits {
    per_replica: usize,
    per_tenant: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_tenant: HashMap<String, usize>,
}

/// One open stream or blocked request; frees its place when dropped.
#[derive(Debug)]
pub struct Slot {
    limits: Arc<StreamLimits>,
    tenant: String,
}

impl StreamLimits {
    pub fn new(per_replica: usize, per_tenant: usize) -> Arc<StreamLimits> {
        Arc::new(StreamLimits {
            per_replica: per_replica.max(1),
            per_tenant: per_tenant.max(1),
            open: Mutex::default(),
        })
    }

    /// A place for one more stream of `tenant`, or the 429 that refuses it.
    pub fn acquire(self: &Arc<Self>, tenant: &str) -> Result<Slot, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mine = open.by_tenant.get(tenant).copied().unwrap_or(0);
        let refuse = |detail: String| ApiError {
            retry_after: Some(5),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "Too many streams", detail)
        };
        if mine >= self.per_tenant {
            return Err(refuse(format!(
                "this tenant already holds {mine} event streams and blocked requests open on this server, the most it allows; close some first"
            )));
        }
        if open.total >= self.per_replica {
            return Err(refuse(format!(
                "this server already holds {} event streams and blocked requests open, the most it allows; try again shortly",
                open.total
            )));
        }
        open.total += 1;
        *open.by_tenant.entry(tenant.to_string()).or_default() += 1;
        Ok(Slot {
            limits: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    /// Streams and blocked requests open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_tenant.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                open.by_tenant.remove(&self.tenant);
            }
        }
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
