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
use http::header::{DATE, ETAG, HeaderMap, IF_MODIFIED_SINCE, IF_NONE_MATCH, LAST_MODIFIED};

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

/// Whether a `Last-Modified` can be sent back as `If-Modified-Since`: only when the
/// response's `Date` is in a later second. Both have whole seconds, so a resource
/// changed again within the second it was last modified in keeps the same
/// `Last-Modified`, and a target would answer `304` to it for ever; when the
/// response was made in a later second, any change after it has a later time.
fn settled(last_modified: &HeaderValue, date: Option<&HeaderValue>) -> bool {
    let at = |v: &HeaderValue| httpdate::parse_http_date(v.to_str().ok()?).ok();
    match (at(last_modified), date.and_then(at)) {
        (Some(modified), Some(date)) => date > modified,
        _ => false,
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
            ..
        }) if status.is_success() && body.len() <= MAX_KEPT_BODY => {
            let etag = headers.get(ETAG).cloned();
            let last_modified = headers
                .get(LAST_MODIFIED)
                .filter(|at| settled(at, headers.get(DATE)))
                .cloned();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn a_last_modified_is_sent_back_only_when_the_response_came_a_second_later() {
        let modified = v("Fri, 04 Dec 2026 14:10:49 GMT");
        assert!(settled(
            &modified,
            Some(&v("Fri, 04 Dec 2026 14:10:50 GMT"))
        ));
        // Made in the second it was modified in: a change later in that second
        // would keep this Last-Modified.
        assert!(!settled(
            &modified,
            Some(&v("Fri, 04 Dec 2026 14:10:49 GMT"))
        ));
        assert!(!settled(&modified, None));
        assert!(!settled(&modified, Some(&v("yesterday"))));
        assert!(!settled(
            &v("not a date"),
            Some(&v("Fri, 04 Dec 2026 14:10:50 GMT"))
        ));
    }
}
