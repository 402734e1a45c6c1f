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
//!   (see [`Registry::admit`] and [`Idle`]), and waits only while every connection
//!   has a request in flight or is under a second old. An address at its own cap
//!   takes the place of its own idle connection, or is refused with a 429;
//! - on shutdown it stops accepting, asks every connection to finish its response
//!   and close, and returns when they have. Long-lived responses (event streams,
//!   blocked requests) end themselves when the server stops.
//!
//! Request bodies are bounded in size and time by the API's body extractor.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
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
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore, oneshot, watch};
use tokio::time::Instant;
use tower::ServiceExt;

/// File descriptors kept free of connections: the database pool, outbound probes,
/// the SQLite file, logs.
const FD_RESERVE: u64 = 1024;

/// How long a new connection is safe from being closed to make room for another:
/// time for its first request head to arrive, which a client sends as soon as it
/// has connected. Without it, a flood of connections could close each newcomer
/// before it had said anything.
const FRESH_GRACE: Duration = Duration::from_secs(1);

/// Refused connections kept open at once until their clients close; past it, a
/// refused connection is closed as soon as its answer is written, so a flood of
/// them costs no more file descriptors than this.
const REFUSALS_AT_ONCE: usize = 32;

/// How long a refused client has to read its answer and close.
const REFUSAL_TIME: Duration = Duration::from_secs(1);

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

/// Whom the per-address cap counts as one client: an IPv4 address, or an IPv6 /64,
/// the least a network is given, within which one host can change its address at
/// will.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Address {
    V4(Ipv4Addr),
    V6(u64),
}

impl Address {
    fn of(ip: IpAddr) -> Address {
        match ip.to_canonical() {
            IpAddr::V4(a) => Address::V4(a),
            IpAddr::V6(a) => Address::V6((u128::from(a) >> 64) as u64),
        }
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Address::V4(a) => write!(f, "{a}"),
            Address::V6(p) => write!(f, "{}/64", Ipv6Addr::from(u128::from(*p) << 64)),
        }
    }
}

/// Connections without a request in flight, in the order they are given up: the
/// ones that have not sent a request yet (oldest first, once past their grace),
/// then the others by how long they have been idle.
#[derive(Default)]
struct Idle {
    fresh: BTreeSet<(Instant, u64)>,
    served: BTreeSet<(Instant, u64)>,
}

impl Idle {
    fn of(&mut self, served: bool) -> &mut BTreeSet<(Instant, u64)> {
        if served {
            &mut self.served
        } else {
            &mut self.fresh
        }
    }

    fn victim(&self, now: Instant) -> Option<u64> {
        match self.fresh.first() {
            Some(&(since, id)) if now >= since + FRESH_GRACE => Some(id),
            _ => self.served.first().map(|&(_, id)| id),
        }
    }

    /// When the oldest fresh connection becomes one to give up.
    fn ripe_at(&self) -> Option<Instant> {
        self.fresh.first().map(|&(since, _)| since + FRESH_GRACE)
    }

    fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.served.is_empty()
    }
}

struct Entry {
    address: Address,
    served: bool,
    busy: bool,
    idle_since: Instant,
    close: oneshot::Sender<()>,
}

#[derive(Default)]
struct Peer {
    open: usize,
    idle: Idle,
}

/// Every open connection, whether it has a request in flight, and since when it
/// has not.
struct Registry {
    limits: Limits,
    next_id: u64,
    open: HashMap<u64, Entry>,
    idle: Idle,
    peers: HashMap<Address, Peer>,
}

enum Admission {
    /// Room was made: `id` is the new connection's, and `closed` tells whether an
    /// idle one was given up for it.
    Open {
        id: u64,
        close: oneshot::Receiver<()>,
        closed: bool,
    },
    /// Its address is at its cap, and each of its connections has a request in
    /// flight or is too new to give up.
    Refused,
    /// Every connection has a request in flight or is too new to give up; the
    /// oldest of those becomes one to give up at `ripe_at`.
    Full { ripe_at: Option<Instant> },
}

impl Registry {
    fn new(limits: Limits) -> Registry {
        Registry {
            limits,
            next_id: 0,
            open: HashMap::new(),
            idle: Idle::default(),
            peers: HashMap::new(),
        }
    }

    /// Finds a connection from `address` a place, closing another to make it when
    /// the slots are taken. An address at its own cap gives up its own idle
    /// connection, never another address's; otherwise the one given up is the
    /// first in [`Idle`]'s order. So a connection is kept out only by connections
    /// with a request in flight (or under a second old): idle ones, whoever holds
    /// them and however many, cannot.
    fn admit(&mut self, address: Address, now: Instant) -> Admission {
        let own = self.peers.get(&address);
        let mut closed = false;
        let at_cap = self
            .limits
            .per_address
            .is_some_and(|cap| own.map_or(0, |p| p.open) >= cap);
        if at_cap {
            let Some(victim) = own.and_then(|p| p.idle.victim(now)) else {
                return Admission::Refused;
            };
            self.give_up(victim);
            closed = true;
        } else if self.open.len() >= self.limits.max_connections {
            let Some(victim) = self.idle.victim(now) else {
                return Admission::Full {
                    ripe_at: self.idle.ripe_at(),
                };
            };
            self.give_up(victim);
            closed = true;
        }
        let id = self.next_id;
        self.next_id += 1;
        let (close_tx, close) = oneshot::channel();
        self.open.insert(
            id,
            Entry {
                address,
                served: false,
                busy: false,
                idle_since: now,
                close: close_tx,
            },
        );
        self.idle.fresh.insert((now, id));
        let peer = self.peers.entry(address).or_default();
        peer.open += 1;
        peer.idle.fresh.insert((now, id));
        Admission::Open { id, close, closed }
    }

    /// Takes `id` off the idle lists (it is busy, or gone).
    fn unlist(&mut self, id: u64) {
        let Some(e) = self.open.get(&id) else { return };
        if e.busy {
            return;
        }
        let key = (e.idle_since, id);
        self.idle.of(e.served).remove(&key);
        if let Some(p) = self.peers.get_mut(&e.address) {
            p.idle.of(e.served).remove(&key);
        }
    }

    fn remove(&mut self, id: u64) -> Option<Entry> {
        self.unlist(id);
        let e = self.open.remove(&id)?;
        if let Some(p) = self.peers.get_mut(&e.address) {
            p.open -= 1;
            if p.open == 0 && p.idle.is_empty() {
                self.peers.remove(&e.address);
            }
        }
        Some(e)
    }

    fn give_up(&mut self, id: u64) {
        if let Some(e) = self.remove(id) {
            let _ = e.close.send(());
        }
    }

    fn request_started(&mut self, id: u64) {
        self.unlist(id);
        if let Some(e) = self.open.get_mut(&id) {
            e.busy = true;
            e.served = true;
        }
    }

    fn request_ended(&mut self, id: u64, now: Instant) {
        let Some(e) = self.open.get_mut(&id) else {
            return;
        };
        e.busy = false;
        e.idle_since = now;
        let (address, key) = (e.address, (now, id));
        self.idle.served.insert(key);
        if let Some(p) = self.peers.get_mut(&address) {
            p.idle.served.insert(key);
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

/// Answers a connection from an address at its cap with a 429 and closes it.
/// The answer goes out before the request is read (HTTP/1.1 lets a server answer
/// early). A socket closed with unread data resets the connection, and the client
/// may then never read the answer: so what the client has sent is read first, and,
/// while fewer than [`REFUSALS_AT_ONCE`] are, until the client closes.
fn refuse(stream: TcpStream, refusals: &Arc<Semaphore>) {
    use std::io::{Read, Write};
    let Ok(mut stream) = stream.into_std() else {
        return;
    };
    let body = concat!(
        r#"{"type":"/problems/too-many-connections","title":"Too many connections","#,
        r#""status":429,"detail":"this address has as many connections open as waitd allows one address; "#,
        r#"reuse an open connection, or close one and try again"}"#
    );
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/problem+json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    // The socket is non-blocking: these read what has arrived and write what fits,
    // which on a new connection is all of the answer.
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        if !matches!(stream.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = stream.write(answer.as_bytes());
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let Ok(mut stream) = TcpStream::from_std(stream) else {
            return;
        };
        let _ = tokio::time::timeout(REFUSAL_TIME, async {
            while stream.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

/// Counts of connections closed or refused to make room, logged at most every
/// 10 s so that a flood of them is one line, not one each.
#[derive(Default)]
struct Crowding {
    closed: u64,
    refused: u64,
    refused_last: Option<Address>,
    logged: Option<Instant>,
}

impl Crowding {
    /// When the counts not yet logged are due to be, if there are any.
    fn due(&self) -> Option<Instant> {
        (self.closed + self.refused > 0).then(|| {
            self.logged
                .map_or_else(Instant::now, |t| t + Duration::from_secs(10))
        })
    }

    fn report(&mut self, limits: &Limits) {
        if self.due().is_none_or(|t| t > Instant::now()) {
            return;
        }
        tracing::warn!(
            max_connections = limits.max_connections,
            per_address = limits.per_address.unwrap_or(0),
            closed_idle = self.closed,
            refused = self.refused,
            refused_last = %self.refused_last.map_or_else(String::new, |a| a.to_string()),
            "connections are crowding in: idle ones were closed to make room for new ones, \
             and new ones from an address at its cap with none idle were refused"
        );
        *self = Crowding {
            logged: Some(Instant::now()),
            ..Crowding::default()
        };
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

    fn registry(max_connections: usize, per_address: Option<usize>) -> Registry {
        Registry::new(Limits {
            max_connections,
            per_address,
            header_timeout: Duration::from_secs(30),
            first_header_timeout: Duration::from_secs(5),
        })
    }

    fn ip(s: &str) -> Address {
        Address::of(s.parse().unwrap())
    }

    /// Admits a connection that must get in; its id and its close signal.
    fn open(r: &mut Registry, from: &str, at: Instant) -> (u64, oneshot::Receiver<()>) {
        match r.admit(ip(from), at) {
            Admission::Open { id, close, .. } => (id, close),
            Admission::Refused => panic!("refused"),
            Admission::Full { .. } => panic!("full"),
        }
    }

    fn was_closed(close: &mut oneshot::Receiver<()>) -> bool {
        close.try_recv().is_ok()
    }

    #[test]
    fn a_new_connection_takes_the_place_of_an_idle_one_once_that_one_is_a_second_old() {
        let t0 = Instant::now();
        let mut r = registry(2, None);
        let (_, mut a) = open(&mut r, "10.0.0.1", t0);
        let (_, mut b) = open(&mut r, "10.0.0.1", t0 + Duration::from_millis(10));
        match r.admit(ip("10.0.0.2"), t0 + Duration::from_millis(500)) {
            Admission::Full { ripe_at } => assert_eq!(ripe_at, Some(t0 + FRESH_GRACE)),
            _ => panic!("a connection under a second old was given up"),
        }
        let (_, _c) = open(&mut r, "10.0.0.2", t0 + FRESH_GRACE);
        assert!(was_closed(&mut a), "the oldest is given up");
        assert!(!was_closed(&mut b));
        assert_eq!(r.open.len(), 2);
    }

    #[test]
    fn connections_with_a_request_in_flight_are_never_given_up_and_silent_ones_go_first() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let mut r = registry(3, None);
        let (busy, mut busy_close) = open(&mut r, "10.0.0.1", t0);
        let (kept, mut kept_close) = open(&mut r, "10.0.0.1", t0);
        let (_, mut silent_close) = open(&mut r, "10.0.0.1", t0 + Duration::from_secs(5));
        r.request_started(busy);
        r.request_started(kept);
        r.request_ended(kept, t0 + Duration::from_secs(1));
        // The silent one is newer than the kept one has been idle, yet goes first.
        let (d, _) = open(&mut r, "10.0.0.2", later);
        assert!(was_closed(&mut silent_close));
        let (e, _) = open(&mut r, "10.0.0.2", later);
        assert!(was_closed(&mut kept_close));
        match r.admit(ip("10.0.0.3"), later + Duration::from_millis(500)) {
            Admission::Full { ripe_at } => assert_eq!(ripe_at, Some(later + FRESH_GRACE)),
            _ => panic!("a connection under a second old was given up"),
        }
        r.request_started(d);
        r.request_started(e);
        assert!(matches!(
            r.admit(ip("10.0.0.3"), later + Duration::from_secs(60)),
            Admission::Full { ripe_at: None }
        ));
        // A connection that ends makes room without closing another.
        r.remove(d);
        match r.admit(ip("10.0.0.3"), later + Duration::from_secs(60)) {
            Admission::Open { closed, .. } => assert!(!closed),
            _ => panic!("no room after a connection ended"),
        }
        assert!(!was_closed(&mut busy_close));
    }

    #[test]
    fn an_address_at_its_cap_gives_up_its_own_idle_connection_or_is_refused() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let mut r = registry(10, Some(2));
        let (x1, mut x1_close) = open(&mut r, "10.0.0.1", t0);
        let (_, mut x2_close) = open(&mut r, "10.0.0.1", t0 + Duration::from_millis(1));
        let (_, mut y_close) = open(&mut r, "10.0.0.2", t0);
        // Both of its own too new to give up: refused, however much room is left.
        assert!(matches!(
            r.admit(ip("10.0.0.1"), t0 + Duration::from_millis(2)),
            Admission::Refused
        ));
        // Later, its own oldest idle one is given up, never another address's.
        r.request_started(x1);
        open(&mut r, "10.0.0.1", later);
        assert!(was_closed(&mut x2_close));
        assert!(!was_closed(&mut x1_close));
        assert!(!was_closed(&mut y_close));
        assert_eq!(r.peers[&ip("10.0.0.1")].open, 2);
        // IPv6 addresses in one /64 are one address; IPv4-mapped ones are IPv4.
        assert_eq!(ip("2001:db8::1"), ip("2001:db8::ffff:1"));
        assert_ne!(ip("2001:db8::1"), ip("2001:db8:0:1::1"));
        assert_eq!(ip("::ffff:10.0.0.1"), ip("10.0.0.1"));
        assert_eq!(ip("2001:db8::1").to_string(), "2001:db8::/64");
    }

    #[test]
    fn a_connection_that_ends_leaves_no_trace() {
        let t0 = Instant::now();
        let mut r = registry(4, Some(2));
        let (a, _a) = open(&mut r, "10.0.0.1", t0);
        let (b, _b) = open(&mut r, "10.0.0.1", t0);
        r.request_started(a);
        r.request_ended(a, t0 + Duration::from_secs(1));
        r.request_started(b);
        r.remove(a);
        r.remove(b);
        // Marks for a connection already gone change nothing.
        r.request_started(a);
        r.request_ended(a, t0 + Duration::from_secs(2));
        assert!(r.open.is_empty() && r.idle.is_empty() && r.peers.is_empty());
    }
}
