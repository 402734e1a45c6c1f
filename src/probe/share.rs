//! Shared polls: the waits of one tenant that send the identical request (method,
//! URL, every header, over the same TLS settings) read one response rather than
//! each sending its own; so do the waits that ask the same probe of a target that
//! is not an HTTP request (`tcp://`, `tls://`, `grpc://`, `dns://`: the same URL,
//! and for `tls://` the same authorities and server name).
//!
//! A wait's [`Target`](super::Target) holds its request's [`Group`], interned here
//! by the request's bytes, so every held wait of that request holds the same one.
//! The group keeps the last request begun for it (a [`Flight`]) for at most the
//! share window after it ends; a wait that falls due reads that request's response
//! when it began within the window, after the wait's own previous poll, or is still
//! in flight, and begins a new one otherwise. Everything else about a wait (its
//! schedule, conditions, retries, deadline) stays its own: only the bytes of the
//! response are shared, held once.
//!
//! It must never join two requests that differ in anything sent, nor two tenants:
//! the key is the tenant and the whole request, compared byte for byte, never a
//! hash alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::metrics::ProbeRequests;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::Observation;

/// What one request brought back, as every wait that reads it sees it.
#[derive(Debug)]
pub(super) enum Fetched {
    /// The request came to nothing (a connection, DNS or TLS error, a timeout, a
    /// refusal): the observation every reader makes.
    Failed(Observation),
    /// The target answered.
    Answered(Response),
    /// `304 Not Modified` to a conditional request: only between the exchange
    /// and the prober, which hands out the response kept instead.
    NotModified,
    /// A probe of a target that is not an HTTP request, before each wait's
    /// conditions judge it ([`super::connection`]).
    Probed(super::connection::Probed),
}

/// A response as it reaches the waits that read it: what came back, and how it
/// came to the wait that sent the request (`Sent`, or `NotModified` for a `304`).
pub(super) type Delivered = (Arc<Fetched>, crate::model::LastPoll);

/// An answer: its status, its headers and (when it was read) its body.
#[derive(Debug)]
pub(super) struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// `None`: not read (no reader of an unshared request needs it); an error: the
    /// observation a reader that needs the body makes (a body over the cap, a body
    /// that broke off).
    pub body: Option<Result<Bytes, Observation>>,
    /// From sending the request to its last byte read.
    pub elapsed: std::time::Duration,
}

/// A request begun for a group: when, and where its response arrives.
#[derive(Debug)]
struct Flight {
    began: Instant,
    rx: watch::Receiver<Option<Delivered>>,
}

/// One distinct request of one tenant, held by every held wait that sends it.
pub(crate) struct Group {
    hash: u64,
    /// The tenant and the request, length-prefixed field by field.
    bytes: Box<[u8]>,
    last: Mutex<Option<Flight>>,
    registry: Weak<Registry>,
    /// The last response, kept for a `304` (see [`super::conditional`]).
    pub kept: super::conditional::Slot,
    /// The request in flight waits for its credential's token endpoint.
    pub minting: std::sync::atomic::AtomicBool,
    /// Told whenever a wait's target lets go of the group.
    let_go: Arc<tokio::sync::Notify>,
    /// Requests in flight for the group, each holding it through a [`Sending`].
    sending: std::sync::atomic::AtomicUsize,
}

/// A request's hold on its group while it is in flight: counted, so that the
/// holds of the waits can be told from those of the requests.
pub(super) struct Sending(pub Arc<Group>);

impl Sending {
    pub fn new(group: Arc<Group>) -> Sending {
        group.sending.fetch_add(1, Relaxed);
        Sending(group)
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        // Uncounted before its hold goes (the field drops after this), so the
        // count never exceeds the requests' holds.
        self.0.sending.fetch_sub(1, Relaxed);
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The bytes hold header values: secrets.
        f.debug_struct("Group").finish_non_exhaustive()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            let mut groups = registry.groups.lock().unwrap_or_else(|p| p.into_inner());
            if groups
                .get(&self.hash)
                .is_some_and(|w| w.strong_count() == 0)
            {
                groups.remove(&self.hash);
                registry.counts.held.fetch_sub(1, Relaxed);
            }
        }
    }
}

/// What a wait that falls due does: read a response begun already, or begin one.
pub(super) enum Turn {
    /// Read the response of the request begun already.
    Join(watch::Receiver<Option<Delivered>>),
    /// Send the request: the response goes to `tx`, and every wait that joins
    /// meanwhile reads it.
    Send(watch::Sender<Option<Delivered>>, Instant),
}

/// The groups of the held waits, by the hash of their request; with the counts
/// the metrics read.
#[derive(Default)]
pub(crate) struct Registry {
    groups: Mutex<HashMap<u64, Weak<Group>>>,
    seed: foldhash::fast::RandomState,
    /// Requests sent, polls shared, distinct requests held.
    pub counts: Arc<ProbeRequests>,
}

impl Registry {
    /// The group of a request, made or found. `None` when another request has
    /// the same hash already (that wait then sends its own requests).
    pub fn group(self: &Arc<Self>, bytes: Vec<u8>) -> Option<Arc<Group>> {
        use std::hash::BuildHasher;
        let hash = self.seed.hash_one(&bytes);
        let mut groups = self.groups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = groups.get(&hash).and_then(Weak::upgrade) {
            return (*found.bytes == *bytes).then_some(found);
        }
        let group = Arc::new(Group {
            hash,
            bytes: bytes.into_boxed_slice(),
            last: Mutex::new(None),
            registry: Arc::downgrade(self),
            kept: Mutex::new(None),
            minting: Default::default(),
            let_go: Default::default(),
            sending: Default::default(),
        });
        if groups.insert(hash, Arc::downgrade(&group)).is_none() {
            self.counts.held.fetch_add(1, Relaxed);
        }
        Some(group)
    }

    /// How many distinct requests the held waits send.
    pub fn held(&self) -> usize {
        self.groups.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Group {
    /// Lets go of `group` for a wait's target, and tells a request in flight
    /// for it, which may now be the only one that holds it.
    pub fn release(group: Arc<Group>) {
        let told = group.let_go.clone();
        drop(group);
        told.notify_waiters();
    }

    /// Resolves once only requests in flight hold the group: every wait that
    /// would read the answer of one has been let go.
    pub async fn unwanted(held: &Sending) {
        let group = &held.0;
        loop {
            let told = group.let_go.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if Arc::strong_count(group) <= group.sending.load(Relaxed) {
                return;
            }
            told.await;
        }
    }

    /// The turn of a wait due `now` whose previous poll was at `previous` (or
    /// which was taken up then): join a request begun after `previous` that is
    /// still in flight or began within `window`, or send one.
    pub fn turn(&self, previous: Instant, now: Instant, window: Duration) -> Turn {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = &*last {
            let running = f.rx.borrow().is_none();
            if f.began > previous && (running || now.duration_since(f.began) <= window) {
                return Turn::Join(f.rx.clone());
            }
        }
        let (tx, rx) = watch::channel(None);
        *last = Some(Flight { began: now, rx });
        Turn::Send(tx, now)
    }

    /// Lets go of the response of the request begun at `began`, when no newer
    /// one has taken its place: a response is held at most a window after it
    /// arrives.
    pub fn forget(&self, began: Instant) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_ref().is_some_and(|f| f.began == began) {
            *last = None;
        }
    }
}

/// The key bytes of a request: the tenant, the method, the URI (or, for a pause,
/// only its host and port), the digest of its own TLS settings (none for the
/// prober's) and the headers (names in lower case, sorted), each
/// length-prefixed so that no two requests share one.
pub(super) fn key(
    tenant: &str,
    uri: &str,
    tls: Option<&crate::outbound::TlsDigest>,
    headers: &[(String, &str)],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        tenant.len()
            + uri.len()
            + 56
            + headers
                .iter()
                .map(|(n, v)| n.len() + v.len() + 8)
                .sum::<usize>(),
    );
    let mut put = |b: &[u8]| {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    put(tenant.as_bytes());
    put(b"GET");
    put(uri.as_bytes());
    put(tls.map_or(&[][..], |d| &d[..]));
    for (name, value) in headers {
        put(name.as_bytes());
        put(value.as_bytes());
    }
    out
}

/// The time a wait last polled (or was taken up), as nanoseconds after a base
/// instant: eight bytes a held wait.
#[derive(Debug)]
pub(super) struct LastPoll(AtomicU64);

fn base() -> Instant {
    // An hour back, so that a clock paused and advanced by tests stays after it.
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    })
}

impl LastPoll {
    pub fn now() -> LastPoll {
        LastPoll(AtomicU64::new(Self::nanos(Instant::now())))
    }

    fn nanos(at: Instant) -> u64 {
        at.saturating_duration_since(base()).as_nanos() as u64
    }

    /// Records a poll at `now`; the previous one.
    pub fn replace(&self, now: Instant) -> Instant {
        let before = self.0.swap(Self::nanos(now), Relaxed);
        base() + Duration::from_nanos(before)
    }
}
