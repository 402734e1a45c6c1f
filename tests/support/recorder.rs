//! A recording upstream: scripted answers per path, and every probe that reached it
//! with its arrival time and the replica that sent it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::Notify;

#[derive(Clone, Debug)]
pub enum Behavior {
    /// 200 `{"data": {"attributes": {"status": s}}}`.
    Status(String),
    /// Hold the request until the path's behavior changes.
    Hold,
    /// Like `Status`, the states in turn, one per request (a target that flaps).
    Cycle(Vec<String>),
}

/// One probe that reached the upstream: which path, when, and the replica that sent
/// it, as its `Waitd-Replica` header names it (`--probe-identity`; None without one).
#[derive(Clone, Debug)]
pub struct Hit {
    pub path: String,
    pub at: Instant,
    pub replica: Option<String>,
}

#[derive(Default)]
struct RecState {
    behaviors: HashMap<String, Behavior>,
    hits: Vec<Hit>,
    turns: HashMap<String, usize>,
}

struct RecInner {
    state: Mutex<RecState>,
    changed: Notify,
    /// Told of every hit as it is recorded.
    hit: Notify,
    started: Instant,
}

/// A scripted upstream on 127.0.0.1 that records every hit with its arrival time and
/// the replica that sent it.
#[derive(Clone)]
pub struct Recorder {
    pub base: String,
    pub port: u16,
    inner: Arc<RecInner>,
}

fn key(path: &str) -> String {
    path.trim_start_matches('/').to_string()
}

impl Recorder {
    pub async fn start() -> Recorder {
        let inner = Arc::new(RecInner {
            state: Mutex::new(RecState::default()),
            changed: Notify::new(),
            hit: Notify::new(),
            started: Instant::now(),
        });
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::get(answer))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Recorder {
            base: format!("http://127.0.0.1:{port}"),
            port,
            inner,
        }
    }

    /// Sets what `path` answers from now on; returns its URL.
    pub fn set(&self, path: &str, b: Behavior) -> String {
        self.inner
            .state
            .lock()
            .unwrap()
            .behaviors
            .insert(key(path), b);
        self.inner.changed.notify_waiters();
        format!("{}/{}", self.base, key(path))
    }

    pub fn set_status(&self, path: &str, s: &str) -> String {
        self.set(path, Behavior::Status(s.to_string()))
    }

    /// Sets many paths at once (one lock, one wake-up).
    pub fn set_all<'a>(&self, paths: impl IntoIterator<Item = &'a String>, s: &str) {
        {
            let mut st = self.inner.state.lock().unwrap();
            for p in paths {
                st.behaviors.insert(key(p), Behavior::Status(s.to_string()));
            }
        }
        self.inner.changed.notify_waiters();
    }

    /// When it started: every hit is at or after it.
    pub fn started(&self) -> Instant {
        self.inner.started
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.inner.state.lock().unwrap().hits.clone()
    }

    /// Whether `check` holds of the hits within `within`: looked at again (under
    /// the lock, without a copy) as each hit is recorded, not on a clock.
    pub async fn hit_when(&self, within: Duration, check: impl Fn(&[Hit]) -> bool) -> bool {
        super::heard_that(&self.inner.hit, within, || {
            check(&self.inner.state.lock().unwrap().hits)
        })
        .await
    }

    pub fn count(&self, path: &str) -> usize {
        self.hits_of(path, self.inner.started).len()
    }

    /// Hits of `path` at or after `since`.
    pub fn hits_of(&self, path: &str, since: Instant) -> Vec<Instant> {
        let k = key(path);
        self.inner
            .state
            .lock()
            .unwrap()
            .hits
            .iter()
            .filter(|h| h.path == k && h.at >= since)
            .map(|h| h.at)
            .collect()
    }
}

async fn answer(
    State(rec): State<Arc<RecInner>>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    rec.state.lock().unwrap().hits.push(Hit {
        path: path.clone(),
        at: Instant::now(),
        replica: headers
            .get(waitd::probe::IDENTITY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    });
    rec.hit.notify_waiters();
    loop {
        let changed = rec.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let b = {
            let mut st = rec.state.lock().unwrap();
            match st.behaviors.get(&path).cloned() {
                Some(Behavior::Cycle(states)) => {
                    let turn = st.turns.entry(path.clone()).or_default();
                    *turn += 1;
                    Some(Behavior::Status(states[(*turn - 1) % states.len()].clone()))
                }
                other => other,
            }
        };
        match b {
            Some(Behavior::Hold) => changed.await,
            Some(Behavior::Cycle(_)) => unreachable!(),
            Some(Behavior::Status(s)) => {
                return (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "application/json")],
                    json!({"data": {"attributes": {"status": s}}}).to_string(),
                )
                    .into_response();
            }
            None => return (StatusCode::NOT_FOUND, "no script").into_response(),
        }
    }
}

/// Whether every one of `paths` has had at least `n` of `hits` at or after
/// `since`: one pass over them, so that it can be looked at on every hit.
pub fn each_hit(hits: &[Hit], paths: &[String], n: usize, since: Instant) -> bool {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for h in hits.iter().filter(|h| h.at >= since) {
        *counts.entry(h.path.as_str()).or_default() += 1;
    }
    paths
        .iter()
        .all(|p| counts.get(key(p).as_str()).copied().unwrap_or(0) >= n)
}

/// Whether every one of `paths` has settled into a cadence since `since`: its
/// last `gaps` + 1 hits at or after `since` each at least `gap` after the one
/// before (what came in a burst before it, claims' first polls, is behind it).
pub fn each_steady(
    hits: &[Hit],
    paths: &[String],
    since: Instant,
    gap: Duration,
    gaps: usize,
) -> bool {
    let mut times: HashMap<&str, Vec<Instant>> = HashMap::new();
    for h in hits.iter().filter(|h| h.at >= since) {
        times.entry(h.path.as_str()).or_default().push(h.at);
    }
    paths.iter().all(|p| {
        times.get(key(p).as_str()).is_some_and(|t| {
            t.len() > gaps
                && t[t.len() - gaps - 1..]
                    .windows(2)
                    .all(|w| w[1].saturating_duration_since(w[0]) >= gap)
        })
    })
}

/// Per path, its hits in time order with their replica.
pub fn by_path(
    attributed: &[(Hit, Option<usize>)],
) -> HashMap<String, Vec<(Instant, Option<usize>)>> {
    let mut m: HashMap<String, Vec<(Instant, Option<usize>)>> = HashMap::new();
    for (h, r) in attributed {
        m.entry(h.path.clone()).or_default().push((h.at, *r));
    }
    for v in m.values_mut() {
        v.sort_by_key(|(t, _)| *t);
    }
    m
}

/// The longest time two replicas both polled one path: each replica's hits are cut
/// into runs (a pause longer than `gap` ends a run); the answer is the largest
/// overlap of two runs of different replicas. Unattributed hits are left out.
pub fn longest_double_poll(hits: &[(Instant, Option<usize>)], gap: Duration) -> Duration {
    let mut runs: Vec<(usize, Instant, Instant)> = Vec::new();
    let mut open: HashMap<usize, usize> = HashMap::new(); // replica -> index in runs
    for (t, r) in hits {
        let Some(r) = r else { continue };
        match open.get(r) {
            Some(&i) if *t - runs[i].2 <= gap => runs[i].2 = *t,
            _ => {
                open.insert(*r, runs.len());
                runs.push((*r, *t, *t));
            }
        }
    }
    let mut longest = Duration::ZERO;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.0 == b.0 {
                continue;
            }
            let start = a.1.max(b.1);
            let end = a.2.min(b.2);
            if end > start {
                longest = longest.max(end - start);
            }
        }
    }
    longest
}

/// The replicas that polled each path.
pub fn pollers(attributed: &[(Hit, Option<usize>)]) -> HashMap<String, HashSet<usize>> {
    let mut m: HashMap<String, HashSet<usize>> = HashMap::new();
    for (h, r) in attributed {
        if let Some(r) = r {
            m.entry(h.path.clone()).or_default().insert(*r);
        }
    }
    m
}
