//! Conditional requests: when a target gave an `ETag` or a `Last-Modified`, the
//! next request of that request sends `If-None-Match` / `If-Modified-Since`, and a
//! `304 Not Modified` is the response before it again (status, headers, body, and
//! so the same observation, decided by the memo without parsing the body).
//!
//! What is kept is bounded: only a response whose body is at most
//! [`MAX_KEPT_BODY`], and at most [`MAX_KEPT_TOTAL`] bytes of them over the
//! process; past that, requests go out unconditional, as if the target had sent
//! no validator. A hostile target therefore cannot grow memory by sending tags.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use http::HeaderValue;
use http::header::{ETAG, HeaderMap, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};

use super::share::{Fetched, Response};

/// The largest body kept for a `304`.
pub const MAX_KEPT_BODY: usize = 64 * 1024;
/// The most bytes of kept responses over the process.
pub const MAX_KEPT_TOTAL: usize = 64 * 1024 * 1024;

/// Bytes of responses kept now, over the process.
#[derive(Debug, Default)]
pub(super) struct Budget(AtomicUsize);

/// A response kept for a `304`, with its validators and its share of the budget.
#[derive(Debug)]
pub(super) struct Kept {
    pub fetched: Arc<Fetched>,
    etag: Option<HeaderValue>,
    last_modified: Option<HeaderValue>,
    cost: usize,
    budget: Arc<Budget>,
}

impl Drop for Kept {
    fn drop(&mut self) {
        self.budget.0.fetch_sub(self.cost, Relaxed);
    }
}

/// Where a request's last response is kept: a wait's own target, or its shared
/// group.
pub(super) type Slot = Mutex<Option<Arc<Kept>>>;

impl Kept {
    /// The validators of the response kept, as conditional request headers.
    pub fn condition(&self, headers: &mut HeaderMap) {
        if let Some(tag) = &self.etag {
            headers.insert(IF_NONE_MATCH, tag.clone());
        }
        if let Some(at) = &self.last_modified {
            headers.insert(IF_MODIFIED_SINCE, at.clone());
        }
    }
}

/// The response kept in `slot`, if any.
pub(super) fn kept(slot: &Slot) -> Option<Arc<Kept>> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// After a response other than a `304`: keep it when it is a 2xx with a validator
/// and a body read within the bounds, else keep nothing.
pub(super) fn remember(slot: &Slot, fetched: &Arc<Fetched>, budget: &Arc<Budget>) {
    let keep = match &**fetched {
        Fetched::Answered(Response {
            status,
            headers,
            body: Some(Ok(body)),
        }) if status.is_success() && body.len() <= MAX_KEPT_BODY => {
            let etag = headers.get(ETAG).cloned();
            let last_modified = headers.get(LAST_MODIFIED).cloned();
            let cost = body.len()
                + headers
                    .iter()
                    .map(|(n, v)| n.as_str().len() + v.len() + 32)
                    .sum::<usize>();
            let fits = (etag.is_some() || last_modified.is_some())
                && budget
                    .0
                    .fetch_update(Relaxed, Relaxed, |used| {
                        (used + cost <= MAX_KEPT_TOTAL).then_some(used + cost)
                    })
                    .is_ok();
            fits.then(|| {
                Arc::new(Kept {
                    fetched: fetched.clone(),
                    etag,
                    last_modified,
                    cost,
                    budget: budget.clone(),
                })
            })
        }
        _ => None,
    };
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = keep;
}
