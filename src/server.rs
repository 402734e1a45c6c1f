//! The HTTP/1.1 server under the API: accepts connections, bounds them, and shuts
//! down gracefully.
//!
//! `axum::serve` sets no timer, so hyper's header-read timeout never fires and a
//! client that sends half a request line, or opens a connection and says nothing,
//! holds it (and a file descriptor) forever. This loop is `axum::serve`'s, with
//! what a server facing strangers needs:
//! - request headers must arrive within the header timeout (`--header-timeout`, 30 s)
//!   of the connection opening or of the previous response, so idle keep-alive
//!   connections close after it too (hyper restarts the timer for every request head);
//! - at most `max_connections` connections are open at once (kept below the
//!   process's file-descriptor limit, which [`raise_fd_limit`] lifts to its hard
//!   ceiling); past it, new connections wait in the listen backlog, and a WARN line
//!   says so;
//! - on shutdown it stops accepting, asks every connection to finish its response
//!   and close, and returns when they have. Long-lived responses (event streams,
//!   blocked requests) end themselves when the server stops.
//!
//! Request bodies are bounded in size and time by the API's body extractor.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower::ServiceExt;

/// File descriptors kept free of connections: the database pool, outbound probes,
/// the SQLite file, logs.
const FD_RESERVE: u64 = 1024;

/// Raises the soft limit on open files to the hard one, where the system allows,
/// and returns the limit now in force (`None` where it cannot be read).
pub fn raise_fd_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::warn!(error = %e, "could not read or raise the open-file limit");
            None
        }
    }
}

/// The connection cap in force: the operator's, but never more than the
/// open-file limit leaves room for.
pub fn connection_cap(wanted: usize, fd_limit: Option<u64>) -> usize {
    let room = fd_limit.map_or(usize::MAX, |l| {
        l.saturating_sub(FD_RESERVE).max(64) as usize
    });
    wanted.clamp(1, room.max(1))
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn run(
    listener: TcpListener,
    app: Router,
    max_connections: usize,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let permits = Arc::new(Semaphore::new(max_connections));
    // Dropping the receiver tells every connection to finish; each holds a clone of
    // `done_rx` until it closes, so `done_tx.closed()` means all have.
    let (signal_tx, signal_rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        drop(signal_rx);
    });
    let (done_tx, done_rx) = watch::channel(());
    let mut warned_at: Option<tokio::time::Instant> = None;
    loop {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(
                        max_connections,
                        "the connection limit is reached; new connections wait until one closes"
                    );
                    warned_at = Some(tokio::time::Instant::now());
                }
                tokio::select! {
                    p = permits.clone().acquire_owned() => match p {
                        Ok(p) => p,
                        Err(_) => break,
                    },
                    _ = signal_tx.closed() => break,
                }
            }
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and the like: back off rather than spin.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = signal_tx.closed() => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let signal_tx = signal_tx.clone();
        let done_rx = done_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _done = done_rx;
            let service = TowerToHyperService::new(app.map_request(
                |req: axum::http::Request<hyper::body::Incoming>| req.map(axum::body::Body::new),
            ));
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .keep_alive(true);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(stream), service));
            let mut stopping = pin!(signal_tx.closed());
            let mut asked = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    _ = &mut stopping, if !asked => {
                        asked = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
        });
    }
    drop(listener);
    drop(done_rx);
    done_tx.closed().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_room_under_the_fd_limit() {
        assert_eq!(connection_cap(4096, Some(1_048_576)), 4096);
        assert_eq!(connection_cap(4096, Some(2048)), 1024);
        assert_eq!(connection_cap(4096, Some(100)), 64);
        assert_eq!(connection_cap(4096, None), 4096);
        assert_eq!(connection_cap(0, None), 1);
    }
}
