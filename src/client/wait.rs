//! `waitd wait`: one wait run in this process, with no server and nothing stored.
//!
//! The request is built from the same flags as `create` (or `--spec`, or
//! `--preset`) and validated as a server validates it; then the same engine steps
//! through the same prober's observations ([`super::prober`]), and the lines and
//! exit code are those of `create --wait`. Nothing outlives the process: a wait
//! that must survive the job, be shared, or call a webhook goes to a server.
//!
//! A callback wait (`--callback`) polls nothing: this process listens on a
//! loopback port for the POST that ends it ([`super::callback`]).

use std::net::SocketAddr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;
use uuid::Uuid;

use super::prober::Poller;
use super::request::{Output, SpecArgs, build_request, wants_json};
use super::{Outcome, Problem, callback, event_line, exit_code_for, print_wait, progress};
use crate::engine::{self, Context, Decision, EngineState, FieldError, Limits, Spec};
use crate::model::{Ending, Event, EventBody, Status, Wait};

/// A poll still in flight at the deadline is cut this long after it, so the
/// poll scheduled at the deadline itself still gets an answer (as on a server).
const DEADLINE_GRACE: Duration = Duration::from_millis(250);

#[derive(Args, Debug)]
pub struct WaitArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Hosts, `*.suffix`es, IPs or CIDRs let past the SSRF guard (comma-separated),
    /// as for `waitd serve`: 127.0.0.1 to poll something on this machine.
    #[arg(long, env = "WAITD_ALLOW_TARGETS", value_delimiter = ',')]
    pub allow_targets: Vec<String>,
    /// The resolver a --dns wait (any dns:// target) asks, IP or IP:PORT (port
    /// 53 when left out); the first nameserver of /etc/resolv.conf when not
    /// given. On the command line the user is the operator: a target's own
    /// resolver= is asked too, judged by the SSRF guard.
    #[arg(long, value_name = "IP:PORT", env = "WAITD_DNS_RESOLVER", value_parser = crate::config::parse_dns_resolver)]
    pub resolver: Option<SocketAddr>,
    /// Floor under every poll and retry delay, as for `waitd serve`.
    #[arg(long, env = "WAITD_MIN_POLL_INTERVAL", default_value = "1s", value_parser = duration)]
    pub min_poll_interval: Duration,
    /// Print the ended wait as JSON (progress goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// human (the default) or json: the ended wait as one JSON object on stdout,
    /// while the progress lines (and a callback wait's URL) go to stderr.
    #[arg(long, value_enum, value_name = "FORMAT", conflicts_with = "json")]
    pub output: Option<Output>,
    /// With --callback: the address to listen on for the callback, IP:PORT;
    /// 127.0.0.1:0 (a free port on loopback) when not given. Only a loopback
    /// address, so that nothing beyond this machine can reach the URL, unless
    /// --allow-remote.
    #[arg(long, value_name = "IP:PORT", value_parser = listen_address)]
    pub listen: Option<SocketAddr>,
    /// Let --listen take an address other than loopback (e.g. 0.0.0.0:9000 for a
    /// job on another machine): anyone who reaches it and has the URL can end the
    /// wait, and the URL travels in plain HTTP.
    #[arg(long)]
    pub allow_remote: bool,
}

fn duration(s: &str) -> Result<Duration, engine::duration::DurationError> {
    engine::duration::parse(s.trim())
}

fn listen_address(s: &str) -> Result<SocketAddr, String> {
    let shown: String = s.chars().take(100).collect();
    s.trim().parse().map_err(|_| {
        format!(
            "takes IP:PORT, e.g. 127.0.0.1:0 (a free port) or [::1]:9000, not \"{shown}\" (a name such as localhost is not resolved)"
        )
    })
}

/// Runs the wait to its end; the exit code tells how it ended.
pub(super) async fn run(a: WaitArgs) -> Outcome {
    let request = build_request(&a.spec)?;
    if request.contains_key("notify") {
        return Err(
            "a wait run in this process sends no webhooks: drop notify, or create the wait on a server (waitd create)"
                .into(),
        );
    }
    let json = wants_json(a.json, a.output);
    let limits = Limits {
        min_poll_interval: a.min_poll_interval,
        dns_tenant_resolvers: true,
        ..Limits::default()
    };
    let floor = limits.min_poll_interval;
    let spec = validate(Value::Object(request), limits).await?;
    let listen = match spec.callback {
        Some(_) => Some(callback::Listen::check(
            a.listen.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
            a.allow_remote,
        )?),
        None if a.listen.is_some() || a.allow_remote => {
            return Err(
                "--listen and --allow-remote are for a callback wait: add --callback, or leave them out"
                    .into(),
            );
        }
        None => None,
    };
    let resolvers = crate::probe::dns::Resolvers {
        operator: match a.resolver {
            Some(at) => Some(at),
            None => crate::probe::dns::system_resolver().await,
        },
        tenants: true,
    };
    let poller = Poller::new(&a.allow_targets, resolvers).map_err(|e| e.0)?;
    if let Some(target) = &spec.target
        && let Ok(url) = url::Url::parse(&target.url)
        && let Some(why) = poller.refusal(&url)
    {
        return Err(why.into());
    }
    let created = Utc::now();
    let id = Uuid::now_v7();
    let (mut st, mut next) = EngineState::start(&spec, created);
    let mut wait = Wait {
        id,
        status: Status::Running,
        state: None,
        reason: None,
        error_detail: None,
        last_error: None,
        output: None,
        polls: 0,
        retries: 0,
        created_at: created,
        updated_at: created,
        deadline: st.deadline,
        next_poll_at: Some(next),
        progress_at: created,
        last_poll: None,
        finished_at: None,
        labels: spec.labels.clone(),
        spec: serde_json::to_value(spec.redacted()).unwrap_or_default(),
        grouping: Default::default(),
    };
    progress(json, &super::short_line(&wait));
    let mut seq = 1;
    let mut say = |at: DateTime<Utc>, body: EventBody| {
        seq += 1;
        let e = Event {
            id: None,
            seq,
            wait_id: id,
            at,
            body,
        };
        progress(json, &event_line(&e));
    };
    if let Some(listen) = listen {
        // Its one "poll" is at the deadline, as on a server.
        wait.next_poll_at = Some(wait.deadline);
        let ended = callback::run(&spec, wait, listen, json).await?;
        let at = ended.finished_at.unwrap_or_else(Utc::now);
        say(
            at,
            EventBody::end(
                ended.status,
                Ending {
                    reason: ended.reason.clone().unwrap_or_default(),
                    state: ended.state.clone(),
                    error_detail: ended.error_detail.clone(),
                    last_error: None,
                    output: ended.output.clone(),
                },
            ),
        );
        if json {
            print_wait(&ended, true);
        }
        return Ok(exit_code_for(ended.status));
    }
    let end = loop {
        tokio::time::sleep(until(next)).await;
        // The deadline wins over the prober's own timeout, as on a server.
        let cut = tokio::time::Instant::now() + until(st.deadline) + DEADLINE_GRACE;
        let (obs, taken) = tokio::time::timeout_at(cut, poller.poll(&spec))
            .await
            .unwrap_or_else(|_| {
                let late = engine::Observation::Transient {
                    error: "the target had not answered by the wait's deadline".into(),
                    retry_after: None,
                };
                (late, None)
            });
        let now = Utc::now();
        let cx = Context {
            now,
            floor,
            jitter: fastrand::f64() * 2.0 - 1.0,
        };
        let step = engine::step(&spec, &mut st, obs, cx);
        for e in &step.events {
            say(now, e.into());
        }
        match step.decision {
            Decision::PollAt(t) => next = t,
            Decision::End(outcome) => break (now, outcome, taken),
        }
    };
    let (at, outcome, output) = end;
    let status = Status::from(outcome.end);
    // As on a server: what the response that ended it gives, when one did.
    let output =
        output.filter(|_| matches!(outcome.end, engine::End::Succeeded | engine::End::Failed));
    say(
        at,
        EventBody::end(
            status,
            Ending {
                reason: outcome.reason.clone(),
                state: st.state.clone(),
                error_detail: outcome.error_detail.clone(),
                last_error: st.last_error.clone(),
                output: output.clone(),
            },
        ),
    );
    if json {
        wait.output = output;
        wait.status = status;
        wait.state = st.state;
        wait.reason = Some(outcome.reason);
        wait.error_detail = outcome.error_detail;
        wait.last_error = st.last_error;
        wait.polls = i32::try_from(st.polls).unwrap_or(i32::MAX);
        wait.retries = i32::try_from(st.retries).unwrap_or(i32::MAX);
        wait.updated_at = at;
        wait.progress_at = at;
        wait.next_poll_at = None;
        wait.finished_at = Some(at);
        print_wait(&wait, true);
    }
    Ok(exit_code_for(status))
}

/// How long from now until `t` (nothing if it has passed).
pub(super) fn until(t: DateTime<Utc>) -> Duration {
    (t - Utc::now()).to_std().unwrap_or_default()
}

/// The request as a server validates it: its preset filled in, then every field
/// checked under `limits`. Parsing its paths and expressions runs on the CPU pool,
/// whose threads have the stack a deep expression needs.
async fn validate(request: Value, limits: Limits) -> Result<Spec, Problem> {
    let presets = crate::presets::Registry::builtin();
    let checked = crate::cpu::pool()
        .run(crate::cpu::Lane::Quick, crate::cpu::SYSTEM, move || {
            let request = presets.apply(&request).map_err(|e| ("preset", e))?;
            Spec::from_request(&request, &limits).map_err(|e| ("request", e))
        })
        .await
        .map_err(|lost| format!("the request could not be checked: {lost}"))?;
    checked.map_err(|(what, errors)| Problem(field_errors(what, &errors)))
}

/// Validation errors as the client prints a server's: one sentence, or a count
/// and one line a field.
fn field_errors(what: &str, errors: &[FieldError]) -> String {
    match errors {
        [one] if one.field.is_empty() => one.message.clone(),
        [one] => format!("{} {}", one.field, one.message),
        many => {
            let mut text = format!("the {what} has {} problems", many.len());
            for e in many {
                text.push_str(&format!("\n  {}: {}", e.field, e.message));
            }
            text
        }
    }
}
