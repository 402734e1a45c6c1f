//! `--host-rate`: at most so many requests a second to one host ("host:port")
//! across the replicas, each replica taking its share of the replicas alive, and
//! the turns shared fairly between whose requests they are.
//!
//! Requests to a host are spaced evenly, one interval (replicas ÷ rate) apart,
//! and wait for their turn without holding a place in the per-host concurrency
//! limit. A moment gone by is not owed, so there are no bursts. When requests
//! wait, the turns go round: to each tenant with a request waiting in turn, and
//! within a tenant to each of its credentials (each [`Key`]) in turn, first
//! come first served only among the requests of one key. So a tenant with one
//! wait on a host gets its turn beside one with forty. Waiting never keeps a wait
//! past its deadline: the worker cuts a probe at the deadline, and a request
//! whose wait is gone gives its turn to the next.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// Whose requests they are within a tenant: a digest of what they carry (their
/// headers, credential and TLS settings).
pub type Key = [u8; 32];

/// The most hosts whose next moment is kept; past it, those idle are let go.
const MAX_HOSTS: usize = 10_000;

/// The longest time between two requests to one host.
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// The least rate that is not none: one request to a host in about 17 minutes.
pub const MIN_RATE: f64 = 0.001;

/// The turns of each host.
#[derive(Debug)]
pub struct HostRate {
    /// Requests a second to one host, across the replicas.
    rate: f64,
    replicas: AtomicU32,
    hosts: Mutex<HashMap<Arc<str>, Host>>,
}

/// One host's next free moment, and the requests waiting for a turn.
#[derive(Debug)]
struct Host {
    next: Instant,
    /// The tenants with requests waiting, in the order their turns come.
    tenants: VecDeque<Waiting>,
    /// A task hands out the turns while requests wait.
    serving: bool,
}

/// A tenant's requests waiting for a host's turns: per key, in the order their
/// turns come, each key's requests in the order they came.
#[derive(Debug)]
struct Waiting {
    tenant: Arc<str>,
    keys: VecDeque<(Key, VecDeque<oneshot::Sender<()>>)>,
}

impl Host {
    /// Hands the next turn to the next request still waiting for it, in turn:
    /// whether one took it.
    fn hand_out(&mut self) -> bool {
        while let Some(mut waiting) = self.tenants.pop_front() {
            let mut given = false;
            if let Some((key, mut queue)) = waiting.keys.pop_front() {
                // A request whose wait was let go is skipped.
                while let Some(tx) = queue.pop_front() {
                    if tx.send(()).is_ok() {
                        given = true;
                        break;
                    }
                }
                if !queue.is_empty() {
                    waiting.keys.push_back((key, queue));
                }
            }
            if !waiting.keys.is_empty() {
                self.tenants.push_back(waiting);
            }
            if given {
                return true;
            }
        }
        false
    }
}

impl HostRate {
    /// `rate` requests a second to one host; none when it is zero (unlimited).
    /// A rate that is negative, not finite or under [`MIN_RATE`] is refused with
    /// a sentence.
    pub fn new(rate: f64) -> Result<Option<Arc<HostRate>>, String> {
        if rate == 0.0 {
            return Ok(None);
        }
        if !rate.is_finite() || rate < MIN_RATE {
            return Err(format!(
                "--host-rate is requests a second to one host: 0 for no limit, or at least {MIN_RATE}"
            ));
        }
        Ok(Some(Arc::new(HostRate {
            rate,
            replicas: AtomicU32::new(1),
            hosts: Mutex::default(),
        })))
    }

    /// How many replicas share the rate (at least 1).
    pub fn set_replicas(&self, n: u32) {
        self.replicas.store(n.max(1), Relaxed);
    }

    /// The time between two requests to one host from this replica, at most an
    /// hour.
    pub fn interval(&self) -> Duration {
        let secs = f64::from(self.replicas.load(Relaxed)) / self.rate;
        Duration::try_from_secs_f64(secs)
            .unwrap_or(MAX_INTERVAL)
            .min(MAX_INTERVAL)
    }

    fn hosts(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Host>> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resolves at the turn of a request of `tenant` with `key` to `host`: at
    /// once when the host is free and no request waits, else when the turns,
    /// going round the tenants and their keys, come to it.
    pub async fn turn(self: &Arc<Self>, host: &Arc<str>, tenant: &Arc<str>, key: &Key) {
        let rx = {
            let now = Instant::now();
            let interval = self.interval();
            let mut hosts = self.hosts();
            if hosts.len() >= MAX_HOSTS && !hosts.contains_key(host) {
                hosts.retain(|_, h| h.serving || h.next > now);
            }
            let h = hosts.entry(host.clone()).or_insert_with(|| Host {
                next: now,
                tenants: VecDeque::new(),
                serving: false,
            });
            if !h.serving && h.next <= now {
                h.next = now + interval;
                return;
            }
            let (tx, rx) = oneshot::channel();
            let waiting = match h.tenants.iter().position(|w| w.tenant == *tenant) {
                Some(i) => &mut h.tenants[i],
                None => {
                    h.tenants.push_back(Waiting {
                        tenant: tenant.clone(),
                        keys: VecDeque::new(),
                    });
                    h.tenants.back_mut().expect("just pushed")
                }
            };
            match waiting.keys.iter_mut().find(|(k, _)| k == key) {
                Some((_, queue)) => queue.push_back(tx),
                None => waiting.keys.push_back((*key, VecDeque::from([tx]))),
            }
            if !h.serving {
                h.serving = true;
                tokio::spawn(self.clone().serve(host.clone()));
            }
            rx
        };
        // The server gone (the runtime ending) is a turn as good as any.
        let _ = rx.await;
    }

    /// Hands out `host`'s turns, one an interval, while requests wait for them.
    async fn serve(self: Arc<Self>, host: Arc<str>) {
        loop {
            let at = match self.hosts().get(&host) {
                Some(h) => h.next,
                None => return,
            };
            tokio::time::sleep_until(at).await;
            let now = Instant::now();
            let interval = self.interval();
            let mut hosts = self.hosts();
            let Some(h) = hosts.get_mut(&host) else {
                return;
            };
            if h.hand_out() {
                h.next = now.max(at) + interval;
            }
            if h.tenants.is_empty() {
                h.serving = false;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn requests_to_one_host_are_spaced_by_the_replicas_share_of_the_rate() {
        let r = HostRate::new(10.0).unwrap().unwrap();
        let (h, g): (Arc<str>, Arc<str>) = ("a:443".into(), "b:443".into());
        let t: Arc<str> = "t".into();
        let t0 = Instant::now();
        r.turn(&h, &t, &[0; 32]).await;
        assert_eq!(Instant::now(), t0);
        r.turn(&h, &t, &[0; 32]).await;
        assert_eq!(Instant::now(), t0 + Duration::from_millis(100));
        r.turn(&g, &t, &[0; 32]).await;
        assert_eq!(
            Instant::now(),
            t0 + Duration::from_millis(100),
            "another host has its own moments"
        );
        r.set_replicas(2);
        r.turn(&h, &t, &[0; 32]).await;
        assert_eq!(Instant::now(), t0 + Duration::from_millis(200));
        r.turn(&h, &t, &[0; 32]).await;
        assert_eq!(Instant::now(), t0 + Duration::from_millis(400));
        // Moments gone by are not owed.
        tokio::time::advance(Duration::from_secs(5)).await;
        let later = Instant::now();
        r.turn(&h, &t, &[0; 32]).await;
        assert_eq!(Instant::now(), later);
        assert!(HostRate::new(0.0).unwrap().is_none());
        for bad in [f64::NAN, f64::INFINITY, -1.0, 1e-20] {
            assert!(HostRate::new(bad).is_err(), "{bad}");
        }
        // The least rate and a million replicas still space requests without
        // overflowing a time.
        let slow = HostRate::new(MIN_RATE).unwrap().unwrap();
        slow.set_replicas(u32::MAX);
        assert_eq!(slow.interval(), MAX_INTERVAL);
    }

    /// Forty requests of one tenant wait for a host's turns when one of another
    /// tenant comes: it has the second turn, not the forty-first; and within a
    /// tenant, a second credential has the next turn of that tenant.
    #[tokio::test(start_paused = true)]
    async fn the_turns_go_round_the_tenants_then_their_credentials() {
        let r = HostRate::new(10.0).unwrap().unwrap();
        let h: Arc<str> = "a:443".into();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        r.turn(&h, &a, &[1; 32]).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        let mut go = |tenant: &Arc<str>, key: u8, name: String| {
            let (r, h, tenant, order) = (r.clone(), h.clone(), tenant.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                r.turn(&h, &tenant, &[key; 32]).await;
                order.lock().unwrap().push(name);
            }));
        };
        for i in 0..40 {
            go(&a, 1, format!("a{i}"));
        }
        // Each request is in line before the next comes.
        tokio::task::yield_now().await;
        go(&b, 2, "b".into());
        tokio::task::yield_now().await;
        go(&a, 3, "a-other".into());
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order[..4], ["a0", "b", "a-other", "a1"], "{order:?}");
        assert_eq!(order.len(), 42);
    }

    /// A request whose wait was let go gives its turn to the next.
    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_takes_no_turn() {
        let r = HostRate::new(1.0).unwrap().unwrap();
        let h: Arc<str> = "a:443".into();
        let t: Arc<str> = "t".into();
        r.turn(&h, &t, &[0; 32]).await;
        let t0 = Instant::now();
        let gone = tokio::spawn({
            let (r, h, t) = (r.clone(), h.clone(), t.clone());
            async move { r.turn(&h, &t, &[0; 32]).await }
        });
        tokio::task::yield_now().await;
        gone.abort();
        r.turn(&h, &t, &[0; 32]).await;
        assert_eq!(Instant::now(), t0 + Duration::from_secs(1));
    }
}
