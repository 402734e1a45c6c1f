//! Per tenant, its running waits as last counted: what spares a create far under
//! the tenant's limit from counting them again.

use std::time::{Duration, Instant};

/// A tenant's running count as last read, when, and whether a create is reading it
/// again now.
#[derive(Debug)]
struct Counted {
    n: i64,
    at: Instant,
    recounting: bool,
}

/// A tenant's running count, once read, spares the next creates from counting for
/// this long while it is more than [`CACHED_MARGIN`] under the limit: overshooting
/// would take that many creates, across all replicas, within this window. Once it is
/// older, one create counts again while the others go on with it for up to as long
/// again, rather than all counting at once.
const COUNT_FRESH: Duration = Duration::from_millis(250);
const CACHED_MARGIN: i64 = 1024;

/// Per tenant, the running count as last read ([`COUNT_FRESH`], [`CACHED_MARGIN`]).
#[derive(Debug, Default)]
pub(in crate::store) struct TenantCounts(std::collections::HashMap<String, Counted>);

impl TenantCounts {
    /// True when the tenant was counted lately and far enough under `max` that no
    /// count is needed now. A stale count is read again by one create (the caller
    /// answered false first), while the others go on with it a little longer.
    pub(super) fn far_under(&mut self, tenant: &str, max: i64, now: Instant) -> bool {
        let Some(c) = self.0.get_mut(tenant).filter(|c| c.n + CACHED_MARGIN < max) else {
            return false;
        };
        let age = now.saturating_duration_since(c.at);
        if age < COUNT_FRESH || (c.recounting && age < 2 * COUNT_FRESH) {
            return true;
        }
        c.recounting = true;
        false
    }

    pub(super) fn counted(&mut self, tenant: &str, n: i64, now: Instant) {
        if self.0.len() > 10_000 {
            self.0
                .retain(|_, c| now.saturating_duration_since(c.at) < 2 * COUNT_FRESH);
        }
        self.0.insert(
            tenant.to_string(),
            Counted {
                n,
                at: now,
                recounting: false,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_tenant_count_is_read_again_by_one_create_while_the_others_go_on() {
        let t0 = Instant::now();
        let mut c = TenantCounts::default();
        assert!(!c.far_under("t", 10_000, t0), "never counted: count");
        c.counted("t", 100, t0);
        assert!(c.far_under("t", 10_000, t0 + COUNT_FRESH / 2));
        // Near the limit, every create counts, fresh or not.
        assert!(!c.far_under("t", 100 + CACHED_MARGIN, t0));
        let stale = t0 + COUNT_FRESH;
        assert!(
            !c.far_under("t", 10_000, stale),
            "the first to see it stale counts"
        );
        assert!(
            c.far_under("t", 10_000, stale),
            "the others go on meanwhile"
        );
        assert!(c.far_under("t", 10_000, t0 + COUNT_FRESH * 3 / 2));
        // The recount never came back (it failed): after twice the window, another
        // create counts.
        assert!(!c.far_under("t", 10_000, t0 + 2 * COUNT_FRESH));
        c.counted("t", 200, t0 + 2 * COUNT_FRESH);
        assert!(c.far_under("t", 10_000, t0 + 2 * COUNT_FRESH));
        assert!(!c.far_under("other", 10_000, t0), "tenants apart");
    }
}
