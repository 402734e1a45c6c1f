//! The Postgres sequencer: one task per replica that gives committed events their
//! global cursor and announces them ([`PgDialect::sequence`]).
//!
//! Writers do not wait for it: the store wakes it after a commit, and the next run
//! numbers every event committed before the wake. It also runs once a second, so
//! events whose writer died between its commit and the wake are numbered all the
//! same. A run that fails loses nothing: the events stay committed, unnumbered,
//! until the next.

use std::future::Future;
use std::time::Duration;

use crate::store::PgDialect;

/// How often the sequencer runs without being woken.
const SWEEP: Duration = Duration::from_secs(1);

pub async fn run(pg: PgDialect, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let wake = pg.committed();
    loop {
        match pg.sequence().await {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "sequencing events failed; the next run picks them up");
                tokio::select! {
                    _ = &mut shutdown => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => return,
            _ = wake.notified() => {}
            _ = tokio::time::sleep(SWEEP) => {}
        }
    }
}
