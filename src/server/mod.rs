//! The HTTP/1.1 server under the API: accepts connections, bounds them, and shuts
//! down gracefully.
//!
//! `axum::serve` sets no timer, so hyper's header-read timeout never fires and a
//! client that sends half a request line, or opens a connection and says nothing,
//! holds it (and a file descriptor) forever. This loop is `axum::serve`'s, with
//! what a server facing strangers needs:
//! - a new connection's first request head must arrive within
//!   `--first-header-timeout` (5 s), and every later one within `--header-timeout`
//!   (30 s) of the previous response, so idle keep-alive connections close after it
//!   too (hyper restarts its timer for every request head);
//! - at most `max_connections` connections are open at once (kept below the
//!   process's file-descriptor limit, which [`raise_fd_limit`] lifts to its hard
//!   ceiling), and at most `per_address` from one address;
//! - a connection without a request in flight never keeps a new one out for long:
//!   when the slots are taken, the new connection takes the place of an idle one
//!   (see [`Registry::admit`](registry::Registry::admit)), and waits only while every connection
//!   has a request in flight or is under a second old. An address at its own cap
//!   takes the place of its own idle connection, or is refused with a 429;
//! - on shutdown it stops accepting, asks every connection to finish its response
//!   and close, and returns when they have. Long-lived responses (event streams,
//!   blocked requests) end themselves when the server stops.
//!
//! Request bodies are bounded in size and time by the API's body extractor.
//!
//! This file is the bounds, the accept loop and the task that serves one
//! connection. [`registry`] keeps the count of open connections and picks the
//! idle one that gives up its place; [`crowding`] answers the connections that
//! find no room and logs how many there were.

use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, oneshot, watch};
use tokio::time::Instant;
use tower::ServiceExt;

mod crowding;
mod registry;

use crowding::{Crowding, REFUSALS_AT_ONCE, refuse};
use registry::{Address, Admission, Registry};

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

/// What bounds the connections, from the settings and the open-file limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Most open at once from one [`Address`], if that is capped.
    pub per_address: Option<usize>,
    /// Time for each request head after the first, from the previous response.
    pub header_timeout: Duration,
    /// Time for the first request head, from the connection opening.
    pub first_header_timeout: Duration,
}

impl Limits {
    pub fn new(config: &crate::config::Server, fd_limit: Option<u64>) -> Limits {
        let max_connections = connection_cap(config.max_connections, fd_limit);
        let per_address = match config.max_connections_per_address {
            None => Some((max_connections / 2).max(1)),
            Some(0) => None,
            Some(n) => Some(n),
        };
        Limits {
            max_connections,
            per_address,
            header_timeout: config.header_timeout,
            first_header_timeout: config.first_header_timeout.min(config.header_timeout),
        }
    }
}

/// The registry, and a signal for the accept loop when a slot may have come free.
struct Slots {
    registry: Mutex<Registry>,
    room: Notify,
}

impl Slots {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        // A panic under the lock leaves counts that are still counts.
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One connection's place in [`Slots`], given back when the connection task ends.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    in_flight: AtomicUsize,
    served: AtomicBool,
}

impl Slot {
    fn start_request(self: &Arc<Slot>) -> InFlight {
        self.served.store(true, Relaxed);
        if self.in_flight.fetch_add(1, Relaxed) == 0 {
            self.slots.registry().request_started(self.id);
        }
        InFlight(self.clone())
    }
}

/// A request in flight: from its head's arrival until its response body is done
/// (or dropped).
struct InFlight(Arc<Slot>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Relaxed) == 1 {
            self.0
                .slots
                .registry()
                .request_ended(self.0.id, Instant::now());
            self.0.slots.room.notify_waiters();
        }
    }
}

/// The task's hold on its slot: the connection has ended when it drops.
struct Held(Arc<Slot>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.slots.registry().remove(self.0.id);
        self.0.slots.room.notify_waiters();
    }
}

/// A response body that ends its request's [`InFlight`] when hyper is done with it.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then drains.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Slots {
        registry: Mutex::new(Registry::new(limits)),
        room: Notify::new(),
    });
    let refusals = Arc::new(Semaphore::new(REFUSALS_AT_ONCE));
    // Dropping the receiver tells every connection to finish; each holds a clone of
    // `done_rx` until it closes, so `done_tx.closed()` means all have.
    let (signal_tx, signal_rx) = watch::channel(());
    tokio::spawn(async move {
        shutdown.await;
        drop(signal_rx);
    });
    let (done_tx, done_rx) = watch::channel(());
    let mut full_warned: Option<Instant> = None;
    let mut crowding = Crowding::default();
    'accepting: loop {
        let report_due = crowding.due();
        let report = tokio::time::sleep_until(report_due.unwrap_or_else(Instant::now));
        let (stream, peer) = tokio::select! {
            _ = report, if report_due.is_some() => {
                crowding.report(&limits);
                continue;
            }
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
        let address = Address::of(peer.ip());
        let (id, close) = loop {
            let room = slots.room.notified();
            let mut room = pin!(room);
            room.as_mut().enable();
            let admission = slots.registry().admit(address, Instant::now());
            match admission {
                Admission::Open { id, close, closed } => {
                    crowding.closed += u64::from(closed);
                    break (id, close);
                }
                Admission::Refused => {
                    crowding.refused += 1;
                    crowding.refused_last = Some(address);
                    crowding.report(&limits);
                    refuse(stream, &refusals);
                    continue 'accepting;
                }
                Admission::Full { ripe_at } => {
                    // Waiting for a new connection to turn a second old is part of
                    // being crowded, not of being busy.
                    if ripe_at.is_none()
                        && full_warned.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
                    {
                        tracing::warn!(
                            max_connections = limits.max_connections,
                            "every connection has a request in flight; new connections wait until one ends"
                        );
                        full_warned = Some(Instant::now());
                    }
                    let ripe = async move {
                        match ripe_at {
                            Some(t) => tokio::time::sleep_until(t).await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = room => {}
                        _ = ripe => {}
                        _ = signal_tx.closed() => break 'accepting,
                    }
                }
            }
        };
        crowding.report(&limits);
        let slot = Arc::new(Slot {
            slots: slots.clone(),
            id,
            in_flight: AtomicUsize::new(0),
            served: AtomicBool::new(false),
        });
        tokio::spawn(serve_connection(
            stream,
            peer,
            app.clone(),
            limits,
            slot,
            close,
            signal_tx.clone(),
            done_rx.clone(),
        ));
    }
    drop(listener);
    drop(done_rx);
    done_tx.closed().await;
}

#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    app: Router,
    limits: Limits,
    slot: Arc<Slot>,
    mut close: oneshot::Receiver<()>,
    signal_tx: watch::Sender<()>,
    done: watch::Receiver<()>,
) {
    let _done = done;
    let _held = Held(slot.clone());
    let _ = stream.set_nodelay(true);
    let service = {
        let slot = slot.clone();
        tower::service_fn(move |mut req: axum::http::Request<Incoming>| {
            // Who asked, for what is limited per client address.
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            let in_flight = slot.start_request();
            let app = app.clone();
            async move {
                let res = app.oneshot(req.map(Body::new)).await?;
                Ok::<_, Infallible>(res.map(|body| {
                    Body::new(Tracked {
                        body,
                        _in_flight: in_flight,
                    })
                }))
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let mut conn = pin!(builder.serve_connection(
        TokioIo::new(crate::linger::Lingering::new(stream)),
        TowerToHyperService::new(service),
    ));
    let mut stopping = pin!(signal_tx.closed());
    let mut first_head = pin!(tokio::time::sleep(limits.first_header_timeout));
    let mut awaiting_first = true;
    let mut asked = false;
    // A oneshot receiver must not be polled once it has answered.
    let mut may_be_given_up = true;
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
            given_up = &mut close, if may_be_given_up => {
                may_be_given_up = false;
                if given_up.is_err() {
                    continue;
                }
                // Given up for a new connection. Polling `conn` is what starts a
                // request, and it is not being polled here, so no request starts
                // between this check and the close.
                if slot.in_flight.load(Relaxed) == 0 {
                    tracing::debug!(%peer, "idle connection closed to make room for a new one");
                    break;
                }
                asked = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = &mut first_head, if awaiting_first => {
                awaiting_first = false;
                if !slot.served.load(Relaxed) {
                    tracing::debug!(%peer, "no request head within the first-header timeout");
                    break;
                }
            }
        }
    }
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

    #[test]
    fn the_per_address_cap_is_half_the_slots_unless_set_and_zero_lifts_it() {
        let limits = |args: &[&str]| {
            Limits::new(
                &crate::config::Config::from_args(args).unwrap().server,
                Some(1_048_576),
            )
        };
        let l = limits(&["--max-connections", "16"]);
        assert_eq!((l.max_connections, l.per_address), (16, Some(8)));
        assert_eq!(limits(&["--max-connections", "1"]).per_address, Some(1));
        let per = |n: &str| limits(&["--max-connections-per-address", n]).per_address;
        assert_eq!(per("0"), None);
        assert_eq!(per("64"), Some(64));
        // The first head's timeout is never longer than every other head's.
        let l = limits(&["--header-timeout", "2s"]);
        assert_eq!(l.first_header_timeout, Duration::from_secs(2));
        assert_eq!(limits(&[]).first_header_timeout, Duration::from_secs(5));
    }
}
