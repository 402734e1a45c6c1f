//! A recording upstream: scripted answers per path, and every probe that reached it
//! with its arrival time and the replica that sent it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{StatusCode, header};
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

/// One probe that reached the upstream: which path, when, from which client port.
#[derive(Clone, Debug)]
pub struct Hit {
    pub path: String,
    pub at: Instant,
    pub port: u16,
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
}

/// A scripted upstream on 127.0.0.1 that records every hit with its arrival time and
/// the client's source port (which [`PortMap`] turns into a replica).
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
        });
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::get(answer))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
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

    pub fn hits(&self) -> Vec<Hit> {
        self.inner.state.lock().unwrap().hits.clone()
    }

    pub fn count(&self, path: &str) -> usize {
        let k = key(path);
        self.inner
            .state
            .lock()
            .unwrap()
            .hits
            .iter()
            .filter(|h| h.path == k)
            .count()
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
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path(path): Path<String>,
) -> Response {
    rec.state.lock().unwrap().hits.push(Hit {
        path: path.clone(),
        at: Instant::now(),
        port: peer.port(),
    });
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

// ---------------------------------------------------------------------------------
// Which replica sent a probe: client port → process, from /proc
// ---------------------------------------------------------------------------------

/// Maps the source ports of connections to the upstream onto replicas, by reading
/// each replica's socket inodes (`/proc/<pid>/fd`) and the kernel's TCP table
/// (`/proc/net/tcp`) every few milliseconds. A probe arriving on a connection is then
/// attributed to the replica whose socket it is. Linux only.
pub struct PortMap {
    upstream_port: u16,
    shared: Arc<PortShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

#[derive(Default)]
struct PortShared {
    pids: Mutex<Vec<(usize, u32)>>,
    /// Per client port, who had it from when: a port freed by a killed replica may be
    /// reused by another one.
    ports: Mutex<HashMap<u16, Vec<(Instant, usize)>>>,
    /// Ports seen for one replica, later for another.
    reused: AtomicUsize,
    stop: AtomicBool,
}

/// A connection is seen by the scanner at most one scan (15 ms) after it opened.
const SCAN_SLACK: Duration = Duration::from_millis(30);

fn owner_at(owners: &[(Instant, usize)], t: Instant) -> Option<usize> {
    owners
        .iter()
        .rev()
        .find(|(since, _)| *since <= t + SCAN_SLACK)
        .or(owners.first())
        .map(|(_, r)| *r)
}

impl PortMap {
    pub fn start(upstream_port: u16) -> PortMap {
        let shared = Arc::new(PortShared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                scan(&s, upstream_port);
                std::thread::sleep(Duration::from_millis(15));
            }
        });
        PortMap {
            upstream_port,
            shared,
            thread: Some(thread),
        }
    }

    pub fn watch(&self, replica: usize, pid: u32) {
        let mut p = self.shared.pids.lock().unwrap();
        p.retain(|(r, _)| *r != replica);
        p.push((replica, pid));
    }

    pub fn unwatch(&self, replica: usize) {
        self.shared
            .pids
            .lock()
            .unwrap()
            .retain(|(r, _)| *r != replica);
    }

    /// Scans now (call right before killing a replica, so its newest connections
    /// are known).
    pub fn snapshot(&self) {
        scan(&self.shared, self.upstream_port);
    }

    /// How many client ports passed from one replica to another.
    pub fn reused(&self) -> usize {
        self.shared.reused.load(Ordering::Relaxed)
    }

    /// Every hit with its replica (None when its connection was never seen). Scans
    /// first: a burst of connections opened since the last scan (a takeover claims
    /// every orphan at once) is still open, pooled, and found now.
    pub fn attribute(&self, hits: &[Hit]) -> Vec<(Hit, Option<usize>)> {
        scan(&self.shared, self.upstream_port);
        let ports = self.shared.ports.lock().unwrap();
        hits.iter()
            .map(|h| {
                let r = ports.get(&h.port).and_then(|o| owner_at(o, h.at));
                (h.clone(), r)
            })
            .collect()
    }
}

impl Drop for PortMap {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn scan(s: &PortShared, upstream_port: u16) {
    let pids = s.pids.lock().unwrap().clone();
    if pids.is_empty() {
        return;
    }
    let mut inode_owner: HashMap<u64, usize> = HashMap::new();
    for (replica, pid) in &pids {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in rd.flatten() {
            if let Ok(target) = std::fs::read_link(e.path())
                && let Some(inode) = target
                    .to_str()
                    .and_then(|t| t.strip_prefix("socket:["))
                    .and_then(|t| t.strip_suffix(']'))
                    .and_then(|t| t.parse::<u64>().ok())
            {
                inode_owner.insert(inode, *replica);
            }
        }
    }
    let Ok(table) = std::fs::read_to_string("/proc/net/tcp") else {
        return;
    };
    let mut found = Vec::new();
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let port_of = |addr: &str| {
            addr.rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        let (Some(local), Some(remote)) = (port_of(f[1]), port_of(f[2])) else {
            continue;
        };
        if remote != upstream_port {
            continue;
        }
        if let Some(r) = f[9].parse::<u64>().ok().and_then(|i| inode_owner.get(&i)) {
            found.push((local, *r));
        }
    }
    let now = Instant::now();
    let mut ports = s.ports.lock().unwrap();
    for (port, r) in found {
        let owners = ports.entry(port).or_default();
        match owners.last() {
            Some((_, last)) if *last == r => {}
            Some(_) => {
                s.reused.fetch_add(1, Ordering::Relaxed);
                owners.push((now, r));
            }
            None => owners.push((now, r)),
        }
    }
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
