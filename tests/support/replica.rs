//! Replicas of the `waitd` binary, each a process of its own on its own port, that a
//! test can kill (SIGKILL), signal, restart and read the logs of.

use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{client, set_flag, test_args};

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// One `waitd serve` process on its own port, sending its name with every probe
/// (`--probe-identity`). Killed (SIGKILL) on drop.
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

/// The flags every replica gets, then `extra` (a flag given twice is refused: change
/// one of these with [`super::set_flag`]).
pub fn replica_args(db_url: &str, port: u16, lease_ttl: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec![
        "serve".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
    ];
    a.extend(set_flag(test_args(db_url), "--lease-ttl", lease_ttl));
    a.extend(["--log-format", "json"].map(String::from));
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
            // Every probe it sends names it, so an upstream can tell who polled.
            .args(["--probe-identity", name])
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
        let client = client();
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
            // Polls /readyz, with a deadline and an exit check.
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
            // Polls for the exit, within `within`.
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

/// The peak resident set of process `pid`, in KiB (VmHWM), 0 when unreadable.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// A process's resident memory now, in KiB (`VmRSS`).
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// One "… kB" line of `/proc/<pid>/status`; 0 when it cannot be read.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}
