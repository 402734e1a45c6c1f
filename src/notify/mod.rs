//! Webhooks: each replica's delivery loop.
//!
//! The store's outbox holds one delivery per event and webhook (see
//! [`crate::store::Due`]). Every replica runs a [`Deliverer`]: it takes due
//! deliveries under a lease, POSTs each to its webhook in the Standard Webhooks
//! format ([`sign`], [`payload`]), and writes the outcome fenced by its lease. A
//! 2xx is delivered; 410 Gone stops the webhook; anything else is tried again on
//! [`SCHEDULE`], honouring `Retry-After`, and after the last attempt the delivery is
//! failed. A replica that dies mid-attempt loses its lease, and another replica
//! sends the same delivery again with the same `webhook-id`: at least once.
//!
//! The loop wakes on the event bus (an event of this replica's, or of any replica
//! on Postgres, may owe a delivery), when its own retries fall due, when a client
//! asks for a redelivery, and at least every [`IDLE`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, SystemTime};

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio::task::JoinSet;
use uuid::Uuid;

use crate::bus::Bus;
use crate::metrics::Metrics;
use crate::model::{Attempt, DeliveryStatus};
use crate::probe::{Guard, GuardedResolver};
use crate::store::{Due, KEPT_ATTEMPTS, Outcome, Store};

/// The retry schedule: after the `n`th failed attempt of a round, the next comes
/// `SCHEDULE[n - 1]` times the base delay later (the base is 5 s, so: 5 s, 30 s,
/// 2 min, 10 min, 30 min, 1 h, 2 h, 4 h, 6 h, 8 h), each spread by ±10%. Eleven
/// attempts over about 21 h 42 min; then the delivery is failed.
pub const SCHEDULE: [u32; 10] = [1, 6, 24, 120, 360, 720, 1440, 2880, 4320, 5760];

/// The base of [`SCHEDULE`] unless configured (`--webhook-retry-base`).
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(5);

/// The most of a receiver's answer that is read (then the connection is dropped).
pub const MAX_RESPONSE: usize = 4096;

/// Most attempts in flight to one receiver (host and port) from one replica: one
/// receiver that hangs cannot take every slot from the others. Claimed deliveries
/// beyond it wait their turn, as many as that receiver answers in about a second;
/// one claimed beyond that is given back, due after about as long as what is ahead
/// of it takes that receiver (50 ms to 10 min).
pub const PER_HOST: usize = 16;

/// After a burst of events wakes the loop, it claims at most this often.
const CLAIM_GAP: Duration = Duration::from_millis(20);

/// The loop looks for due deliveries at least this often (another replica's
/// retries, a missed notice).
pub const IDLE: Duration = Duration::from_secs(1);

/// How the deliverer is set up.
#[derive(Clone, Debug)]
pub struct NotifyConfig {
    /// The bound on one attempt, from connecting to the last byte read.
    pub timeout: Duration,
    /// [`SCHEDULE`]'s unit.
    pub retry_base: Duration,
    /// How long a replica holds a delivery it took (longer than `timeout`).
    pub lease_ttl: Duration,
    /// Most attempts in flight at once.
    pub concurrency: usize,
    pub guard: Guard,
    pub resolve_overrides: Vec<(String, SocketAddr)>,
}

/// The delay after the `tries`th failed attempt of a round, jittered by `unit` (a
/// number in [0, 1): ±10% around the schedule); `None` when that was the last.
pub fn retry_delay(tries: i32, base: Duration, unit: f64) -> Option<Duration> {
    let step = *SCHEDULE.get(usize::try_from(tries).ok()?.checked_sub(1)?)?;
    let d = base.saturating_mul(step);
    Some(d.mul_f64(0.9 + 0.2 * unit.clamp(0.0, 1.0)))
}

/// The `webhook-signature` of a message: `v1,` and the base64 HMAC-SHA256 of
/// `{id}.{timestamp}.{body}` under the secret's key.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// The body of a delivery: `type` (`wait.` and the event's kind), `timestamp` (the
/// event's time), `data` (the wait as it stands when sent) and `event` (the event it
/// announces: its `seq`, `kind`, `at` and fields).
pub fn payload(due: &Due) -> Vec<u8> {
    let mut event = serde_json::to_value(&due.event).unwrap_or(Value::Null);
    if let Value::Object(o) = &mut event {
        o.remove("id");
    }
    let body = json!({
        "type": format!("wait.{}", due.event.kind()),
        "timestamp": due.event.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "data": due.wait,
        "event": event,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The receiver a webhook URL names, as the per-host limit counts them: host and
/// port.
fn receiver(url: &str) -> String {
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

/// What a task of the loop came to: the next attempt's time when the delivery stays
/// pending, and, for an attempt, its receiver and how long it took.
struct Done {
    next: Option<DateTime<Utc>>,
    sent: Option<(String, Duration)>,
}

/// Where a claimed delivery goes.
enum Admit {
    /// Sent now.
    Send(Due),
    /// Waits for a slot of its receiver.
    Queued,
    /// Given back, due this long from now.
    PutBack(Due, Duration),
}

/// Per receiver: attempts in flight (at most [`PER_HOST`]), claimed deliveries
/// waiting for a slot, and how long its attempts take.
#[derive(Default)]
struct Receivers {
    slots: std::collections::HashMap<String, Slots>,
    /// Deliveries waiting, over every receiver (at most [`MAX_WAITING`]).
    waiting: usize,
}

/// Most claimed deliveries waiting for a slot on one replica (each holds its wait).
const MAX_WAITING: usize = 1024;

#[derive(Default)]
struct Slots {
    flying: usize,
    waiting: std::collections::VecDeque<(tokio::time::Instant, Due)>,
    /// Recent attempts' duration, smoothed.
    took: Duration,
}

impl Receivers {
    fn admit(&mut self, host: &str, d: Due) -> Admit {
        let slots = self.slots.entry(host.to_string()).or_default();
        if slots.flying < PER_HOST {
            slots.flying += 1;
            return Admit::Send(d);
        }
        // As many wait as this receiver answers in about a second (and never fewer
        // than PER_HOST): a fast one takes a burst at once, one that hangs does not
        // hold more leases than it can use.
        let per_second = if slots.took.is_zero() {
            1000
        } else {
            (1_000_000 / slots.took.as_micros().max(1)).clamp(1, 1000) as usize
        };
        if slots.waiting.len() < PER_HOST * per_second && self.waiting < MAX_WAITING {
            slots.waiting.push_back((tokio::time::Instant::now(), d));
            self.waiting += 1;
            return Admit::Queued;
        }
        // Back for about as long as what is ahead of it takes this receiver.
        let ahead = (slots.flying + slots.waiting.len()) as u32 / PER_HOST as u32;
        let after = (slots.took * ahead).clamp(Duration::from_millis(50), Duration::from_secs(600));
        Admit::PutBack(d, after)
    }

    /// An attempt to `host` finished after `took`: what goes next in its slot.
    fn finished(&mut self, host: &str, took: Duration, stale: Duration) -> Vec<Admit> {
        let Some(slots) = self.slots.get_mut(host) else {
            return Vec::new();
        };
        slots.flying = slots.flying.saturating_sub(1);
        slots.took = (slots.took * 3 + took) / 4;
        let mut out = Vec::new();
        while let Some((since, d)) = slots.waiting.pop_front() {
            self.waiting -= 1;
            if since.elapsed() > stale {
                out.push(Admit::PutBack(d, Duration::from_secs(1)));
                continue;
            }
            slots.flying += 1;
            out.push(Admit::Send(d));
            break;
        }
        if slots.flying == 0 && slots.waiting.is_empty() {
            self.slots.remove(host);
        }
        out
    }
}

/// One replica's delivery loop.
pub struct Deliverer {
    pub store: Store,
    pub bus: Bus,
    pub metrics: Arc<Metrics>,
    pub owner: Uuid,
    pub cfg: NotifyConfig,
    /// Notified when a client queues a redelivery.
    pub wake: Arc<Notify>,
}

/// What an attempt came to, before it is written.
struct Sent {
    status: DeliveryStatus,
    attempt: Attempt,
    retry_after: Option<Duration>,
}

impl Deliverer {
    /// Runs until `stop` resolves; attempts in flight then have 5 s to finish and be
    /// written (one cut short keeps its lease, and is sent again once it runs out).
    pub async fn run(self, stop: impl Future<Output = ()>) {
        let client = match crate::probe::guarded_client(
            GuardedResolver::new(
                Arc::new(self.cfg.guard.clone()),
                &self.cfg.resolve_overrides,
            ),
            self.cfg.timeout,
        )
        .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %crate::probe::error_chain(&e), "cannot build the HTTP client for webhooks; no deliveries from this replica");
                return;
            }
        };
        let (writes, rx) = tokio::sync::mpsc::channel(4 * WRITE_BATCH);
        let written = tokio::spawn(writer(
            self.store.clone(),
            self.owner,
            rx,
            self.wake.clone(),
        ));
        let me = Arc::new(Running { d: self, writes });
        let mut bus = me.bus.subscribe();
        let mut flying: JoinSet<Done> = JoinSet::new();
        let mut receivers = Receivers::default();
        let mut last_claim = tokio::time::Instant::now();
        // The soonest retry this replica scheduled.
        let mut soonest: Option<DateTime<Utc>> = None;
        let mut last_gauge = tokio::time::Instant::now() - IDLE;
        tokio::pin!(stop);
        loop {
            let free = me.cfg.concurrency.saturating_sub(flying.len());
            let mut full = false;
            if free > 0 {
                let now = Utc::now();
                if soonest.is_some_and(|t| t <= now) {
                    soonest = None;
                }
                last_claim = tokio::time::Instant::now();
                match me
                    .store
                    .claim_deliveries(me.owner, now, me.cfg.lease_ttl, free as i64)
                    .await
                {
                    Ok(due) => {
                        full = due.len() == free;
                        for d in due {
                            let host = receiver(&d.delivery.url);
                            match receivers.admit(&host, d) {
                                Admit::Send(d) => me.spawn_attempt(&mut flying, &client, host, d),
                                Admit::Queued => {}
                                Admit::PutBack(d, after) => {
                                    let me = me.clone();
                                    flying.spawn(async move { me.put_back(d, after).await });
                                }
                            }
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot claim webhook deliveries"),
                }
            }
            if last_gauge.elapsed() >= IDLE {
                last_gauge = tokio::time::Instant::now();
                if let Ok(oldest) = me.store.oldest_pending_delivery().await {
                    let age = oldest.map_or(0, |t| (Utc::now() - t).num_milliseconds().max(0));
                    me.metrics.webhook_oldest_pending_ms.store(age, Relaxed);
                }
            }
            // A retry that came due while the claim above ran is claimed at once
            // (it used to wait for IDLE: a negative wait is no wait at all).
            let idle = soonest
                .map(|t| (t - Utc::now()).to_std().unwrap_or(Duration::ZERO))
                .unwrap_or(IDLE)
                .min(IDLE);
            tokio::select! {
                _ = &mut stop => break,
                _ = tokio::time::sleep(idle), if !full => {}
                _ = std::future::ready(()), if full && free > 0 => {}
                _ = me.wake.notified() => {}
                r = bus.recv() => {
                    if matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                        break;
                    }
                    // Events come in bursts: take what a few milliseconds bring at once,
                    // and claim no more often than CLAIM_GAP.
                    let gap = CLAIM_GAP.saturating_sub(last_claim.elapsed());
                    tokio::time::sleep(gap.max(Duration::from_millis(5))).await;
                    while bus.try_recv().is_ok() {}
                }
                Some(done) = flying.join_next(), if !flying.is_empty() => {
                    let Ok(done) = done else { continue };
                    if let Some(next) = done.next {
                        soonest = Some(soonest.map_or(next, |s| s.min(next)));
                    }
                    let Some((host, took)) = done.sent else { continue };
                    // The receiver's slot is free: its next waiting delivery goes, or
                    // one that waited past half its lease is given back.
                    for next in receivers.finished(&host, took, me.cfg.lease_ttl / 2) {
                        match next {
                            Admit::Send(d) => me.spawn_attempt(&mut flying, &client, host.clone(), d),
                            Admit::PutBack(d, after) => {
                                let me = me.clone();
                                flying.spawn(async move { me.put_back(d, after).await });
                            }
                            Admit::Queued => {}
                        }
                    }
                }
            }
        }
        // What waits in the queues keeps its lease until it runs out.
        let drain = async { while flying.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(5), drain)
            .await
            .is_err()
        {
            flying.abort_all();
        }
        // The last outcomes are written before the store closes.
        drop(me);
        let _ = written.await;
    }
}

/// A running deliverer: its settings, and where its outcomes go to be written in
/// batches.
struct Running {
    d: Deliverer,
    writes: tokio::sync::mpsc::Sender<Outcome>,
}

impl std::ops::Deref for Running {
    type Target = Deliverer;

    fn deref(&self) -> &Deliverer {
        &self.d
    }
}

/// Outcomes written in one transaction at most.
const WRITE_BATCH: usize = 256;

/// Writes the outcomes `rx` brings, as many at once as have come (one statement on
/// Postgres), until every sender is gone. A batch that holds a retry wakes the
/// loop once it is written: the loop sleeps until the soonest retry it scheduled,
/// but a claim then, before the outcome's write had committed, found the delivery
/// still leased, and the retry waited for the next idle claim (a second late).
async fn writer(
    store: Store,
    owner: Uuid,
    mut rx: tokio::sync::mpsc::Receiver<Outcome>,
    wake: Arc<Notify>,
) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        match store.finish_deliveries(owner, Utc::now(), &batch).await {
            Ok(written) => {
                if batch
                    .iter()
                    .zip(&written)
                    .any(|(o, ok)| *ok && o.status == DeliveryStatus::Pending)
                {
                    wake.notify_one();
                }
                for (o, ok) in batch.iter().zip(written) {
                    if !ok {
                        tracing::info!(
                            delivery = o.id,
                            "a webhook delivery's lease passed to another replica before its outcome was written"
                        );
                    }
                }
            }
            Err(e) => {
                // Their leases run out and they are taken again: at least once.
                tracing::warn!(deliveries = batch.len(), error = %e, "cannot record webhook deliveries' outcomes");
            }
        }
        batch.clear();
    }
}

impl Running {
    fn spawn_attempt(
        self: &Arc<Self>,
        flying: &mut JoinSet<Done>,
        client: &reqwest::Client,
        host: String,
        d: Due,
    ) {
        let (me, client) = (self.clone(), client.clone());
        flying.spawn(async move {
            let started = tokio::time::Instant::now();
            let next = me.attempt(&client, d).await;
            Done {
                next,
                sent: Some((host, started.elapsed())),
            }
        });
    }

    /// Gives a claimed delivery back unsent, due `after` from now (its receiver has
    /// [`PER_HOST`] attempts in flight and as many waiting).
    async fn put_back(&self, due: Due, after: Duration) -> Done {
        let next = Utc::now() + chrono::Duration::from_std(after).unwrap_or_default();
        let outcome = Outcome {
            id: due.delivery.id,
            epoch: due.epoch,
            wait_id: due.wait_id,
            endpoint: due.delivery.endpoint,
            status: DeliveryStatus::Pending,
            next_attempt_at: Some(next),
            tries: due.tries,
            attempts: due.delivery.attempts,
            attempted: false,
        };
        self.write(outcome).await;
        Done {
            next: Some(next),
            sent: None,
        }
    }

    /// Hands an outcome to the writer (the attempt's slot is free meanwhile).
    async fn write(&self, outcome: Outcome) {
        let _ = self.writes.send(outcome).await;
    }

    /// Sends one delivery and writes what came of it; the time of its next attempt
    /// when it stays pending.
    async fn attempt(&self, client: &reqwest::Client, due: Due) -> Option<DateTime<Utc>> {
        if due.stopped {
            let outcome = Outcome {
                id: due.delivery.id,
                epoch: due.epoch,
                wait_id: due.wait_id,
                endpoint: due.delivery.endpoint,
                status: DeliveryStatus::Stopped,
                next_attempt_at: None,
                tries: due.tries,
                attempts: due.delivery.attempts.clone(),
                attempted: false,
            };
            self.write(outcome).await;
            return None;
        }
        let sent = self.send(client, &due).await;
        let now = Utc::now();
        let tries = due.tries + 1;
        let (status, next) = match sent.status {
            DeliveryStatus::Pending => {
                let planned = retry_delay(tries, self.cfg.retry_base, fastrand::f64());
                match planned {
                    Some(d) => {
                        let d = sent
                            .retry_after
                            .map_or(d, |ra| ra.min(crate::probe::MAX_RETRY_AFTER));
                        let at = now + chrono::Duration::from_std(d).unwrap_or_default();
                        (DeliveryStatus::Pending, Some(at))
                    }
                    None => (DeliveryStatus::Failed, None),
                }
            }
            other => (other, None),
        };
        self.metrics.webhook(match status {
            DeliveryStatus::Pending => "retry",
            s => s.as_str(),
        });
        if status == DeliveryStatus::Delivered {
            let age = (now - due.event.at).to_std().unwrap_or_default();
            self.metrics.webhook_latency.observe(age);
        }
        let mut attempts = due.delivery.attempts.clone();
        attempts.push(sent.attempt);
        if attempts.len() > KEPT_ATTEMPTS {
            attempts.drain(..attempts.len() - KEPT_ATTEMPTS);
        }
        let outcome = Outcome {
            id: due.delivery.id,
            epoch: due.epoch,
            wait_id: due.wait_id,
            endpoint: due.delivery.endpoint,
            status,
            next_attempt_at: next,
            tries,
            attempts,
            attempted: true,
        };
        self.write(outcome).await;
        next
    }

    /// One POST; never fails: every problem is an attempt's error.
    async fn send(&self, client: &reqwest::Client, due: &Due) -> Sent {
        let started = std::time::Instant::now();
        let at = Utc::now();
        let result = self.post(client, due).await;
        let duration_ms = started.elapsed().as_millis() as u64;
        let attempt = |status_code, error| Attempt {
            at,
            status_code,
            error,
            duration_ms,
        };
        match result {
            Ok((code, retry_after)) => Sent {
                status: match code {
                    200..=299 => DeliveryStatus::Delivered,
                    410 => DeliveryStatus::Stopped,
                    _ => DeliveryStatus::Pending,
                },
                attempt: attempt(Some(code), None),
                retry_after,
            },
            Err((refused, error)) => Sent {
                status: if refused {
                    DeliveryStatus::Failed
                } else {
                    DeliveryStatus::Pending
                },
                attempt: attempt(None, Some(error)),
                retry_after: None,
            },
        }
    }

    /// The request: its status and `Retry-After`, or whether the guard refused it
    /// and why it failed.
    async fn post(
        &self,
        client: &reqwest::Client,
        due: &Due,
    ) -> Result<(u16, Option<Duration>), (bool, String)> {
        let url = url::Url::parse(&due.delivery.url)
            .map_err(|e| (true, format!("the webhook URL is not valid: {e}")))?;
        if let Err(refused) = self.cfg.guard.check_url(&url) {
            return Err((true, refused.to_string()));
        }
        let key = crate::engine::spec::secret_key(&due.secret)
            .ok_or_else(|| (true, "the webhook's secret cannot be read".to_string()))?;
        let body = payload(due);
        let timestamp = Utc::now().timestamp();
        let id = &due.delivery.webhook_id;
        let signature = sign(&key, id, timestamp, &body);
        let sent = client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", id.as_str())
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let mut res = match sent {
            Ok(r) => r,
            Err(e) => {
                if let Some(refused) = crate::probe::guard_refusal(&e) {
                    return Err((true, refused));
                }
                let e = e.without_url();
                return Err((
                    false,
                    if e.is_timeout() {
                        format!(
                            "the receiver did not answer within {}",
                            crate::engine::duration::format(self.cfg.timeout)
                        )
                    } else {
                        crate::probe::error_chain(&e)
                    },
                ));
            }
        };
        let code = res.status().as_u16();
        let retry_after = crate::probe::retry_after(res.headers(), SystemTime::now());
        // Read a little of the answer (a receiver may want it drained), never more.
        let mut read = 0;
        while read < MAX_RESPONSE {
            match res.chunk().await {
                Ok(Some(c)) => read += c.len(),
                _ => break,
            }
        }
        Ok((code, retry_after))
    }
}
