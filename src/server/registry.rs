//! Which connections are open, which of them have a request in flight, and which
//! one gives up its place when a new connection finds the slots taken (see
//! [`Registry::admit`] and [`Idle`]). Counts and lists only: the connection tasks
//! mark their requests in it, and the accept loop asks it for room.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Limits;

/// How long a new connection is safe from being closed to make room for another:
/// time for its first request head to arrive, which a client sends as soon as it
/// has connected. Without it, a flood of connections could close each newcomer
/// before it had said anything.
const FRESH_GRACE: Duration = Duration::from_secs(1);

/// Whom the per-address cap counts as one client: an IPv4 address, or an IPv6 /64,
/// the least a network is given, within which one host can change its address at
/// will.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Address {
    V4(Ipv4Addr),
    V6(u64),
}

impl Address {
    pub(super) fn of(ip: IpAddr) -> Address {
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

pub(super) struct Entry {
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
pub(super) struct Registry {
    limits: Limits,
    next_id: u64,
    open: HashMap<u64, Entry>,
    idle: Idle,
    peers: HashMap<Address, Peer>,
}

pub(super) enum Admission {
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
    pub(super) fn new(limits: Limits) -> Registry {
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
    pub(super) fn admit(&mut self, address: Address, now: Instant) -> Admission {
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

    pub(super) fn remove(&mut self, id: u64) -> Option<Entry> {
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

    pub(super) fn request_started(&mut self, id: u64) {
        self.unlist(id);
        if let Some(e) = self.open.get_mut(&id) {
            e.busy = true;
            e.served = true;
        }
    }

    pub(super) fn request_ended(&mut self, id: u64, now: Instant) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
