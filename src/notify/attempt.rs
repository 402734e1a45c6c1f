//! One attempt: a delivery's POST, what it came to, and the one way an outcome
//! of a delivery is made ([`outcome`]).

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{Request, Uri};

use super::Running;
use super::message::{payload, sign};
use crate::model::{Attempt, DeliveryStatus};
use crate::outbound::{self, Body, Client, Error, Peer};
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

/// What comes of a claimed delivery, to be written: its new status and next
/// attempt, and the attempt made, if one was (it counts as a try and joins the
/// last [`KEPT_ATTEMPTS`]). A delivery given back or stopped unsent makes none.
pub fn outcome(
    due: Due,
    status: DeliveryStatus,
    next_attempt_at: Option<DateTime<Utc>>,
    made: Option<Attempt>,
) -> Outcome {
    let mut attempts = due.delivery.attempts;
    let attempted = made.is_some();
    if let Some(a) = made {
        attempts.push(a);
        if attempts.len() > KEPT_ATTEMPTS {
            attempts.drain(..attempts.len() - KEPT_ATTEMPTS);
        }
    }
    Outcome {
        id: due.delivery.id,
        epoch: due.epoch,
        wait_id: due.wait_id,
        endpoint: due.delivery.endpoint,
        status,
        next_attempt_at,
        tries: due.tries + i32::from(attempted),
        attempts,
        attempted,
    }
}

/// What one attempt came to: the delivery's status and the attempt made.
struct Sent {
    status: DeliveryStatus,
    attempt: Attempt,
    retry_after: Option<Duration>,
}

/// One POST of `due` to its webhook; never fails: every problem is the attempt's
/// error. A 2xx is delivered, 410 Gone stops the webhook; an error that may pass,
/// and any other status, leaves it pending; the rest fail it.
async fn send(client: &Client, timeout: Duration, due: &Due) -> Sent {
    let started = std::time::Instant::now();
    let at = Utc::now();
    // One bound on the attempt, from connecting to the last byte read.
    let result = tokio::time::timeout(timeout, post(client, due))
        .await
        .unwrap_or(Err(Error::Timeout {
            peer: Peer::Receiver,
            within: timeout,
        }));
    let attempt = |status_code, error| Attempt {
        at,
        status_code,
        error,
        duration_ms: started.elapsed().as_millis() as u64,
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
        Err(e) => Sent {
            status: if e.is_transient() {
                DeliveryStatus::Pending
            } else {
                DeliveryStatus::Failed
            },
            attempt: attempt(None, Some(e.to_string())),
            retry_after: None,
        },
    }
}

/// The request: the receiver's status and `Retry-After`, or why there is none.
async fn post(client: &Client, due: &Due) -> Result<(u16, Option<Duration>), Error> {
    let invalid =
        |e: &dyn std::fmt::Display| Error::Invalid(format!("the webhook URL is not valid: {e}"));
    let url = url::Url::parse(&due.delivery.url).map_err(|e| invalid(&e))?;
    client
        .guard()
        .check_url(&url)
        .map_err(|refused| Error::Refused(refused.to_string()))?;
    let uri: Uri = url.as_str().parse().map_err(|e| invalid(&e))?;
    let key = crate::engine::spec::secret_key(&due.secret)
        .ok_or_else(|| Error::Invalid("the webhook's secret cannot be read".to_string()))?;
    let body = payload(due);
    let timestamp = Utc::now().timestamp();
    let id = &due.delivery.webhook_id;
    let signature = sign(&key, id, timestamp, &body);
    let request = Request::post(uri)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "*/*")
        .header(USER_AGENT, outbound::USER_AGENT)
        .header("webhook-id", id.as_str())
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(Body::from(body))
        .map_err(|e| invalid(&e))?;
    let mut res = client.send(request, Peer::Receiver).await?;
    let code = res.status().as_u16();
    let retry_after = outbound::retry_after(res.headers(), SystemTime::now());
    // Read a little of the answer (a receiver may want it drained), never more.
    outbound::drain(res.body_mut(), MAX_RESPONSE).await;
    Ok((code, retry_after))
}

impl Running {
    /// Sends one delivery and hands what came of it to the writer; the time of its
    /// next attempt when it stays pending. A delivery whose webhook was stopped
    /// since it was queued is stopped unsent.
    pub(super) async fn attempt(&self, client: &Client, due: Due) -> Option<DateTime<Utc>> {
        if due.stopped {
            self.write(outcome(due, DeliveryStatus::Stopped, None, None))
                .await;
            return None;
        }
        let span = client.traces().webhook(
            due.trace.as_deref(),
            due.wait_id,
            due.delivery.id,
            due.delivery.attempts_total.saturating_add(1),
        );
        let sent = match &span {
            Some(cx) => {
                use opentelemetry::context::FutureExt as _;
                send(client, self.cfg.timeout, &due)
                    .with_context(cx.clone())
                    .await
            }
            None => send(client, self.cfg.timeout, &due).await,
        };
        let now = Utc::now();
        let (status, next) = match sent.status {
            DeliveryStatus::Pending => {
                match retry_delay(due.tries + 1, self.cfg.retry_base, fastrand::f64()) {
                    Some(d) => {
                        let d = sent
                            .retry_after
                            .map_or(d, |ra| ra.min(outbound::MAX_RETRY_AFTER));
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
        if let Some(cx) = &span {
            crate::traces::attempted(
                cx,
                status.as_str(),
                sent.attempt.status_code,
                sent.attempt.error.as_deref(),
            );
        }
        if status == DeliveryStatus::Delivered {
            let age = (now - due.event.at).to_std().unwrap_or_default();
            self.metrics.webhook_latency.observe(age);
        }
        self.write(outcome(due, status, next, Some(sent.attempt)))
            .await;
        next
    }
}
