//! The command-line client: `waitd create | get | list | cancel | follow`, and
//! `waitd wait`, which runs one wait in this process without a server.
//!
//! The server commands talk to a waitd server over its HTTP API (the server from
//! `--server` or `WAITD_URL`, the API token from `WAITD_TOKEN`); every command turns
//! how a wait ended into the exit code, so a CI step can be one command:
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
//! into the server's own [`Event`] type and prints one line per event; when the
//! connection drops it reconnects with `Last-Event-ID`, so no event is printed twice
//! or lost. An interrupt prints one line and leaves the server-side wait running
//! unless `--cancel-on-interrupt`.

mod api;
mod callback;
mod prober;
mod request;
mod target;
pub mod wait;

use std::io::Write;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use clap::Subcommand;
use reqwest::Method;
use serde_json::Value;

use crate::model::{Event, EventBody, Status, Wait, WaitPage};
use api::{Api, typed};
pub use request::{CreateArgs, FollowArgs, IdsArgs, ListArgs, OneArgs, Output, SpecArgs};
use request::{check_id, create_request, split_pair, wants_json};

pub const EXIT_SUCCEEDED: u8 = 0;
pub const EXIT_FAILED: u8 = 1;
pub const EXIT_TIMED_OUT: u8 = 2;
pub const EXIT_ERROR: u8 = 3;
pub const EXIT_CANCELED: u8 = 4;
pub const EXIT_PROBLEM: u8 = 5;
pub const EXIT_INTERRUPTED: u8 = 130;
pub const EXIT_TERMINATED: u8 = 143;

/// The server the client commands talk to when neither `--server` nor `WAITD_URL`
/// names one.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

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

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Create a wait on the server and print it; with --wait, follow it to its end.
    Create(Box<CreateArgs>),
    /// Run one wait in this process, with no server and nothing stored, printing
    /// what `create --wait` prints and exiting with the same codes.
    Wait(Box<wait::WaitArgs>),
    /// Print a wait.
    Get(OneArgs),
    /// List waits, newest first.
    List(ListArgs),
    /// Cancel running waits (an ended wait is left as it ended).
    Cancel(IdsArgs),
    /// Print a wait's events, one line each, until it ends; the exit code tells how.
    Follow(FollowArgs),
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

/// A line of a followed wait's progress: on stdout, or on stderr when stdout is
/// for the JSON of the ended wait.
fn progress(json: bool, line: &str) {
    if json { note(line) } else { say(line) }
}

/// Runs one client command to its exit code; `server` is the server the server
/// commands talk to. Ctrl+C (or SIGTERM) stops it with one line on stderr.
pub async fn run(cmd: Command, server: &str) -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Command::Wait(a) = cmd {
        let code = tokio::select! {
            r = wait::run(*a) => r.unwrap_or_else(|Problem(e)| {
                note(&format!("waitd: {e}"));
                EXIT_PROBLEM
            }),
            code = interrupted() => {
                note("waitd: interrupted; the wait ran in this process and ends with it");
                code
            }
        };
        return ExitCode::from(code);
    }
    let api = match Api::new(server) {
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
            let (w, answer) = api.get_wait(&a.id).await?;
            if wants_json(a.json, a.output) {
                print_json(&answer);
            } else {
                say(&short_line(&w));
            }
            Ok(EXIT_SUCCEEDED)
        }
        Command::Cancel(a) => cancel(api, a).await,
        Command::List(a) => list(api, a).await,
        Command::Wait(_) => Err("waitd wait runs without a server".into()),
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

/// Creates the wait and prints it: one line, then a callback wait's URL and a
/// nudge URL, each on a line of its own (or the server's answer as JSON, which
/// carries them as callback_url and nudge_url); with `--wait`, the URLs come
/// before the wait is followed, on stderr when stdout is for the JSON of the
/// ended wait.
async fn create(api: &Api, a: CreateArgs, current: Arc<Mutex<Option<String>>>) -> Outcome {
    let req = create_request(&a)?;
    let json = wants_json(a.json, a.output);
    let (wait, answer) = api.create(&req, a.idempotency_key.as_deref()).await?;
    let id = wait.id.to_string();
    let callback_url = answer["callback_url"].as_str();
    if req.get("callback").is_some() && callback_url.is_none() {
        note(
            "waitd: the server's answer carries no callback_url: it was a replay of an earlier create with this --idempotency-key, and only the first answer shows the URL; create the wait with a new key for a new URL",
        );
    }
    let nudge_url = answer["nudge_url"].as_str();
    if req.get("nudge") == Some(&Value::Bool(true)) && nudge_url.is_none() {
        note(
            "waitd: the server's answer carries no nudge_url: it was a replay of an earlier create with this --idempotency-key, and only the first answer shows the URL; create the wait with a new key for a new URL",
        );
    }
    let urls = callback_url.into_iter().chain(nudge_url);
    if !a.wait {
        if json {
            print_json(&answer);
        } else {
            say(&short_line(&wait));
            urls.for_each(say);
        }
        return Ok(EXIT_SUCCEEDED);
    }
    *current.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.clone());
    progress(json, &short_line(&wait));
    urls.for_each(|url| progress(json, url));
    let end = api
        .follow(&id, |e, _| {
            if matches!(e.body, EventBody::Created { .. }) {
                return; // the line above said it
            }
            progress(json, &event_line(e));
        })
        .await?;
    if json {
        let (ended, answer) = api.get_wait(&id).await?;
        print_json(&answer);
        return Ok(exit_code_for(ended.status));
    }
    Ok(exit_code_for(end))
}

/// Cancels each wait in turn, printing each as it stands after; one that cannot
/// be canceled (a mistyped id, an unknown wait) is reported and the others are
/// still canceled, and the exit code is then 5.
async fn cancel(api: &Api, a: IdsArgs) -> Outcome {
    // Every id is checked before any wait is canceled: a typo cancels nothing.
    for id in &a.ids {
        check_id(id)?;
    }
    let mut code = EXIT_SUCCEEDED;
    for id in &a.ids {
        match api.cancel(id).await {
            Ok(w) => print_wait(&w, a.json),
            Err(Problem(e)) => {
                note(&format!("waitd: {id}: {e}"));
                code = EXIT_PROBLEM;
            }
        }
    }
    Ok(code)
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

/// A server's answer as it came, as one JSON object.
fn print_json(answer: &Value) {
    say(&serde_json::to_string_pretty(answer).unwrap_or_default());
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
