//! A throwaway Postgres cluster the test owns, so it can stop, restart or freeze it
//! without touching the shared server.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::TempDir;
use super::replica::free_port;

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
