//! The harness of the tests and of the load benchmark (`benches/load.rs` includes it
//! with `#[path]`): a fresh Postgres database per test, a scripted upstream standing
//! in for the cloud APIs, and waitd itself on 127.0.0.1:0. Its parts for waitd as
//! separate processes are the submodules: [`replica`] (the `waitd` binary), [`pg`] (a
//! Postgres cluster of the test's own), [`recorder`] (an upstream that records which
//! replica sent each probe) and [`follower`] (an SSE client); [`in_process`] is waitd
//! without a socket or Postgres, for what the API answers.
//!
//! Each binary uses some of it, hence the module-wide `dead_code` allowance.
#![allow(dead_code)]

pub mod collector;
pub mod follower;
pub mod hostile_cel;
pub mod in_process;
pub mod issuer;
pub mod pg;
pub mod receiver;
pub mod recorder;
pub mod replica;
pub mod signals;
pub mod stores;
pub mod venv;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sqlx::Connection;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The server the tests use; `WAITD_TEST_DATABASE_URL` points elsewhere.
pub fn admin_url() -> String {
    std::env::var("WAITD_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A throwaway database, dropped by [`TestDb::drop_db`] (or left for CI's sweep).
pub struct TestDb {
    pub name: String,
    pub url: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let admin = admin_url();
        let name = format!("waitd_t_{}", uuid::Uuid::now_v7().simple());
        let mut conn = sqlx::PgConnection::connect(&admin)
            .await
            .expect("tests need Postgres: set WAITD_TEST_DATABASE_URL or run .ci/run");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let base = admin
            .rsplit_once('/')
            .map(|(b, _)| b.to_string())
            .unwrap_or(admin.clone());
        TestDb {
            url: format!("{base}/{name}"),
            name,
        }
    }

    pub async fn drop_db(&self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&admin_url()).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut conn)
            .await;
        }
    }
}

/// One scripted answer of the upstream.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
}

impl Reply {
    pub fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body: body.to_string(),
            headers: vec![("content-type".into(), "application/json".into())],
            delay: Duration::ZERO,
        }
    }

    /// `{"data": {"attributes": {"status": s}}}`, the Latitude.sh shape.
    pub fn status(s: &str) -> Reply {
        Reply::json(200, json!({"data": {"attributes": {"status": s}}}))
    }

    pub fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.into(), v.into()));
        self
    }
}

#[derive(Default)]
struct Script {
    /// Per path: the replies left; the last one repeats.
    replies: HashMap<String, Vec<Reply>>,
    hits: HashMap<String, usize>,
    /// Per path: when its first request came.
    first: HashMap<String, std::time::Instant>,
    seen_headers: HashMap<String, Vec<HeaderMap>>,
}

/// A scripted HTTP server on 127.0.0.1:0 standing in for a cloud API. Each path has
/// its own script, so many waits can share one upstream.
#[derive(Clone)]
pub struct Upstream {
    pub base: String,
    script: Arc<Mutex<Script>>,
    /// Told of every request, for [`Upstream::hit`].
    hit: Arc<tokio::sync::Notify>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let script = Arc::new(Mutex::new(Script::default()));
        let hit = Arc::new(tokio::sync::Notify::new());
        let app = axum::Router::new()
            .route("/{*path}", axum::routing::get(answer))
            .with_state((script.clone(), hit.clone()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Upstream { base, script, hit }
    }

    /// Whether `path` has had at least `n` requests within `within`: woken by each
    /// request, not by a clock.
    pub async fn hit(&self, path: &str, n: usize, within: Duration) -> bool {
        self.requested(within, |up| up.hits(path) >= n).await
    }

    /// Whether `check` holds of the requests so far within `within`: looked at
    /// again as each request comes, not on a clock.
    pub async fn requested(&self, within: Duration, check: impl Fn(&Upstream) -> bool) -> bool {
        heard_that(&self.hit, within, || check(self)).await
    }

    /// Sets the script of `path` (e.g. "/servers/1"); returns the full URL.
    pub fn script(&self, path: &str, replies: Vec<Reply>) -> String {
        let mut s = self.script.lock().unwrap();
        s.replies
            .insert(path.trim_start_matches('/').to_string(), replies);
        format!("{}{}", self.base, path)
    }

    pub fn hits(&self, path: &str) -> usize {
        let s = self.script.lock().unwrap();
        s.hits
            .get(path.trim_start_matches('/'))
            .copied()
            .unwrap_or(0)
    }

    /// When `path`'s first request came, if one has.
    pub fn first_hit(&self, path: &str) -> Option<std::time::Instant> {
        let s = self.script.lock().unwrap();
        s.first.get(path.trim_start_matches('/')).copied()
    }

    pub fn headers_seen(&self, path: &str) -> Vec<HeaderMap> {
        let s = self.script.lock().unwrap();
        s.seen_headers
            .get(path.trim_start_matches('/'))
            .cloned()
            .unwrap_or_default()
    }
}

async fn answer(
    State((script, hit)): State<(Arc<Mutex<Script>>, Arc<tokio::sync::Notify>)>,
    Path(path): Path<String>,
    headers: HeaderMap,
) -> Response {
    let reply = {
        let mut s = script.lock().unwrap();
        *s.hits.entry(path.clone()).or_default() += 1;
        s.first
            .entry(path.clone())
            .or_insert_with(std::time::Instant::now);
        s.seen_headers
            .entry(path.clone())
            .or_default()
            .push(headers);
        match s.replies.get_mut(&path) {
            Some(list) if list.len() > 1 => Some(list.remove(0)),
            Some(list) => list.first().cloned(),
            None => None,
        }
    };
    hit.notify_waiters();
    let Some(reply) = reply else {
        return (StatusCode::NOT_FOUND, "no script").into_response();
    };
    if !reply.delay.is_zero() {
        // Pacing: a reply's scripted delay.
        tokio::time::sleep(reply.delay).await;
    }
    let mut res = (StatusCode::from_u16(reply.status).unwrap(), reply.body).into_response();
    for (k, v) in reply.headers {
        res.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            axum::http::HeaderValue::from_str(&v).unwrap(),
        );
    }
    res
}

/// The status and the JSON body (null when there is none) of a request.
async fn answered(request: reqwest::RequestBuilder) -> (u16, Value) {
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// waitd on 127.0.0.1:0 against a test database.
pub struct App {
    pub base: String,
    pub client: reqwest::Client,
    /// What it reports as it works: [`App::heard`].
    pub signals: signals::Signals,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), waitd::StartError>>>,
}

/// The first `Some` that `check` gives within `within`, looked at again each time
/// `notify` wakes (a request arrived, a line was printed, an export came): a
/// signal, not a clock. `None` when `within` passes first. The wake-up is armed
/// before each look, so a change between the look and the wait is not missed.
pub async fn heard<T>(
    notify: &tokio::sync::Notify,
    within: Duration,
    check: impl Fn() -> Option<T>,
) -> Option<T> {
    let heard = async {
        loop {
            let next = notify.notified();
            tokio::pin!(next);
            next.as_mut().enable();
            if let Some(v) = check() {
                return v;
            }
            next.await;
        }
    };
    tokio::time::timeout(within, heard).await.ok()
}

/// Whether `check` holds within `within`, as [`heard`] looks.
pub async fn heard_that(
    notify: &tokio::sync::Notify,
    within: Duration,
    check: impl Fn() -> bool,
) -> bool {
    heard(notify, within, || check().then_some(()))
        .await
        .is_some()
}

/// The CPU time this thread has run, from Linux's `/proc/thread-self/schedstat`
/// (nanoseconds on a CPU): a bound on what an input costs, which the other tests
/// sharing the machine's cores do not stretch as they stretch wall time.
pub fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat: the tests run on Linux");
    let ns = stat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("an unreadable schedstat: {stat}"));
    Duration::from_nanos(ns)
}

/// Flags every test app gets: millisecond polling, loopback targets allowed, short leases.
pub fn test_args(db_url: &str) -> Vec<String> {
    [
        "--database-url",
        db_url,
        "--min-poll-interval",
        "1ms",
        "--allow-targets",
        "127.0.0.1",
        "--lease-ttl",
        "3s",
        "--db-connections",
        "8",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// `args` with `flag` set to `value`: in place where it is given (the parser refuses
/// a flag given twice), else appended.
pub fn set_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    match args.iter().position(|a| a == flag) {
        Some(i) => args[i + 1] = value.to_string(),
        None => args.extend([flag.to_string(), value.to_string()]),
    }
    args
}

/// `args` without `flag` and its value.
pub fn unset_flag(mut args: Vec<String>, flag: &str) -> Vec<String> {
    if let Some(i) = args.iter().position(|a| a == flag) {
        args.drain(i..i + 2);
    }
    args
}

/// A client that gives up on a request after 30 s.
pub fn client() -> reqwest::Client {
    client_builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// reqwest's builder, with the TLS provider installed.
pub fn client_builder() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

impl App {
    pub async fn start(db: &TestDb) -> App {
        App::start_with(db, &[]).await
    }

    pub async fn start_with(db: &TestDb, extra: &[&str]) -> App {
        let mut args = test_args(&db.url);
        args.extend(extra.iter().map(|s| s.to_string()));
        App::start_args(args).await
    }

    /// Starts waitd with exactly these flags (see [`test_args`] for the usual ones),
    /// for tests that must change one of the usual flags rather than add one.
    pub async fn start_args(args: Vec<String>) -> App {
        let config = waitd::Config::from_args(args).expect("valid test flags");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let base = format!("http://{addr}");
        // Started: the store is migrated and the router built; the listener is
        // bound, so a request waits in its backlog until the server accepts it.
        let started = waitd::App::start(config, addr).await.expect("waitd starts");
        let signals = started.signals.clone();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(started.serve(listener, async move {
            let _ = rx.await;
        }));
        let app = App {
            base,
            client: client(),
            signals,
            stop: Some(tx),
            task: Some(task),
        };
        let ready = app.client.get(app.url("/readyz")).send().await;
        assert!(
            ready.is_ok_and(|r| r.status().is_success()),
            "waitd did not become ready"
        );
        app
    }

    /// The signals sent from now on.
    pub fn heard(&self) -> signals::Heard {
        signals::Heard::from(&self.signals)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Stops the app gracefully; returns what `serve` returned and how long it took.
    pub async fn stop(mut self) -> (Result<(), waitd::StartError>, Duration) {
        let started = std::time::Instant::now();
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let r = tokio::time::timeout(Duration::from_secs(20), self.task.take().unwrap())
            .await
            .expect("waitd stops within 20 s")
            .expect("serve task did not panic");
        (r, started.elapsed())
    }

    pub async fn create(&self, spec: Value) -> (u16, Value) {
        answered(self.client.post(self.url("/waits")).json(&spec)).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        answered(self.client.get(self.url(path))).await
    }

    pub async fn post(&self, path: &str) -> (u16, Value) {
        answered(self.client.post(self.url(path))).await
    }

    /// [`App::create`] as the tenant of the API token `token`.
    pub async fn create_as(&self, token: &str, spec: &Value) -> (u16, Value) {
        answered(
            self.client
                .post(self.url("/waits"))
                .bearer_auth(token)
                .json(spec),
        )
        .await
    }

    /// [`App::get`] as the tenant of the API token `token`.
    pub async fn get_as(&self, token: &str, path: &str) -> (u16, Value) {
        answered(self.client.get(self.url(path)).bearer_auth(token)).await
    }

    /// [`App::post`] as the tenant of the API token `token`.
    pub async fn post_as(&self, token: &str, path: &str) -> (u16, Value) {
        answered(self.client.post(self.url(path)).bearer_auth(token)).await
    }

    /// Blocks on the wait until it ends (bounded), returning its final form.
    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> String {
        client()
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Lets the worker go round `n` times, and proves it did: a wait of its own on
    /// `up` whose every poll finds a new state is polled and recorded `n` times,
    /// then canceled. What a test would otherwise sleep for ("no poll lands in the
    /// meantime") is anchored to the worker's progress rather than to a clock.
    pub async fn turns(&self, up: &Upstream, n: usize) {
        let path = format!("/turns/{}", uuid::Uuid::now_v7().simple());
        let flips = (0..=n)
            .map(|i| Reply::status(if i % 2 == 0 { "tick" } else { "tock" }))
            .collect();
        let url = up.script(&path, flips);
        let mut s = spec(&url);
        s["want"] = json!(["never"]);
        s["poll"] = json!({"initial": "1ms", "factor": 1, "max": "1ms", "jitter": 0});
        let mut heard = self.heard();
        let (status, w) = self.create(s).await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        heard.recorded_times(&id, n).await;
        let (status, w) = self.post(&format!("/waits/{id}/cancel")).await;
        assert_eq!(status, 200, "{w}");
    }

    pub async fn wait_end(&self, id: &str) -> Value {
        let (_, w) = self.get(&format!("/waits/{id}?wait=20s")).await;
        w
    }
}

/// A minimal valid spec polling `url` for the Latitude-shaped status.
pub fn spec(url: &str) -> Value {
    json!({
        "target": {"url": url},
        "state": "/data/attributes/status",
        "want": ["on"],
        "fail": ["failed_deployment"],
        "timeout": "20s",
        "poll": {"initial": "5ms", "max": "20ms", "jitter": 0},
        "retry": {"delay": "5ms", "max_delay": "20ms"}
    })
}

/// Calls `f` every 10 ms until it gives `Some`, which is returned, or `within` passes
/// (then `None`). Every wait for something to happen goes through here.
pub async fn poll_for<T, F, Fut>(within: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let until = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        // The one poll interval of poll_for.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Checks `check` until it holds or `within` passes: how long it took, if it held.
pub async fn until<F, Fut>(within: Duration, mut check: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = std::time::Instant::now();
    poll_for(within, || {
        let held = check();
        async move { held.await.then(|| started.elapsed()) }
    })
    .await
}

/// Checks `check` until it holds or `within` passes; returns whether it held.
pub async fn eventually<F, Fut>(within: Duration, check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until(within, check).await.is_some()
}

/// Runs a `SELECT count(*) …` directly against the test database.
pub async fn db_count(db: &TestDb, sql: &'static str) -> i64 {
    let mut conn = sqlx::PgConnection::connect(&db.url)
        .await
        .expect("connect to the test database");
    let n: i64 = sqlx::query_scalar(sql)
        .fetch_one(&mut conn)
        .await
        .expect("count query");
    let _ = conn.close().await;
    n
}

/// Runs one statement directly against the test database; returns the rows affected.
pub async fn db_exec(db: &TestDb, sql: &'static str) -> u64 {
    let mut conn = sqlx::PgConnection::connect(&db.url)
        .await
        .expect("connect to the test database");
    let n = sqlx::query(sql)
        .execute(&mut conn)
        .await
        .expect("statement")
        .rows_affected();
    let _ = conn.close().await;
    n
}

/// A TCP proxy in front of Postgres that a test can cut (every connection dropped,
/// new ones refused) and restore, to make the store unreachable for a while.
pub struct PgProxy {
    pub port: u16,
    up: Arc<std::sync::atomic::AtomicBool>,
    live: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl PgProxy {
    pub fn start() -> PgProxy {
        let admin = url::Url::parse(&admin_url()).expect("a URL");
        let target = format!(
            "{}:{}",
            admin.host_str().unwrap_or("127.0.0.1"),
            admin.port().unwrap_or(5432)
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let live: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let (up2, live2) = (up.clone(), live.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if !up2.load(std::sync::atomic::Ordering::SeqCst) {
                    let _ = client.shutdown(std::net::Shutdown::Both);
                    continue;
                }
                let Ok(server) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                {
                    let mut l = live2.lock().unwrap();
                    l.push(client.try_clone().unwrap());
                    l.push(server.try_clone().unwrap());
                }
                let pump = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                        let _ = from.shutdown(std::net::Shutdown::Both);
                    });
                };
                pump(client.try_clone().unwrap(), server.try_clone().unwrap());
                pump(server, client);
            }
        });
        PgProxy { port, up, live }
    }

    /// The test database's URL, through this proxy.
    pub fn url(&self, db: &TestDb) -> String {
        let mut u = url::Url::parse(&db.url).expect("a URL");
        u.set_host(Some("127.0.0.1")).unwrap();
        u.set_port(Some(self.port)).unwrap();
        u.to_string()
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        for s in self.live.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }

    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl App {
    /// waitd on the embedded SQLite store at `url` (`sqlite://PATH`), with the usual
    /// test flags.
    pub async fn start_sqlite(url: &str) -> App {
        let db = TestDb {
            name: String::new(),
            url: url.to_string(),
        };
        App::start(&db).await
    }
}

/// A fresh directory under the system temp dir, removed on drop unless the test is
/// failing or `WAITD_TEST_KEEP_LOGS` is set (then its path is printed, so the logs in
/// it can be read; `WAITD_TEST_RUST_LOG` sets the replicas' `RUST_LOG`).
pub struct TempDir {
    pub path: std::path::PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&path).expect("create a temp dir");
        TempDir { path }
    }

    /// A SQLite store in this directory.
    pub fn sqlite_url(&self) -> String {
        format!("sqlite://{}", self.path.join("waitd.db").display())
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

/// Reads from `s` until it closes; true when it closed within `within`.
pub async fn closes_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 1024];
    let until = std::time::Instant::now() + within;
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}
