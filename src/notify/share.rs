//! How one replica shares its attempts: between tenants, and between each tenant's
//! receivers.
//!
//! The claim already gives each tenant its turn (see
//! [`crate::store::Outbox::claim`]): it never hands over more of a
//! tenant's deliveries than its share less what [`Share::taken`] says it holds. Here,
//! a claimed delivery is sent when its tenant has fewer than its share in flight and
//! its receiver (the tenant's webhooks at one host and port) fewer than half that;
//! otherwise it waits for a slot of that receiver, or is given back. So a receiver
//! that hangs holds half its tenant's share, and a tenant at most its share: never
//! another tenant's.
//!
//! Both bounds are [`KeyedSlots`]: an attempt carries its [`Permit`] and frees it
//! when it ends, however it ends.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::outbound::{KeyedSlots, Slot};
use crate::store::Due;

/// Most claimed deliveries waiting for a slot on one replica (each holds its lease).
const MAX_WAITING: usize = 1024;

/// Most webhook URLs remembered per receiver, for the claim to leave alone while it
/// is stalled (a receiver with more gets the rest claimed and given back).
const MAX_URLS: usize = 64;

/// A receiver with every slot taken and no attempt finished for this long (or four
/// times its usual attempt, if longer) is stalled: what waits for it is given back,
/// and nothing more waits for it, so that it holds no more of its tenant's share
/// than its slots.
const STALL: Duration = Duration::from_millis(250);

/// The receiver a webhook URL names, as the slots count them: host and port.
pub fn receiver(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or(""),
                u.port_or_known_default().unwrap_or(0)
            )
        })
        .unwrap_or_default()
}

/// A tenant's receiver: slots are keyed by both, so that two tenants' webhooks on
/// one host never share them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub tenant: String,
    pub receiver: String,
}

impl Key {
    pub fn of(due: &Due) -> Key {
        Key {
            tenant: due.tenant.clone(),
            receiver: receiver(&due.delivery.url),
        }
    }
}

/// An attempt's places: one of its receiver's and one of its tenant's. Dropped
/// when the attempt ends.
#[derive(Debug)]
pub struct Permit {
    _receiver: Slot<Key>,
    _tenant: Slot<String>,
}

/// Where a claimed delivery goes.
pub enum Admit {
    /// Sent now, holding its places.
    Send(Due, Permit),
    /// Waits for a slot of its receiver.
    Queued,
    /// Given back, due this long from now.
    PutBack(Due, Duration),
}

/// One tenant's receiver: claimed deliveries waiting for a slot, and how long its
/// attempts take. (Its attempts in flight are its places taken in
/// [`Share::receivers`].)
struct Slots {
    waiting: VecDeque<(Instant, Due)>,
    /// Recent attempts' duration, smoothed.
    took: Duration,
    /// When an attempt last finished (or the first was sent).
    progress: Instant,
    /// The webhook URLs of its deliveries seen here.
    urls: HashSet<String>,
}

impl Slots {
    fn new() -> Slots {
        Slots {
            waiting: VecDeque::new(),
            took: Duration::ZERO,
            progress: Instant::now(),
            urls: HashSet::new(),
        }
    }

    /// How long an attempt takes this receiver: the smoothed duration, or, while
    /// `flying` attempts are in flight and none finishes, at least the time since
    /// one did (a receiver that has just begun to hang shows it before any
    /// attempt ends).
    fn pace(&self, flying: usize) -> Duration {
        if flying == 0 {
            return self.took;
        }
        self.took.max(self.progress.elapsed())
    }

    fn stalled(&self, flying: usize, per_receiver: usize) -> bool {
        flying >= per_receiver && self.progress.elapsed() >= STALL.max(self.took * 4)
    }

    /// How long until it counts as stalled, while every slot is taken and
    /// deliveries wait for it.
    fn stalls_in(&self, flying: usize, per_receiver: usize) -> Option<Duration> {
        (flying >= per_receiver && !self.waiting.is_empty()).then(|| {
            STALL
                .max(self.took * 4)
                .saturating_sub(self.progress.elapsed())
        })
    }
}

/// The slots of one replica.
pub struct Share {
    per_tenant: usize,
    per_receiver: usize,
    /// Attempts in flight per tenant's receiver, at most `per_receiver`.
    receivers: Arc<KeyedSlots<Key>>,
    /// Attempts in flight per tenant, at most `per_tenant`.
    tenants: Arc<KeyedSlots<String>>,
    slots: HashMap<Key, Slots>,
    /// Deliveries waiting per tenant; a tenant is here while it holds anything.
    held: HashMap<String, usize>,
    /// Deliveries waiting, over every receiver (at most [`MAX_WAITING`]).
    waiting: usize,
}

/// Both places of `key`, or none.
fn take(
    receivers: &Arc<KeyedSlots<Key>>,
    tenants: &Arc<KeyedSlots<String>>,
    key: &Key,
) -> Option<Permit> {
    let receiver = receivers.try_acquire(key.clone()).ok()?;
    let tenant = tenants.try_acquire(key.tenant.clone()).ok()?;
    Some(Permit {
        _receiver: receiver,
        _tenant: tenant,
    })
}

impl Share {
    /// `per_tenant` attempts in flight per tenant, and half that (at least one) per
    /// receiver of a tenant.
    pub fn new(per_tenant: usize) -> Share {
        let per_tenant = per_tenant.max(1);
        let per_receiver = (per_tenant / 2).max(1);
        Share {
            per_tenant,
            per_receiver,
            receivers: KeyedSlots::new(per_receiver),
            tenants: KeyedSlots::new(per_tenant),
            slots: HashMap::new(),
            held: HashMap::new(),
            waiting: 0,
        }
    }

    pub fn per_tenant(&self) -> usize {
        self.per_tenant
    }

    /// What each tenant holds here (in flight and waiting), for the claim's turns.
    pub fn taken(&self) -> Vec<(String, i64)> {
        self.held
            .iter()
            .map(|(t, waiting)| (t.clone(), (self.tenants.held(t) + waiting) as i64))
            .collect()
    }

    /// Whether a tenant holds its whole share here: the claim left its other due
    /// deliveries in the store.
    pub fn any_at_share(&self) -> bool {
        self.held
            .iter()
            .any(|(t, waiting)| self.tenants.held(t) + waiting >= self.per_tenant)
    }

    /// The webhook URLs of each tenant's stalled receivers: the claim leaves their
    /// deliveries in the store until an attempt there finishes.
    pub fn stalled(&self) -> Vec<(String, String)> {
        self.slots
            .iter()
            .filter(|(k, s)| s.stalled(self.receivers.held(k), self.per_receiver))
            .flat_map(|(k, s)| s.urls.iter().map(|u| (k.tenant.clone(), u.clone())))
            .collect()
    }

    pub fn admit(&mut self, key: Key, d: Due) -> Admit {
        let waiting = self.held.entry(key.tenant.clone()).or_default();
        let slots = self.slots.entry(key.clone()).or_insert_with(Slots::new);
        if slots.urls.len() < MAX_URLS && !slots.urls.contains(&d.delivery.url) {
            slots.urls.insert(d.delivery.url.clone());
        }
        let flying = self.receivers.held(&key);
        if let Some(permit) = take(&self.receivers, &self.tenants, &key) {
            if flying == 0 {
                slots.progress = Instant::now();
            }
            return Admit::Send(d, permit);
        }
        // As many wait as this receiver answers in about a second (a fast one takes
        // a burst at once), and none for one that is stalled.
        let pace = slots.pace(flying);
        let per_second = if pace.is_zero() {
            1000
        } else {
            (1_000_000 / pace.as_micros().max(1)).clamp(1, 1000) as usize
        };
        if !slots.stalled(flying, self.per_receiver)
            && slots.waiting.len() < self.per_receiver * per_second
            && self.tenants.held(&key.tenant) + *waiting < self.per_tenant
            && self.waiting < MAX_WAITING
        {
            slots.waiting.push_back((Instant::now(), d));
            *waiting += 1;
            self.waiting += 1;
            return Admit::Queued;
        }
        // Back for about as long as what is ahead of it takes this receiver.
        let ahead = ((flying + slots.waiting.len()) / self.per_receiver).max(1) as u32;
        let after = (pace * ahead).clamp(Duration::from_millis(50), Duration::from_secs(600));
        self.forget(&key);
        Admit::PutBack(d, after)
    }

    /// An attempt of `key` finished after `took`, its places given back with
    /// `permit`: what goes next in its slot (one that waited past `stale` is given
    /// back instead).
    pub fn finished(
        &mut self,
        key: &Key,
        took: Duration,
        stale: Duration,
        permit: Permit,
    ) -> Vec<Admit> {
        drop(permit);
        let mut out = Vec::new();
        let Some(slots) = self.slots.get_mut(key) else {
            return out;
        };
        let waiting = self.held.entry(key.tenant.clone()).or_default();
        slots.took = (slots.took * 3 + took) / 4;
        slots.progress = Instant::now();
        while let Some((since, d)) = slots.waiting.pop_front() {
            if since.elapsed() > stale {
                *waiting -= 1;
                self.waiting -= 1;
                out.push(Admit::PutBack(d, Duration::from_secs(1)));
                continue;
            }
            // The places just given back make room, unless another attempt of
            // the tenant took them first: then it waits on.
            match take(&self.receivers, &self.tenants, key) {
                Some(permit) => {
                    *waiting -= 1;
                    self.waiting -= 1;
                    out.push(Admit::Send(d, permit));
                }
                None => slots.waiting.push_front((since, d)),
            }
            break;
        }
        self.forget(key);
        out
    }

    /// How long until a receiver with deliveries waiting for it stalls: the loop
    /// looks again then, so that what waits is given back without waiting for
    /// another wake-up.
    pub fn next_stall(&self) -> Option<Duration> {
        self.slots
            .iter()
            .filter_map(|(k, s)| s.stalls_in(self.receivers.held(k), self.per_receiver))
            .min()
    }

    /// Gives back what waits for a stalled receiver: it would hold its tenant's
    /// share, which the tenant's other receivers can use meanwhile.
    pub fn shed(&mut self) -> Vec<(Due, Duration)> {
        let mut out = Vec::new();
        for (key, slots) in &mut self.slots {
            let flying = self.receivers.held(key);
            if slots.waiting.is_empty() || !slots.stalled(flying, self.per_receiver) {
                continue;
            }
            let after = slots
                .pace(flying)
                .clamp(Duration::from_millis(50), Duration::from_secs(600));
            let waiting = self.held.entry(key.tenant.clone()).or_default();
            for (_, d) in slots.waiting.drain(..) {
                *waiting -= 1;
                self.waiting -= 1;
                out.push((d, after));
            }
        }
        out
    }

    /// Drops the entries of a receiver with nothing in flight or waiting, and of its
    /// tenant if that holds nothing either.
    fn forget(&mut self, key: &Key) {
        if self.receivers.held(key) == 0
            && self.slots.get(key).is_some_and(|s| s.waiting.is_empty())
        {
            self.slots.remove(key);
        }
        if self.tenants.held(&key.tenant) == 0
            && self.held.get(&key.tenant).is_some_and(|w| *w == 0)
        {
            self.held.remove(&key.tenant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receiver_is_its_host_and_port() {
        assert_eq!(
            receiver("https://hooks.example.com/a"),
            "hooks.example.com:443"
        );
        assert_eq!(receiver("http://127.0.0.1:9000/b?x=1"), "127.0.0.1:9000");
        assert_eq!(receiver("not a url"), "");
    }

    /// `n` due deliveries of tenant `a`, each a wait's `created` to one receiver.
    async fn due(n: usize) -> Vec<Due> {
        use crate::notify::fixtures;
        let store = fixtures::store().await;
        let spec = fixtures::spec(&["created"]);
        let t0 = chrono::Utc::now() - chrono::Duration::seconds(60);
        for _ in 0..n {
            store.waits().create("a", &spec, t0, None).await.unwrap();
        }
        fixtures::due(&store, uuid::Uuid::now_v7(), n as i64).await
    }

    #[tokio::test]
    async fn a_tenant_is_at_its_share_while_it_holds_all_of_it_in_flight_or_waiting() {
        let mut share = Share::new(2);
        let mut due = due(3).await.into_iter();
        assert!(!share.any_at_share(), "an empty share is at its share");
        let d = due.next().unwrap();
        let Admit::Send(_, first) = share.admit(Key::of(&d), d) else {
            panic!("the first was not sent");
        };
        assert!(
            !share.any_at_share(),
            "one of two places is the whole share"
        );
        // One place per receiver at a share of two: the second waits for it, and
        // the tenant now holds its whole share.
        let d = due.next().unwrap();
        let key = Key::of(&d);
        assert!(matches!(share.admit(key.clone(), d), Admit::Queued));
        assert!(
            share.any_at_share(),
            "in flight and waiting, the share is held"
        );
        // The first ends: the second goes in its place, one of two places held.
        let mut next = share.finished(
            &key,
            Duration::from_millis(5),
            Duration::from_secs(15),
            first,
        );
        assert_eq!(next.len(), 1);
        let Some(Admit::Send(_, second)) = next.pop() else {
            panic!("the waiting one was not sent");
        };
        assert!(!share.any_at_share(), "one place of two is held");
        let d = due.next().unwrap();
        assert!(matches!(share.admit(key.clone(), d), Admit::Queued));
        assert!(share.any_at_share());
        let mut next = share.finished(
            &key,
            Duration::from_millis(5),
            Duration::from_secs(15),
            second,
        );
        let Some(Admit::Send(_, third)) = next.pop() else {
            panic!("the waiting one was not sent");
        };
        share.finished(
            &key,
            Duration::from_millis(5),
            Duration::from_secs(15),
            third,
        );
        assert!(!share.any_at_share(), "nothing held, yet at its share");
    }

    #[test]
    fn half_a_share_per_receiver_and_at_least_one() {
        assert_eq!(Share::new(32).per_receiver, 16);
        assert_eq!(Share::new(1).per_receiver, 1);
        assert_eq!(Share::new(0).per_tenant(), 1);
    }
}
