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
    /// Runs until `stop` resolves; attempts in flight then finish (each is bounded
    /// by the timeout) and are written.
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
        let me = Arc::new(self);
        let mut bus = me.bus.subscribe();
        let mut flying: JoinSet<Option<DateTime<Utc>>> = JoinSet::new();
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
                match me
                    .store
                    .claim_deliveries(me.owner, now, me.cfg.lease_ttl, free as i64)
                    .await
                {
                    Ok(due) => {
                        full = due.len() == free;
                        for d in due {
                            let me = me.clone();
                            let client = client.clone();
                            flying.spawn(async move { me.attempt(&client, d).await });
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
            let idle = soonest
                .and_then(|t| (t - Utc::now()).to_std().ok())
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
                    // Events come in bursts: take what a few milliseconds bring at once.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    while bus.try_recv().is_ok() {}
                }
                Some(done) = flying.join_next(), if !flying.is_empty() => {
                    if let Ok(Some(next)) = done {
                        soonest = Some(soonest.map_or(next, |s| s.min(next)));
                    }
                }
            }
        }
        while flying.join_next().await.is_some() {}
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
            if let Err(e) = self
                .store
                .finish_delivery(self.owner, Utc::now(), &outcome)
                .await
            {
                tracing::warn!(delivery = due.delivery.id, error = %e, "cannot record a webhook delivery's outcome");
            }
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
        match self.store.finish_delivery(self.owner, now, &outcome).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(
                    delivery = due.delivery.id,
                    "a webhook delivery's lease passed to another replica before its outcome was written"
                );
            }
            Err(e) => {
                // The lease runs out and the delivery is taken again: at least once.
                tracing::warn!(delivery = due.delivery.id, error = %e, "cannot record a webhook delivery's outcome");
            }
        }
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
