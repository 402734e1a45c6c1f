//! `waitd wait --callback`: a callback wait (docs/design.md §2.15) run in this
//! process. It listens on a loopback port for the POST that ends it, at a URL of
//! the server's shape, `http://IP:PORT/callbacks/<secret>` (and its `/fail` and
//! `/heartbeat`), with a fresh 256-bit secret, and ends as a server ends the wait:
//!
//! - `POST {url}` with a JSON body: `succeeded` with the body as its `output`,
//!   `200` with the wait; when the spec has a `state` path or conditions, the
//!   body is judged by them first, as a server judges it: it ends the wait
//!   `succeeded` or `failed`, or is progress (`202`), or cannot be judged (`422`);
//! - `POST {url}/fail`: `failed`, with the body as its `error_detail`;
//! - `POST {url}/heartbeat`: restarts `callback.heartbeat`'s clock, whose silence
//!   ends the wait `failed`;
//! - the deadline: `timed_out`.
//!
//! The first completion wins; every request after it is a `409` with the wait as
//! it ended. A body over 64 KiB is a `413`, one that is not JSON a `400` or `415`,
//! and none of them ends the wait; a wrong secret is a `404`. The process exits
//! once the answer to the completion is written.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::wait::until;
use super::{Problem, event_line, note, progress};
use crate::api::MAX_BODY;
use crate::api::callbacks::{FAILED, PATH, SUCCEEDED};
use crate::engine::{self, Context, Decision, End, EngineState, Spec};
use crate::model::{Event, EventBody, Status, Wait};
use crate::store::callbacks::{Secret, SecretHash};

/// Why a callback wait ended at its deadline: a server's sentence.
pub(super) const DEADLINE: &str = "the deadline passed before a callback completed the wait";

/// How long a request has to send its head, and then its body.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The most of an oversized body read (and dropped) before the `413` is answered,
/// so that the client, still sending, reads the answer rather than a reset.
const DRAIN_AT_MOST: usize = 4 * 1024 * 1024;

/// An address to listen on, checked.
#[derive(Clone, Copy, Debug)]
pub(super) struct Listen(SocketAddr);

impl Listen {
    /// `addr`, when it is loopback or `allow_remote` lets it be anything.
    pub(super) fn check(addr: SocketAddr, allow_remote: bool) -> Result<Listen, Problem> {
        if !addr.ip().to_canonical().is_loopback() && !allow_remote {
            return Err(format!(
                "--listen {addr} is not a loopback address: anyone who reaches it and has the URL could end the wait; listen on 127.0.0.1 or [::1], or add --allow-remote to listen on {addr} anyway"
            )
            .into());
        }
        Ok(Listen(addr))
    }
}

/// Runs the callback wait `wait` (running, with `spec`) to its end, and returns
/// it as it ended. The URL is printed (on stdout, or stderr when stdout is for
/// JSON) once the port is open.
pub(super) async fn run(
    spec: &Spec,
    wait: Wait,
    listen: Listen,
    json: bool,
) -> Result<Wait, Problem> {
    let listener = TcpListener::bind(listen.0)
        .await
        .map_err(|e| format!("cannot listen on {} for the callback: {e}", listen.0))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot tell the address listened on: {e}"))?;
    let secret = Secret::generate();
    progress(json, &format!("http://{local}{PATH}{}", secret.expose()));
    if local.ip().is_unspecified() {
        note(&format!(
            "waitd: listening on every address of this machine at port {}; give the caller the URL with an address of this machine it reaches in place of {}",
            local.port(),
            local.ip()
        ));
    }
    let heartbeat = spec.callback.as_ref().and_then(|c| c.heartbeat);
    let deadline = Instant::now() + until(wait.deadline);
    let (beats, mut beat) = watch::channel(Instant::now());
    let shared = Arc::new(Shared {
        hash: secret.hash(),
        spec: spec.clone(),
        json,
        wait: Mutex::new(wait),
        beats,
    });
    // Told when a connection whose request ended the wait has written its answer.
    let (answered, mut ended) = mpsc::unbounded_channel::<()>();
    loop {
        let silence = match heartbeat {
            Some(h) => *beat.borrow_and_update() + h,
            None => deadline,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(serve(stream, shared.clone(), answered.clone()));
                }
                // A connection that failed before it was accepted (out of file
                // descriptors, a reset): the listener goes on.
                Err(e) => note(&format!("waitd: a connection to the callback URL failed: {e}")),
            },
            _ = ended.recv() => break,
            _ = beat.changed() => {}
            _ = tokio::time::sleep_until(silence), if heartbeat.is_some() => {
                let h = heartbeat.unwrap_or_default();
                if Instant::now() >= *beat.borrow() + h
                    && shared.end(Status::Failed, crate::callbacks::silence_reason(h), None, None)
                {
                    break;
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                if shared.end(Status::TimedOut, DEADLINE.into(), None, None) {
                    break;
                }
            }
        }
    }
    Ok(shared.current())
}

/// What the listener and its connections share.
struct Shared {
    /// The SHA-256 of the URL's secret, which a presented secret's is compared
    /// with in constant time.
    hash: SecretHash,
    /// What judges a callback's body, when it has a state path or conditions.
    spec: Spec,
    /// Whether stdout is for the ended wait's JSON (progress lines go to stderr).
    json: bool,
    /// The wait: running until the first end.
    wait: Mutex<Wait>,
    /// When the last heartbeat came (the start, before any).
    beats: watch::Sender<Instant>,
}

impl Shared {
    fn current(&self) -> Wait {
        self.wait.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn knows(&self, presented: &str) -> bool {
        bool::from(SecretHash::of(presented).0.ct_eq(&self.hash.0))
    }

    /// Ends the wait, unless something ended it first; whether this did.
    fn end(
        &self,
        status: Status,
        reason: String,
        error_detail: Option<Value>,
        output: Option<Value>,
    ) -> bool {
        let mut w = self.wait.lock().unwrap_or_else(|p| p.into_inner());
        if w.status != Status::Running {
            return false;
        }
        let now = Utc::now();
        w.status = status;
        w.reason = Some(reason);
        w.error_detail = error_detail;
        w.output = output;
        w.updated_at = now;
        w.progress_at = now;
        w.finished_at = Some(now);
        w.next_poll_at = None;
        true
    }

    /// Records the state a body that was progress showed, with a line for its
    /// change; whether the wait was running.
    fn progress(&self, state: Option<String>) -> bool {
        let mut w = self.wait.lock().unwrap_or_else(|p| p.into_inner());
        if w.status != Status::Running {
            return false;
        }
        let Some(to) = state.filter(|s| w.state.as_ref() != Some(s)) else {
            return true;
        };
        let now = Utc::now();
        let from = w.state.replace(to.clone());
        w.updated_at = now;
        w.progress_at = now;
        let e = Event {
            id: None,
            seq: 0,
            wait_id: w.id,
            at: now,
            body: EventBody::State { from, to },
        };
        progress(self.json, &event_line(&e));
        true
    }

    /// Restarts the heartbeat's clock of a running wait; whether it was running.
    fn beat(&self) -> bool {
        let w = self.wait.lock().unwrap_or_else(|p| p.into_inner());
        if w.status != Status::Running {
            return false;
        }
        self.beats.send_replace(Instant::now());
        true
    }
}

/// Serves one connection, one request (no keep-alive); tells `answered` when
/// its request ended the wait and its answer is written.
async fn serve(
    stream: tokio::net::TcpStream,
    shared: Arc<Shared>,
    answered: mpsc::UnboundedSender<()>,
) {
    let ended_here = Arc::new(AtomicBool::new(false));
    let flag = ended_here.clone();
    let service = service_fn(move |req| {
        let (shared, flag) = (shared.clone(), flag.clone());
        async move { Ok::<_, Infallible>(handle(&shared, &flag, req).await) }
    });
    let _ = http1::Builder::new()
        .keep_alive(false)
        .timer(TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if ended_here.load(Ordering::SeqCst) {
        let _ = answered.send(());
    }
}

enum Action {
    Complete,
    Fail,
    Beat,
}

async fn handle(
    shared: &Shared,
    ended_here: &AtomicBool,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let not_found = || {
        problem(
            StatusCode::NOT_FOUND,
            "Not found",
            "no callback wait has this URL; use the callback URL this wait printed, exactly as given",
        )
    };
    let Some(rest) = req.uri().path().strip_prefix(PATH) else {
        return not_found();
    };
    let (secret, action) = match rest.split_once('/') {
        None => (rest, Action::Complete),
        Some((s, "fail")) => (s, Action::Fail),
        Some((s, "heartbeat")) => (s, Action::Beat),
        Some(_) => return not_found(),
    };
    if !shared.knows(secret) {
        return not_found();
    }
    if req.method() != Method::POST {
        let mut res = problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "Method not allowed",
            format!(
                "a callback URL takes POST, not {}: POST a JSON body to it (or to its /fail), or POST to its /heartbeat",
                req.method()
            ),
        );
        res.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return res;
    }
    match action {
        Action::Beat => {
            // Its body, if any, is not read: what matters is that it came.
            let _ = read_bounded(req).await;
            let beat = shared.beat();
            wait_answer(
                if beat {
                    StatusCode::OK
                } else {
                    StatusCode::CONFLICT
                },
                &shared.current(),
            )
        }
        Action::Fail => {
            let body = match json_body(req).await {
                Ok(b) => b,
                Err(refusal) => return refusal.answer(),
            };
            let detail = crate::engine::bound::detail(&body);
            let ended = shared.end(Status::Failed, FAILED.into(), Some(detail), None);
            finished(shared, ended_here, ended)
        }
        Action::Complete => {
            let headers = crate::probe::header_map(req.headers());
            let body = match json_body(req).await {
                Ok(b) => b,
                Err(refusal) => return refusal.answer(),
            };
            let spec = &shared.spec;
            let judged = spec.success_condition.is_some()
                || spec.failure_condition.is_some()
                || spec.state.is_some();
            if !judged {
                let output = Some(crate::engine::bound::output(&body));
                let ended = shared.end(Status::Succeeded, SUCCEEDED.into(), None, output);
                return finished(shared, ended_here, ended);
            }
            match verdict(spec.clone(), body.clone(), headers).await {
                Verdict::End(o) if o.end == End::Succeeded => {
                    let output = Some(crate::engine::bound::output(&body));
                    let ended = shared.end(Status::Succeeded, o.reason, None, output);
                    finished(shared, ended_here, ended)
                }
                Verdict::End(o) => {
                    let detail = o
                        .error_detail
                        .unwrap_or_else(|| crate::engine::bound::detail(&body));
                    let ended = shared.end(Status::Failed, o.reason, Some(detail), None);
                    finished(shared, ended_here, ended)
                }
                Verdict::Progress(state) => {
                    let running = shared.progress(state);
                    let status = if running {
                        StatusCode::ACCEPTED
                    } else {
                        StatusCode::CONFLICT
                    };
                    wait_answer(status, &shared.current())
                }
                Verdict::Unjudged(why) => problem(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "Target refused",
                    format!("the callback's body was not judged: {why}; the wait goes on"),
                ),
            }
        }
    }
}

/// The answer to a completion: `200` with the wait it ended, or `409` with the
/// wait as what came first ended it.
fn finished(shared: &Shared, ended_here: &AtomicBool, ended: bool) -> Response<Full<Bytes>> {
    if ended {
        ended_here.store(true, Ordering::SeqCst);
    }
    let status = if ended {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    wait_answer(status, &shared.current())
}

/// What the spec's state path and conditions make of a callback's body.
enum Verdict {
    /// It ends the wait `succeeded` or `failed`.
    End(engine::Outcome),
    /// It meets neither: the wait goes on, with the state read from it, if any.
    Progress(Option<String>),
    /// It could not be judged: the wait goes on unchanged.
    Unjudged(String),
}

/// The engine's verdict on a callback's body, judged alone as a server judges
/// it: as a response with HTTP 200 carrying it. Conditions run on the CPU pool,
/// whose threads have the stack a deep expression needs.
async fn verdict(
    spec: Spec,
    body: Value,
    headers: std::collections::BTreeMap<String, String>,
) -> Verdict {
    let judged = crate::cpu::pool()
        .run(crate::cpu::Lane::Long, crate::cpu::SYSTEM, move || {
            let now = Utc::now();
            let obs = crate::probe::callback_observation(&spec, &body, &headers);
            let (mut st, _) = EngineState::start(&spec, now);
            let cx = Context {
                now,
                floor: Duration::ZERO,
                jitter: 0.0,
            };
            let step = engine::step(&spec, &mut st, obs, cx);
            match step.decision {
                Decision::End(o) if matches!(o.end, End::Succeeded | End::Failed) => {
                    Verdict::End(o)
                }
                Decision::End(o) => Verdict::Unjudged(o.reason),
                Decision::PollAt(_) => match step.events.into_iter().find_map(|e| match e {
                    engine::Event::Retry { error, .. } => Some(error),
                    _ => None,
                }) {
                    Some(error) => Verdict::Unjudged(error),
                    None => Verdict::Progress(st.state),
                },
            }
        })
        .await;
    judged.unwrap_or_else(|lost| Verdict::Unjudged(lost.to_string()))
}

/// The request's body as JSON, or the answer that refuses it, as a server's:
/// `415` for a type that is not JSON, `413` past 64 KiB, `400` for an empty
/// body or one that is not JSON, `408` for one that does not come.
async fn json_body(req: Request<Incoming>) -> Result<Value, Refusal> {
    check_content_type(req.headers())?;
    let bytes = read_bounded(req).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "Bad request",
            "the request body is empty; send JSON, e.g. {} (or the job's result)",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            "Bad request",
            format!("the request body is not valid JSON: {e}"),
        )
    })
}

/// JSON, or no type, or curl's `-d` default (form-urlencoded) whose body is
/// JSON, as a server takes.
fn check_content_type(headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime == "application/json"
        || mime.ends_with("+json")
        || mime == "application/x-www-form-urlencoded"
    {
        return Ok(());
    }
    Err(refuse(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "Unsupported media type",
        format!("the request body must be JSON (Content-Type: application/json), not {mime}"),
    ))
}

/// The body, at most [`MAX_BODY`] bytes of it, read within [`READ_TIMEOUT`].
async fn read_bounded(req: Request<Incoming>) -> Result<Vec<u8>, Refusal> {
    let mut body = req.into_body();
    let mut bytes: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| {
                refuse(
                    StatusCode::BAD_REQUEST,
                    "Bad request",
                    "the request body could not be read: it broke off, or its chunked encoding is malformed",
                )
            })?;
            let Ok(chunk) = frame.into_data() else {
                continue;
            };
            seen = seen.saturating_add(chunk.len());
            if seen > DRAIN_AT_MOST {
                break;
            }
            if seen <= MAX_BODY {
                bytes.extend_from_slice(&chunk);
            }
        }
        Ok::<(), Refusal>(())
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(refuse(
                StatusCode::REQUEST_TIMEOUT,
                "Request timeout",
                format!(
                    "the request body did not arrive within {}",
                    crate::engine::duration::format(READ_TIMEOUT)
                ),
            ));
        }
    }
    if seen > MAX_BODY {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Request too large",
            format!(
                "the request body is over the {} KiB limit; the wait goes on",
                MAX_BODY / 1024
            ),
        ));
    }
    Ok(bytes)
}

/// Why a request is refused: its status and a sentence.
struct Refusal {
    status: StatusCode,
    title: &'static str,
    detail: String,
}

fn refuse(status: StatusCode, title: &'static str, detail: impl Into<String>) -> Refusal {
    Refusal {
        status,
        title,
        detail: detail.into(),
    }
}

impl Refusal {
    fn answer(self) -> Response<Full<Bytes>> {
        problem(self.status, self.title, self.detail)
    }
}

fn wait_answer(status: StatusCode, wait: &Wait) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(wait).unwrap_or_default();
    answer(status, "application/json", body)
}

/// A refusal as a server words one (RFC 9457 problem details).
fn problem(status: StatusCode, title: &str, detail: impl Into<String>) -> Response<Full<Bytes>> {
    let body = json!({
        "type": format!("/problems/{}", title.to_lowercase().replace(' ', "-")),
        "title": title,
        "status": status.as_u16(),
        "detail": detail.into(),
    });
    answer(
        status,
        "application/problem+json",
        body.to_string().into_bytes(),
    )
}

fn answer(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(body)));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_is_listened_on_unless_asked() {
        for ok in ["127.0.0.1:0", "[::1]:9000", "[::ffff:127.0.0.1]:0"] {
            assert!(Listen::check(ok.parse().unwrap(), false).is_ok(), "{ok}");
        }
        let e = Listen::check("0.0.0.0:9000".parse().unwrap(), false).unwrap_err();
        assert!(e.0.contains("--allow-remote"), "{}", e.0);
        assert!(Listen::check("0.0.0.0:9000".parse().unwrap(), true).is_ok());
    }
}
