//! [`KeyedSlots`]: at most so many holders per key (a host, a tenant's receiver, a
//! tenant), and optionally at most so many in all.
//!
//! It serves the probes' bound per host (waiting for a place), and the webhook
//! deliverer's bounds per receiver and per tenant and the API's stream caps
//! (refused at once when full). Each place is a [`Slot`] that frees itself when
//! dropped, so a task that ends or is aborted never leaks one.
//!
//! The map holds only keys someone holds or waits for: the last [`Slot`] of a key
//! removes it (one lookup, not a sweep), so a stranger naming a million hosts one
//! after another leaves nothing behind.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Every this many drops, keys nobody holds are swept: a waiter abandoned while it
/// waited may leave its key behind.
const SWEEP_EVERY: u64 = 4096;

/// The bound, its keys' places, and the places in all. Shared behind an `Arc`.
#[derive(Debug)]
pub struct KeyedSlots<K> {
    per_key: usize,
    total: Option<(usize, Arc<Semaphore>)>,
    /// foldhash, seeded at random per map as std's hasher is, at a fraction of
    /// SipHash's cost: a lookup and a removal on every poll.
    keys: Mutex<Keys<K>>,
    dropped: AtomicU64,
}

type Keys<K> = HashMap<K, Arc<Semaphore>, foldhash::fast::RandomState>;

/// Why a place was refused, and how many were held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The key holds this many, its most.
    Key(usize),
    /// Every key together holds this many, the most in all.
    Total(usize),
}

/// A place held; frees it when dropped.
#[derive(Debug)]
pub struct Slot<K: Hash + Eq + Clone> {
    slots: Arc<KeyedSlots<K>>,
    key: K,
    permit: Option<OwnedSemaphorePermit>,
    total: Option<OwnedSemaphorePermit>,
}

impl<K: Hash + Eq + Clone> Slot<K> {
    pub fn key(&self) -> &K {
        &self.key
    }
}

impl<K: Hash + Eq + Clone> KeyedSlots<K> {
    /// At most `per_key` (at least one) places per key.
    pub fn new(per_key: usize) -> Arc<KeyedSlots<K>> {
        Self::build(per_key, None)
    }

    /// At most `per_key` places per key and `total` (at least one) in all.
    pub fn with_total(per_key: usize, total: usize) -> Arc<KeyedSlots<K>> {
        let total = total.max(1);
        Self::build(per_key, Some((total, Arc::new(Semaphore::new(total)))))
    }

    fn build(per_key: usize, total: Option<(usize, Arc<Semaphore>)>) -> Arc<KeyedSlots<K>> {
        Arc::new(KeyedSlots {
            per_key: per_key.max(1),
            total,
            keys: Mutex::default(),
            dropped: AtomicU64::new(0),
        })
    }

    pub fn per_key(&self) -> usize {
        self.per_key
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Keys<K>> {
        self.keys.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key's semaphore, made if it has none. Clones are taken only under the
    /// lock, which is what lets a drop tell that nobody else holds one.
    fn semaphore(&self, key: &K) -> Arc<Semaphore> {
        self.lock()
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_key)))
            .clone()
    }

    /// The key's semaphore, and a slot of it that holds no permit yet: dropped as
    /// it is, it only forgets the key when nobody else holds it.
    fn vacant(self: &Arc<Self>, key: K) -> (Arc<Semaphore>, Slot<K>) {
        let sem = self.semaphore(&key);
        let slot = Slot {
            slots: self.clone(),
            key,
            permit: None,
            total: None,
        };
        (sem, slot)
    }

    /// A place of `key`, now, or why not: the key's places are checked before
    /// the total.
    pub fn try_acquire(self: &Arc<Self>, key: K) -> Result<Slot<K>, Full> {
        let (sem, mut slot) = self.vacant(key);
        // Dropped on refusal, `slot` forgets the key when nobody else holds it
        // (taking a permit consumes `sem`, refused or not).
        slot.permit = Some(
            sem.try_acquire_owned()
                .map_err(|_| Full::Key(self.per_key))?,
        );
        if let Some((most, total)) = &self.total {
            slot.total = Some(
                total
                    .clone()
                    .try_acquire_owned()
                    .map_err(|_| Full::Total(*most))?,
            );
        }
        Ok(slot)
    }

    /// A place of `key`, waiting for one (and for a place in all, when there is a
    /// total) in the order asked.
    pub async fn acquire(self: &Arc<Self>, key: K) -> Slot<K> {
        let (sem, mut slot) = self.vacant(key);
        // Never closed, so the waits end with a permit.
        slot.permit = sem.acquire_owned().await.ok();
        if let Some((_, total)) = &self.total {
            slot.total = total.clone().acquire_owned().await.ok();
        }
        slot
    }

    /// Places `key` holds now.
    pub fn held(&self, key: &K) -> usize {
        self.lock()
            .get(key)
            .map_or(0, |s| self.per_key - s.available_permits())
    }

    /// Places held in all, when there is a total.
    pub fn total_held(&self) -> usize {
        self.total
            .as_ref()
            .map_or(0, |(most, s)| most - s.available_permits())
    }

    /// Keys held or waited for now.
    pub fn keys(&self) -> usize {
        self.lock().len()
    }
}

impl<K: Hash + Eq + Clone> Drop for Slot<K> {
    fn drop(&mut self) {
        drop((self.permit.take(), self.total.take()));
        let n = self.slots.dropped.fetch_add(1, Relaxed);
        let mut keys = self.slots.lock();
        // A count of one is the map's own: nobody holds the key or waits for it.
        if n % SWEEP_EVERY == SWEEP_EVERY - 1 {
            keys.retain(|_, sem| Arc::strong_count(sem) > 1);
        } else if keys
            .get(&self.key)
            .is_some_and(|sem| Arc::strong_count(sem) == 1)
        {
            keys.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_holds_at_most_its_places_and_a_dropped_slot_frees_one() {
        let s = KeyedSlots::new(2);
        let a1 = s.try_acquire("a").unwrap();
        let _a2 = s.try_acquire("a").unwrap();
        assert_eq!(s.try_acquire("a").unwrap_err(), Full::Key(2));
        let _b = s.try_acquire("b").unwrap();
        assert_eq!(s.held(&"a"), 2);
        drop(a1);
        assert_eq!(s.held(&"a"), 1);
        assert!(s.try_acquire("a").is_ok());
    }

    #[test]
    fn a_total_bounds_every_key_together_and_the_key_is_checked_first() {
        let s = KeyedSlots::with_total(2, 3);
        let _a1 = s.try_acquire("a").unwrap();
        let _a2 = s.try_acquire("a").unwrap();
        assert_eq!(s.try_acquire("a").unwrap_err(), Full::Key(2));
        let b1 = s.try_acquire("b").unwrap();
        assert_eq!(s.try_acquire("b").unwrap_err(), Full::Total(3));
        assert_eq!(s.total_held(), 3);
        drop(b1);
        assert_eq!(s.total_held(), 2);
        assert!(s.try_acquire("c").is_ok());
    }

    #[test]
    fn keys_nobody_holds_are_forgotten_even_after_a_refusal() {
        let s = KeyedSlots::with_total(1, 1);
        let a = s.try_acquire("a").unwrap();
        assert_eq!(s.try_acquire("b").unwrap_err(), Full::Total(1));
        assert_eq!(s.keys(), 1, "the refused key is not kept");
        drop(a);
        assert_eq!(s.keys(), 0);
        assert_eq!(s.per_key(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gets_the_place_a_holder_frees() {
        let s = KeyedSlots::new(1);
        let held = s.acquire("h").await;
        let waiting = {
            let s = s.clone();
            tokio::spawn(async move { s.acquire("h").await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a second place was given");
        drop(held);
        let got = waiting.await.unwrap();
        assert_eq!(*got.key(), "h");
        assert_eq!(s.held(&"h"), 1);
        drop(got);
        assert_eq!(s.keys(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_abandoned_waiter_leaves_no_key_behind_after_a_sweep() {
        let s = KeyedSlots::new(1);
        let held = s.acquire("h").await;
        let abandoned = tokio::time::timeout(std::time::Duration::from_millis(1), s.acquire("h"));
        assert!(abandoned.await.is_err());
        drop(held);
        for _ in 0..SWEEP_EVERY {
            drop(s.try_acquire("other").unwrap());
        }
        assert_eq!(s.keys(), 0);
    }
}
