//! Replicas of the `waitd` binary, each a process of its own on its own port, that a
//! test can kill (SIGKILL), signal, restart and read the logs of; and [`Watched`], a
//! `waitd` process whose log lines and exit are heard as they happen.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::{client, set_flag, test_args};

/// A port that was free a moment ago, for a process told its port before it
/// starts. It is taken below the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`): a port from that range, checked
/// free, may be handed to another test's outgoing connection or `bind(:0)` before
/// the process binds it, and the more tests run at once the likelier that is.
/// Below it only callers of this function take ports, each at random.
pub fn free_port() -> u16 {
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000, ephemeral.max(10_100));
    for _ in 0..1000 {
        let port = fastrand::u16(low..high);
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// An address on this machine where nothing listens, so a connection to it is
/// refused: a [`free_port`], which no other test's `bind(:0)` or outgoing
/// connection takes meanwhile (a port freed in the ephemeral range may be).
pub fn closed_addr() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], free_port()))
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
    proc: Watched,
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

/// The `RUST_LOG` of the replicas (`WAITD_TEST_RUST_LOG` replaces the usual one),
/// always with the INFO lines that carry an `addr` field: "waitd starting" and
/// "waitd listening", which [`Replica::ready`] awaits.
fn replica_rust_log() -> String {
    let base = std::env::var("WAITD_TEST_RUST_LOG").unwrap_or("warn,waitd::worker=info".into());
    format!("{base},waitd[{{addr}}]=info")
}

impl Replica {
    /// Spawns the process (not yet ready: see [`Replica::ready`]). Its stderr goes to
    /// `<dir>/<name>.log` (appended to, so a restart keeps the earlier lines).
    pub fn spawn(name: &str, dir: &FsPath, port: u16, args: Vec<String>) -> Replica {
        let log = dir.join(format!("{name}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_waitd"));
        command
            .args(&args)
            // Every probe it sends names it, so an upstream can tell who polled.
            .args(["--probe-identity", name])
            .env("RUST_LOG", replica_rust_log())
            .env("NO_COLOR", "1");
        let proc = Watched::spawn(command, &log);
        Replica {
            name: name.to_string(),
            port,
            base: format!("http://127.0.0.1:{port}"),
            pid: proc.pid,
            log,
            args,
            proc,
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
        // The dead process's last lines are in the log before the new one writes.
        self.proc.close();
        let dir = self.log.parent().unwrap().to_path_buf();
        let fresh = Replica::spawn(&self.name, &dir, self.port, self.args.clone());
        self.pid = fresh.pid;
        self.proc = fresh.proc;
    }

    /// Until it serves: it logs "waitd listening" once its store is open and
    /// migrated, its worker started and its socket bound; then `/readyz` must answer
    /// 200. Fails the test, with the log, if it exits first or is not listening
    /// within `within`.
    pub async fn ready(&mut self, within: Duration) {
        if let Err(why) = self.proc.listening(within).await {
            panic!("replica {} {why}; log:\n{}", self.name, self.log_tail(40));
        }
        // One request: the store answered its migrations a moment ago, so a 503
        // here (the store gone since) is a failure to report, not a pace to wait on.
        let answer = client().get(self.url("/readyz")).send().await;
        match answer {
            Ok(r) if r.status().is_success() => {}
            other => panic!(
                "replica {} listens but /readyz answered {:?}; log:\n{}",
                self.name,
                other.map(|r| r.status()),
                self.log_tail(40)
            ),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        self.proc.kill();
    }

    pub fn signal(&self, sig: &str) {
        self.proc.signal(sig);
    }

    /// The exit status, once it has exited.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.proc.try_exit()
    }

    pub fn running(&mut self) -> bool {
        self.try_exit().is_none()
    }

    /// Its exit status, once it exits within `within` (else `None`).
    pub async fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        self.proc.exit(within).await
    }

    /// Its log so far: every line it has written.
    pub fn log_text(&self) -> String {
        self.proc.log_text()
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

/// What a [`Watched`] process has said and done so far.
#[derive(Default)]
struct Said {
    /// It logged "waitd listening".
    listening: bool,
    /// Its exit status, once it is reaped.
    exited: Option<ExitStatus>,
    /// The last of [`Watched::sync`]'s marks the copier has read.
    synced: u64,
}

/// A [`Said`], and who is told when it changes.
#[derive(Default)]
struct News {
    said: Mutex<Said>,
    /// Wakes the async waiters ([`Watched::listening`], [`Watched::exit`]).
    changed: tokio::sync::Notify,
    /// Wakes [`Watched::sync`], which is not async.
    changed_sync: Condvar,
}

impl News {
    fn update(&self, f: impl FnOnce(&mut Said)) {
        f(&mut self.said.lock().unwrap());
        self.changed.notify_waiters();
        self.changed_sync.notify_all();
    }
}

/// A process of the `waitd` binary whose stderr is copied line by line into a log
/// file by a thread of the test's own, woken by each line, so that a test awaits what
/// it logs ("waitd listening") and its exit rather than polling for them. SIGKILLed
/// on drop.
///
/// Its stdout is a pipe that only the process writes to: the pipe's end is its exit,
/// which another thread hears and then reaps it. Reading the log first has the
/// copier catch up ([`Watched::sync`]), so a line the process wrote before the test
/// looks is in the file, as when the process wrote to the file itself.
pub struct Watched {
    pub pid: u32,
    log: PathBuf,
    child: Arc<Mutex<Child>>,
    news: Arc<News>,
    /// A second write end of the process's stderr, for [`Watched::sync`]'s marks;
    /// dropped on [`Watched::close`], after the process.
    marks: Option<std::io::PipeWriter>,
    /// The prefix of those marks: no line the process writes has it.
    mark: String,
    marked: AtomicU64,
    copier: Option<std::thread::JoinHandle<()>>,
}

impl Watched {
    /// Spawns `command` (stdin, stdout and stderr are set here), appending its stderr
    /// to `log`.
    pub fn spawn(mut command: Command, log: &FsPath) -> Watched {
        let (err_read, err_write) = std::io::pipe().expect("a pipe for stderr");
        let (mut out_read, out_write) = std::io::pipe().expect("a pipe for stdout");
        let marks = err_write.try_clone().expect("a second write end");
        let child = command
            .stdin(Stdio::null())
            .stdout(out_write)
            .stderr(err_write)
            .spawn()
            .expect("spawn the waitd binary");
        // The command held our copies of the write ends: only the process's are left.
        drop(command);
        let pid = child.id();
        let child = Arc::new(Mutex::new(child));
        let news = Arc::new(News::default());
        let mark = format!("\u{1}mark-{}:", uuid::Uuid::now_v7().simple());

        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open the log");
        let (n, m) = (news.clone(), mark.clone());
        let copier = std::thread::spawn(move || {
            let mut lines = BufReader::new(err_read);
            // A line read so far: written in pieces, it may be cut by a mark.
            let mut line: Vec<u8> = Vec::new();
            loop {
                let mut piece = Vec::new();
                match lines.read_until(b'\n', &mut piece) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => line.extend_from_slice(&piece),
                }
                // A mark is one write of less than PIPE_BUF bytes, so it arrives
                // whole, ending with its own newline.
                if let Some(at) = find(&line, m.as_bytes()) {
                    let seq = String::from_utf8_lossy(&line[at + m.len()..])
                        .trim()
                        .parse()
                        .unwrap_or(0);
                    line.truncate(at);
                    n.update(|s| s.synced = s.synced.max(seq));
                    continue;
                }
                let _ = file.write_all(&line);
                if find(&line, b"waitd listening").is_some() {
                    n.update(|s| s.listening = true);
                }
                line.clear();
            }
            let _ = file.write_all(&line);
        });

        let (n, c) = (news.clone(), child.clone());
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut out_read, &mut std::io::sink());
            // Its stdout closed: it has exited (or is exiting), so this is brief.
            if let Ok(st) = c.lock().unwrap().wait() {
                n.update(|s| {
                    s.exited.get_or_insert(st);
                });
            }
        });

        Watched {
            pid,
            log: log.to_path_buf(),
            child,
            news,
            marks: Some(marks),
            mark,
            marked: AtomicU64::new(0),
            copier: Some(copier),
        }
    }

    /// The first `f` gives of what the process has said, looked at again as each
    /// change is heard; `None` when `within` passes first.
    async fn when<T>(&self, within: Duration, f: impl Fn(&Said) -> Option<T>) -> Option<T> {
        super::heard(&self.news.changed, within, || {
            f(&self.news.said.lock().unwrap())
        })
        .await
    }

    /// Until it logs "waitd listening"; else why not (it exited, or `within` passed).
    pub async fn listening(&self, within: Duration) -> Result<(), String> {
        let heard = self
            .when(within, |s| match s.exited {
                Some(st) => Some(Err(format!("exited ({st}) before it was listening"))),
                None => s.listening.then_some(Ok(())),
            })
            .await;
        heard.unwrap_or_else(|| Err(format!("was not listening within {within:?}")))
    }

    /// Its exit status, once it exits within `within` (else `None`).
    pub async fn exit(&self, within: Duration) -> Option<ExitStatus> {
        self.when(within, |s| s.exited).await
    }

    /// The exit status, once it has exited.
    pub fn try_exit(&self) -> Option<ExitStatus> {
        let known = self.news.said.lock().unwrap().exited;
        if known.is_some() {
            return known;
        }
        let st = self.child.lock().unwrap().try_wait().ok().flatten()?;
        self.news.update(|s| {
            s.exited.get_or_insert(st);
        });
        Some(st)
    }

    /// SIGKILL, and reap.
    pub fn kill(&self) {
        let mut c = self.child.lock().unwrap();
        let _ = c.kill();
        let st = c.wait();
        drop(c);
        if let Ok(st) = st {
            self.news.update(|s| {
                s.exited.get_or_insert(st);
            });
        }
    }

    /// Sends `sig` (e.g. "TERM"), unless it has exited already (its exit status
    /// then says how).
    pub fn signal(&self, sig: &str) {
        // Held meanwhile, so that it is not reaped: the pid is still its own.
        let mut child = self.child.lock().unwrap();
        if let Ok(Some(st)) = child.try_wait() {
            drop(child);
            self.news.update(|s| {
                s.exited.get_or_insert(st);
            });
            return;
        }
        let st = Command::new("kill")
            .args([format!("-{sig}"), self.pid.to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{sig} {} failed", self.pid);
    }

    /// Until the copier has written to the log every line the process wrote before
    /// this call: it sends a mark down the process's stderr, after them, and waits
    /// for the copier to read it.
    pub fn sync(&self) {
        let Some(w) = &self.marks else { return };
        let seq = self.marked.fetch_add(1, Ordering::SeqCst) + 1;
        if (&*w)
            .write_all(format!("{}{seq}\n", self.mark).as_bytes())
            .is_err()
        {
            return;
        }
        let said = self.news.said.lock().unwrap();
        let _ = self
            .news
            .changed_sync
            .wait_timeout_while(said, Duration::from_secs(10), |s| s.synced < seq);
    }

    /// Every line it has logged so far.
    pub fn log_text(&self) -> String {
        self.sync();
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills it (if it still runs) and lets the copier write its last lines and
    /// stop.
    pub fn close(&mut self) {
        self.kill();
        self.marks = None;
        if let Some(c) = self.copier.take() {
            let _ = c.join();
        }
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.close();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
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
