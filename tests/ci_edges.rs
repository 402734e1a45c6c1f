//! The CI path at its edges: what a blocked curl sees across restarts and at every
//! bad end, what a 202 shows, a deadline against a target that never answers, URLs
//! that would mean another host, a narrowed allow-list, the end counters, and what
//! start-up and a broken database say.

mod support;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use support::follower::send;
use support::replica::{Replica, free_port, replica_args};
use support::{App, PgProxy, Reply, TempDir, TestDb, Upstream, client, eventually, spec};

/// Runs `curl` with `args`; returns its exit code, stdout and how long it took.
async fn curl(args: Vec<String>) -> (i32, String, Duration) {
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        let out = std::process::Command::new("curl")
            .args(&args)
            .output()
            .expect("curl is installed");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            started.elapsed(),
        )
    })
    .await
    .unwrap()
}

/// The documented resilient one-liner (docs/api.md), against `base`, with a fast
/// retry delay.
fn one_liner(base: &str, key: &str, spec: &Value) -> Vec<String> {
    [
        "--fail-with-body",
        "-sS",
        "--retry",
        "30",
        "--retry-delay",
        "1",
        "--retry-connrefused",
        "-H",
        &format!("Idempotency-Key: {key}"),
        "-X",
        "POST",
        &format!("{base}/waits?wait=true"),
        "-d",
        &spec.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The JSON values curl printed, one after another.
fn json_values(out: &str) -> Vec<Value> {
    serde_json::Deserializer::from_str(out)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("curl printed something that is not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_curl_with_retry_rides_a_rolling_restart_and_exits_by_how_the_wait_ended() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let dir = TempDir::new("waitd-rolling");
    let mut a = Replica::start("a", &dir.path, &db.url, "1s", &[]).await;
    let mut b = Replica::start("b", &dir.path, &db.url, "1s", &[]).await;

    let url = up.script("/roll", vec![Reply::status("deploying")]);
    let mut s = spec(&url);
    s["timeout"] = json!("60s");
    let run = tokio::spawn(curl(one_liner(&a.base, "rolling-1", &s)));
    let created = up.hit("/roll", 1, Duration::from_secs(5)).await;
    assert!(created, "the wait was never polled");
    // A rolling restart: a, then b, each stopped with SIGTERM and started again.
    for r in [&mut a, &mut b] {
        r.signal("TERM");
        assert!(r.wait_exit(Duration::from_secs(10)).await.is_some());
        r.respawn();
        r.ready(Duration::from_secs(15)).await;
    }
    up.script("/roll", vec![Reply::status("on")]);
    let (code, out, _) = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("curl ends")
        .unwrap();
    assert_eq!(code, 0, "curl: {out}\n{}", a.log_tail(20));
    // --fail-with-body prints every answer's body, the 503s it retried included:
    // the last is the wait.
    let bodies = json_values(&out);
    let (w, retried) = bodies.split_last().expect("curl printed the wait");
    assert_eq!(w["status"], "succeeded", "{w}");
    for r in retried {
        assert_eq!(r["status"], 503, "only 503s are retried: {out}");
    }
    // The retried POST blocked on the same wait rather than creating another.
    let list = send(client().get(a.url("/waits"))).await;
    assert_eq!(
        list.body["items"].as_array().unwrap().len(),
        1,
        "{}",
        list.body
    );

    // Every bad end: a non-zero exit at once, not a retry with backoff.
    let failed = up.script("/failed", vec![Reply::status("failed_deployment")]);
    let refused = up.script("/refused", vec![Reply::json(401, json!({"message": "no"}))]);
    let slow = up.script("/slow", vec![Reply::status("deploying")]);
    let mut short = spec(&slow);
    short["timeout"] = json!("800ms");
    for (name, s, status) in [
        ("failed", spec(&failed), "failed"),
        ("error", spec(&refused), "error"),
        ("timed_out", short, "timed_out"),
    ] {
        let (code, out, took) = curl(one_liner(&b.base, &format!("bad-{name}"), &s)).await;
        assert_eq!(code, 22, "{name}: curl --fail-with-body fails: {out}");
        assert!(took < Duration::from_secs(3), "{name}: curl took {took:?}");
        // The body is the wait, so the job's log says how and why it ended.
        let w: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(w["status"], status, "{name}: {w}");
        assert!(w["reason"].is_string(), "{name}: {w}");
        let list = send(client().get(b.url(&format!("/waits?status={status}")))).await;
        assert_eq!(
            list.body["items"].as_array().unwrap().len(),
            1,
            "{name}: {}",
            list.body
        );
    }
    drop((a, b));
    db.drop_db().await;
}

#[tokio::test]
async fn a_202_shows_the_wait_as_it_is_when_the_duration_runs_out() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/busy", vec![Reply::json(503, json!({}))]);
    let app = App::start(&db).await;
    let mut s = spec(&url);
    s["retry"] = json!({"delay": "20ms", "max_delay": "20ms", "max_retries": null});
    let (status, h, w) = common_send(app.client.post(app.url("/waits?wait=400ms")).json(&s)).await;
    assert_eq!(status, 202, "{w}");
    assert!(h.get("location").is_some());
    assert_eq!(w["status"], "running");
    assert!(w["polls"].as_i64().unwrap() >= 2, "{w}");
    assert!(w["retries"].as_i64().unwrap() >= 1, "{w}");
    assert!(
        w["last_error"].as_str().unwrap_or("").contains("503"),
        "{w}"
    );
    let id = w["id"].as_str().unwrap();
    let (status, _, w) =
        common_send(app.client.get(app.url(&format!("/waits/{id}?wait=300ms")))).await;
    assert_eq!(status, 202);
    assert!(w["polls"].as_i64().unwrap() >= 4, "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

async fn common_send(req: reqwest::RequestBuilder) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let h = r.headers().clone();
    (status, h, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_probe_that_never_answers_is_cut_at_the_deadline() {
    let db = TestDb::new().await;
    // A target that accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/hang", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in listener.incoming() {
            held.push(c);
        }
    });
    let app = App::start_with(&db, &["--probe-timeout", "10s"]).await;
    let mut s = spec(&url);
    s["timeout"] = json!("700ms");
    let (status, w) = app.create(s).await;
    assert_eq!(status, 201);
    let id = w["id"].as_str().unwrap().to_string();
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    let at = |k: &str| chrono::DateTime::parse_from_rfc3339(w[k].as_str().unwrap()).unwrap();
    let late = at("finished_at") - at("deadline");
    assert!(
        late < chrono::TimeDelta::milliseconds(500),
        "ended {late} after the deadline"
    );
    assert!(
        w["reason"]
            .as_str()
            .unwrap()
            .contains("had not answered by the wait's deadline"),
        "{w}"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn urls_the_parser_would_rewrite_into_another_host_are_refused() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    for url in [
        "http:///x",
        "http:////x",
        "http:x",
        "http:/x",
        "https:///",
        "http:\\\\x/",
        "http://a\\b/",
        "http://ex ample.com/",
        "http://ex\tample.com/",
        "http://example.com/a\nb",
        " http://example.com/",
    ] {
        let (status, w) = app.create(spec(url)).await;
        assert_eq!(status, 400, "{url:?}: {w}");
        assert_eq!(w["errors"][0]["field"], "target.url", "{url:?}: {w}");
    }
    // The odd IPv4 spellings name the same host and are the guard's to judge.
    let (status, w) = app.create(spec("http://2130706433/x")).await;
    assert_eq!(status, 201, "{w}");
    assert_eq!(w["spec"]["target"]["url"], "http://127.0.0.1/x");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn every_end_is_counted_once_whoever_ended_it() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let app = App::start(&db).await;
    let slow = up.script("/slow", vec![Reply::status("deploying")]);
    let fast = up.script("/fast", vec![Reply::status("on")]);
    let mut heard = app.heard();
    let (_, w) = app.create(spec(&slow)).await;
    let id = w["id"].as_str().unwrap().to_string();
    let (_, w) = app.create(spec(&fast)).await;
    let fast_id = w["id"].as_str().unwrap().to_string();
    app.wait_end(&fast_id).await;
    for _ in 0..2 {
        let (status, w) = app.post(&format!("/waits/{id}/cancel")).await;
        assert_eq!((status, w["status"].as_str()), (200, Some("canceled")));
    }
    // The worker counts an end once its write is back, a moment after readers can
    // see it (a cancel is counted before it is answered).
    let counted = |metrics: &str, canceled: u64| {
        [("canceled", canceled), ("succeeded", 1), ("error", 0)]
            .iter()
            .all(|(status, n)| {
                metrics.contains(&format!(
                    "waitd_waits_ended_total{{status=\"{status}\"}} {n}\n"
                ))
            })
    };
    let read = || async {
        let r = app.client.get(app.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    };
    heard.ended(&fast_id).await;
    let metrics = read().await;
    assert!(counted(&metrics, 1), "{metrics}");
    // And no more afterwards: the second cancel found it ended, and the worker that
    // held the wait does not count it again. The point: the count does not grow
    // while the worker goes round three times since the cancels' notices (its own
    // wait, canceled, counts one).
    app.turns(&up, 3).await;
    let metrics = read().await;
    assert!(counted(&metrics, 2), "{metrics}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_narrower_allow_list_ends_waits_it_refuses_with_a_warn_line_naming_id_and_host() {
    let up = Upstream::start().await;
    let url = up.script("/guarded", vec![Reply::status("deploying")]);
    let dir = TempDir::new("waitd-allow");
    let store = dir.sqlite_url();
    let mut r = Replica::start("allow", &dir.path, &store, "1s", &[]).await;
    let a = send(
        client()
            .post(r.url("/waits"))
            .json(&spec(&format!("{url}?token=s3cret"))),
    )
    .await;
    let id = a.body["id"].as_str().unwrap().to_string();
    assert!(up.hit("/guarded", 1, Duration::from_secs(5)).await);
    r.signal("TERM");
    r.wait_exit(Duration::from_secs(10)).await;
    // The same replica, without the allow-list.
    let port = free_port();
    let args = support::unset_flag(replica_args(&store, port, "1s", &[]), "--allow-targets");
    let mut r = Replica::spawn("allow", &dir.path, port, args);
    r.ready(Duration::from_secs(15)).await;
    let w = send(client().get(r.url(&format!("/waits/{id}?wait=5s")))).await;
    assert_eq!(w.body["status"], "error", "{}", w.body);
    let warned = r.log_events("the SSRF guard refuses this wait's target; it ends in error");
    assert_eq!(warned.len(), 1, "{}", r.log_tail(20));
    assert_eq!(warned[0]["level"], "WARN");
    assert_eq!(warned[0]["fields"]["wait_id"], id);
    assert_eq!(warned[0]["fields"]["host"], "127.0.0.1");
    assert!(
        !r.log_text().contains("s3cret"),
        "the query string was logged"
    );
}

/// A child process killed when the test ends, whether it passed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `waitd serve` on `port` and `database_url`, with tokens and an allow-list, its
/// log as JSON on a pipe.
fn serve_logging(port: u16, database_url: &str) -> std::process::Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_waitd"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            database_url,
            "--tokens",
            "ci:0123456789abcdef-ci,ci:0123456789abcdef-c2,dash:0123456789abcdef-d1",
            "--allow-targets",
            "10.0.0.0/8,api.internal",
            "--log-format",
            "json",
        ])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn start_up_says_in_one_line_what_it_runs_with() {
    let port = free_port();
    let child = serve_logging(port, "postgres://postgres:hunter2@127.0.0.1:1/nowhere");
    // Postgres is not there: it says where, and stops; never with the password.
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("127.0.0.1:1"), "{err}");
    assert!(!err.contains("hunter2"), "the password was printed: {err}");
    let dir = TempDir::new("waitd-startup");
    let mut child = KillOnDrop(serve_logging(
        port,
        &format!("sqlite://{}", dir.path.join("w.db").display()),
    ));
    let c = client();
    let up = eventually(Duration::from_secs(10), || async {
        c.get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .is_ok()
    })
    .await;
    assert!(up);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    let _ = child.0.wait();
    let mut err = String::new();
    use std::io::Read;
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let line: Value = err
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "waitd starting")
        .unwrap_or_else(|| panic!("no start-up line in:\n{err}"));
    let f = &line["fields"];
    assert_eq!(line["level"], "INFO");
    assert!(
        f["store"].as_str().unwrap().starts_with("SQLite file "),
        "{f}"
    );
    assert_eq!(f["auth"], "3 tokens for 2 tenants", "{f}");
    assert_eq!(f["allow_targets"], "10.0.0.0/8,api.internal", "{f}");
    assert!(
        f["worker"].as_str().unwrap().contains("capacity 100000"),
        "{f}"
    );
    assert_eq!(f["addr"], format!("127.0.0.1:{port}"), "{f}");
    assert!(f["max_connections"].as_u64().is_some(), "{f}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_resumes_waits_says_how_many() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let dir = TempDir::new("waitd-resume");
    let mut r = Replica::start("resume", &dir.path, &db.url, "1s", &[]).await;
    for i in 0..3 {
        let url = up.script(&format!("/r/{i}"), vec![Reply::status("deploying")]);
        let a = send(client().post(r.url("/waits")).json(&spec(&url))).await;
        assert_eq!(a.status, 201);
    }
    assert!(
        up.requested(Duration::from_secs(5), |up| {
            (0..3).all(|i| up.hits(&format!("/r/{i}")) > 0)
        })
        .await
    );
    const RESUMED: &str = "resumed waits polled before by another replica or an earlier run";
    let before = r.log_events(RESUMED).len();
    r.kill9();
    r.respawn();
    r.ready(Duration::from_secs(15)).await;
    // The restarted replica takes the three over once the dead one's lease ends, in
    // one claim or a few, and says so.
    let resumed = eventually(Duration::from_secs(10), || async {
        r.log_events(RESUMED)[before..]
            .iter()
            .map(|e| e["fields"]["resumed"].as_u64().unwrap_or(0))
            .sum::<u64>()
            >= 3
    })
    .await;
    assert!(resumed, "{}", r.log_tail(20));
    assert_eq!(r.log_events(RESUMED)[before]["level"], "INFO");
    drop(r);
    db.drop_db().await;
}

#[tokio::test]
async fn a_broken_database_is_named_with_host_port_database_and_cause() {
    // Nothing listening there.
    let port = free_port();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitd"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{}", free_port()),
            "--database-url",
            &format!("postgres://postgres@127.0.0.1:{port}/waitd_ci"),
        ])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.contains("database \"waitd_ci\""), "{err}");
    assert!(err.contains("refused"), "{err}");
    assert!(!err.contains("pool timed out"), "{err}");
    // A database that does not exist, and a user that does not.
    let admin = url::Url::parse(&support::admin_url()).unwrap();
    for (url, says) in [
        (
            format!(
                "postgres://postgres@{}:{}/waitd_no_such_db",
                admin.host_str().unwrap(),
                admin.port().unwrap_or(5432)
            ),
            "does not exist; create it",
        ),
        (
            format!(
                "postgres://nobody_here@{}:{}/postgres",
                admin.host_str().unwrap(),
                admin.port().unwrap_or(5432)
            ),
            "authentication failed",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_waitd"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{}", free_port()),
                "--database-url",
                &url,
            ])
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains(says), "{url}: {err}");
    }

    // A database that goes away under a running replica: /readyz says where and why.
    let db = TestDb::new().await;
    let proxy = PgProxy::start();
    let app = App::start_args(support::test_args(&proxy.url(&db))).await;
    proxy.cut();
    let r = app.client.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_some());
    let body: Value = r.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("127.0.0.1:{}", proxy.port)),
        "{detail}"
    );
    assert!(
        detail.contains(&format!("database \"{}\"", db.name)),
        "{detail}"
    );
    proxy.restore();
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
