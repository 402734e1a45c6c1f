//! One attempt: the request a delivery makes, signed in the Standard Webhooks
//! format, and the outcome it comes to.

use std::time::{Duration, SystemTime};

use base64::Engine;
use chrono::{DateTime, Utc};
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

use super::Running;
use crate::model::{Attempt, DeliveryStatus};
use crate::store::{Due, KEPT_ATTEMPTS, Outcome};

/// The retry schedule: after the `n`th failed attempt of a round, the next comes
/// `SCHEDULE[n - 1]` times the base delay later (the base is 5 s, so: 5 s, 30 s,
/// 2 min, 10 min, 30 min, 1 h, 2 h, 4 h, 6 h, 8 h), each spread by ±10%. Eleven
/// attempts over about 21 h 42 min; then the delivery is failed.
pub const SCHEDULE: [u32; 10] = [1, 6, 24, 120, 360, 720, 1440, 2880, 4320, 5760];

/// The base of [`SCHEDULE`] unless configured (`--webhook-retry-base`).
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_secs(5);

/// The most of a receiver's answer that is read (then the connection is dropped).
pub const MAX_RESPONSE: usize = 4096;

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

/// What an attempt came to, before it is written.
struct Sent {
    status: DeliveryStatus,
    attempt: Attempt,
    retry_after: Option<Duration>,
}

impl Running {
    /// Hands an outcome to the writer (the attempt's slot is free meanwhile).
    pub(super) async fn write(&self, outcome: Outcome) {
        let _ = self.writes.send(outcome).await;
    }

    /// Sends one delivery and writes what came of it; the time of its next attempt
    /// when it stays pending.
    pub(super) async fn attempt(
        &self,
        client: &reqwest::Client,
        due: Due,
    ) -> Option<DateTime<Utc>> {
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
