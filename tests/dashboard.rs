//! The dashboard in a real browser: Debian's Chromium, headless, driven over WebDriver
//! (its chromedriver, which each test starts on a free port and stops) with
//! fantoccini. It checks what a person would see: the token form, the waits that
//! exist, waits appearing and changing live, a cancel from the detail view, a
//! callback wait approved and another rejected there (and no such buttons for a
//! read-only token), waitd restarted under the open page (the stream reconnects and
//! catches up, no event lost or repeated), a waitd whose history was reset (a 409:
//! the page loads again), and hostile values shown as text. It saves screenshots of the list and of a detail
//! view under `target/dashboard-screenshots/` (and one of the page when a check fails).
//!
//! It needs `chromium` and `chromedriver` (Debian: `apt-get install chromium
//! chromium-driver`; `.ci/run` installs them) and fails, saying so, when they are
//! missing: it is never skipped.

mod support;

#[path = "dashboard/forms.rs"]
mod forms;
#[path = "dashboard/groups.rs"]
mod groups;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use futures_util::{FutureExt, StreamExt};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use support::replica::Replica;
use support::{App, Reply, TestDb, Upstream};

const TOKENS: &str = "ci:0123456789abcdef-ci";
const TOKEN: &str = "0123456789abcdef-ci";
/// How long the page may take to show something before the test fails.
const PATIENCE: Duration = Duration::from_secs(5);

/// One browser at a time: each test runs a Chromium, on a machine that may have 2 cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Chromium's flags. Without the background-networking ones, Chromium keeps calling
/// home, and a closed network refuses it.
const CHROME_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,900",
];

/// Where screenshots go: `<target dir>/dashboard-screenshots/`.
fn screenshot_dir() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let dir = tmp
        .parent()
        .map(|t| t.join("dashboard-screenshots"))
        .unwrap_or_else(|| tmp.join("dashboard-screenshots"));
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir
}

/// A program on PATH (or in /usr/bin), or a failure saying how to install it.
fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "tests/dashboard.rs drives a real browser and needs `{name}`, which is not \
                 installed: install Chromium and its WebDriver (Debian: apt-get install -y \
                 chromium chromium-driver; .ci/run installs them)"
            )
        })
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

type Outcome = Result<(), Box<dyn std::any::Any + Send>>;

/// A headless Chromium under its own chromedriver. The driver runs in a process
/// group of its own, so that stopping it stops the browser it started too.
struct Browser {
    c: Client,
    driver: Child,
    dir: support::TempDir,
}

impl Browser {
    async fn start() -> Browser {
        let chromium = tool("chromium");
        let chromedriver = tool("chromedriver");
        let dir = support::TempDir::new("waitd-browser");
        let profile = dir.path.join("profile");
        let log_path = dir.path.join("chromedriver.log");
        // Appended to by the driver (stderr) and by the thread that reads its stdout.
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .unwrap();
        let port = support::replica::free_port();
        let mut driver = Command::new(&chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log.try_clone().unwrap())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", chromedriver.display()));
        // It says on stdout once it serves: its lines go on to the log, and that one
        // is heard. The sender dropped unsent means its output ended first.
        let (said, started) = tokio::sync::oneshot::channel::<()>();
        let out = driver.stdout.take().unwrap();
        std::thread::spawn(move || {
            let (mut log, mut said) = (log, Some(said));
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                if line.contains("ChromeDriver was started successfully")
                    && let Some(said) = said.take()
                {
                    let _ = said.send(());
                }
            }
        });
        let driver_url = format!("http://127.0.0.1:{port}");
        let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        match tokio::time::timeout(Duration::from_secs(15), started).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                kill_group(&mut driver);
                panic!(
                    "chromedriver's output ended before it started; its log:\n{}",
                    read_log()
                );
            }
            Err(_) => {
                kill_group(&mut driver);
                panic!(
                    "chromedriver did not start on port {port} within 15 s; its log:\n{}",
                    read_log()
                );
            }
        }
        let mut args: Vec<String> = CHROME_ARGS.iter().map(|s| s.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({
            "browserName": "chrome",
            // An alert stays open, so that the test can see that none did.
            "unhandledPromptBehavior": "ignore",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        });
        let caps = caps.as_object().unwrap().clone();
        let c = match ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&driver_url)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                kill_group(&mut driver);
                let log =
                    std::fs::read_to_string(dir.path.join("chromedriver.log")).unwrap_or_default();
                panic!("chromedriver could not start Chromium: {e}; its log:\n{log}");
            }
        };
        Browser { c, driver, dir }
    }

    /// Ends the session (Chromium quits) and stops chromedriver.
    async fn quit(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.c.clone().close()).await;
        kill_group(&mut self.driver);
    }

    /// Runs a scenario; when it fails, saves a screenshot and prints what the page
    /// showed. See [`Browser::finish`].
    async fn run<F: std::future::Future<Output = ()>>(&self, name: &str, scenario: F) -> Outcome {
        let outcome = AssertUnwindSafe(scenario).catch_unwind().await;
        if outcome.is_err() {
            if let Ok(png) = self.c.screenshot().await {
                let path = screenshot_dir().join(format!("failure-{name}.png"));
                let _ = std::fs::write(&path, png);
                eprintln!("the page when {name} failed: {}", path.display());
            }
            eprintln!("{}", self.describe().await);
            let log =
                std::fs::read_to_string(self.dir.path.join("chromedriver.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            eprintln!(
                "chromedriver's last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        outcome
    }

    /// Quits, then passes a failure of the scenario on.
    async fn finish(self, outcome: Outcome) {
        self.quit().await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    async fn describe(&self) -> String {
        let state = self
            .c
            .execute(
                "return JSON.stringify({hook: window.__waitd, url: location.href, \
                 banner: document.getElementById('banner')?.innerText, \
                 text: document.body.innerText.slice(0, 3000)}, null, 1)",
                vec![],
            )
            .await;
        match state {
            Ok(v) => format!("page: {}", v.as_str().unwrap_or_default()),
            Err(e) => format!("page: unreadable ({e})"),
        }
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.c
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("the script failed: {e}\n{script}"))
    }

    /// Waits until `ok` holds of what `script` returns in the page (for at most
    /// `within`); returns that value. The page is looked at again each time it
    /// changes (a DOM mutation, or a change of `window.__waitd`, which the page
    /// announces with a `waitd-hook` event), not on a clock.
    async fn shows(
        &self,
        what: &str,
        within: Duration,
        script: &str,
        args: Vec<Value>,
        ok: impl Fn(&Value) -> bool,
    ) -> Value {
        let until = Instant::now() + within;
        let mut seen = Value::Null;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let (v, key) = self.changed(script, &args, &seen, left).await;
            if ok(&v) {
                return v;
            }
            if left.is_zero() {
                panic!("the page did not show {what} within {within:?}; it showed {v}");
            }
            seen = key;
        }
    }

    /// What `script` returns once it differs from `seen` (its JSON text as the
    /// page wrote it; null: at once), or after `within`: the value and its text.
    async fn changed(
        &self,
        script: &str,
        args: &[Value],
        seen: &Value,
        within: Duration,
    ) -> (Value, Value) {
        // Under WebDriver's script timeout (30 s); a longer wait looks again.
        let ms = within.min(Duration::from_secs(20)).as_millis() as u64;
        let mut a = args.to_vec();
        a.push(seen.clone());
        a.push(json!(ms));
        let waiting = format!("{AWAIT_CHANGE_HEAD}\n{script}\n{AWAIT_CHANGE_TAIL}");
        let answer = match self.c.execute_async(&waiting, a).await {
            Ok(answer) => answer,
            // A page that navigated (a reload) ends the script: look at the new one.
            Err(_) => {
                let v = self.js(script, args.to_vec()).await;
                return (v, Value::Null);
            }
        };
        if let Some(e) = answer.get("threw") {
            panic!("the script failed: {e}\n{script}");
        }
        (answer["value"].clone(), answer["key"].clone())
    }

    /// Waits until the element `css` is shown, then clicks it as a person would.
    /// The page re-renders a view when an event arrives, so the element found may
    /// be replaced before the click lands ("stale element"): then it is found
    /// again, as a person would find the new button.
    async fn click(&self, css: &str) {
        let until = Instant::now() + PATIENCE;
        loop {
            self.shows(
                &format!("a clickable {css}"),
                PATIENCE,
                "const n = document.querySelector(arguments[0]); \
                 return !!n && !n.closest('[hidden]') && !n.disabled && n.getClientRects().length > 0;",
                vec![json!(css)],
                truthy,
            )
            .await;
            let clicked = match self.c.find(Locator::Css(css)).await {
                Ok(n) => n.click().await,
                Err(e) => Err(e),
            };
            match clicked {
                Ok(()) => return,
                Err(e) if e.to_string().contains("stale element") && Instant::now() < until => {
                    continue;
                }
                Err(e) => panic!("click {css}: {e}"),
            }
        }
    }

    /// Types the token into the form the page shows when the API answers 401.
    async fn enter_token(&self) {
        self.shows(
            "the token form",
            PATIENCE,
            "return !!document.querySelector('[data-testid=\"token-form\"]');",
            vec![],
            truthy,
        )
        .await;
        self.c
            .find(Locator::Css("[data-testid=\"token-input\"]"))
            .await
            .unwrap()
            .send_keys(TOKEN)
            .await
            .unwrap();
        self.click("[data-testid=\"token-submit\"]").await;
        self.shows(
            "the list after the token was accepted",
            PATIENCE,
            "return !document.querySelector('[data-testid=\"token-form\"]') && \
             window.__waitd.ready && window.__waitd.streamState === 'connected';",
            vec![],
            truthy,
        )
        .await;
    }

    /// Waits until the row of wait `id` satisfies `ok`; returns {status, state, labels}.
    async fn row(
        &self,
        what: &str,
        id: &str,
        within: Duration,
        ok: impl Fn(&Value) -> bool,
    ) -> Value {
        self.shows(what, within, ROW, vec![json!(id)], ok).await
    }

    async fn save_screenshot(&self, name: &str) -> PathBuf {
        let png = self.c.screenshot().await.expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let path = screenshot_dir().join(name);
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        kill_group(&mut self.driver);
    }
}

/// Stops chromedriver and the Chromium it started: its whole process group, then
/// reaps it. Until it is reaped its pid cannot be reused, so the group is still ours.
fn kill_group(driver: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", driver.id())])
        .stderr(Stdio::null())
        .status();
    let _ = driver.kill();
    let _ = driver.wait();
}

/// A row of the list as {status, state, labels} (its text, as shown), or null.
const ROW: &str = "const r = document.querySelector(`[data-testid=\"wait-row\"][data-wait-id=\"${arguments[0]}\"]`); \
    if (!r) return null; \
    return {status: r.dataset.status, \
            state: r.querySelector('[data-testid=\"wait-state\"]').textContent, \
            labels: r.querySelector('[data-testid=\"wait-labels\"]').textContent, \
            last_poll: r.dataset.lastPoll, \
            paused: r.querySelector('[data-testid=\"wait-state\"]').classList.contains('host-paused')};";

/// The start of the script [`Browser::changed`] runs: the caller's script
/// becomes the body of `look`, with the caller's arguments as its own.
const AWAIT_CHANGE_HEAD: &str = "const args = Array.from(arguments); \
    const done = args.pop(); const ms = args.pop(); const seen = args.pop(); \
    function look() {";
/// The end of that script: answers `{value, key}` (or `{threw}`) at once when what
/// `look` returns differs from `seen`, else at the first DOM mutation or
/// `waitd-hook` event after which it does, or after `ms`.
const AWAIT_CHANGE_TAIL: &str = "} \
    const now = () => { try { const v = look.apply(null, args); const value = v === undefined ? null : v; \
        return {value, key: JSON.stringify(value)}; } catch (e) { return {threw: String(e)}; } }; \
    let r = now(); \
    if (seen === null || r.threw !== undefined || r.key !== seen) { done(r); return; } \
    let over = false; let timer = 0; \
    const observer = new MutationObserver(() => check()); \
    function check() { \
        r = now(); \
        if (!over && r.threw === undefined && r.key === seen) return; \
        observer.disconnect(); window.removeEventListener('waitd-hook', check); clearTimeout(timer); \
        done(r); \
    } \
    observer.observe(document, {subtree: true, childList: true, characterData: true, attributes: true}); \
    window.addEventListener('waitd-hook', check); \
    timer = setTimeout(() => { over = true; check(); }, ms);";

/// The open detail view as {id, status, kinds, seqs, text}, or null.
const DETAIL: &str = "const d = document.querySelector('[data-testid=\"wait-detail\"]'); \
    if (!d) return null; \
    const items = Array.from(d.querySelectorAll('[data-testid=\"timeline\"] > [data-testid=\"timeline-item\"]')); \
    return {id: d.dataset.waitId, \
            status: d.querySelector('[data-testid=\"detail-status\"]').dataset.status, \
            kinds: items.map((i) => i.dataset.kind), \
            seqs: items.map((i) => Number(i.dataset.seq)), \
            timeline: items.map((i) => i.textContent), \
            text: d.textContent};";

/// The API with the token, as a client of the dashboard's server.
struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    fn new(base: &str) -> Api {
        Api {
            base: base.to_string(),
            http: support::client(),
        }
    }

    async fn get(&self, path: &str) -> Value {
        let r = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "GET {path}");
        r.json().await.unwrap()
    }

    /// `GET /waits/{id}?wait=`: answered when the wait ends (or, still running, with
    /// a 202 once `within` runs out): the status code and the wait.
    async fn blocked(&self, id: &str, within: Duration) -> (u16, Value) {
        let r = self
            .http
            .get(format!(
                "{}/waits/{id}?wait={}ms",
                self.base,
                within.as_millis()
            ))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The first event of the wait `id` that `ok` accepts, from its event stream
    /// (its history, then each event as it is written); fails the test, saying
    /// `what` was awaited, after `within`.
    async fn event(
        &self,
        what: &str,
        id: &str,
        within: Duration,
        ok: impl Fn(&Value) -> bool,
    ) -> Value {
        let heard = async {
            let r = self
                .http
                .get(format!("{}/waits/{id}/events", self.base))
                .bearer_auth(TOKEN)
                .header(reqwest::header::ACCEPT, "text/event-stream")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "the event stream of {id}");
            let mut events = eventsource_stream::Eventsource::eventsource(r.bytes_stream());
            while let Some(Ok(e)) = events.next().await {
                let event: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
                if ok(&event) {
                    return Some(event);
                }
            }
            None
        };
        match tokio::time::timeout(within, heard).await {
            Ok(Some(event)) => event,
            Ok(None) => panic!("the event stream of {id} ended before {what}"),
            Err(_) => panic!("not within {within:?}: {what}"),
        }
    }

    /// Awaits the wait's `state` event to `to`, then checks that a read shows it.
    async fn state_written(&self, what: &str, id: &str, to: &str) {
        self.event(what, id, PATIENCE, |e| {
            e["kind"] == "state" && e["to"] == to
        })
        .await;
        assert_eq!(self.get(&format!("/waits/{id}")).await["state"], to);
    }

    /// Creates a wait; returns its id.
    async fn create(&self, spec: Value) -> String {
        let r = self
            .http
            .post(format!("{}/waits", self.base))
            .bearer_auth(TOKEN)
            .json(&spec)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 201, "POST /waits: {body}");
        body["id"].as_str().unwrap().to_string()
    }
}

/// A wait on `url` that lasts longer than the test, polled every 20–100 ms.
fn wait_spec(url: &str, labels: Value) -> Value {
    let mut s = support::spec(url);
    s["labels"] = labels;
    s["timeout"] = json!("10m");
    s["poll"] = json!({"initial": "20ms", "max": "100ms", "jitter": 0});
    s
}

/// Records every value `data-state` of the stream indicator takes, in
/// `window.__states`, so that a state held only briefly is seen too.
const WATCH_STREAM: &str = "const n = document.querySelector('[data-testid=\"stream-status\"]'); \
    window.__states = [n.dataset.state]; \
    const push = (s) => { if (window.__states[window.__states.length - 1] !== s) window.__states.push(s); }; \
    new MutationObserver((records) => records.forEach((r, i) => \
        push(i + 1 < records.length ? records[i + 1].oldValue : n.dataset.state))) \
      .observe(n, {attributes: true, attributeFilter: ['data-state'], attributeOldValue: true}); \
    return true;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_lists_follows_cancels_and_shows_hostile_values_as_text() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--tokens", TOKENS]).await;
    let up = Upstream::start().await;
    let browser = Browser::start().await;
    let b = &browser;
    let scenario = async {
        let api = Api::new(&app.base);

        // A wait that exists before the page opens; the page asks for the token.
        let a = api
            .create(wait_spec(
                &up.script("/servers/a", vec![Reply::status("deploying")]),
                json!({"pipeline": "4471", "server": "sv-edge-01"}),
            ))
            .await;
        b.c.goto(&format!("{}/", app.base)).await.unwrap();
        assert_eq!(
            b.c.current_url().await.unwrap().path(),
            "/ui/",
            "/ redirects to /ui/"
        );
        b.enter_token().await;
        let row = b
            .row("the existing wait", &a, PATIENCE, |v| {
                v["state"] == "deploying"
            })
            .await;
        assert_eq!(row["status"], "running");
        assert!(
            row["labels"].as_str().unwrap().contains("pipeline:4471"),
            "{row}"
        );
        let kept = b
            .js(
                "return {session: sessionStorage.getItem('waitd.apiToken'), local: localStorage.length, \
                 cookie: document.cookie, url: location.href};",
                vec![],
            )
            .await;
        assert_eq!(
            kept["session"], TOKEN,
            "the token is kept in sessionStorage"
        );
        assert_eq!(kept["local"], 0, "nothing in localStorage: {kept}");
        assert_eq!(kept["cookie"], "", "no cookie: {kept}");
        assert!(!kept["url"].as_str().unwrap().contains(TOKEN), "{kept}");

        // Spies, before anything hostile exists: a dialog, an error or a blocked
        // inline script would be recorded here. And a mark a reload would wipe.
        b.js(
            "window.__spied = {dialogs: [], errors: [], csp: []}; \
             for (const k of ['alert', 'confirm', 'prompt']) window[k] = (m) => { window.__spied.dialogs.push(`${k}: ${m}`); }; \
             window.onerror = (m) => { window.__spied.errors.push(String(m)); }; \
             document.addEventListener('securitypolicyviolation', (e) => window.__spied.csp.push(e.violatedDirective)); \
             window.__notReloaded = true; return true;",
            vec![],
        )
        .await;

        // A new wait appears within a second, changes live, and ends succeeded.
        let w = api
            .create(wait_spec(
                &up.script("/servers/b", vec![Reply::status("deploying")]),
                json!({"pipeline": "4471", "server": "sv-edge-02"}),
            ))
            .await;
        let created = Instant::now();
        b.row("the new wait", &w, Duration::from_secs(1), |v| !v.is_null())
            .await;
        let appeared = created.elapsed();
        assert!(appeared < Duration::from_secs(1), "{appeared:?}");
        b.row("the first state", &w, PATIENCE, |v| {
            v["state"] == "deploying"
        })
        .await;
        up.script("/servers/b", vec![Reply::status("installing")]);
        b.row("the state changing live", &w, PATIENCE, |v| {
            v["state"] == "installing"
        })
        .await;
        up.script("/servers/b", vec![Reply::status("on")]);
        let row = b
            .row("the wait succeeding", &w, PATIENCE, |v| {
                v["status"] == "succeeded"
            })
            .await;
        assert_eq!(row["state"], "on");
        assert_eq!(
            b.js("return window.__notReloaded === true;", vec![]).await,
            true,
            "no reload"
        );

        // More waits, so the screenshot shows the statuses side by side.
        let failed = api
            .create(wait_spec(
                &up.script("/servers/c", vec![Reply::status("failed_deployment")]),
                json!({"pipeline": "4470", "server": "sv-db-03"}),
            ))
            .await;
        let provisioning = api
            .create(wait_spec(
                &up.script("/servers/d", vec![Reply::status("provisioning")]),
                json!({"pipeline": "4472", "team": "data"}),
            ))
            .await;
        let queued = api
            .create(wait_spec(
                &up.script("/servers/e", vec![Reply::status("queued")]),
                json!({"pipeline": "4473", "team": "infra"}),
            ))
            .await;
        // Rows shift down as new ones arrive on top: let them arrive before a click.
        for id in [&failed, &provisioning, &queued] {
            b.row("the new waits", id, PATIENCE, |v| !v.is_null()).await;
        }

        // A host that asks for quiet: a wait that falls due then sends nothing,
        // and its row says the host is paused.
        let quiet = Upstream::start().await;
        let asks = || vec![Reply::json(429, json!({})).header("retry-after", "600")];
        let mut heard = app.heard();
        let first = api
            .create(wait_spec(
                &quiet.script("/quiet/1", asks()),
                json!({"pipeline": "4474"}),
            ))
            .await;
        heard.recorded(&first).await;
        assert!(
            !api.get(&format!("/waits/{first}")).await["last_error"].is_null(),
            "the first wait reads its 429"
        );
        let second = api
            .create(wait_spec(
                &quiet.script("/quiet/2", asks()),
                json!({"pipeline": "4474"}),
            ))
            .await;
        let row = b
            .row("a paused host on its wait", &second, PATIENCE, |v| {
                v["last_poll"] == "paused"
            })
            .await;
        assert_eq!(row["paused"], true, "{row}");
        assert_eq!(quiet.hits("/quiet/2"), 0, "nothing sent to a paused host");
        b.click(&format!(
            "[data-testid=\"wait-row\"][data-wait-id=\"{second}\"]"
        ))
        .await;
        b.shows(
            "the paused host in the detail",
            PATIENCE,
            DETAIL,
            vec![],
            |v| {
                v["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("host paused"))
            },
        )
        .await;
        b.click("[data-testid=\"close-detail\"]").await;
        b.shows(
            "the detail closed",
            PATIENCE,
            DETAIL,
            vec![],
            Value::is_null,
        )
        .await;

        // Cancel from the detail view, with its confirm step.
        b.click(&format!("[data-testid=\"wait-row\"][data-wait-id=\"{a}\"]"))
            .await;
        b.shows(
            "the detail of the running wait",
            PATIENCE,
            DETAIL,
            vec![],
            |v| v["id"] == a.as_str() && v["status"] == "running",
        )
        .await;
        b.click("[data-testid=\"cancel-wait\"]").await;
        b.click("[data-testid=\"confirm-cancel\"]").await;
        let (status, got) = api.blocked(&a, PATIENCE).await;
        assert_eq!(
            (status, &got["status"]),
            (409, &json!("canceled")),
            "the API does not show the wait canceled: {got}"
        );
        let d = b
            .shows("the canceled wait", PATIENCE, DETAIL, vec![], |v| {
                v["status"] == "canceled"
                    && v["kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|k| k == "canceled")
            })
            .await;
        assert_eq!(d["id"], a.as_str());
        b.row("the row canceled", &a, PATIENCE, |v| {
            v["status"] == "canceled"
        })
        .await;
        b.click("[data-testid=\"close-detail\"]").await;
        b.shows(
            "the detail closed",
            PATIENCE,
            DETAIL,
            vec![],
            Value::is_null,
        )
        .await;

        // Screenshots: the list, then a detail view with its timeline.
        b.row("the failed wait", &failed, PATIENCE, |v| {
            v["status"] == "failed"
        })
        .await;
        b.row("a running wait's state", &provisioning, PATIENCE, |v| {
            v["state"] == "provisioning"
        })
        .await;
        b.row("a running wait's state", &queued, PATIENCE, |v| {
            v["state"] == "queued"
        })
        .await;
        // Polls are not events: the page reads the rows on screen again shortly after
        // events changed them. (The wait held back by the pause has polled nothing:
        // a held poll is no poll.)
        b.shows(
            "every row's polls read again after its events",
            PATIENCE,
            "const rows = Array.from(document.querySelectorAll('[data-testid=\"wait-row\"]')); \
             return rows.length === 7 && rows.every((r) => r.dataset.lastPoll === 'paused' \
               || r.querySelector('.c-polls').textContent !== '0');",
            vec![],
            truthy,
        )
        .await;
        let list_png = b.save_screenshot("list.png").await;
        b.click(&format!("[data-testid=\"wait-row\"][data-wait-id=\"{w}\"]"))
            .await;
        let d = b
            .shows(
                "the succeeded wait's timeline",
                PATIENCE,
                DETAIL,
                vec![],
                |v| {
                    v["id"] == w.as_str()
                        && v["kinds"]
                            .as_array()
                            .is_some_and(|k| k.last() == Some(&json!("succeeded")))
                },
            )
            .await;
        assert_eq!(
            d["kinds"],
            json!(["created", "state", "state", "state", "succeeded"]),
            "{d}"
        );
        let detail_png = b.save_screenshot("detail.png").await;
        eprintln!(
            "screenshots: {} {}",
            list_png.display(),
            detail_png.display()
        );
        b.click("[data-testid=\"close-detail\"]").await;
        b.shows(
            "the detail closed",
            PATIENCE,
            DETAIL,
            vec![],
            Value::is_null,
        )
        .await;

        // Hostile values are text: a label that is markup, a target state that is
        // a script.
        let img = "<img src=x onerror=alert(1)>";
        let script = "<script>alert(1)</script>";
        let h = api
            .create(wait_spec(
                &up.script("/servers/h", vec![Reply::status(script)]),
                json!({"note": img}),
            ))
            .await;
        let row = b
            .row("the hostile state as text", &h, PATIENCE, |v| {
                v["state"] == script
            })
            .await;
        assert!(row["labels"].as_str().unwrap().contains(img), "{row}");
        let shown =
            b.c.find(Locator::Css(&format!(
                "[data-testid=\"wait-row\"][data-wait-id=\"{h}\"] [data-testid=\"wait-state\"]"
            )))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(shown, script, "the state reads literally");
        b.click(&format!("[data-testid=\"wait-row\"][data-wait-id=\"{h}\"]"))
            .await;
        let d = b
            .shows("the hostile wait's detail", PATIENCE, DETAIL, vec![], |v| {
                v["id"] == h.as_str()
                    && v["kinds"]
                        .as_array()
                        .is_some_and(|k| k.iter().any(|k| k == "state"))
            })
            .await;
        let text = d["text"].as_str().unwrap();
        assert!(text.contains(img) && text.contains(script), "{d}");
        let dom = b
            .js(
                "return {tags: Array.from(document.querySelectorAll('img, script')).map((n) => n.outerHTML), \
                 on: Array.from(document.querySelectorAll('*')).flatMap((n) => Array.from(n.attributes) \
                       .filter((a) => /^on/i.test(a.name)).map((a) => `${n.tagName} ${a.name}`)), \
                 spied: window.__spied, notReloaded: window.__notReloaded === true};",
                vec![],
            )
            .await;
        assert_eq!(
            dom["tags"],
            json!([r#"<script type="module" src="/ui/app.js"></script>"#]),
            "only index.html's module script: {dom}"
        );
        assert_eq!(dom["on"], json!([]), "no event-handler attribute: {dom}");
        assert_eq!(
            dom["spied"],
            json!({"dialogs": [], "errors": [], "csp": []}),
            "no dialog, no error, nothing blocked: {dom}"
        );
        assert_eq!(dom["notReloaded"], true);
        match b.c.get_alert_text().await {
            Err(e) if e.is_no_such_alert() => {}
            other => panic!("a dialog is open: {other:?}"),
        }
    };
    let outcome = browser.run("list", scenario).await;
    browser.finish(outcome).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
    eprintln!("the browser test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_catches_up_after_waitd_restarts_and_reloads_after_a_reset() {
    let _serial = SERIAL.lock().await;
    let started = Instant::now();
    let db = TestDb::new().await;
    let dir = support::TempDir::new("waitd-dashboard");
    let up = Upstream::start().await;
    let extra = ["--tokens", TOKENS];
    // Two replicas on one database: the page follows `a`, which restarts; `b` polls
    // the wait, and writes its events while `a` is down.
    let mut rb = Replica::start("b", &dir.path, &db.url, "3s", &extra).await;
    let api_b = Api::new(&rb.base);
    let url = up.script("/servers/r", vec![Reply::status("deploying")]);
    let w = api_b
        .create(wait_spec(&url, json!({"pipeline": "5100"})))
        .await;
    api_b
        .state_written("replica b polling the wait", &w, "deploying")
        .await;
    let mut ra = Replica::start("a", &dir.path, &db.url, "3s", &extra).await;
    let api_a = Api::new(&ra.base);
    let browser = Browser::start().await;
    let b = &browser;
    let scenario = async {
        b.c.goto(&format!("{}/ui/", ra.base)).await.unwrap();
        b.enter_token().await;
        b.row("the wait", &w, PATIENCE, |v| v["state"] == "deploying")
            .await;
        b.click(&format!("[data-testid=\"wait-row\"][data-wait-id=\"{w}\"]"))
            .await;
        b.shows("the wait's timeline", PATIENCE, DETAIL, vec![], |v| {
            v["id"] == w.as_str() && v["kinds"] == json!(["created", "state"])
        })
        .await;
        b.js(WATCH_STREAM, vec![]).await;
        let before = b.js("return window.__waitd;", vec![]).await;
        let applied = before["eventsApplied"].as_u64().unwrap();
        let last = before["lastEventId"].as_i64().unwrap();

        // Stop `a` under the open page; while it is down, `b` writes an event.
        ra.signal("TERM");
        assert!(
            ra.wait_exit(Duration::from_secs(15)).await.is_some(),
            "replica a did not stop on SIGTERM"
        );
        b.shows(
            "the stream reconnecting",
            PATIENCE,
            "return window.__states;",
            vec![],
            |v| v.as_array().unwrap().iter().any(|s| s == "reconnecting"),
        )
        .await;
        up.script("/servers/r", vec![Reply::status("installing")]);
        api_b
            .state_written("replica b writing the new state", &w, "installing")
            .await;
        assert!(!ra.running(), "the event was written while a was down");
        ra.respawn();
        ra.ready(Duration::from_secs(15)).await;

        // The page reconnects by itself and catches up: the event written meanwhile,
        // exactly once.
        b.row(
            "the state written while waitd was down",
            &w,
            Duration::from_secs(12),
            |v| v["state"] == "installing",
        )
        .await;
        b.shows(
            "the stream connected again",
            PATIENCE,
            "return window.__states;",
            vec![],
            |v| v.as_array().unwrap().last() == Some(&json!("connected")),
        )
        .await;
        up.script("/servers/r", vec![Reply::status("on")]);
        b.row("the wait succeeding after the restart", &w, PATIENCE, |v| {
            v["status"] == "succeeded"
        })
        .await;
        let since = api_a.get(&format!("/events?after={last}")).await;
        let ids: Vec<i64> = since["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["id"].as_i64().unwrap())
            .collect();
        let newest = *ids.last().expect("events after the restart");
        let hook = b
            .shows(
                "every event applied",
                PATIENCE,
                "return window.__waitd;",
                vec![],
                |v| v["lastEventId"] == json!(newest),
            )
            .await;
        assert_eq!(
            hook["eventsApplied"].as_u64().unwrap() - applied,
            ids.len() as u64,
            "each event since {last} applied once ({ids:?}): {hook}"
        );
        let d = b
            .shows("the timeline complete", PATIENCE, DETAIL, vec![], |v| {
                v["status"] == "succeeded" && v["kinds"].as_array().unwrap().len() >= 5
            })
            .await;
        let history = api_a.get(&format!("/waits/{w}/events")).await;
        let seqs: Vec<i64> = history["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["seq"].as_i64().unwrap())
            .collect();
        assert_eq!(
            d["seqs"],
            json!(seqs),
            "the timeline has every event once: {d}"
        );
        assert_eq!(
            d["kinds"],
            json!(["created", "state", "state", "state", "succeeded"]),
            "{d}"
        );
        let states = b.js("return window.__states;", vec![]).await;
        let states: Vec<&str> = states
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let down = states.iter().position(|s| *s == "reconnecting").unwrap();
        assert!(states[..down].contains(&"connected"), "{states:?}");
        assert_eq!(states.last(), Some(&"connected"), "{states:?}");
    };
    let outcome = browser.run("restart", scenario).await;
    browser.finish(outcome).await;

    // A waitd whose history is gone (an in-memory store, restarted): the page's
    // cursor is past every event it has, waitd answers 409, and the page loads again.
    let browser = Browser::start().await;
    let b = &browser;
    let mut mem = Replica::start("memory", &dir.path, "sqlite::memory:", "3s", &extra).await;
    let api_m = Api::new(&mem.base);
    let scenario = async {
        let mut old = Vec::new();
        for (i, path) in ["/servers/m1", "/servers/m2"].into_iter().enumerate() {
            let url = up.script(path, vec![Reply::status("deploying")]);
            old.push(
                api_m
                    .create(wait_spec(&url, json!({"n": i.to_string()})))
                    .await,
            );
        }
        b.c.goto(&format!("{}/ui/", mem.base)).await.unwrap();
        b.enter_token().await;
        for id in &old {
            b.row("a wait of the first store", id, PATIENCE, |v| {
                v["state"] == "deploying"
            })
            .await;
        }
        let url = up.script("/servers/m3", vec![Reply::status("deploying")]);
        old.push(api_m.create(wait_spec(&url, json!({"n": "2"}))).await);
        b.row("a wait created live", &old[2], PATIENCE, |v| !v.is_null())
            .await;
        mem.signal("TERM");
        assert!(mem.wait_exit(Duration::from_secs(15)).await.is_some());
        mem.respawn();
        mem.ready(Duration::from_secs(15)).await;
        b.shows(
            "the list loaded again",
            Duration::from_secs(12),
            ROW,
            vec![json!(old[0])],
            Value::is_null,
        )
        .await;
        let banner = b
            .shows(
                "the banner about the reset",
                PATIENCE,
                "return document.querySelector('[data-testid=\"banner\"]').innerText;",
                vec![],
                truthy,
            )
            .await;
        assert!(
            banner.as_str().unwrap().contains("history restarted"),
            "{banner}"
        );
        b.shows(
            "the stream connected",
            PATIENCE,
            "return window.__waitd.streamState;",
            vec![],
            |v| v == "connected",
        )
        .await;
        let url = up.script("/servers/m4", vec![Reply::status("deploying")]);
        let fresh = api_m.create(wait_spec(&url, json!({"n": "3"}))).await;
        b.row("a wait of the new store, live", &fresh, PATIENCE, |v| {
            v["state"] == "deploying"
        })
        .await;
        let rows = b
            .js(
                "return document.querySelectorAll('[data-testid=\"wait-row\"]').length;",
                vec![],
            )
            .await;
        assert_eq!(rows, 1, "only the new store's wait");
    };
    let outcome = browser.run("reset", scenario).await;
    browser.finish(outcome).await;
    rb.signal("TERM");
    let _ = rb.wait_exit(Duration::from_secs(10)).await;
    db.drop_db().await;
    eprintln!("the browser test took {:?}", started.elapsed());
}

/// The row of wait `id` as {status, target, kind}, or null.
const TARGET_ROW: &str = "const r = document.querySelector(`[data-testid=\"wait-row\"][data-wait-id=\"${arguments[0]}\"]`); \
    if (!r) return null; \
    const t = r.querySelector('[data-testid=\"wait-target\"]'); \
    return {status: r.dataset.status, target: t.textContent, kind: t.dataset.kind};";

/// Which of the detail's buttons that change a wait are shown, and what the
/// actions say.
const ACTIONS: &str = "const d = document.querySelector('[data-testid=\"wait-detail\"]'); \
    if (!d) return null; \
    const shown = (t) => { const n = d.querySelector(`[data-testid=\"${t}\"]`); \
        return !!n && !n.closest('[hidden]') && n.getClientRects().length > 0; }; \
    return {id: d.dataset.waitId, \
            status: d.querySelector('[data-testid=\"detail-status\"]').dataset.status, \
            approve: shown('approve-wait'), reject: shown('reject-wait'), cancel: shown('cancel-wait'), \
            result: (d.querySelector('[data-testid=\"action-result\"]') || {}).textContent || '', \
            callback: shown('detail-callback'), \
            heartbeat: (d.querySelector('[data-testid=\"detail-heartbeat\"]') || {}).textContent || null, \
            canWrite: window.__waitd.canWrite, \
            newWait: !document.querySelector('[data-testid=\"new-wait\"]').hidden};";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_approves_and_rejects_callback_waits_and_a_read_only_token_sees_no_buttons() {
    const READ: &str = "0123456789abcdef-read";
    let _serial = SERIAL.lock().await;
    let db = TestDb::new().await;
    let tokens = format!("{TOKENS},ci:{READ}:read");
    let app = App::start_with(&db, &["--tokens", &tokens]).await;
    let browser = Browser::start().await;
    let b = &browser;
    let scenario = async {
        let api = Api::new(&app.base);
        let approve = api
            .create(json!({"callback": {"heartbeat": "10m"}, "timeout": "30m", "labels": {"step": "approve"}}))
            .await;
        let reject = api
            .create(json!({"callback": {}, "timeout": "30m", "labels": {"step": "reject"}}))
            .await;
        b.c.goto(&format!("{}/ui/", app.base)).await.unwrap();
        b.enter_token().await;

        // The list reads "callback" where a target would be.
        let row = b
            .shows(
                "the callback wait's row",
                PATIENCE,
                TARGET_ROW,
                vec![json!(approve)],
                |v| !v.is_null(),
            )
            .await;
        assert_eq!(
            row,
            json!({"status": "running", "target": "callback · heartbeat 10m", "kind": "callback"})
        );
        let row = b
            .shows(
                "the other row",
                PATIENCE,
                TARGET_ROW,
                vec![json!(reject)],
                |v| !v.is_null(),
            )
            .await;
        assert_eq!(row["target"], "callback", "{row}");

        // Approve: one click, and the view shows the wait ended.
        b.click(&format!(
            "[data-testid=\"wait-row\"][data-wait-id=\"{approve}\"]"
        ))
        .await;
        let shown = b
            .shows("Approve and Reject", PATIENCE, ACTIONS, vec![], |v| {
                v["id"] == approve.as_str() && v["approve"] == true
            })
            .await;
        assert_eq!(
            (
                &shown["reject"],
                &shown["cancel"],
                &shown["callback"],
                &shown["heartbeat"]
            ),
            (&json!(true), &json!(true), &json!(true), &json!("10m")),
            "{shown}"
        );
        b.click("[data-testid=\"approve-wait\"]").await;
        let (status, got) = api.blocked(&approve, PATIENCE).await;
        assert_eq!(
            (status, &got["status"], &got["reason"]),
            (200, &json!("succeeded"), &json!("approved through the API")),
            "the API does not show the wait approved: {got}"
        );
        // The status comes by the stream, the result when the click's own request
        // answers: either may show first.
        let after = b
            .shows("the approved wait", PATIENCE, ACTIONS, vec![], |v| {
                v["status"] == "succeeded"
                    && v["result"].as_str().is_some_and(|r| r.contains("Approved"))
            })
            .await;
        assert_eq!(
            (&after["approve"], &after["reject"]),
            (&json!(false), &json!(false)),
            "{after}"
        );
        b.row("the row approved", &approve, PATIENCE, |v| {
            v["status"] == "succeeded"
        })
        .await;

        // Reject, with a reason: it becomes the wait's error_detail.
        b.click(&format!(
            "[data-testid=\"wait-row\"][data-wait-id=\"{reject}\"]"
        ))
        .await;
        b.shows("Reject", PATIENCE, ACTIONS, vec![], |v| {
            v["id"] == reject.as_str() && v["reject"] == true
        })
        .await;
        b.click("[data-testid=\"reject-wait\"]").await;
        b.shows(
            "the reason field",
            PATIENCE,
            "const n = document.querySelector('[data-testid=\"reject-reason\"]'); \
             return !!n && !n.closest('[hidden]');",
            vec![],
            truthy,
        )
        .await;
        b.c.find(Locator::Css("[data-testid=\"reject-reason\"]"))
            .await
            .unwrap()
            .send_keys("not during the freeze")
            .await
            .unwrap();
        b.click("[data-testid=\"confirm-reject\"]").await;
        let (status, got) = api.blocked(&reject, PATIENCE).await;
        assert_eq!(
            (status, &got["status"], &got["error_detail"]),
            (
                422,
                &json!("failed"),
                &json!({"reason": "not during the freeze"})
            ),
            "the API does not show the wait rejected: {got}"
        );
        b.shows("the rejected wait", PATIENCE, DETAIL, vec![], |v| {
            v["status"] == "failed"
                && v["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("not during the freeze"))
        })
        .await;

        // A read-only token: the same kind of wait, and no button that changes it.
        let third = api.create(json!({"callback": {}, "timeout": "30m"})).await;
        b.js(
            "sessionStorage.setItem('waitd.apiToken', arguments[0]); \
             location.hash = `#/waits/${arguments[1]}`; location.reload(); return true;",
            vec![json!(READ), json!(third)],
        )
        .await;
        let ro = b
            .shows(
                "the wait under a read-only token",
                PATIENCE,
                ACTIONS,
                vec![],
                |v| v["id"] == third.as_str() && v["status"] == "running" && v["canWrite"] == false,
            )
            .await;
        assert_eq!(
            (&ro["approve"], &ro["reject"], &ro["cancel"], &ro["newWait"]),
            (&json!(false), &json!(false), &json!(false), &json!(false)),
            "{ro}"
        );
        assert_eq!(ro["callback"], true, "{ro}");
        let (status, got) = api.blocked(&third, Duration::from_millis(1)).await;
        assert_eq!((status, &got["status"]), (202, &json!("running")));
    };
    let outcome = browser.run("approvals", scenario).await;
    browser.finish(outcome).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
