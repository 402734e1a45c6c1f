//! The client's arguments, and the request they make: a spec file, a preset or a
//! URL, with flags laid over it. `create` and `wait` share [`SpecArgs`], so the
//! same flags describe a wait whether it runs on a server or in this process.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{Map, Value, json};

use super::Problem;

/// What to wait for: the flags `create` and `wait` share.
#[derive(Args, Debug)]
pub struct SpecArgs {
    /// Start from this preset (`GET /presets` on a server lists them).
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
    /// Wait for HOST:PORT to accept a TCP connection (target.url
    /// tcp://HOST:PORT); conditions read tcp.connected, tcp.elapsed.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["url", "tls"])]
    pub tcp: Option<String>,
    /// Wait for the certificate chain HOST:PORT serves to verify (target.url
    /// tls://HOST:PORT); conditions read tls.days_left, tls.sans and the rest.
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "url")]
    pub tls: Option<String>,
    /// Wait for a gRPC server to report SERVING through the gRPC health checking
    /// protocol (target.url grpc://HOST:PORT[/SERVICE]); conditions read
    /// grpc.status, grpc.code, grpc.elapsed.
    #[arg(long, value_name = "HOST:PORT[/SERVICE]", conflicts_with_all = ["url", "tcp", "tls", "ca", "server_name"])]
    pub grpc: Option<String>,
    /// Wait for NAME to resolve (target.url dns://NAME?type=TYPE), asked of the
    /// server's resolver (with `wait`, of --resolver); conditions read
    /// dns.records, dns.rcode, dns.elapsed.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["url", "tcp", "tls", "grpc", "ca", "server_name"])]
    pub dns: Option<String>,
    /// With --dns: the record type asked for, A (the default), AAAA, CNAME, TXT,
    /// MX, SRV or NS.
    #[arg(long = "type", value_name = "TYPE", requires = "dns")]
    pub record_type: Option<String>,
    /// A PEM file of the certificate authorities the target's chain must verify
    /// to, instead of the platform's (target.tls.ca; at most 32 KiB).
    #[arg(long, value_name = "FILE", conflicts_with = "tcp")]
    pub ca: Option<PathBuf>,
    /// With --tls: the name the server is asked for (SNI) and its chain verified
    /// for, instead of HOST (target.tls.server_name).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["url", "tcp"])]
    pub server_name: Option<String>,
    /// The method of each poll: GET (the default), POST, PUT, PATCH or DELETE
    /// (target.method). A poll that is not a GET carries its own Idempotency-Key.
    #[arg(long, value_name = "METHOD", conflicts_with_all = ["tcp", "tls", "grpc", "dns"])]
    pub method: Option<String>,
    /// The body each poll sends (target.body): TEXT, or @FILE for a file's text
    /// (@- reads standard input), at most 16 KiB. A JSON object or array is sent
    /// as JSON, anything else as text. Without --method the method is POST.
    #[arg(long, value_name = "@FILE|TEXT", conflicts_with_all = ["tcp", "tls", "grpc", "dns"])]
    pub data: Option<String>,
    /// The JSON Pointer or JSONPath of the state in the target's answer, e.g.
    /// /data/attributes/status (used with --want and --fail).
    #[arg(long, value_name = "PATH")]
    pub state: Option<String>,
    /// A state that means done; repeat for several.
    #[arg(long = "want", value_name = "STATE")]
    pub want: Vec<String>,
    /// A state that means it failed; repeat for several.
    #[arg(long = "fail", value_name = "STATE")]
    pub fail: Vec<String>,
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
    /// The wait's timeout (its deadline is now plus this), e.g. 30m; 10m when
    /// neither this nor the request says.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// The poll schedule: the first interval, then the factor each healthy poll
    /// multiplies it by, up to the largest interval (poll.initial, poll.factor,
    /// poll.max), e.g. 5s or 5s,1 (every 5 s) or 1s,2,1m; 2s,1.5,15s when neither
    /// this nor the request says.
    #[arg(long, value_name = "INITIAL[,FACTOR[,MAX]]")]
    pub poll: Option<String>,
    /// A header to send with each poll, NAME:VALUE (e.g. 'Authorization: Bearer
    /// …'); repeat for several. Values are secrets, as in target.headers: never
    /// shown back, and sealed at rest by a server with a secret key.
    #[arg(long = "header", value_name = "NAME:VALUE", conflicts_with_all = ["tcp", "tls", "grpc", "dns"])]
    pub headers: Vec<String>,
    /// Wait for a POST to the wait's callback URL instead of polling (callback:
    /// {}): a JSON body POSTed to the URL ends the wait succeeded, one POSTed to
    /// URL/fail ends it failed with the body as its error_detail, and
    /// URL/heartbeat restarts --heartbeat's clock; with --state, --want, --fail or
    /// a condition, each body is judged by them as a polled answer would be. The
    /// URL is printed on its own line, right after the wait's; anyone who has it
    /// can end the wait.
    #[arg(long, conflicts_with_all = CALLBACK_CONFLICTS)]
    pub callback: bool,
    /// With --callback (which it implies): silence this long (no heartbeat, no
    /// completion) ends the wait failed (callback.heartbeat), e.g. 5m.
    #[arg(long, value_name = "DURATION", conflicts_with_all = CALLBACK_CONFLICTS)]
    pub heartbeat: Option<String>,
}

/// The flags that describe what to poll, which a callback wait does not take (it
/// takes --state, --want, --fail and the conditions, which judge its bodies).
const CALLBACK_CONFLICTS: [&str; 14] = [
    "preset",
    "params",
    "url",
    "tcp",
    "tls",
    "grpc",
    "dns",
    "record_type",
    "ca",
    "server_name",
    "method",
    "data",
    "poll",
    "headers",
];

/// How a command prints the wait (`--output`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// One line for the wait (and one per event as it is followed).
    Human,
    /// The wait as one JSON object, as the server answers it.
    Json,
}

/// Whether `--json` or `--output json` asks for JSON.
pub(super) fn wants_json(json: bool, output: Option<Output>) -> bool {
    json || output == Some(Output::Json)
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    #[command(flatten)]
    pub spec: SpecArgs,
    /// A webhook to POST to when the wait ends (signed, Standard Webhooks); repeat
    /// for several. Needs --notify-secret-file.
    #[arg(long = "notify", value_name = "URL", requires = "notify_secret_file")]
    pub notify: Vec<String>,
    /// A file holding the webhooks' signing secret (whsec_…, one line), so that it
    /// never shows in a process list or a shell history.
    #[arg(long, value_name = "FILE", requires = "notify")]
    pub notify_secret_file: Option<PathBuf>,
    /// Follow the wait to its end, printing one line per event; the exit code tells
    /// how it ended.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: cancel the wait on the server when interrupted.
    #[arg(long, requires = "wait")]
    pub cancel_on_interrupt: bool,
    /// Poll with a credential the server's operator holds for your tenant
    /// (target.auth.credential; the server's --credentials-file names them).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["all", "any", "callback", "heartbeat"])]
    pub auth_credential: Option<String>,
    /// Give the wait a nudge URL, printed on its own line after the wait's (with
    /// --output json, the answer's nudge_url): a POST to it polls the wait now,
    /// at most once a minimum poll interval; the poll still decides.
    #[arg(long, conflicts_with_all = ["all", "any", "callback", "heartbeat"])]
    pub nudge: bool,
    /// Listen to the tenant's event source SOURCE for events whose key is KEY
    /// (on_event): each one polls the wait now, as a nudge does.
    #[arg(long, value_name = "SOURCE:KEY", conflicts_with_all = ["all", "any"])]
    pub on_event: Option<String>,
    /// With --on-event: a CEL expression over the event's body and headers; an
    /// event with the key is the wait's only when it is true (on_event.match).
    #[arg(long, value_name = "EXPR", requires = "on_event")]
    pub on_event_match: Option<String>,
    /// With --on-event: poll (the default) polls the wait now; end judges the
    /// event's body by the wait's conditions, as a callback's is (on_event.then).
    #[arg(long, value_name = "poll|end", requires = "on_event", value_parser = ["poll", "end"])]
    pub on_event_then: Option<String>,
    /// Make a retried create return the first wait (the Idempotency-Key header).
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// Print the wait as JSON (with --wait: the ended wait; progress goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// human (the default) or json: the wait as one JSON object, as the server
    /// answers it, with its callback_url after a --callback create. With --wait,
    /// the ended wait, while the progress lines (and the callback URL) go to stderr.
    #[arg(long, value_enum, value_name = "FORMAT", conflicts_with = "json")]
    pub output: Option<Output>,
    /// Create a group that succeeds when every one of these waits does: each FILE
    /// holds a wait request (or {"id": "<wait id>"}). --label, --timeout and
    /// --notify apply to the group.
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = &GROUP_CONFLICTS[1..])]
    pub all: Vec<PathBuf>,
    /// Create a group that succeeds when the first of these waits does (see --all).
    #[arg(long, value_name = "FILE", num_args = 1.., conflicts_with_all = GROUP_CONFLICTS)]
    pub any: Vec<PathBuf>,
}

/// The flags that describe one wait, which a group (--all, --any) does not take,
/// after `all`, which `--any` does not take either.
const GROUP_CONFLICTS: [&str; 23] = [
    "all",
    "preset",
    "params",
    "spec",
    "url",
    "tcp",
    "tls",
    "grpc",
    "dns",
    "record_type",
    "ca",
    "server_name",
    "method",
    "data",
    "state",
    "want",
    "fail",
    "success_condition",
    "failure_condition",
    "poll",
    "headers",
    "callback",
    "heartbeat",
];

#[derive(Args, Debug)]
pub struct OneArgs {
    /// The wait's id.
    pub id: String,
    /// Print the wait as JSON.
    #[arg(long)]
    pub json: bool,
    /// human (the default) or json: the wait as one JSON object, as the server
    /// answers it (--json is the same).
    #[arg(long, value_enum, value_name = "FORMAT", conflicts_with = "json")]
    pub output: Option<Output>,
}

#[derive(Args, Debug)]
pub struct IdsArgs {
    /// The waits' ids.
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// Print each wait as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ListArgs {
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
    /// The wait's id.
    pub id: String,
    /// Cancel the wait on the server when interrupted.
    #[arg(long)]
    pub cancel_on_interrupt: bool,
    /// Print each event as one line of JSON.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn check_id(id: &str) -> Result<(), Problem> {
    uuid::Uuid::parse_str(id).map(|_| ()).map_err(|_| {
        Problem(format!(
            "\"{id}\" is not a wait id; wait ids are UUIDs such as 0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21"
        ))
    })
}

pub(super) fn split_pair<'a>(flag: &str, s: &'a str) -> Result<(&'a str, &'a str), Problem> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| Problem(format!("{flag} takes NAME=VALUE, not \"{s}\"")))
}

/// The text of `path` (`-`: standard input), read only as far as `limit` bytes: a
/// longer one is refused with a sentence naming `what` it should have held,
/// without reading the rest (a `--spec /dev/zero` is refused at once).
pub(super) fn read_bounded(path: &Path, limit: usize, what: &str) -> Result<String, Problem> {
    use std::io::Read;
    let shown = path.display();
    let mut bytes = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(limit as u64 + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(limit as u64 + 1).read_to_end(&mut bytes))
    };
    let from = if path.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        shown.to_string()
    };
    read.map_err(|e| format!("cannot read {from}: {e}"))?;
    if bytes.len() > limit {
        return Err(format!(
            "{from} is longer than {}, more than {what} can be; is it the right file?",
            crate::engine::bound::format_size(limit)
        )
        .into());
    }
    String::from_utf8(bytes).map_err(|_| Problem(format!("{from} is not UTF-8 text")))
}

/// A wait request from `path`: a JSON object, no larger than a server takes.
fn read_request(path: &Path) -> Result<Map<String, Value>, Problem> {
    let text = read_bounded(path, crate::api::MAX_BODY, "a wait request")?;
    let from = if path.as_os_str() == "-" {
        "standard input".to_string()
    } else {
        path.display().to_string()
    };
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(format!("{from} is not a JSON object").into()),
        Err(e) => Err(format!("{from} is not valid JSON: {e}").into()),
    }
}

/// The object at `key` of `req`, taken out to be added to (empty if absent).
pub(super) fn take_object(req: &mut Map<String, Value>, key: &str) -> Map<String, Value> {
    match req.remove(key) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    }
}

/// `NAME=VALUE` flags added to the object at `key`.
fn add_pairs(
    req: &mut Map<String, Value>,
    key: &str,
    flag: &str,
    pairs: &[String],
) -> Result<(), Problem> {
    if pairs.is_empty() {
        return Ok(());
    }
    let mut obj = take_object(req, key);
    for p in pairs {
        let (k, v) = split_pair(flag, p)?;
        obj.insert(k.into(), json!(v));
    }
    req.insert(key.into(), Value::Object(obj));
    Ok(())
}

/// The request the flags describe: the spec file (if any), then the flags over it.
pub(super) fn build_request(a: &SpecArgs) -> Result<Map<String, Value>, Problem> {
    let stdin = |p: Option<&Path>| p.is_some_and(|p| p.as_os_str() == "-");
    let readers: Vec<&str> = [
        ("--spec -", stdin(a.spec.as_deref())),
        ("--ca -", stdin(a.ca.as_deref())),
        ("--data @-", a.data.as_deref() == Some("@-")),
    ]
    .into_iter()
    .filter_map(|(flag, reads)| reads.then_some(flag))
    .collect();
    if readers.len() > 1 {
        return Err(format!(
            "{} would each read standard input; give all but one of them as a file",
            readers.join(" and ")
        )
        .into());
    }
    let mut req = match &a.spec {
        None => Map::new(),
        Some(path) => read_request(path)?,
    };
    let callback = a.callback || a.heartbeat.is_some();
    if a.spec.is_none()
        && a.preset.is_none()
        && a.url.is_none()
        && a.tcp.is_none()
        && a.tls.is_none()
        && a.grpc.is_none()
        && a.dns.is_none()
        && !callback
    {
        return Err(
            "say what to wait for: --preset NAME (with --param NAME=VALUE), --spec FILE with a request, --url URL with --state PATH --want STATE or --success-condition EXPR, --tcp HOST:PORT, --tls HOST:PORT, --grpc HOST:PORT, --dns NAME, or --callback for a POST to the wait's own URL"
                .into(),
        );
    }
    if callback {
        let mut cb = take_object(&mut req, "callback");
        if let Some(h) = &a.heartbeat {
            crate::engine::duration::parse(h).map_err(|e| format!("--heartbeat {e}"))?;
            cb.insert("heartbeat".into(), json!(h));
        }
        req.insert("callback".into(), Value::Object(cb));
    }
    let url = super::target::url_of(a)?;
    if let Some(url) = url {
        let mut target = take_object(&mut req, "target");
        target.insert("url".into(), json!(url));
        req.insert("target".into(), Value::Object(target));
    }
    super::target::add_target_flags(&mut req, a)?;
    for (key, value) in [
        ("state", &a.state),
        ("success_condition", &a.success_condition),
        ("failure_condition", &a.failure_condition),
        ("preset", &a.preset),
    ] {
        if let Some(v) = value {
            req.insert(key.into(), json!(v));
        }
    }
    for (key, values) in [("want", &a.want), ("fail", &a.fail)] {
        if !values.is_empty() {
            req.insert(key.into(), json!(values));
        }
    }
    add_pairs(&mut req, "params", "--param", &a.params)?;
    add_pairs(&mut req, "labels", "--label", &a.labels)?;
    if let Some(t) = &a.timeout {
        crate::engine::duration::parse(t).map_err(|e| format!("--timeout {e}"))?;
        req.insert("timeout".into(), json!(t));
    }
    if let Some(p) = &a.poll {
        let mut poll = take_object(&mut req, "poll");
        poll.extend(parse_poll(p)?);
        req.insert("poll".into(), Value::Object(poll));
    }
    if !a.headers.is_empty() {
        let mut target = take_object(&mut req, "target");
        let mut headers = take_object(&mut target, "headers");
        for h in &a.headers {
            let (name, value) = split_header(h)?;
            headers.insert(name.into(), json!(value));
        }
        target.insert("headers".into(), Value::Object(headers));
        req.insert("target".into(), Value::Object(target));
    }
    Ok(req)
}

/// `--poll INITIAL[,FACTOR[,MAX]]` as the request's `poll` fields. The bounds (the
/// server's floor, a factor from 1 to 10, `max` not below `initial`) are the
/// validator's, which names the `poll` field it refuses.
fn parse_poll(p: &str) -> Result<Map<String, Value>, Problem> {
    let usage =
        "--poll takes INITIAL[,FACTOR[,MAX]]: durations and a number, e.g. 5s, 5s,1 or 1s,2,1m";
    let parts: Vec<&str> = p.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return Err(format!("{usage}; \"{p}\" has {} parts", parts.len()).into());
    }
    let mut poll = Map::new();
    for (i, part) in parts.iter().enumerate() {
        let (key, value) = match i {
            1 => (
                "factor",
                part.parse::<f64>()
                    .ok()
                    .filter(|f| f.is_finite())
                    .map(|f| json!(f))
                    .ok_or_else(|| format!("{usage}; the factor \"{part}\" is not a number"))?,
            ),
            _ => {
                crate::engine::duration::parse(part).map_err(|e| {
                    let which = if i == 0 { "INITIAL" } else { "MAX" };
                    format!("{usage}; {which} {e}")
                })?;
                (if i == 0 { "initial" } else { "max" }, json!(part))
            }
        };
        poll.insert(key.into(), value);
    }
    Ok(poll)
}

/// `--header NAME:VALUE`, split at the first `:`, the value without the spaces
/// around it. The value is a secret: no sentence repeats it, nor the text given
/// when it has no name.
fn split_header(h: &str) -> Result<(&str, &str), Problem> {
    match h.split_once(':') {
        Some((name, value)) if !name.trim().is_empty() => Ok((name.trim(), value.trim())),
        _ => Err(
            "--header takes NAME:VALUE, e.g. --header 'Authorization: Bearer …'; the one given has no name before a ':' (it is not repeated here, since a header value may be a secret)"
                .into(),
        ),
    }
}

/// The request `create` sends: [`build_request`], and the webhooks of `--notify`
/// with the secret from `--notify-secret-file`.
pub(super) fn create_request(a: &CreateArgs) -> Result<Value, Problem> {
    let mut req = match (a.all.is_empty(), a.any.is_empty()) {
        (true, true) => build_request(&a.spec)?,
        (false, _) => group_request("all", &a.all, &a.spec)?,
        (true, false) => group_request("any", &a.any, &a.spec)?,
    };
    if a.nudge {
        req.insert("nudge".into(), json!(true));
    }
    if let Some(on) = &a.on_event {
        let (source, key) = on
            .split_once(':')
            .filter(|(s, k)| !s.is_empty() && !k.is_empty())
            .ok_or_else(|| {
                Problem(format!(
                    "--on-event takes SOURCE:KEY, an event source's name and the key its events must carry, e.g. --on-event ci:run-42; \"{on}\" has no source or no key"
                ))
            })?;
        let mut listen = take_object(&mut req, "on_event");
        listen.insert("source".into(), json!(source));
        listen.insert("key".into(), json!(key));
        if let Some(m) = &a.on_event_match {
            listen.insert("match".into(), json!(m));
        }
        if let Some(t) = &a.on_event_then {
            listen.insert("then".into(), json!(t));
        }
        req.insert("on_event".into(), Value::Object(listen));
    }
    if let Some(name) = &a.auth_credential {
        let mut target = take_object(&mut req, "target");
        target.insert("auth".into(), json!({ "credential": name }));
        req.insert("target".into(), Value::Object(target));
    }
    if let Some(path) = &a.notify_secret_file {
        // A secret is `whsec_` and the base64 of at most 64 bytes: a longer file is
        // not one, and is not read past this.
        let secret = read_bounded(path, 1024, "a webhook secret")
            .map_err(|Problem(e)| format!("the --notify-secret-file: {e}"))?;
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
    Ok(Value::Object(req))
}

/// A group's request: `{mode: [each file's request]}`, with the labels and the
/// timeout of the flags.
fn group_request(
    mode: &str,
    files: &[PathBuf],
    a: &SpecArgs,
) -> Result<Map<String, Value>, Problem> {
    let mut members = Vec::with_capacity(files.len());
    for path in files {
        members.push(Value::Object(read_request(path)?));
    }
    let mut req = Map::new();
    req.insert(mode.into(), Value::Array(members));
    add_pairs(&mut req, "labels", "--label", &a.labels)?;
    if let Some(t) = &a.timeout {
        crate::engine::duration::parse(t).map_err(|e| format!("--timeout {e}"))?;
        req.insert("timeout".into(), json!(t));
    }
    Ok(req)
}
