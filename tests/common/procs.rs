//! Test support for running waitd as real, separate processes: replicas of the
//! `waitd` binary, a throwaway Postgres cluster the test owns (so it can stop,
//! restart or freeze it without touching the shared server), a recording upstream
//! that notes which replica sent each probe, and a browser-like SSE follower.
//!
//! Included by `tests/replicas.rs` with `#[path]`; it uses nothing of `common`.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::Notify;

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A fresh directory under the system temp dir, removed on drop unless the test is
/// failing or `WAITD_TEST_KEEP_LOGS` is set (then its path is printed, so the logs in
/// it can be read; `WAITD_TEST_RUST_LOG` sets the replicas' `RUST_LOG`).
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create a temp dir");
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("WAITD_TEST_KEEP_LOGS").is_some() {
            eprintln!("logs kept in {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------------
// Replicas
// ---------------------------------------------------------------------------------

/// One `waitd serve` process on its own port. Killed (SIGKILL) on drop.
pub struct Replica {
    pub name: String,
    pub port: u16,
    pub base: String,
    pub pid: u32,
    pub log: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    exited: Option<ExitStatus>,
}

/// The flags every replica gets; `extra` adds or overrides (clap takes the last).
pub fn replica_args(db_url: &str, port: u16, lease_ttl: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "serve",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--database-url",
        db_url,
        "--min-poll-interval",
        "1ms",
        "--allow-targets",
        "127.0.0.1",
        "--lease-ttl",
        lease_ttl,
        "--db-connections",
        "8",
        "--log-format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

impl Replica {
    /// Spawns the process (not yet ready: see [`Replica::ready`]). Its stderr goes to
    /// `<dir>/<name>.log` (appended to, so a restart keeps the earlier lines).
    pub fn spawn(name: &str, dir: &FsPath, port: u16, args: Vec<String>) -> Replica {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the replica log");
        let child = Command::new(env!("CARGO_BIN_EXE_waitd"))
            .args(&args)
            .env(
                "RUST_LOG",
                std::env::var("WAITD_TEST_RUST_LOG").unwrap_or("warn,waitd::worker=info".into()),
            )
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn the waitd binary");
        Replica {
            name: name.to_string(),
            port,
            base: format!("http://127.0.0.1:{port}"),
            pid: child.id(),
            log,
            args,
            child: Some(child),
            exited: None,
        }
    }

    /// Spawns and waits until `/readyz` answers 200.
    pub async fn start(name: &str, dir: &FsPath, db_url: &str, ttl: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let mut r = Replica::spawn(name, dir, port, replica_args(db_url, port, ttl, extra));
        r.ready(Duration::from_secs(15)).await;
        r
    }

    /// Starts the same command again (same port, same flags, same log) after it died.
    pub fn respawn(&mut self) {
        assert!(!self.running(), "{} is still running", self.name);
        let dir = self.log.parent().unwrap().to_path_buf();
        let mut fresh = Replica::spawn(&self.name, &dir, self.port, self.args.clone());
        self.pid = fresh.pid;
        self.child = fresh.child.take();
        self.exited = None;
    }

    pub async fn ready(&mut self, within: Duration) {
        let client = http();
        let until = Instant::now() + within;
        loop {
            if let Ok(r) = client.get(self.url("/readyz")).send().await
                && r.status().is_success()
            {
                return;
            }
            if let Some(st) = self.try_exit() {
                panic!(
                    "replica {} exited before it was ready ({st}); log:\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            if Instant::now() > until {
                panic!(
                    "replica {} not ready within {within:?}; log:\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            if let Ok(st) = c.wait() {
                self.exited = Some(st);
            }
        }
    }

    pub fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .args([format!("-{sig}"), self.pid.to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{sig} {} failed", self.pid);
    }

    /// The exit status, once it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none()
            && let Some(c) = self.child.as_mut()
            && let Ok(Some(st)) = c.try_wait()
        {
            self.exited = Some(st);
        }
        self.exited
    }

    pub fn running(&mut self) -> bool {
        self.try_exit().is_none()
    }

    /// Waits (polling) for the process to exit.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + within;
        loop {
            if let Some(st) = self.try_exit() {
                return Some(st);
            }
            if Instant::now() > until {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self, n: usize) -> String {
        let t = self.log_text();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The log lines (JSON) whose message is `message`, as parsed objects.
    pub fn log_events(&self, message: &str) -> Vec<Value> {
        self.log_text()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message)
            .collect()
    }

    /// The worker's owner id (from its "worker pool started" line; the latest one
    /// after a restart).
    pub fn owner(&self) -> Option<uuid::Uuid> {
        self.log_events("worker pool started")
            .last()
            .and_then(|v| v["fields"]["owner"].as_str().and_then(|s| s.parse().ok()))
    }

    /// Lines that say something went badly wrong inside the process.
    pub fn panics(&self) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains("panicked") || l.contains("RUST_BACKTRACE"))
            .map(str::to_string)
            .collect()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill9();
    }
}

// ---------------------------------------------------------------------------------
// A throwaway Postgres cluster
// ---------------------------------------------------------------------------------

fn pg_bin_dir() -> PathBuf {
    let dir = std::env::var("WAITD_PG_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/usr/lib/postgresql/15/bin"));
    for tool in ["initdb", "pg_ctl", "postgres"] {
        assert!(
            dir.join(tool).exists(),
            "this test starts its own Postgres cluster and needs the server binaries \
             (initdb, pg_ctl, postgres) in {}: install PostgreSQL 15 (Debian: apt-get install \
             postgresql-15) or point WAITD_PG_BIN at their directory",
            dir.display()
        );
    }
    dir
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A Postgres cluster of the test's own, on a free port, trust auth, user
/// `postgres`. Stopped (immediately) and deleted on drop.
pub struct PgCluster {
    pub port: u16,
    pub url: String,
    bin: PathBuf,
    dir: TempDir,
    as_postgres: bool,
    frozen: Mutex<Vec<u32>>,
}

impl PgCluster {
    fn tool(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(path);
            c
        } else {
            Command::new(path)
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.path.join("data")
    }

    /// initdb + start (blocking: call from `spawn_blocking` or before serving).
    pub fn start() -> PgCluster {
        let bin = pg_bin_dir();
        let dir = TempDir::new("waitd-pg");
        let as_postgres = is_root();
        if as_postgres {
            // initdb refuses to run as root: the cluster belongs to `postgres`.
            let st = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir.path)
                .status()
                .expect("run chown");
            assert!(st.success(), "chown of the cluster dir to postgres failed");
        }
        let port = free_port();
        let c = PgCluster {
            port,
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            bin,
            dir,
            as_postgres,
            frozen: Mutex::new(Vec::new()),
        };
        let out = c
            .tool("initdb")
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(c.data())
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c.pg_start();
        c
    }

    /// `pg_ctl start -w` on the same port and data dir.
    pub fn pg_start(&self) {
        let opts = format!(
            "-p {} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port
        );
        let out = self
            .tool("pg_ctl")
            .args(["start", "-w", "-t", "30", "-D"])
            .arg(self.data())
            .args(["-l"])
            .arg(self.dir.path.join("postgres.log"))
            .args(["-o", &opts])
            .output()
            .expect("run pg_ctl start");
        assert!(
            out.status.success(),
            "pg_ctl start failed: {}{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(self.dir.path.join("postgres.log")).unwrap_or_default()
        );
    }

    /// `pg_ctl stop -m immediate`: every connection is cut at once, as in a crash.
    pub fn stop_immediate(&self) {
        let out = self
            .tool("pg_ctl")
            .args(["stop", "-w", "-m", "immediate", "-D"])
            .arg(self.data())
            .output()
            .expect("run pg_ctl stop");
        assert!(
            out.status.success(),
            "pg_ctl stop failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// SIGSTOP the postmaster and every backend: connections stay open but nothing
    /// answers, as when the network to the database is cut.
    pub fn freeze(&self) {
        let pm = self.postmaster_pid().expect("postmaster.pid");
        // Noted first, so that a failure below still thaws them on drop.
        self.frozen.lock().unwrap().push(pm);
        let st = Command::new("kill")
            .args(["-STOP", &pm.to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -STOP of the postmaster failed");
        // Its children; a backend may exit between the listing and the signal.
        for pid in children_of(pm) {
            self.frozen.lock().unwrap().push(pid);
            let _ = Command::new("kill")
                .args(["-STOP", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }

    pub fn thaw(&self) {
        let pids = std::mem::take(&mut *self.frozen.lock().unwrap());
        if !pids.is_empty() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .args(pids.iter().map(u32::to_string))
                .stderr(Stdio::null())
                .status();
        }
    }

    pub fn log_tail(&self, n: usize) -> String {
        let t = std::fs::read_to_string(self.dir.path.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.thaw();
        let _ = self
            .tool("pg_ctl")
            .args(["stop", "-w", "-t", "10", "-m", "immediate", "-D"])
            .arg(self.data())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Pids whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so split after ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|s| s.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push(pid);
        }
    }
    out
}

// ---------------------------------------------------------------------------------
// The recording upstream
// ---------------------------------------------------------------------------------

/// What a path answers.
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

// ---------------------------------------------------------------------------------
// HTTP helpers and the SSE follower
// ---------------------------------------------------------------------------------

pub fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

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
    task: tokio::task::JoinHandle<()>,
}

pub const TERMINAL: &[&str] = &["succeeded", "failed", "timed_out", "canceled", "error"];

impl Follower {
    pub fn start(url: String, reconnect: bool) -> Follower {
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let attempts: Arc<Mutex<Vec<u16>>> = Arc::default();
        let kick = Arc::new(Notify::new());
        let done = Arc::new(AtomicBool::new(false));
        let (s, a, k, d) = (seen.clone(), attempts.clone(), kick.clone(), done.clone());
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
                        let mut events =
                            eventsource_stream::Eventsource::eventsource(r.bytes_stream());
                        loop {
                            let next = tokio::select! {
                                n = events.next() => n,
                                _ = k.notified() => break,
                            };
                            let Some(Ok(e)) = next else { break };
                            let terminal = TERMINAL.contains(&e.event.as_str());
                            s.lock().unwrap().push(Seen {
                                at: Instant::now(),
                                id: e.id.clone(),
                                kind: e.event.clone(),
                                data: serde_json::from_str(&e.data).unwrap_or(Value::Null),
                            });
                            if !e.id.is_empty() {
                                last_id = Some(e.id);
                            }
                            if terminal && url.contains("/waits/") {
                                d.store(true, Ordering::Relaxed);
                                return;
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
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        Follower {
            seen,
            attempts,
            kick,
            done,
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

    /// Waits until `f` holds of what was seen.
    pub async fn until(&self, within: Duration, f: impl Fn(&[Seen]) -> bool) -> bool {
        let until = Instant::now() + within;
        loop {
            if f(&self.seen.lock().unwrap()) {
                return true;
            }
            if Instant::now() > until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}
