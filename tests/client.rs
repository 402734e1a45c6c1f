//! The command-line client, run as a process (`waitd create | get | list | cancel |
//! follow`) against a test server: its output and its exit codes (0 succeeded,
//! 1 failed, 2 timed out, 3 error, 4 canceled, 5 usage or server problem, 130
//! interrupted).

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_waitd");

/// What a finished client run printed, and how it exited.
#[derive(Debug)]
pub(crate) struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub(crate) fn command(server: &str, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("WAITD_URL", server)
        .env_remove("WAITD_TOKEN")
        .env("RUST_BACKTRACE", "1");
    c
}

/// Runs the client to its end (off the async runtime, which serves the app).
pub(crate) async fn waitd(server: &str, args: &[&str]) -> Run {
    waitd_env(server, args, &[]).await
}

pub(crate) async fn waitd_env(server: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut c = command(server, args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || c.output().expect("run waitd"))
        .await
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A client process whose output lines are collected as they come.
pub(crate) struct Live {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    /// Told of every line read, of either stream, and of each stream's end.
    read: Arc<tokio::sync::Notify>,
    /// The streams read to their end (of two).
    drained: Arc<std::sync::atomic::AtomicUsize>,
}

impl Live {
    pub(crate) fn spawn(server: &str, args: &[&str]) -> Live {
        let mut child = command(server, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn waitd");
        let lines: Arc<Mutex<Vec<String>>> = Arc::default();
        let stderr: Arc<Mutex<String>> = Arc::default();
        let read = Arc::new(tokio::sync::Notify::new());
        let drained: Arc<std::sync::atomic::AtomicUsize> = Arc::default();
        let out = child.stdout.take().unwrap();
        let (l, r, d) = (lines.clone(), read.clone(), drained.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
                r.notify_waiters();
            }
            d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            r.notify_waiters();
        });
        let err = child.stderr.take().unwrap();
        let (e, r, d) = (stderr.clone(), read.clone(), drained.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                {
                    let mut e = e.lock().unwrap();
                    e.push_str(&line);
                    e.push('\n');
                }
                r.notify_waiters();
            }
            d.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            r.notify_waiters();
        });
        Live {
            child,
            lines,
            stderr,
            read,
            drained,
        }
    }

    /// Whether `check` holds of what it has printed (stdout lines, stderr) within
    /// `within`: looked at again as each line is read, not on a clock.
    pub(crate) async fn printed(
        &self,
        within: Duration,
        check: impl Fn(&[String], &str) -> bool,
    ) -> bool {
        self.read_until(within, || {
            check(&self.lines(), &self.stderr.lock().unwrap())
        })
        .await
    }

    /// Whether `check` holds within `within`, looked at as each line is read.
    async fn read_until(&self, within: Duration, check: impl Fn() -> bool) -> bool {
        let heard = async {
            loop {
                let next = self.read.notified();
                tokio::pin!(next);
                next.as_mut().enable();
                if check() {
                    return;
                }
                next.await;
            }
        };
        tokio::time::timeout(within, heard).await.is_ok()
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    pub(crate) async fn wait_for_lines(&self, n: usize) {
        let ok = self
            .printed(Duration::from_secs(15), |lines, _| lines.len() >= n)
            .await;
        assert!(
            ok,
            "waitd printed {:?} (stderr {:?}), expected {n} lines",
            self.lines(),
            self.stderr.lock().unwrap()
        );
    }

    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    /// Waits for the process to exit; returns its code, stdout lines and stderr.
    pub(crate) async fn finish(mut self) -> (i32, Vec<String>, String) {
        // The reader threads have read both pipes to their end: the process closed
        // them, as it does when it exits.
        let drained = self
            .read_until(Duration::from_secs(20), || {
                self.drained.load(std::sync::atomic::Ordering::SeqCst) == 2
            })
            .await;
        assert!(
            drained,
            "waitd did not exit: its output did not end (stdout {:?}, stderr {:?})",
            self.lines(),
            self.stderr.lock().unwrap()
        );
        // It has exited, or is a moment from it: reaping it does not block.
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        let stderr = self.stderr.lock().unwrap().clone();
        (code, self.lines(), stderr)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A JSON file with fast timings, to lay over a preset.
pub(crate) fn fast_spec_file(extra: Value) -> std::path::PathBuf {
    let mut spec = json!({
        "poll": {"initial": "5ms", "max": "20ms", "jitter": 0},
        "retry": {"delay": "5ms", "max_delay": "20ms"}
    });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            spec[k] = v;
        }
    }
    let path = std::env::temp_dir().join(format!("waitd-spec-{}.json", uuid::Uuid::now_v7()));
    std::fs::write(&path, spec.to_string()).unwrap();
    path
}

pub(crate) fn status(s: &str) -> Reply {
    Reply::status(s)
}

/// The event kind of a `follow` line (`HH:MM:SS <kind>…`).
pub(crate) fn kind_of(line: &str) -> &str {
    line.split(' ').nth(1).unwrap_or("").trim_end_matches(':')
}

pub(crate) fn is_uuid(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok()
}

async fn finish(app: App, db: TestDb) {
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn create_prints_one_short_line_and_exits_0() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script("/servers/sv_1", vec![status("deploying")]);
    let app = App::start(&db).await;
    let spec = fast_spec_file(json!({}));
    let base = format!("base_url={}", up.base);
    let run = waitd(
        &app.base,
        &[
            "create",
            "--preset",
            "latitude.server",
            "--param",
            "server_id=sv_1",
            "--param",
            &base,
            "--spec",
            spec.to_str().unwrap(),
            "--label",
            "pipeline=7",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{run:?}");
    let (id, rest) = lines[0].split_once(' ').unwrap();
    assert!(is_uuid(id), "{run:?}");
    // `running`, or `running state=deploying` when the first poll beat the answer.
    assert!(
        rest == "running" || rest == "running state=deploying",
        "{run:?}"
    );
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["labels"]["pipeline"], "7");
    assert_eq!(
        w["spec"]["target"]["url"],
        format!("{}/servers/sv_1", up.base)
    );

    let run = waitd(
        &app.base,
        &[
            "create",
            "--preset",
            "latitude.server",
            "--param",
            "server_id=sv_1",
            "--param",
            &base,
            "--spec",
            spec.to_str().unwrap(),
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("--json prints the wait");
    assert_eq!(w["status"], "running");
    let _ = std::fs::remove_file(spec);
    finish(app, db).await;
}

#[tokio::test]
async fn create_wait_follows_the_wait_to_success_and_exits_0() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    up.script(
        "/servers/sv_1",
        vec![status("deploying"), status("deploying"), status("on")],
    );
    let app = App::start(&db).await;
    let spec = fast_spec_file(json!({}));
    let base = format!("base_url={}", up.base);
    let run = waitd(
        &app.base,
        &[
            "create",
            "--wait",
            "--preset",
            "latitude.server",
            "--param",
            "server_id=sv_1",
            "--param",
            &base,
            "--spec",
            spec.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{run:?}");
    assert!(lines[0].contains(" running"), "{run:?}");
    assert!(lines[1].ends_with(" state deploying"), "{run:?}");
    assert!(lines[2].ends_with(" state deploying -> on"), "{run:?}");
    assert!(
        lines[3].contains(" succeeded: the target reached \"on\""),
        "{run:?}"
    );
    assert_eq!(run.stderr, "", "{run:?}");
    let _ = std::fs::remove_file(spec);
    finish(app, db).await;
}

#[tokio::test]
async fn create_takes_a_url_and_cel_conditions_from_flags() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let ok = up.script(
        "/deployments/web",
        vec![
            Reply::json(
                200,
                json!({"spec": {"replicas": 2}, "status": {"readyReplicas": 1}}),
            ),
            Reply::json(
                200,
                json!({"spec": {"replicas": 2}, "status": {"readyReplicas": 2}}),
            ),
        ],
    );
    let forbidden = up.script("/deployments/locked", vec![Reply::json(403, json!({}))]);
    let app = App::start(&db).await;
    let spec = fast_spec_file(json!({}));
    let spec = spec.to_str().unwrap();
    let run = waitd(
        &app.base,
        &[
            "create",
            "--wait",
            "--spec",
            spec,
            "--url",
            &ok,
            "--success-condition",
            "body.status.readyReplicas >= body.spec.replicas",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("success_condition held"), "{run:?}");
    let run = waitd(
        &app.base,
        &[
            "create",
            "--wait",
            "--spec",
            spec,
            "--url",
            &forbidden,
            "--success-condition",
            "status == 200",
            "--failure-condition",
            "status == 403",
        ],
    )
    .await;
    assert_eq!(run.code, 1, "failed: {run:?}");
    assert!(run.stdout.contains("failure_condition held"), "{run:?}");
    // A bad expression: the server's sentence, exit 5.
    let run = waitd(
        &app.base,
        &["create", "--url", &ok, "--success-condition", "status =="],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("success_condition"), "{run:?}");
    let _ = std::fs::remove_file(spec);
    finish(app, db).await;
}

#[tokio::test]
async fn a_followed_wait_exits_1_failed_2_timed_out_3_error() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let failed = up.script(
        "/servers/failed",
        vec![status("deploying"), status("failed_deployment")],
    );
    let stuck = up.script("/servers/stuck", vec![status("deploying")]);
    let denied = up.script(
        "/servers/denied",
        vec![Reply::json(403, json!({"errors": [{"code": "FORBIDDEN"}]}))],
    );
    let app = App::start(&db).await;

    let spec = |url: &str, timeout: &str| {
        fast_spec_file(json!({
            "target": {"url": url},
            "state": "/data/attributes/status",
            "want": ["on"],
            "fail": ["failed_deployment"],
            "timeout": timeout
        }))
    };
    let cases = [
        (failed, 1, "failed"),
        (stuck, 2, "timed_out"),
        (denied, 3, "error"),
    ];
    for (url, code, kind) in cases {
        let file = spec(&url, "20s");
        let mut args = vec!["create", "--wait", "--spec", file.to_str().unwrap()];
        if kind == "timed_out" {
            args.extend(["--timeout", "300ms"]);
        }
        let run = waitd(&app.base, &args).await;
        assert_eq!(run.code, code, "{kind}: {run:?}");
        let last = run.stdout.lines().last().unwrap_or_default().to_string();
        assert!(last.contains(&format!(" {kind}: ")), "{kind}: {run:?}");
        let _ = std::fs::remove_file(file);
    }

    // --json prints the ended wait as the one thing on stdout; progress goes to stderr.
    let file = spec(
        &up.script("/servers/f2", vec![status("failed_deployment")]),
        "20s",
    );
    let run = waitd(
        &app.base,
        &[
            "create",
            "--wait",
            "--json",
            "--spec",
            file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, 1, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("one JSON document");
    assert_eq!(w["status"], "failed");
    assert!(run.stderr.contains(" failed: "), "{run:?}");
    let _ = std::fs::remove_file(file);
    finish(app, db).await;
}

#[tokio::test]
async fn follow_exits_4_when_the_wait_is_canceled() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/servers/s", vec![status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let live = Live::spawn(&app.base, &["follow", &id]);
    live.wait_for_lines(2).await; // created, state deploying
    let (s, _) = app.post(&format!("/waits/{id}/cancel")).await;
    assert_eq!(s, 200);
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 4, "{lines:?} {stderr}");
    assert!(
        lines[0].ends_with(" created") || lines[0].contains(" created ("),
        "{lines:?}"
    );
    assert!(
        lines
            .last()
            .unwrap()
            .contains(" canceled: canceled by a client"),
        "{lines:?}"
    );
    finish(app, db).await;
}

#[tokio::test]
async fn follow_prints_one_line_per_event_and_ends_at_the_terminal_event() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/servers/f",
        vec![
            status("deploying"),
            Reply::json(503, json!({})),
            status("on"),
        ],
    );
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded");
    let (_, events) = app.get(&format!("/waits/{id}/events")).await;
    let kinds: Vec<String> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["created", "state", "retry", "state", "succeeded"]);

    let run = waitd(&app.base, &["follow", &id]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), kinds.len(), "{run:?}");
    for (line, kind) in lines.iter().zip(&kinds) {
        assert_eq!(kind_of(line), kind, "{run:?}");
    }
    assert!(
        lines[2].contains(" retry 1 in ") && lines[2].contains("503 Service Unavailable"),
        "{run:?}"
    );

    let run = waitd(&app.base, &["follow", "--json", &id]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let parsed: Vec<Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event a line"))
        .collect();
    assert_eq!(parsed.len(), 5);
    assert_eq!(parsed[4]["kind"], "succeeded");
    finish(app, db).await;
}

/// A TCP relay in front of the app whose connections a test can cut.
struct Relay {
    base: String,
    live: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn start(target: &str) -> Relay {
        let target = target.trim_start_matches("http://").to_string();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let live: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let live2 = live.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let Ok(server) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                live2
                    .lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                let pump = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                };
                pump(client.try_clone().unwrap(), server.try_clone().unwrap());
                pump(server, client);
            }
        });
        Relay { base, live }
    }

    /// Drops every open connection (new ones still get through).
    fn cut(&self) {
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

#[tokio::test]
async fn follow_resumes_after_the_last_event_when_the_connection_drops() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/servers/r", vec![status("deploying")]);
    let app = App::start(&db).await;
    let relay = Relay::start(&app.base);
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let live = Live::spawn(&relay.base, &["follow", &id]);
    live.wait_for_lines(2).await; // created, state deploying
    relay.cut();
    // The client notices, and reconnects with Last-Event-ID: 2.
    let noticed = live
        .printed(Duration::from_secs(10), |_, stderr| {
            stderr.contains("reconnecting after event 2")
        })
        .await;
    assert!(noticed, "stderr: {}", live.stderr.lock().unwrap());
    up.script("/servers/r", vec![status("on")]);
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 0, "{lines:?} {stderr}");
    let kinds: Vec<&str> = lines.iter().map(|l| kind_of(l)).collect();
    assert_eq!(
        kinds,
        ["created", "state", "state", "succeeded"],
        "no event twice, none lost: {lines:?}"
    );
    finish(app, db).await;
}

#[tokio::test]
async fn ctrl_c_prints_one_clean_line_exits_130_and_leaves_the_wait_running() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/servers/c", vec![status("deploying")]);
    let app = App::start(&db).await;
    let file = fast_spec_file(json!({
        "target": {"url": url}, "state": "/data/attributes/status", "want": ["on"]
    }));
    let live = Live::spawn(
        &app.base,
        &["create", "--wait", "--spec", file.to_str().unwrap()],
    );
    live.wait_for_lines(2).await; // the wait, state deploying
    let id = live.lines()[0].split(' ').next().unwrap().to_string();
    live.signal("-INT");
    let (code, _, stderr) = live.finish().await;
    assert_eq!(code, 130, "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert_eq!(
        stderr.trim_end(),
        format!(
            "waitd: interrupted; wait {id} keeps running on the server (waitd cancel {id} stops it)"
        )
    );
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    let _ = std::fs::remove_file(file);
    finish(app, db).await;
}

#[tokio::test]
async fn ctrl_c_with_cancel_on_interrupt_cancels_the_wait() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/servers/c", vec![status("deploying")]);
    let app = App::start(&db).await;
    let (_, w) = app.create(spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let live = Live::spawn(&app.base, &["follow", "--cancel-on-interrupt", &id]);
    live.wait_for_lines(2).await;
    live.signal("-INT");
    let (code, _, stderr) = live.finish().await;
    assert_eq!(code, 130, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!("waitd: interrupted; canceled wait {id}")
    );
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "canceled", "{w}");
    finish(app, db).await;
}

#[tokio::test]
async fn get_list_and_cancel_print_short_lines_or_json() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/servers/g", vec![status("deploying")]);
    let app = App::start(&db).await;
    let mut ids = Vec::new();
    for p in ["1", "2"] {
        let mut s = spec(&url);
        s["labels"] = json!({"pipeline": p});
        let (_, w) = app.create(s).await;
        ids.push(w["id"].as_str().unwrap().to_string());
    }
    let (a, b) = (&ids[0], &ids[1]);

    let run = waitd(&app.base, &["list", "--status", "running"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let listed: Vec<&str> = run
        .stdout
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(listed, [b.as_str(), a.as_str()], "newest first: {run:?}");

    let run = waitd(&app.base, &["list", "--label", "pipeline=1", "--json"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let items: Vec<Value> = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(&items[0]["id"], a.as_str());

    let run = waitd(&app.base, &["cancel", a]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout.trim_end(),
        format!("{a} canceled state=deploying: canceled by a client")
    );

    let run = waitd(&app.base, &["get", a]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.starts_with(&format!("{a} canceled")), "{run:?}");
    let run = waitd(&app.base, &["get", "--json", a]).await;
    let w: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(w["status"], "canceled");
    finish(app, db).await;
}

#[tokio::test]
async fn usage_and_server_problems_exit_5_with_a_sentence() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;

    // Nothing to wait for.
    let run = waitd(&app.base, &["create"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("--preset NAME"), "{run:?}");
    // A flag clap does not know.
    let run = waitd(&app.base, &["list", "--colour"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    // A mistyped command, or a serve flag that does not exist: 5, not clap's 2
    // (which would read as "timed out").
    let run = waitd(&app.base, &["crate"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("crate"), "{run:?}");
    let run = waitd(&app.base, &["--no-such-flag"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    let run = waitd(&app.base, &["--help"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    // A malformed --param.
    let run = waitd(
        &app.base,
        &["create", "--preset", "latitude.server", "--param", "sv_1"],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("--param takes NAME=VALUE"), "{run:?}");
    // The server's 422, with its sentence.
    let run = waitd(&app.base, &["create", "--preset", "latitude.server"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stderr
            .contains("params.server_id is required by preset latitude.server"),
        "{run:?}"
    );
    // No such wait.
    let missing = uuid::Uuid::now_v7().to_string();
    let run = waitd(&app.base, &["get", &missing]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stderr.contains(&format!("there is no wait {missing}")),
        "{run:?}"
    );
    let run = waitd(&app.base, &["follow", &missing]).await;
    assert_eq!(run.code, 5, "{run:?}");
    let run = waitd(&app.base, &["follow", "not-an-id"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    // No server there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let run = waitd(&format!("http://127.0.0.1:{port}"), &["list"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stderr.contains("cannot reach the waitd server"),
        "{run:?}"
    );
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    finish(app, db).await;
}

#[tokio::test]
async fn the_api_token_comes_from_waitd_token() {
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--tokens", "ci:0123456789abcdef-ci"]).await;
    let run = waitd(&app.base, &["list"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("WAITD_TOKEN"), "{run:?}");
    let run = waitd_env(
        &app.base,
        &["list"],
        &[("WAITD_TOKEN", "0123456789abcdef-ci")],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    finish(app, db).await;
}

#[tokio::test]
async fn create_takes_webhooks_from_flags_with_the_secret_from_a_file_and_never_prints_it() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let rx = support::receiver::Receiver::start().await;
    let ok = up.script("/servers/hooked", vec![status("on")]);
    let app = App::start(&db).await;
    let spec = fast_spec_file(json!({"state": "/data/attributes/status", "want": ["on"]}));
    let spec = spec.to_str().unwrap();
    let dir = TempDir::new("waitd-cli-hook");
    let secret_file = dir.path.join("hook.secret");
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let (a, b) = (rx.url("/a"), rx.url("/b"));
    let run = waitd(
        &app.base,
        &[
            "create",
            "--wait",
            "--json",
            "--spec",
            spec,
            "--url",
            &ok,
            "--notify",
            &a,
            "--notify",
            &b,
            "--notify-secret-file",
            secret_file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stdout.contains(&secret[6..]) && !run.stderr.contains(&secret[6..]));
    let w: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(w["spec"]["notify"][1]["url"], b.as_str());
    assert_eq!(w["spec"]["notify"][0]["secret"], "<redacted>");
    assert!(rx.until_got("/a", 1, Duration::from_secs(10)).await);
    assert!(rx.until_got("/b", 1, Duration::from_secs(10)).await);
    // A file without a secret: exit 5, and the file's text is not printed.
    std::fs::write(&secret_file, "hunter2\n").unwrap();
    let run = waitd(
        &app.base,
        &[
            "create",
            "--url",
            &ok,
            "--spec",
            spec,
            "--notify",
            &a,
            "--notify-secret-file",
            secret_file.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stderr.contains("does not hold a webhook secret") && !run.stderr.contains("hunter2"),
        "{run:?}"
    );
    // --notify without the secret file is a usage error.
    let run = waitd(&app.base, &["create", "--url", &ok, "--notify", &a]).await;
    assert_eq!(run.code, 5, "{run:?}");
    finish(app, db).await;
}

#[tokio::test]
async fn server_goes_before_or_after_the_command_and_cancel_takes_several_ids() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/servers/m", vec![status("deploying")]);
    let app = App::start(&db).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (_, w) = app.create(spec(&url)).await;
        ids.push(w["id"].as_str().unwrap().to_string());
    }
    let (a, b) = (ids[0].as_str(), ids[1].as_str());
    // WAITD_URL names a server that is not there: only --server can reach it.
    let nowhere = "http://127.0.0.1:1";
    let run = waitd(nowhere, &["--server", &app.base, "get", a]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.starts_with(&format!("{a} running")), "{run:?}");
    let run = waitd(nowhere, &["get", a, "--server", &app.base]).await;
    assert_eq!(run.code, 0, "{run:?}");

    let run = waitd(&app.base, &["cancel", a, b]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let canceled: Vec<&str> = run
        .stdout
        .lines()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(canceled, [a, b], "{run:?}");
    for id in [a, b] {
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "canceled", "{w}");
    }

    // A typo among the ids cancels nothing.
    let (_, w) = app.create(spec(&url)).await;
    let c = w["id"].as_str().unwrap();
    let run = waitd(&app.base, &["cancel", c, "not-an-id"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(
        run.stderr.contains("\"not-an-id\" is not a wait id"),
        "{run:?}"
    );
    let (_, w) = app.get(&format!("/waits/{c}")).await;
    assert_eq!(w["status"], "running", "{w}");

    // --server means nothing to serve: a usage mistake, not ignored.
    let run = waitd(&app.base, &["serve", "--server", &app.base]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("--listen"), "{run:?}");
    finish(app, db).await;
}
