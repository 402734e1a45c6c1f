//! Plain requests that report what came back, and a browser-like SSE follower.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{StatusCode, header};
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::Notify;

/// One response: status, content type, body (JSON or Null).
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub body: Value,
    pub took: Duration,
}

pub async fn send(req: reqwest::RequestBuilder) -> Answer {
    let started = Instant::now();
    let r = req.send().await.expect("the request got an answer");
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = r.text().await.unwrap_or_default();
    Answer {
        status,
        content_type,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        took: started.elapsed(),
    }
}

/// One event an SSE follower received.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub id: String,
    pub kind: String,
    pub data: Value,
}

/// Follows an SSE URL like a browser's EventSource: when the stream breaks (or is
/// kicked), it reconnects with `Last-Event-ID` set to the last id it received, every
/// 100 ms until a stream opens. A per-wait follower stops after the terminal event.
pub struct Follower {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Status of every connection attempt, in order.
    pub attempts: Arc<Mutex<Vec<u16>>>,
    kick: Arc<Notify>,
    done: Arc<AtomicBool>,
    /// Told of every event received, and of each stream opened.
    received: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

pub const TERMINAL: &[&str] = &["succeeded", "failed", "timed_out", "canceled", "error"];

impl Follower {
    pub fn start(url: String, reconnect: bool) -> Follower {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let attempts: Arc<Mutex<Vec<u16>>> = Arc::default();
        let kick = Arc::new(Notify::new());
        let done = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Notify::new());
        let (s, a, k, d) = (seen.clone(), attempts.clone(), kick.clone(), done.clone());
        let r_ = received.clone();
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(2))
                .build()
                .unwrap();
            let mut last_id: Option<String> = None;
            loop {
                let mut req = client.get(&url).header(header::ACCEPT, "text/event-stream");
                if let Some(id) = &last_id {
                    req = req.header("Last-Event-ID", id);
                }
                match req.send().await {
                    Ok(r) if r.status() == StatusCode::OK => {
                        a.lock().unwrap().push(200);
                        r_.notify_waiters();
                        let mut events =
                            eventsource_stream::Eventsource::eventsource(r.bytes_stream());
                        loop {
                            let next = tokio::select! {
                                n = events.next() => n,
                                _ = k.notified() => break,
                            };
                            let Some(Ok(e)) = next else { break };
                            let ends =
                                TERMINAL.contains(&e.event.as_str()) && url.contains("/waits/");
                            s.lock().unwrap().push(Seen {
                                at: Instant::now(),
                                id: e.id.clone(),
                                kind: e.event.clone(),
                                data: serde_json::from_str(&e.data).unwrap_or(Value::Null),
                            });
                            // Done before anyone waiting for this event hears of it.
                            if ends {
                                d.store(true, Ordering::Relaxed);
                            }
                            r_.notify_waiters();
                            if ends {
                                return;
                            }
                            if !e.id.is_empty() {
                                last_id = Some(e.id);
                            }
                        }
                    }
                    Ok(r) => a.lock().unwrap().push(r.status().as_u16()),
                    Err(_) => a.lock().unwrap().push(0),
                }
                if !reconnect {
                    d.store(true, Ordering::Relaxed);
                    return;
                }
                // EventSource's reconnection delay.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Follower {
            seen,
            attempts,
            kick,
            done,
            received,
            task,
        }
    }

    /// Drops the current connection; the follower reconnects with Last-Event-ID.
    pub fn kick(&self) {
        self.kick.notify_one();
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn attempts(&self) -> Vec<u16> {
        self.attempts.lock().unwrap().clone()
    }

    /// The stream ended by itself (per-wait: after the terminal event; or, without
    /// reconnecting, when the server closed it).
    pub fn done(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }

    /// Whether `f` holds of what was seen within `within`: looked at again as
    /// each event is received, not on a clock.
    pub async fn seen_when(&self, within: Duration, f: impl Fn(&[Seen]) -> bool) -> bool {
        self.heard_when(within, || f(&self.seen.lock().unwrap()))
            .await
    }

    /// Whether a stream opened (a 200) within `within`.
    pub async fn opened(&self, within: Duration) -> bool {
        self.heard_when(within, || self.attempts.lock().unwrap().contains(&200))
            .await
    }

    async fn heard_when(&self, within: Duration, check: impl Fn() -> bool) -> bool {
        super::heard_that(&self.received, within, check).await
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}
