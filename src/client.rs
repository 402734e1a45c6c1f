//! The command-line client: `waitd create | get | list | cancel | follow`.
//!
//! It talks to a waitd server over its HTTP API (the server from `--server` or
//! `WAITD_URL`, the API token from `WAITD_TOKEN`) and turns how a wait ended into the
//! exit code, so a CI step can be one command:
//!
//! | exit | meaning |
//! |---|---|
//! | 0 | succeeded (or, for commands that do not follow a wait, the request worked) |
//! | 1 | failed: the target reported a failure state |
//! | 2 | timed out |
//! | 3 | error: waitd could not tell (permanent HTTP error, retries exhausted…) |
//! | 4 | canceled |
//! | 5 | a usage problem, or a problem reaching or with the server |
//! | 130 | interrupted (Ctrl+C); 143 on SIGTERM |
//!
//! Following reads the wait's server-sent-event stream (with `eventsource-stream`)
//! into the server's own [`Event`] type and prints one line per event; when the connection drops it reconnects with
//! `Last-Event-ID`, so no event is printed twice or lost. An interrupt prints one
//! line and leaves the server-side wait running unless `--cancel-on-interrupt`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::{Map, Value, json};

use crate::model::{Event, EventBody, Status, Wait, WaitPage};

pub const EXIT_SUCCEEDED: u8 = 0;
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_TIMED_OUT: u8 = 2;
pub const EXIT_ERROR: u8 = 3;
pub const EXIT_CANCELED: u8 = 4;
pub const EXIT_PROBLEM: u8 = 5;
pub const EXIT_INTERRUPTED: u8 = 130;
pub const EXIT_TERMINATED: u8 = 143;

/// How long a follow keeps trying to reach a server that stopped answering.
const RECONNECT_FOR: Duration = Duration::from_secs(120);
/// Bound on each plain (non-streaming) request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The exit code for how a wait stands.
pub fn exit_code_for(status: Status) -> u8 {
    match status {
        Status::Succeeded => EXIT_SUCCEEDED,
        Status::Failed => EXIT_FAILED,
        Status::TimedOut => EXIT_TIMED_OUT,
        Status::Error => EXIT_ERROR,
        Status::Canceled => EXIT_CANCELED,
        Status::Running => EXIT_PROBLEM,
    }
}

#[derive(Args, Clone, Debug)]
pub struct ServerArg {
    /// The waitd server (the API token comes from WAITD_TOKEN).
    #[arg(long, env = "WAITD_URL", default_value = "http://127.0.0.1:8080")]
    pub server: String,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a wait and print it; with --wait, follow it to its end.
    Create(Box<CreateArgs>),
    /// Print a wait.
    Get(OneArgs),
    /// List waits, newest first.
    List(ListArgs),
    /// Cancel a running wait (an ended wait is left as it ended).
    Cancel(OneArgs),
    /// Print a wait's events, one line each, until it ends; the exit code tells how.
    Follow(FollowArgs),
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    #[command(flatten)]
    pub conn: ServerArg,
    /// Start from this preset (the server's GET /presets lists them).
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// A preset parameter, NAME=VALUE; repeat for several.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,
    /// A JSON file with the request (with --preset: fields that override the
    /// preset's); `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub spec: Option<PathBuf>,
    /// The URL to poll (target.url).
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// A CEL expression over body, status, headers and state: the wait succeeds
    /// when it is true, e.g. 'body.status.readyReplicas >= body.spec.replicas'.
    #[arg(long, value_name = "EXPR")]
    pub success_condition: Option<String>,
    /// A CEL expression: the wait fails as soon as it is true, e.g. 'status == 403'.
    #[arg(long, value_name = "EXPR")]
    pub failure_condition: Option<String>,
    /// A label, KEY=VALUE; repeat for several.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// A webhook to POST to when the wait ends (signed, Standard Webhooks); repeat
    /// for several. Needs --notify-secret-file.
    #[arg(long = "notify", value_name = "URL", requires = "notify_secret_file")]
    pub notify: Vec<String>,
    /// A file holding the webhooks' signing secret (whsec_…, one line), so that it
    /// never shows in a process list or a shell history.
    #[arg(long, value_name = "FILE", requires = "notify")]
    pub notify_secret_file: Option<PathBuf>,
    /// The wait's timeout (its deadline is now plus this), e.g. 30m.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Follow the wait to its end, printing one line per event; the exit code tells
    /// how it ended.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: cancel the wait on the server when interrupted.
    #[arg(long, requires = "wait")]
    pub cancel_on_interrupt: bool,
    /// Make a retried create return the first wait (the Idempotency-Key header).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Print the wait as JSON (with --wait: the ended wait; progress goes to stderr).
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct OneArgs {
    #[command(flatten)]
    pub conn: ServerArg,
    /// The wait's id.
    pub id: String,
    /// Print the wait as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub conn: ServerArg,
    /// Only waits with this status: running, succeeded, failed, timed_out, canceled,
    /// error.
    #[arg(long, value_name = "STATUS")]
    pub status: Option<String>,
    /// Only waits with this label, KEY=VALUE; repeat for several (all must match).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// At most this many waits (1 to 500).
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print the waits as a JSON array.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct FollowArgs {
    #[command(flatten)]
    pub conn: ServerArg,
    /// The wait's id.
    pub id: String,
    /// Cancel the wait on the server when interrupted.
    #[arg(long)]
    pub cancel_on_interrupt: bool,
    /// Print each event as one line of JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why a command could not do its job (exit 5).
#[derive(Debug)]
struct Problem(String);

impl<T: Into<String>> From<T> for Problem {
    fn from(s: T) -> Problem {
        Problem(s.into())
    }
}

type Outcome = Result<u8, Problem>;

/// Prints a line on standard output; a closed pipe (`| head`) is not an error.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn note(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

/// Runs one client command to its exit code. Ctrl+C (or SIGTERM) stops it with one
/// line on stderr.
pub async fn run(cmd: Command) -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server = match &cmd {
        Command::Create(a) => &a.conn,
        Command::Get(a) | Command::Cancel(a) => &a.conn,
        Command::List(a) => &a.conn,
        Command::Follow(a) => &a.conn,
    };
    let api = match Api::new(&server.server) {
        Ok(a) => a,
        Err(Problem(e)) => {
            note(&format!("waitd: {e}"));
            return ExitCode::from(EXIT_PROBLEM);
        }
    };
    let cancel_on_interrupt = match &cmd {
        Command::Create(a) => a.cancel_on_interrupt,
        Command::Follow(a) => a.cancel_on_interrupt,
        _ => false,
    };
    // The wait being followed, once known: what an interrupt talks about.
    let current: Arc<Mutex<Option<String>>> = Arc::default();
    let work = execute(&api, cmd, current.clone());
    let code = tokio::select! {
        r = work => match r {
            Ok(code) => code,
            Err(Problem(e)) => {
                note(&format!("waitd: {e}"));
                EXIT_PROBLEM
            }
        },
        code = interrupted() => {
            let id = current.lock().map(|c| c.clone()).unwrap_or_default();
            let line = match id {
                Some(id) if cancel_on_interrupt => match api.cancel(&id).await {
                    Ok(_) => format!("waitd: interrupted; canceled wait {id}"),
                    Err(Problem(e)) => format!("waitd: interrupted; could not cancel wait {id}: {e}"),
                },
                Some(id) => format!(
                    "waitd: interrupted; wait {id} keeps running on the server (waitd cancel {id} stops it)"
                ),
                None => "waitd: interrupted".to_string(),
            };
            note(&line);
            code
        }
    };
    ExitCode::from(code)
}

/// Resolves with the exit code of the first interrupt: SIGINT (Ctrl+C) or SIGTERM.
async fn interrupted() -> u8 {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (int, term) {
            (Ok(mut int), Ok(mut term)) => tokio::select! {
                _ = int.recv() => EXIT_INTERRUPTED,
                _ = term.recv() => EXIT_TERMINATED,
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
                EXIT_INTERRUPTED
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        EXIT_INTERRUPTED
    }
}

async fn execute(api: &Api, cmd: Command, current: Arc<Mutex<Option<String>>>) -> Outcome {
    match cmd {
        Command::Create(a) => create(api, *a, current).await,
        Command::Get(a) => {
            let w = api.get_wait(&a.id).await?;
            print_wait(&w, a.json);
            Ok(EXIT_SUCCEEDED)
        }
        Command::Cancel(a) => {
            let w = api.cancel(&a.id).await?;
            print_wait(&w, a.json);
            Ok(EXIT_SUCCEEDED)
        }
        Command::List(a) => list(api, a).await,
        Command::Follow(a) => {
            check_id(&a.id)?;
            *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(a.id.clone());
            let json = a.json;
            let end = api
                .follow(&a.id, |e, raw| {
                    if json {
                        say(raw);
                    } else {
                        say(&event_line(e));
                    }
                })
                .await?;
            Ok(exit_code_for(end))
        }
    }
}

fn check_id(id: &str) -> Result<(), Problem> {
    uuid::Uuid::parse_str(id).map(|_| ()).map_err(|_| {
        Problem(format!(
            "\"{id}\" is not a wait id; wait ids are UUIDs such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21"
        ))
    })
}

fn split_pair<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str), Problem> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| Problem(format!("{flag} takes NAME=VALUE, not \"{s}\"")))
}

/// The request `create` sends: the spec file (if any), then the flags over it.
fn build_request(a: &CreateArgs) -> Result<Value, Problem> {
    let mut req = match &a.spec {
        None => Map::new(),
        Some(path) => {
            let text = if path.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())
                    .map_err(|e| format!("cannot read the request from standard input: {e}"))?
            } else {
                std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?
            };
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(m)) => m,
                Ok(_) => return Err(format!("{} is not a JSON object", path.display()).into()),
                Err(e) => return Err(format!("{} is not valid JSON: {e}", path.display()).into()),
            }
        }
    };
    if a.spec.is_none() && a.preset.is_none() && a.url.is_none() {
        return Err(
            "say what to wait for: --preset NAME (with --param NAME=VALUE), --spec FILE with a request, or --url URL with --success-condition EXPR"
                .into(),
        );
    }
    if let Some(url) = &a.url {
        let mut target = match req.remove("target") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        target.insert("url".into(), json!(url));
        req.insert("target".into(), Value::Object(target));
    }
    for (key, value) in [
        ("success_condition", &a.success_condition),
        ("failure_condition", &a.failure_condition),
    ] {
        if let Some(v) = value {
            req.insert(key.into(), json!(v));
        }
    }
    if let Some(p) = &a.preset {
        req.insert("preset".into(), json!(p));
    }
    if !a.params.is_empty() {
        let mut params = match req.remove("params") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        for p in &a.params {
            let (k, v) = split_pair("--param", p)?;
            params.insert(k.into(), json!(v));
        }
        req.insert("params".into(), Value::Object(params));
    }
    if !a.labels.is_empty() {
        let mut labels = match req.remove("labels") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        for l in &a.labels {
            let (k, v) = split_pair("--label", l)?;
            labels.insert(k.into(), json!(v));
        }
        req.insert("labels".into(), Value::Object(labels));
    }
    if let Some(path) = &a.notify_secret_file {
        let secret = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the --notify-secret-file {}: {e}",
                path.display()
            )
        })?;
        let secret = secret.trim();
        if crate::engine::spec::secret_key(secret).is_none() {
            // Never print the secret itself.
            return Err(format!(
                "{} does not hold a webhook secret: write whsec_ followed by base64, e.g. `echo whsec_$(openssl rand -base64 32) > {}`",
                path.display(),
                path.display()
            )
            .into());
        }
        let mut notify = match req.remove("notify") {
            Some(Value::Array(v)) => v,
            _ => Vec::new(),
        };
        for url in &a.notify {
            notify.push(json!({"url": url, "secret": secret}));
        }
        req.insert("notify".into(), Value::Array(notify));
    }
    if let Some(t) = &a.timeout {
        crate::engine::duration::parse(t).map_err(|e| format!("--timeout {e}"))?;
        req.insert("timeout".into(), json!(t));
    }
    Ok(Value::Object(req))
}

async fn create(api: &Api, a: CreateArgs, current: Arc<Mutex<Option<String>>>) -> Outcome {
    let req = build_request(&a)?;
    let wait = api.create(&req, a.idempotency_key.as_deref()).await?;
    let id = wait.id.to_string();
    if !a.wait {
        print_wait(&wait, a.json);
        return Ok(EXIT_SUCCEEDED);
    }
    *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.clone());
    let json = a.json;
    if json {
        note(&short_line(&wait));
    } else {
        say(&short_line(&wait));
    }
    let end = api
        .follow(&id, |e, _| {
            if matches!(e.body, EventBody::Created { .. }) {
                return; // the line above said it
            }
            let line = event_line(e);
            if json { note(&line) } else { say(&line) }
        })
        .await?;
    if json {
        let ended = api.get_wait(&id).await?;
        print_wait(&ended, true);
        return Ok(exit_code_for(ended.status));
    }
    Ok(exit_code_for(end))
}

async fn list(api: &Api, a: ListArgs) -> Outcome {
    if !(1..=500).contains(&a.limit) {
        return Err("--limit takes a number from 1 to 500".into());
    }
    let mut query: Vec<(String, String)> = vec![("limit".into(), a.limit.to_string())];
    if let Some(s) = &a.status {
        s.parse::<Status>()
            .map_err(|_| format!("--status takes one of {}", Status::list()))?;
        query.push(("status".into(), s.clone()));
    }
    for l in &a.labels {
        let (k, v) = split_pair("--label", l)?;
        query.push(("label".into(), format!("{k}:{v}")));
    }
    let page: WaitPage = typed(api.send(Method::GET, "/waits", &query, None, &[]).await?)?;
    let items = page.items;
    if a.json {
        say(&serde_json::to_string_pretty(&items).unwrap_or_default());
    } else {
        for w in &items {
            say(&short_line(w));
        }
    }
    Ok(EXIT_SUCCEEDED)
}

fn print_wait(w: &Wait, json: bool) {
    if json {
        say(&serde_json::to_string_pretty(w).unwrap_or_default());
    } else {
        say(&short_line(w));
    }
}

/// `<id> <status>[ state=<state>][: <reason>]`.
pub fn short_line(w: &Wait) -> String {
    let mut line = format!("{} {}", w.id, w.status);
    if let Some(s) = &w.state {
        line.push_str(&format!(" state={s}"));
    }
    if let Some(r) = &w.reason {
        line.push_str(&format!(": {r}"));
    }
    line
}

/// One event as one line: `HH:MM:SS <kind> …`.
pub fn event_line(e: &Event) -> String {
    let at = e.at.format("%H:%M:%S");
    let rest = match &e.body {
        EventBody::Created { deadline } => format!(" (deadline {})", deadline.to_rfc3339()),
        EventBody::State { from: Some(f), to } => format!(" {f} -> {to}"),
        EventBody::State { from: None, to } => format!(" {to}"),
        EventBody::Retry {
            error,
            attempt,
            delay,
        } => format!(" {attempt} in {delay}: {error}"),
        other => other
            .ending()
            .map(|(_, end)| format!(": {}", end.reason))
            .unwrap_or_default(),
    };
    format!("{at} {}{rest}", e.kind())
}

/// A JSON answer as one of the server's own types.
fn typed<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, Problem> {
    serde_json::from_value(v).map_err(|e| {
        Problem(format!(
            "the server's answer does not read as this client expects ({e}); are the client and server versions the same?"
        ))
    })
}

/// The server's HTTP API.
struct Api {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Api {
    fn new(server: &str) -> Result<Api, Problem> {
        let base = server.trim_end_matches('/').to_string();
        let url = url::Url::parse(&base).map_err(|e| {
            format!("--server (or WAITD_URL) \"{server}\" is not a URL ({e}); write e.g. http://127.0.0.1:8080")
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "--server (or WAITD_URL) \"{server}\" must be an http or https URL"
            )
            .into());
        }
        let token = std::env::var("WAITD_TOKEN")
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let http = reqwest::Client::builder()
            .user_agent(concat!("waitd-client/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {e}"))?;
        Ok(Api { base, http, token })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut rb = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            rb = rb.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        rb
    }

    /// One JSON request; a non-2xx answer becomes a [`Problem`] with the server's
    /// explanation.
    async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
        headers: &[(&str, String)],
    ) -> Result<Value, Problem> {
        let path = if query.is_empty() {
            path.to_string()
        } else {
            let q: String = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(query)
                .finish();
            format!("{path}?{q}")
        };
        let mut rb = self.request(method, &path).timeout(REQUEST_TIMEOUT);
        if let Some(b) = body {
            rb = rb
                .header(CONTENT_TYPE, "application/json")
                .body(b.to_string());
        }
        for (k, v) in headers {
            rb = rb.header(*k, v);
        }
        let res = rb.send().await.map_err(|e| {
            format!(
                "cannot reach the waitd server at {}: {}",
                self.base,
                cause(&e)
            )
        })?;
        let status = res.status();
        let bytes = res
            .bytes()
            .await
            .map_err(|e| format!("the waitd server's answer broke off: {}", cause(&e)))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|_| {
                Problem(format!(
                    "the server at {} answered {status} with something that is not JSON; is it a waitd server?",
                    self.base
                ))
            });
        }
        Err(problem(status, &bytes))
    }

    async fn create(&self, req: &Value, key: Option<&str>) -> Result<Wait, Problem> {
        let headers: Vec<(&str, String)> = key
            .map(|k| vec![("idempotency-key", k.to_string())])
            .unwrap_or_default();
        typed(
            self.send(Method::POST, "/waits", &[], Some(req), &headers)
                .await?,
        )
    }

    async fn get_wait(&self, id: &str) -> Result<Wait, Problem> {
        check_id(id)?;
        typed(
            self.send(Method::GET, &format!("/waits/{id}"), &[], None, &[])
                .await?,
        )
    }

    async fn cancel(&self, id: &str) -> Result<Wait, Problem> {
        check_id(id)?;
        typed(
            self.send(Method::POST, &format!("/waits/{id}/cancel"), &[], None, &[])
                .await?,
        )
    }

    /// Follows the wait's event stream, calling `each` once per event (with its JSON
    /// as sent), until the terminal event, whose status it returns. A dropped
    /// connection is resumed with `Last-Event-ID`; a server that stays unreachable
    /// for [`RECONNECT_FOR`], or refuses the request (a 4xx), is a [`Problem`].
    async fn follow(
        &self,
        id: &str,
        mut each: impl FnMut(&Event, &str),
    ) -> Result<Status, Problem> {
        use eventsource_stream::Eventsource;
        use futures_util::StreamExt;
        check_id(id)?;
        let path = format!("/waits/{id}/events");
        let mut last_id: Option<String> = None;
        let mut delay = Duration::from_millis(200);
        let mut failing_since: Option<Instant> = None;
        loop {
            let mut rb = self
                .request(Method::GET, &path)
                .header(ACCEPT, HeaderValue::from_static("text/event-stream"));
            if let Some(l) = &last_id {
                rb = rb.header("last-event-id", l);
            }
            let trouble = match rb.send().await {
                Ok(res) if res.status().is_success() => {
                    let mut events = res.bytes_stream().eventsource();
                    loop {
                        match events.next().await {
                            Some(Ok(frame)) => {
                                failing_since = None;
                                delay = Duration::from_millis(200);
                                let e: Event = serde_json::from_str(&frame.data).map_err(|e| {
                                    Problem(format!("an event from the server does not read as this client expects ({e})"))
                                })?;
                                if !frame.id.is_empty() {
                                    last_id = Some(frame.id.clone());
                                }
                                each(&e, &frame.data);
                                if let Some((status, _)) = e.body.ending() {
                                    return Ok(status);
                                }
                            }
                            None => break "the event stream ended early".to_string(),
                            Some(Err(e)) => break format!("the event stream broke off: {e}"),
                        }
                    }
                }
                Ok(res) => {
                    let status = res.status();
                    let bytes = res.bytes().await.unwrap_or_default();
                    if status.is_client_error() {
                        return Err(problem(status, &bytes));
                    }
                    format!("the server answered {status}")
                }
                Err(e) => format!(
                    "cannot reach the waitd server at {}: {}",
                    self.base,
                    cause(&e)
                ),
            };
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= RECONNECT_FOR {
                return Err(format!(
                    "{trouble}; gave up after trying for {}s",
                    RECONNECT_FOR.as_secs()
                )
                .into());
            }
            note(&format!(
                "waitd: {trouble}; reconnecting{}",
                last_id
                    .as_ref()
                    .map(|l| format!(" after event {l}"))
                    .unwrap_or_default()
            ));
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }
}

/// A non-2xx answer as a problem: the server's problem+json detail and field errors,
/// or the status and a hint.
fn problem(status: StatusCode, body: &[u8]) -> Problem {
    match serde_json::from_slice::<Value>(body) {
        Ok(p) if p["detail"].is_string() => {
            let mut text = p["detail"].as_str().unwrap_or_default().to_string();
            if let Some(errors) = p["errors"].as_array().filter(|e| e.len() > 1) {
                for e in errors {
                    text.push_str(&format!(
                        "\n  {}: {}",
                        e["field"].as_str().unwrap_or(""),
                        e["message"].as_str().unwrap_or("")
                    ));
                }
            }
            if status == StatusCode::UNAUTHORIZED {
                text.push_str(" (set WAITD_TOKEN)");
            }
            Problem(text)
        }
        _ => Problem(format!(
            "the server answered {status}; is --server (or WAITD_URL) a waitd server?"
        )),
    }
}

/// The innermost cause of a reqwest error, which is the useful part.
fn cause(e: &reqwest::Error) -> String {
    let mut source: &dyn std::error::Error = e;
    while let Some(s) = source.source() {
        source = s;
    }
    let inner = source.to_string();
    let outer = e.to_string();
    if inner == outer {
        outer
    } else {
        format!("{outer} ({inner})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_the_documented_exit_codes() {
        let codes: Vec<u8> = Status::ALL.iter().map(|s| exit_code_for(*s)).collect();
        // running, succeeded, failed, timed_out, canceled, error
        assert_eq!(codes, [5, 0, 1, 2, 4, 3]);
    }

    #[test]
    fn an_event_reads_as_one_line() {
        let e: Event = serde_json::from_str(
            r#"{"id":2,"seq":2,"wait_id":"0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21","kind":"state","at":"2025-01-02T03:04:05.6Z","from":"deploying","to":"on"}"#,
        )
        .unwrap();
        assert_eq!(event_line(&e), "03:04:05 state deploying -> on");
    }
}
