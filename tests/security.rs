//! Security tests (docs/design.md §7), black-box over HTTP: hostile input never earns a
//! 5xx and is always answered with problem+json; every SSRF form is refused; tokens
//! and tenants hold on every route; target header values never leak (responses,
//! logs of the real binary at trace level, the database when a key is configured);
//! key rotation keeps old waits polling; and the limits answer 429 with Retry-After.

use crate::support;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use sqlx::Connection;
use support::in_process::{Call, InProcess};
use support::replica::free_port;
use support::*;

const TOKEN_A: &str = "tok-tenant-a-0123456789abcdef";
const TOKEN_B: &str = "tok-tenant-b-0123456789abcdef";
/// The target header value that must never come back out.
const CANARY: &str = "Bearer s3cr3t-LEAK-canary-12345";
/// A second secret header value, in a custom header.
const CANARY2: &str = "s3cr3t-LEAK-canary-67890";
/// What is searched for: common to both canaries.
const NEEDLE: &str = "LEAK-canary";
const KEY1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

/// Status, headers and body text of a sent request.
async fn send(req: reqwest::RequestBuilder) -> (u16, HeaderMap, String) {
    let r = req.send().await.expect("request sent");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    (status, headers, text)
}

/// Why this answer is not a well-formed 4xx problem document, if it is not one.
fn problem_fault(status: u16, headers: &HeaderMap, text: &str) -> Option<String> {
    if status >= 500 {
        return Some(format!("a {status}: {text}"));
    }
    if !(400..500).contains(&status) {
        return Some(format!("not an error but a {status}: {text}"));
    }
    let ct = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct != "application/problem+json" {
        return Some(format!("a {status} of content type {ct:?}: {text}"));
    }
    let p: Value = match serde_json::from_str(text) {
        Ok(p) => p,
        Err(e) => {
            return Some(format!(
                "a {status} whose problem is not JSON ({e}): {text}"
            ));
        }
    };
    if p["status"] != json!(status) {
        return Some(format!(
            "a {status} whose problem says status {}",
            p["status"]
        ));
    }
    for field in ["type", "title", "detail"] {
        if p[field].as_str().is_none_or(str::is_empty) {
            return Some(format!("a {status} whose problem has no {field}: {text}"));
        }
    }
    None
}

/// Sends `req` and asserts a problem document of status `want`; returns it.
async fn expect_problem(req: reqwest::RequestBuilder, want: u16) -> Value {
    let (status, headers, text) = send(req).await;
    if let Some(fault) = problem_fault(status, &headers, &text) {
        panic!("wanted a {want} problem, got {fault}");
    }
    assert_eq!(status, want, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// A valid spec that never polls during a test (its first poll is 15 s away).
fn quiet_spec(url: &str) -> Value {
    let mut s = spec(url);
    s["poll"]["delay"] = json!("15s");
    s
}

/// `base` with the value at JSON Pointer `ptr` set to `v` (objects made as needed).
fn set(mut base: Value, ptr: &str, v: Value) -> Value {
    let mut slot = &mut base;
    for key in ptr.trim_start_matches('/').split('/') {
        if !slot.is_object() {
            *slot = json!({});
        }
        slot = slot
            .as_object_mut()
            .unwrap()
            .entry(key.to_string())
            .or_insert(Value::Null);
    }
    *slot = v;
    base
}

/// The usual test flags without `--allow-targets`: the SSRF guard at its default.
fn guarded_args(db: &TestDb, extra: &[&str]) -> Vec<String> {
    let mut a = unset_flag(test_args(&db.url), "--allow-targets");
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn tenant_flags() -> String {
    format!("a:{TOKEN_A},b:{TOKEN_B}")
}

async fn create_as(app: &App, token: &str, body: &Value) -> (u16, Value) {
    let (status, _, text) = send(
        app.client
            .post(app.url("/waits"))
            .bearer_auth(token)
            .json(body),
    )
    .await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn get_as(app: &App, token: &str, path: &str) -> (u16, Value) {
    let (status, _, text) = send(app.client.get(app.url(path)).bearer_auth(token)).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Reads an SSE response until `done` holds for what was read, or `within` passes.
async fn read_sse_until(
    mut r: reqwest::Response,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> String {
    let mut text = String::new();
    let until = tokio::time::Instant::now() + within;
    while !done(&text) {
        match tokio::time::timeout_at(until, r.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    text
}

/// The `wait_id`s of the `data:` lines of an SSE text.
fn sse_wait_ids(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .filter_map(|e| e["wait_id"].as_str().map(str::to_string))
        .collect()
}

/// Runs one query against the test database; every row's single text column.
async fn db_texts(db: &TestDb, sql: &'static str) -> Vec<String> {
    let mut conn = sqlx::PgConnection::connect(&db.url)
        .await
        .expect("connect to the test database");
    let rows: Vec<Option<String>> = sqlx::query_scalar(sql)
        .fetch_all(&mut conn)
        .await
        .expect("query");
    let _ = conn.close().await;
    rows.into_iter().flatten().collect()
}

/// Every row of every waitd table, as text.
async fn db_dump(db: &TestDb) -> String {
    let mut all = String::new();
    for sql in [
        "SELECT t::text FROM waits t",
        "SELECT t::text FROM wait_specs t",
        "SELECT t::text FROM wait_events t",
        "SELECT t::text FROM idempotency_keys t",
    ] {
        all.push_str(&db_texts(db, sql).await.join("\n"));
        all.push('\n');
    }
    all
}

/// A `waitd` process of the real binary, whose log lines and exit are heard as they
/// happen ([`support::replica::Watched`]); SIGKILLed on drop.
struct Proc {
    proc: support::replica::Watched,
}

impl Proc {
    fn spawn(args: &[&str], rust_log: &str, log: PathBuf) -> Proc {
        std::fs::File::create(&log).expect("create the log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_waitd"));
        command
            .args(args)
            .env("RUST_LOG", rust_log)
            .env("NO_COLOR", "1")
            .env_remove("WAITD_TOKENS")
            .env_remove("WAITD_ALLOW_ANONYMOUS");
        Proc {
            proc: support::replica::Watched::spawn(command, &log),
        }
    }

    fn log_text(&self) -> String {
        self.proc.log_text()
    }

    /// Until it logs "waitd listening" (its `rust_log` must let INFO lines of `waitd`
    /// through), then `url` must answer 2xx; panics with the log if it exits first.
    async fn ready(&mut self, url: &str) {
        if let Err(why) = self.proc.listening(Duration::from_secs(20)).await {
            panic!("waitd {why}:\n{}", self.log_text());
        }
        let answer = client().get(url).send().await;
        assert!(
            answer.as_ref().is_ok_and(|r| r.status().is_success()),
            "waitd listens but {url} answered {:?}:\n{}",
            answer.map(|r| r.status()),
            self.log_text()
        );
    }

    /// Its exit status, if it exits within `within`.
    async fn exit_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        self.proc.exit(within).await
    }

    /// SIGTERM, and the exit status if it exits within 20 s.
    async fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.signal("TERM");
        self.exit_within(Duration::from_secs(20)).await
    }
}

/// Removes a test's directory of logs, unless `WAITD_TEST_KEEP_LOGS` is set.
fn remove_unless_kept(dir: &std::path::Path) {
    if std::env::var_os("WAITD_TEST_KEEP_LOGS").is_some() {
        eprintln!("logs kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(dir);
    }
}

fn temp_path(prefix: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&p).unwrap();
    p
}

// ---------------------------------------------------------------------------------
// Hostile input
// ---------------------------------------------------------------------------------

/// One hostile request and the status it must get. The batteries call waitd's router
/// in this process (no Postgres, no socket): what they check is what the API
/// answers. The HTTP layer's own limits (the bare 414, a malformed chunked body, header
/// timeouts) are tested through a socket in tests/hostile_tenants.rs.
struct Case {
    name: String,
    req: Call,
    want: u16,
}

/// Sends every case; fails listing each one that got a 5xx, no problem+json, or a
/// status other than its own.
async fn run_battery(cases: Vec<Case>) {
    let total = cases.len();
    let mut faults = Vec::new();
    for c in cases {
        let a = c.req.send().await;
        let (status, headers, text) = (a.status, a.headers, a.text);
        if let Some(f) = problem_fault(status, &headers, &text) {
            faults.push(format!("{}: {f}", c.name));
        } else if status != c.want {
            faults.push(format!(
                "{}: wanted {}, got {status}: {text}",
                c.name, c.want
            ));
        }
    }
    assert!(
        faults.is_empty(),
        "{} of {total} hostile requests were mishandled:\n{}",
        faults.len(),
        faults.join("\n")
    );
}

/// The spec the hostile bodies are variations of.
fn base() -> Value {
    let mut s = quiet_spec("https://api.example.com/servers/1");
    s["target"]["headers"] = json!({"Authorization": "Bearer x"});
    s
}

#[tokio::test]
async fn hostile_request_bodies_never_earn_a_5xx_and_are_always_answered_with_problem_json() {
    let app = InProcess::start().await;
    let post = || app.post("/waits");
    let mut cases = Vec::new();

    // Raw bodies: malformed, odd, deep and badly encoded JSON; all 400.
    let deep_arrays = format!("{}{}", "[".repeat(30_000), "]".repeat(30_000));
    let deep_objects = format!(
        r#"{{"labels": {}1{}}}"#,
        r#"{"a":"#.repeat(5_000),
        "}".repeat(5_000)
    );
    let mut duplicate = base().to_string();
    duplicate.insert_str(duplicate.len() - 1, r#", "want": 5"#);
    let huge_int = base().to_string().replace(
        r#""want":["on"]"#,
        r#""want":["on"],"consecutive":18446744073709551616"#,
    );
    let with_bytes = |head: &str, bytes: &[u8], tail: &str| {
        let mut v = head.as_bytes().to_vec();
        v.extend_from_slice(bytes);
        v.extend_from_slice(tail.as_bytes());
        v
    };
    let raw_bodies: Vec<(&str, Vec<u8>)> = vec![
        ("truncated JSON", br#"{"target": {"url": "#.to_vec()),
        ("trailing garbage", br#"{"want": ["on"]} {}"#.to_vec()),
        ("single quotes", b"{'want': ['on']}".to_vec()),
        ("a NaN literal", br#"{"poll": {"factor": NaN}}"#.to_vec()),
        (
            "an Infinity literal",
            br#"{"poll": {"jitter": Infinity}}"#.to_vec(),
        ),
        (
            "a number overflowing f64",
            br#"{"consecutive": 1e400}"#.to_vec(),
        ),
        ("an integer of 2^64", huge_int.into_bytes()),
        (
            "duplicate keys, the last a wrong type",
            duplicate.into_bytes(),
        ),
        ("an empty body", Vec::new()),
        ("a whitespace body", b" \r\n\t ".to_vec()),
        ("a null body", b"null".to_vec()),
        ("an array body", b"[{}]".to_vec()),
        ("a string body", br#""on""#.to_vec()),
        ("a bare number body", b"-0".to_vec()),
        ("30 000 nested arrays", deep_arrays.into_bytes()),
        ("5 000 nested objects", deep_objects.into_bytes()),
        ("invalid UTF-8 bytes", vec![b'{', 0xff, 0xfe, b'}']),
        (
            "invalid UTF-8 in a string",
            with_bytes(r#"{"state": "/a"#, &[0xc3, 0x28], r#""}"#),
        ),
        (
            "an overlong UTF-8 encoding",
            with_bytes(r#"{"state": "/"#, &[0xc0, 0xaf], r#""}"#),
        ),
        (
            "a lone surrogate escape",
            br#"{"state": "/\ud800"}"#.to_vec(),
        ),
        ("a raw NUL in a string", b"{\"state\": \"/a\0\"}".to_vec()),
        (
            "a UTF-16 body",
            r#"{"want": []}"#.encode_utf16().flat_map(u16::to_le_bytes).collect(),
        ),
    ];
    for (name, body) in raw_bodies {
        cases.push(Case {
            name: name.into(),
            req: post().header("content-type", "application/json").body(body),
            want: 400,
        });
    }

    // One field of a valid spec made hostile; all 400.
    let mut nested = json!("on");
    for _ in 0..100 {
        nested = json!([nested]);
    }
    let n_strings = |n: usize, f: fn(usize) -> String| -> serde_json::Map<String, Value> {
        (0..n).map(|i| (f(i), json!("v"))).collect()
    };
    let long = |n: usize| "x".repeat(n);
    let fields: Vec<(&str, &str, Value)> = vec![
        // sizes
        (
            "a 60 KB URL",
            "/target/url",
            json!(format!("https://a.example/{}", long(60_000))),
        ),
        (
            "a 10 KB state path",
            "/state",
            json!(format!("/{}", long(10_000))),
        ),
        ("a 10 KB want entry", "/want", json!([long(10_000)])),
        (
            "2 000 want entries",
            "/want",
            json!((0..2000).collect::<Vec<_>>()),
        ),
        (
            "a 20 KB header value",
            "/target/headers",
            json!({"X-Big": long(20_000)}),
        ),
        (
            "40 headers",
            "/target/headers",
            json!(n_strings(40, |i| format!("X-H{i}"))),
        ),
        (
            "40 labels",
            "/labels",
            json!(n_strings(40, |i| format!("l{i}"))),
        ),
        ("a 10 KB label value", "/labels", json!({"k": long(10_000)})),
        ("a 100-deep array as a want entry", "/want", json!([nested])),
        // wrong types
        (
            "target as a string",
            "/target",
            json!("https://api.example.com/"),
        ),
        ("target.url as a number", "/target/url", json!(80)),
        ("want as a string", "/want", json!("on")),
        ("want holding an object", "/want", json!([{"on": true}])),
        ("state as a number", "/state", json!(5)),
        ("timeout as a number", "/timeout", json!(30)),
        ("consecutive as a string", "/consecutive", json!("2")),
        (
            "require_transition as a string",
            "/require_transition",
            json!("true"),
        ),
        ("ignore_case as a number", "/ignore_case", json!(1)),
        ("not_found as a boolean", "/not_found", json!(true)),
        ("poll as a string", "/poll", json!("2s")),
        ("poll.factor as a string", "/poll/factor", json!("NaN")),
        (
            "retry.max_retries as a string",
            "/retry/max_retries",
            json!("10"),
        ),
        ("labels as an array", "/labels", json!(["a:b"])),
        ("a label value as a number", "/labels", json!({"k": 5})),
        (
            "headers as an array",
            "/target/headers",
            json!(["Bearer x"]),
        ),
        (
            "a header value as null",
            "/target/headers",
            json!({"X-A": null}),
        ),
        (
            "a header value as an object",
            "/target/headers",
            json!({"X-A": {"v": 1}}),
        ),
        // negative, fractional and overflowing numbers
        ("consecutive -1", "/consecutive", json!(-1)),
        ("consecutive 0", "/consecutive", json!(0)),
        ("consecutive 1.5", "/consecutive", json!(1.5)),
        (
            "consecutive 2^32+1",
            "/consecutive",
            json!(4_294_967_297u64),
        ),
        ("max_retries -1", "/retry/max_retries", json!(-1)),
        (
            "max_retries 2^32",
            "/retry/max_retries",
            json!(4_294_967_296u64),
        ),
        ("max_retries 1e19", "/retry/max_retries", json!(1e19)),
        ("poll.factor 0", "/poll/factor", json!(0)),
        ("poll.factor -1", "/poll/factor", json!(-1)),
        ("poll.factor 1e308", "/poll/factor", json!(1e308)),
        ("poll.jitter -0.1", "/poll/jitter", json!(-0.1)),
        ("poll.jitter 1", "/poll/jitter", json!(1.0)),
        ("poll.jitter u64::MAX", "/poll/jitter", json!(u64::MAX)),
        // durations
        ("a negative timeout", "/timeout", json!("-5s")),
        ("a unitless timeout", "/timeout", json!("5")),
        ("a fractional timeout", "/timeout", json!("1.5s")),
        ("a zero timeout", "/timeout", json!("0s")),
        ("a timeout with a space inside", "/timeout", json!("5 s")),
        ("a timeout in an unknown unit", "/timeout", json!("5sec")),
        (
            "a timeout in Arabic-Indic digits",
            "/timeout",
            json!("\u{663}s"),
        ),
        (
            "a timeout of 10^29 hours",
            "/timeout",
            json!("99999999999999999999999999999h"),
        ),
        (
            "a timeout of 2^64 ms",
            "/timeout",
            json!("18446744073709551616ms"),
        ),
        (
            "a timeout of u64::MAX ms",
            "/timeout",
            json!("18446744073709551615ms"),
        ),
        ("a timeout over the maximum", "/timeout", json!("25h")),
        ("an empty timeout", "/timeout", json!("")),
        ("a timeout of NUL", "/timeout", json!("\u{0}s")),
        ("a negative poll.initial", "/poll/initial", json!("-1ms")),
        ("poll.delay past the timeout", "/poll/delay", json!("25s")),
        (
            "poll.max of u64::MAX ms",
            "/poll/max",
            json!("18446744073709551615ms"),
        ),
        ("retry.delay of 100 000 h", "/retry/delay", json!("100000h")),
        (
            "retry.max_delay of 2^64 ms",
            "/retry/max_delay",
            json!("18446744073709551616ms"),
        ),
        // labels
        (
            "a Cyrillic label name",
            "/labels",
            json!({"ключ": "значение"}),
        ),
        ("an emoji label name", "/labels", json!({"🚀": "x"})),
        ("an empty label name", "/labels", json!({"": "x"})),
        (
            "a 64-character label name",
            "/labels",
            json!({"k".repeat(64): "x"}),
        ),
        (
            "a label value with a NUL",
            "/labels",
            json!({"k": "a\u{0}b"}),
        ),
        (
            "a label value with CR LF",
            "/labels",
            json!({"k": "a\r\nb"}),
        ),
        (
            "a label value with ESC",
            "/labels",
            json!({"k": "\u{1b}[31mred"}),
        ),
        // headers
        (
            "CR LF in a header value",
            "/target/headers",
            json!({"X-A": "a\r\nX-Injected: 1"}),
        ),
        (
            "LF in a header value",
            "/target/headers",
            json!({"X-A": "a\nb"}),
        ),
        (
            "CR in a header value",
            "/target/headers",
            json!({"X-A": "a\rb"}),
        ),
        (
            "NUL in a header value",
            "/target/headers",
            json!({"X-A": "a\u{0}b"}),
        ),
        (
            "DEL in a header value",
            "/target/headers",
            json!({"X-A": "a\u{7f}b"}),
        ),
        (
            "CR LF in a header name",
            "/target/headers",
            json!({"X-A\r\nX-B": "v"}),
        ),
        (
            "a space in a header name",
            "/target/headers",
            json!({"X A": "v"}),
        ),
        (
            "a colon in a header name",
            "/target/headers",
            json!({"Authorization:": "v"}),
        ),
        ("an empty header name", "/target/headers", json!({"": "v"})),
        (
            "a non-ASCII header name",
            "/target/headers",
            json!({"Autorización": "v"}),
        ),
        (
            "the Host header",
            "/target/headers",
            json!({"Host": "169.254.169.254"}),
        ),
        (
            "the Content-Length header",
            "/target/headers",
            json!({"Content-Length": "5"}),
        ),
        (
            "Transfer-Encoding",
            "/target/headers",
            json!({"Transfer-Encoding": "chunked"}),
        ),
        (
            "a header twice",
            "/target/headers",
            json!({"authorization": "a", "Authorization": "b"}),
        ),
        // URLs
        ("a file URL", "/target/url", json!("file:///etc/passwd")),
        ("an ftp URL", "/target/url", json!("ftp://example.com/x")),
        (
            "a gopher URL",
            "/target/url",
            json!("gopher://example.com:70/_x"),
        ),
        (
            "a javascript URL",
            "/target/url",
            json!("javascript:alert(1)"),
        ),
        (
            "a data URL",
            "/target/url",
            json!("data:application/json,{}"),
        ),
        ("a URL without a host", "/target/url", json!("http://")),
        ("a relative URL", "/target/url", json!("//example.com/x")),
        (
            "a URL with credentials",
            "/target/url",
            json!("https://user:pass@example.com/"),
        ),
        (
            "a URL with a space in the host",
            "/target/url",
            json!("http://exa mple.com/"),
        ),
        (
            "an unclosed IPv6 literal",
            "/target/url",
            json!("http://[::1/"),
        ),
        (
            "an IPv6 literal with a zone",
            "/target/url",
            json!("http://[fe80::1%25eth0]/"),
        ),
        ("an empty URL", "/target/url", json!("")),
        // state paths
        ("a dotted state path", "/state", json!("data.status")),
        ("an unterminated JSONPath", "/state", json!("$[")),
        (
            "a JSONPath with a broken filter",
            "/state",
            json!("$..[?(@.a=="),
        ),
        ("a JSON Pointer with a bad escape", "/state", json!("/a~2")),
        ("an empty state path", "/state", json!("")),
        (
            "a JSONPath index past 2^53",
            "/state",
            json!("$[9007199254740992]"),
        ),
    ];
    for (name, ptr, v) in fields {
        cases.push(Case {
            name: name.into(),
            req: post().json(&set(base(), ptr, v)),
            want: 400,
        });
    }

    // Whole requests.
    let case = |name: &str, req: Call, want: u16| Case {
        name: name.into(),
        req,
        want,
    };
    let with_key =
        |key: reqwest::header::HeaderValue| post().header("idempotency-key", key).json(&base());
    let over_64_kib = set(base(), "/labels/pad", json!(long(70 * 1024)));
    let preset_array = json!({"preset": "latitude.server", "params": {"server_id": ["x"]}});
    let long_key = "k".repeat(300).parse().unwrap();
    let bytes_key = reqwest::header::HeaderValue::from_bytes(&[0xff, 0xfe]).unwrap();
    let query = |q: &str| app.post(&format!("/waits{q}")).json(&base());
    cases.extend([
        case("a body over 64 KiB", post().json(&over_64_kib), 413),
        case(
            "preset as a number",
            post().json(&json!({"preset": 5})),
            422,
        ),
        case(
            "an unknown preset",
            post().json(&json!({"preset": "../x"})),
            422,
        ),
        case(
            "params without a preset",
            post().json(&json!({"params": {}})),
            422,
        ),
        case(
            "a preset param as an array",
            post().json(&preset_array),
            422,
        ),
        case("?wait=forever", query("?wait=forever"), 400),
        case("?wait=-1s", query("?wait=-1s"), 400),
        // (A hold of 10^29 h is "as long as it takes": tests/api_errors.rs.)
        case("?wait given twice", query("?wait=1s&wait=2s"), 400),
        case("an unknown query parameter", query("?wiat=1s"), 400),
        case("a 300-character Idempotency-Key", with_key(long_key), 400),
        case(
            "an empty Idempotency-Key",
            with_key("".parse().unwrap()),
            400,
        ),
        case("a non-ASCII Idempotency-Key", with_key(bytes_key), 400),
    ]);
    // Content types.
    for (name, ct) in [
        (
            "a text/plain body",
            reqwest::header::HeaderValue::from_static("text/plain"),
        ),
        (
            "an XML body",
            reqwest::header::HeaderValue::from_static("application/xml"),
        ),
        (
            "a content type of invalid bytes",
            reqwest::header::HeaderValue::from_bytes(&[0xff]).unwrap(),
        ),
    ] {
        cases.push(Case {
            name: name.into(),
            req: post().header("content-type", ct).body(base().to_string()),
            want: 415,
        });
    }

    assert!(
        cases.len() >= 30,
        "the battery has only {} cases",
        cases.len()
    );
    run_battery(cases).await;

    // None of it created a wait, and the server is still well.
    let page = app.get("/waits").send().await;
    assert_eq!(page.status, 200, "{}", page.text);
    assert_eq!(
        page.json()["items"],
        json!([]),
        "a hostile request created a wait"
    );
    assert_eq!(app.get("/healthz").send().await.status, 200);
    app.stop().await;
}

#[tokio::test]
async fn hostile_paths_queries_and_headers_on_the_read_routes_are_answered_with_problem_json() {
    let app = InProcess::start().await;
    let id = uuid::Uuid::now_v7();
    let get = |path: String, want: u16| Case {
        name: format!("GET {}", path.chars().take(80).collect::<String>()),
        req: app.get(&path),
        want,
    };
    let mut cases = vec![
        get("/waits/not-a-uuid".into(), 404),
        get(format!("/waits/{id}"), 404),
        get(format!("/waits/{id}?wait=1s"), 404),
        get("/waits/%00".into(), 404),
        get("/waits/..%2F..%2Fetc%2Fpasswd".into(), 404),
        get(format!("/waits/{}", "a".repeat(8000)), 404),
        get(format!("/waits/{id}?wait=garbage"), 400),
        get(format!("/waits/{id}?wait=1.5s"), 400),
        get(format!("/waits/{id}?nope=1"), 400),
        get("/waits?limit=0".into(), 400),
        get("/waits?limit=501".into(), 400),
        get("/waits?limit=-1".into(), 400),
        get("/waits?limit=99999999999999999999999".into(), 400),
        get("/waits?limit=1e3".into(), 400),
        get(
            "/waits?status=running%27%3B%20DROP%20TABLE%20waits%3B--".into(),
            400,
        ),
        get("/waits?label=nocolon".into(), 400),
        get("/waits?cursor=%27%20OR%201%3D1".into(), 400),
        get("/waits?bogus=1".into(), 400),
        get(format!("/waits/{id}/events?after=-1"), 400),
        // Past any seq a wait can have: after all of them (and this wait is none).
        get(format!("/waits/{id}/events?after=99999999999"), 404),
        get(format!("/waits/{id}/events?after=9999999999999999999"), 400),
        get(format!("/waits/{id}/events?after=abc"), 400),
        get(format!("/waits/{id}/events?follow=maybe"), 400),
        get(format!("/waits/{id}/events"), 404),
        get("/events?after=9223372036854775808".into(), 400),
        get("/events?after=-5".into(), 400),
        get("/events?label=nocolon".into(), 400),
        get("/events?follow=yes".into(), 400),
        get("/presets/..%2F..%2Fetc%2Fpasswd".into(), 404),
        get(format!("/presets/{}", "p".repeat(5000)), 404),
        get("/no-such-route".into(), 404),
    ];
    cases.push(Case {
        name: "Last-Event-ID of letters on /events".into(),
        req: app.get("/events").header("last-event-id", "abc"),
        want: 400,
    });
    cases.push(Case {
        name: "Last-Event-ID of invalid bytes on a wait's stream".into(),
        req: app
            .get(&format!("/waits/{id}/events"))
            .header("accept", "text/event-stream")
            .header(
                "last-event-id",
                reqwest::header::HeaderValue::from_bytes(&[0xff]).unwrap(),
            ),
        // Not ignored: a bad value is a 400, before the wait is looked up.
        want: 400,
    });
    cases.push(Case {
        name: "POST cancel of a non-UUID".into(),
        req: app.post("/waits/not-a-uuid/cancel"),
        want: 404,
    });
    cases.push(Case {
        name: "POST cancel of an unknown wait".into(),
        req: app.post(&format!("/waits/{id}/cancel")),
        want: 404,
    });
    cases.push(Case {
        name: "DELETE /waits".into(),
        req: app.delete("/waits"),
        want: 405,
    });
    cases.push(Case {
        name: "PUT a wait".into(),
        req: app.put(&format!("/waits/{id}")).json(&base()),
        want: 405,
    });
    assert!(
        cases.len() >= 30,
        "the battery has only {} cases",
        cases.len()
    );
    run_battery(cases).await;
    app.stop().await;
}

#[tokio::test]
async fn a_wait_id_that_decodes_to_invalid_utf8_is_answered_with_problem_json() {
    let app = InProcess::start().await;
    // A 404 (as for any id that is not a UUID) or a 400 would do; it must be a problem.
    let mut faults = Vec::new();
    for (what, req) in [
        ("GET /waits/%ff", app.get("/waits/%ff")),
        ("cancel /waits/%ff", app.post("/waits/%ff/cancel")),
        ("GET /waits/%ff/events", app.get("/waits/%ff/events")),
        ("GET /presets/%ff", app.get("/presets/%ff")),
    ] {
        let a = req.send().await;
        let (status, headers, text) = (a.status, a.headers, a.text);
        if let Some(f) = problem_fault(status, &headers, &text) {
            faults.push(format!("{what}: {f}"));
        } else if status != 404 && status != 400 {
            faults.push(format!("{what}: wanted 404 or 400, got {status}: {text}"));
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));
    app.stop().await;
}

#[tokio::test]
async fn unicode_label_values_are_accepted_and_read_back_unchanged() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let labels = json!({"team": "équipe 🚀", "rtl": "\u{202e}txt.exe", "cjk": "部署"});
    let (status, w) = app.create(set(base(), "/labels", labels.clone())).await;
    assert_eq!(status, 201, "{w}");
    assert_eq!(w["labels"], labels);
    let (status, page) = app
        .get("/waits?label=team:%C3%A9quipe%20%F0%9F%9A%80")
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    // A key no wait can carry (label names are ASCII) is refused with a sentence.
    let (status, page) = app.get("/waits?label=%D0%BA%D0%BB%D1%8E%D1%87:x").await;
    assert_eq!(status, 400, "{page}");
    assert!(
        page["detail"].as_str().unwrap().contains("label name"),
        "{page}"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// SSRF
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn every_internal_target_form_is_refused_at_creation_with_422() {
    let db = TestDb::new().await;
    let app = App::start_args(guarded_args(&db, &[])).await;
    let forms = [
        // loopback
        "http://127.0.0.1/",
        "http://127.1.2.3:8080/x",
        "http://[::1]/",
        "http://[0:0:0:0:0:0:0:1]/",
        // RFC 1918
        "http://10.0.0.1/",
        "https://10.255.255.255:8443/x",
        "http://172.16.5.4/",
        "http://172.31.255.255/",
        "http://192.168.1.1/",
        // link-local, cloud metadata
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.1.1/",
        "http://[fe80::1]/",
        "http://[fd00:ec2::254]/",
        // CGNAT
        "http://100.64.0.1/",
        "http://100.100.100.200/",
        "http://100.127.255.254/",
        // unique-local
        "http://[fc00::1]/",
        "http://[fdff:ffff::1]/",
        // multicast, broadcast, reserved
        "http://224.0.0.1/",
        "http://239.255.255.250/",
        "http://[ff02::1]/",
        "http://255.255.255.255/",
        "http://240.0.0.1/",
        // unspecified
        "http://0.0.0.0/",
        "http://0/",
        "http://[::]/",
        // IPv4 carried in IPv6
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:7f00:1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[::ffff:10.0.0.1]/",
        "http://[::127.0.0.1]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[2002:7f00:1::]/",
        // odd IPv4 spellings
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0x7f.0.0.1/",
        "http://0177.0.0.1/",
        "http://017700000001/",
        "http://127.1/",
        "http://0x7f.1/",
        "http://127.0.0.1./",
        "http://2852039166/",
        "http://0xa9fea9fe/",
        "http://0251.0376.0251.0376/",
        "http://10.1/",
        "http://0x0a000001/",
        "http://%31%32%37.0.0.1/",
        "http://\u{ff11}\u{ff12}\u{ff17}.\u{ff10}.\u{ff10}.\u{ff11}/",
        // localhost names
        "http://localhost/",
        "http://LOCALHOST:8080/x",
        "http://localhost./",
        "http://api.localhost/",
        "http://a.b.LocalHost./",
    ];
    let mut faults = Vec::new();
    for url in forms {
        let (status, headers, text) =
            send(app.client.post(app.url("/waits")).json(&quiet_spec(url))).await;
        if let Some(f) = problem_fault(status, &headers, &text) {
            faults.push(format!("{url}: {f}"));
        } else if status != 422 {
            faults.push(format!("{url}: wanted 422, got {status}: {text}"));
        } else if !text.contains("--allow-targets") {
            faults.push(format!("{url}: the refusal gives no advice: {text}"));
        }
    }
    // A credentials trick is refused too (as a bad URL).
    let (status, headers, text) = send(
        app.client
            .post(app.url("/waits"))
            .json(&quiet_spec("http://example.com:80@127.0.0.1/")),
    )
    .await;
    if problem_fault(status, &headers, &text).is_some() {
        faults.push(format!(
            "the userinfo trick was not refused: {status} {text}"
        ));
    }
    assert!(
        faults.is_empty(),
        "{} of {} internal targets were not refused with 422:\n{}",
        faults.len(),
        forms.len(),
        faults.join("\n")
    );
    // Public targets still pass, so the guard is not refusing everything.
    for url in [
        "http://93.184.215.14/x",
        "https://api.example.com/x",
        "http://[2606:4700::1111]/",
    ] {
        let (status, w) = app.create(quiet_spec(url)).await;
        assert_eq!(status, 201, "{url}: {w}");
    }
    let (_, page) = app.get("/waits").await;
    assert_eq!(
        page["items"].as_array().map(Vec::len),
        Some(3),
        "only the public targets are waits: {page}"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_preset_cannot_smuggle_an_internal_target_past_the_guard() {
    let db = TestDb::new().await;
    let app = App::start_args(guarded_args(&db, &[])).await;
    for body in [
        json!({
            "preset": "http.ok",
            "params": {"url": "http://169.254.169.254/latest/meta-data/"},
            "state": "/s"
        }),
        json!({
            "preset": "latitude.server",
            "params": {"base_url": "http://127.0.0.1:9", "server_id": "sv_1"}
        }),
        json!({
            "preset": "latitude.server",
            "params": {"server_id": "sv_1"},
            "target": {"url": "http://10.0.0.1/"}
        }),
    ] {
        let p = expect_problem(app.client.post(app.url("/waits")).json(&body), 422).await;
        assert!(
            p["detail"].as_str().unwrap().contains("--allow-targets"),
            "{p}"
        );
    }
    let (_, page) = app.get("/waits").await;
    assert_eq!(page["items"], json!([]));
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// Creates a wait on `url` and returns it as it ended.
async fn run_to_end(app: &App, url: &str) -> Value {
    let (status, w) = app.create(spec(url)).await;
    assert_eq!(status, 201, "{url}: {w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_ne!(w["status"], "running", "{url} did not end: {w}");
    w
}

#[tokio::test]
async fn a_name_that_resolves_to_a_forbidden_address_ends_in_error_and_is_never_contacted() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let port = up.base.rsplit(':').next().unwrap().to_string();
    for p in ["/evil", "/evil6", "/meta", "/good"] {
        up.script(p, vec![Reply::status("on")]);
    }
    let app = App::start_args(guarded_args(
        &db,
        &[
            "--resolve",
            "evil.test=127.0.0.1,evil6.test=::1,meta.test=169.254.169.254,good.test=127.0.0.1",
            "--allow-targets",
            "good.test",
        ],
    ))
    .await;
    for (host, path, words) in [
        ("evil.test", "/evil", "loopback"),
        ("evil6.test", "/evil6", "loopback"),
        ("meta.test", "/meta", "metadata"),
    ] {
        let w = run_to_end(&app, &format!("http://{host}:{port}{path}")).await;
        assert_eq!(w["status"], "error", "{host}: {w}");
        let reason = w["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(host) && reason.contains(words) && reason.contains("--allow-targets"),
            "{host}: the reason does not say why: {w}"
        );
        assert_eq!(up.hits(path), 0, "{host} reached the upstream");
    }
    // The same upstream is reachable under an allowed name: the zero hits above mean
    // the guard stopped them.
    let w = run_to_end(&app, &format!("http://good.test:{port}/good")).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(up.hits("/good") >= 1);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn allow_targets_opens_exactly_the_hosts_suffixes_addresses_and_ranges_it_names() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let port = up.base.rsplit(':').next().unwrap().to_string();
    for p in ["/good", "/apps", "/bare", "/sub", "/notgood", "/evilapps"] {
        up.script(p, vec![Reply::status("on")]);
    }
    let app = App::start_args(guarded_args(
        &db,
        &[
            "--allow-targets",
            "good.test,*.apps.test,10.1.2.3,192.168.0.0/16,[fd00::5],dev.localhost",
            "--resolve",
            "good.test=127.0.0.1,sub.good.test=127.0.0.1,notgood.test=127.0.0.1,\
             x.apps.test=127.0.0.1,apps.test=127.0.0.1,evilapps.test=127.0.0.1",
        ],
    ))
    .await;
    // At creation: literals and localhost names.
    for url in [
        "http://10.1.2.3/",
        "http://[::ffff:10.1.2.3]/",
        "http://192.168.200.7/",
        "http://[fd00::5]/",
        "http://dev.localhost/",
    ] {
        let (status, w) = app.create(quiet_spec(url)).await;
        assert_eq!(status, 201, "{url} is allowed: {w}");
    }
    for url in [
        "http://10.1.2.4/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://127.0.0.1/",
        "http://169.254.169.254/",
        "http://[fd00::6]/",
        "http://other.localhost/",
        "http://localhost/",
    ] {
        expect_problem(
            app.client.post(app.url("/waits")).json(&quiet_spec(url)),
            422,
        )
        .await;
    }
    // At connect time: names.
    for (host, path) in [("good.test", "/good"), ("x.apps.test", "/apps")] {
        let w = run_to_end(&app, &format!("http://{host}:{port}{path}")).await;
        assert_eq!(w["status"], "succeeded", "{host} is allowed: {w}");
        assert!(up.hits(path) >= 1, "{host}");
    }
    for (host, path) in [
        ("apps.test", "/bare"),
        ("sub.good.test", "/sub"),
        ("notgood.test", "/notgood"),
        ("evilapps.test", "/evilapps"),
    ] {
        let w = run_to_end(&app, &format!("http://{host}:{port}{path}")).await;
        assert_eq!(w["status"], "error", "{host} is not allowed: {w}");
        assert!(
            w["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("loopback"),
            "{w}"
        );
        assert_eq!(up.hits(path), 0, "{host} reached the upstream");
    }
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Tokens and tenants
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn every_route_but_the_open_ones_answers_401_problem_json_without_a_valid_token() {
    // In-process on SQLite in memory: what is asked here is the API's answer.
    let up = Upstream::start().await;
    let url = up.script("/pending", vec![Reply::status("deploying")]);
    let app = InProcess::start_with(&["--tokens", &tenant_flags(), "--rate-limit", "0"]).await;
    let (status, w) = app
        .post("/waits")
        .bearer_auth(TOKEN_A)
        .json(&spec(&url))
        .answer()
        .await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();

    let bad_auth: Vec<(&str, Option<HeaderValue>)> = vec![
        ("no Authorization", None),
        (
            "a wrong token",
            Some("Bearer tok-tenant-z-0123456789abcdef".parse().unwrap()),
        ),
        (
            "the token plus a character",
            Some(format!("Bearer {TOKEN_A}x").parse().unwrap()),
        ),
        (
            "a prefix of the token",
            Some(format!("Bearer {}", &TOKEN_A[..20]).parse().unwrap()),
        ),
        (
            "the token as Basic",
            Some(format!("Basic {TOKEN_A}").parse().unwrap()),
        ),
        ("the token without a scheme", Some(TOKEN_A.parse().unwrap())),
        ("an empty Bearer", Some("Bearer ".parse().unwrap())),
        ("a tenant name as token", Some("Bearer a".parse().unwrap())),
        (
            "a tenant:token pair",
            Some(format!("Bearer a:{TOKEN_A}").parse().unwrap()),
        ),
        (
            "invalid bytes",
            Some(HeaderValue::from_bytes(b"Bearer \xfftok-tenant-a-0123456789abcdef").unwrap()),
        ),
    ];
    let routes: Vec<(&str, String, bool)> = vec![
        ("POST", "/waits".into(), false),
        ("GET", "/waits".into(), false),
        ("GET", format!("/waits/{id}"), false),
        ("GET", format!("/waits/{id}?wait=1s"), false),
        ("POST", format!("/waits/{id}/cancel"), false),
        ("GET", format!("/waits/{id}/events"), false),
        ("GET", format!("/waits/{id}/events"), true),
        ("GET", "/events".into(), false),
        ("GET", "/events".into(), true),
        ("GET", "/presets".into(), false),
        ("GET", "/presets/http.ok".into(), false),
    ];
    let mut faults = Vec::new();
    for (method, path, sse) in &routes {
        for (how, auth) in &bad_auth {
            let mut req = match *method {
                "POST" => app.post(path).json(&spec(&url)),
                _ => app.get(path),
            };
            if *sse {
                req = req.header("accept", "text/event-stream");
            }
            if let Some(v) = auth {
                req = req.header("authorization", v.clone());
            }
            let r = req.send().await;
            let (status, text) = (r.status, &r.text);
            if let Some(f) = problem_fault(status, &r.headers, text) {
                faults.push(format!("{method} {path} (sse {sse}) with {how}: {f}"));
            } else if status != 401 {
                faults.push(format!(
                    "{method} {path} (sse {sse}) with {how}: {status} {text}"
                ));
            } else if text.contains(TOKEN_A) || text.contains("tok-tenant-z") {
                faults.push(format!(
                    "{method} {path} with {how}: the 401 echoes the token"
                ));
            }
        }
    }
    assert!(faults.is_empty(), "{}", faults.join("\n"));

    // Nothing happened to tenant A's data.
    let (status, page) = app.get("/waits").bearer_auth(TOKEN_A).answer().await;
    assert_eq!(status, 200);
    assert_eq!(page["items"].as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(
        page["items"][0]["status"], "running",
        "a 401 cancel canceled: {page}"
    );

    // The open routes stay open, with or without (even a wrong) token.
    for path in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let r = app.get(path).send().await;
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        let r = app
            .get(path)
            .bearer_auth("wrong-wrong-wrong-wrong")
            .send()
            .await;
        assert_eq!(r.status, 200, "{path} with a wrong token: {}", r.text);
    }
    // And the right token works on each guarded route.
    for path in [
        "/waits".to_string(),
        format!("/waits/{id}"),
        format!("/waits/{id}/events"),
        "/events".to_string(),
        "/presets".to_string(),
    ] {
        let (status, body) = app.get(&path).bearer_auth(TOKEN_A).answer().await;
        assert_eq!(status, 200, "{path}: {body}");
    }
    app.stop().await;
}

#[tokio::test]
async fn tokens_come_from_a_tokens_file_and_a_short_token_is_refused_at_start_up() {
    let db = TestDb::new().await;
    let dir = temp_path("waitd-sec-tokens");
    let file = dir.join("tokens");
    std::fs::write(&file, "# the tokens\n\nc:tok-tenant-c-0123456789abcdef\n").unwrap();
    let app = App::start_with(&db, &["--tokens-file", file.to_str().unwrap()]).await;
    let (status, _) = get_as(&app, "tok-tenant-c-0123456789abcdef", "/waits").await;
    assert_eq!(status, 200);
    expect_problem(app.client.get(app.url("/waits")), 401).await;
    expect_problem(app.client.get(app.url("/waits")).bearer_auth(TOKEN_A), 401).await;
    app.stop().await.0.unwrap();

    for (tokens, says) in [
        ("a:short-token", "16"),
        ("a:", "16"),
        (":tok-tenant-a-0123456789abcdef", "tenant name"),
        ("no-colon-0123456789abcdef", "tenant:token"),
    ] {
        let mut args = test_args(&db.url);
        args.extend(["--tokens".to_string(), tokens.to_string()]);
        let config = waitd::Config::from_args(args).expect("flags parse");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            waitd::serve(listener, config, std::future::pending::<()>()),
        )
        .await
        .unwrap_or_else(|_| panic!("{tokens:?} was accepted: waitd is serving"));
        let err = r.expect_err(tokens).to_string();
        assert!(err.contains(says), "{tokens:?}: {err}");
        assert!(err.contains("--tokens entry 1"), "{tokens:?}: {err}");
        assert!(
            !err.contains("short-token"),
            "the error echoes the token: {err}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    db.drop_db().await;
}

#[tokio::test]
async fn a_tenant_gets_404_for_another_tenants_wait_on_every_route_and_never_sees_its_events() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let done_url = up.script(
        "/a-done",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let running_url = up.script("/a-running", vec![Reply::status("deploying")]);
    let b_url = up.script("/b", vec![Reply::status("deploying"), Reply::status("on")]);
    let app = App::start_with(&db, &["--tokens", &tenant_flags(), "--rate-limit", "0"]).await;

    let mut a_spec = spec(&done_url);
    a_spec["labels"] = json!({"owner": "a", "shared": "x"});
    let (_, a_done) = create_as(&app, TOKEN_A, &a_spec).await;
    let a_done = a_done["id"].as_str().unwrap().to_string();
    let mut a_spec = spec(&running_url);
    a_spec["labels"] = json!({"owner": "a", "shared": "x"});
    let (_, a_run) = create_as(&app, TOKEN_A, &a_spec).await;
    let a_run = a_run["id"].as_str().unwrap().to_string();
    let (_, w) = get_as(&app, TOKEN_A, &format!("/waits/{a_done}?wait=20s")).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(
        up.hit("/a-running", 2, Duration::from_secs(10)).await,
        "A's running wait is polled"
    );

    // What B gets for an id that does not exist at all: A's ids must look the same.
    let ghost = uuid::Uuid::now_v7().to_string();
    let ghost_problem = expect_problem(
        app.client
            .get(app.url(&format!("/waits/{ghost}")))
            .bearer_auth(TOKEN_B),
        404,
    )
    .await;
    for id in [&a_done, &a_run] {
        let reqs: Vec<(String, reqwest::RequestBuilder)> = vec![
            (
                "GET".into(),
                app.client.get(app.url(&format!("/waits/{id}"))),
            ),
            (
                "GET ?wait=1s".into(),
                app.client.get(app.url(&format!("/waits/{id}?wait=1s"))),
            ),
            (
                "GET ?wait=true".into(),
                app.client.get(app.url(&format!("/waits/{id}?wait=true"))),
            ),
            (
                "cancel".into(),
                app.client.post(app.url(&format!("/waits/{id}/cancel"))),
            ),
            (
                "events".into(),
                app.client.get(app.url(&format!("/waits/{id}/events"))),
            ),
            (
                "events SSE".into(),
                app.client
                    .get(app.url(&format!("/waits/{id}/events")))
                    .header("accept", "text/event-stream"),
            ),
            (
                "events ?follow=true".into(),
                app.client
                    .get(app.url(&format!("/waits/{id}/events?follow=true"))),
            ),
            (
                "events SSE resumed".into(),
                app.client
                    .get(app.url(&format!("/waits/{id}/events")))
                    .header("accept", "text/event-stream")
                    .header("last-event-id", "0"),
            ),
        ];
        for (what, req) in reqs {
            let p = tokio::time::timeout(
                Duration::from_secs(5),
                expect_problem(req.bearer_auth(TOKEN_B), 404),
            )
            .await
            .unwrap_or_else(|_| panic!("B's {what} of A's wait {id} did not answer"));
            assert_eq!(
                p["detail"].as_str().unwrap().replace(id.as_str(), "ID"),
                ghost_problem["detail"]
                    .as_str()
                    .unwrap()
                    .replace(&ghost, "ID"),
                "B's {what} tells A's wait from a missing one"
            );
        }
    }
    // B's cancel did nothing to A's running wait.
    let (_, w) = get_as(&app, TOKEN_A, &format!("/waits/{a_run}")).await;
    assert_eq!(w["status"], "running", "B canceled A's wait: {w}");

    // B's own wait, run to its end.
    let mut b_spec = spec(&b_url);
    b_spec["labels"] = json!({"owner": "b", "shared": "x"});
    let (_, b_wait) = create_as(&app, TOKEN_B, &b_spec).await;
    let b_id = b_wait["id"].as_str().unwrap().to_string();
    let (_, w) = get_as(&app, TOKEN_B, &format!("/waits/{b_id}?wait=20s")).await;
    assert_eq!(w["status"], "succeeded", "{w}");

    // Lists.
    for q in [
        "",
        "?status=running",
        "?status=succeeded",
        "?label=owner:a",
        "?label=shared:x",
        "?limit=500",
    ] {
        let (status, page) = get_as(&app, TOKEN_B, &format!("/waits{q}")).await;
        assert_eq!(status, 200, "{page}");
        let ids: Vec<&str> = page["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w["id"].as_str())
            .collect();
        assert!(
            !ids.contains(&a_done.as_str()) && !ids.contains(&a_run.as_str()),
            "B's list {q} shows A's waits: {ids:?}"
        );
        assert!(ids.iter().all(|i| *i == b_id), "{ids:?}");
    }
    // A's list is A's alone too.
    let (_, page) = get_as(&app, TOKEN_A, "/waits").await;
    let a_ids: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(a_ids.len(), 2, "{a_ids:?}");
    assert!(!a_ids.contains(&b_id.as_str()));

    // The global feed, as JSON.
    for q in ["", "?after=0", "?label=shared:x", "?label=owner:a"] {
        let (status, page) = get_as(&app, TOKEN_B, &format!("/events{q}")).await;
        assert_eq!(status, 200, "{page}");
        for e in page["items"].as_array().unwrap() {
            assert_eq!(
                e["wait_id"],
                json!(b_id),
                "B's /events{q} shows another wait's event: {e}"
            );
        }
        if q != "?label=owner:a" {
            assert!(
                !page["items"].as_array().unwrap().is_empty(),
                "B sees its own events on /events{q}"
            );
        }
    }
    // The global feed, as SSE: read until B's own terminal event has come through.
    let r = app
        .client
        .get(app.url("/events"))
        .header("accept", "text/event-stream")
        .header("last-event-id", "0")
        .bearer_auth(TOKEN_B)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = read_sse_until(r, Duration::from_secs(10), |t| {
        t.contains("event: succeeded")
    })
    .await;
    assert!(
        text.contains("event: succeeded"),
        "B's stream never showed B's end: {text}"
    );
    let ids = sse_wait_ids(&text);
    assert!(!ids.is_empty());
    assert!(
        ids.iter().all(|i| *i == b_id),
        "B's SSE feed shows another wait: {ids:?}"
    );
    // A's own stream, for contrast, does show A's events.
    let (_, page) = get_as(&app, TOKEN_A, "/events").await;
    assert!(
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["wait_id"] == json!(a_done))
    );
    assert!(
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["wait_id"] != json!(b_id))
    );

    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn idempotency_keys_are_per_tenant() {
    // In-process on SQLite in memory: what is asked here is the API's answer.
    let app = InProcess::start_with(&["--tokens", &tenant_flags(), "--rate-limit", "0"]).await;
    let body = quiet_spec("https://api.example.com/servers/1");
    let post = |token: &str, key: &str, body: &Value| {
        app.post("/waits")
            .bearer_auth(token)
            .header("idempotency-key", key)
            .json(body)
            .send()
    };
    let r = post(TOKEN_A, "deploy-42", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.header("idempotent-replayed"), "");
    let a = r.json();

    // B with A's key and A's body: a wait of B's own, not A's replayed.
    let r = post(TOKEN_B, "deploy-42", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        r.header("idempotent-replayed"),
        "",
        "B got A's wait replayed: {}",
        r.text
    );
    let b = r.json();
    assert_ne!(a["id"], b["id"], "B got A's wait");

    // Keys B used are not A's: a key of B's with another body is no conflict for A.
    let other = set(body.clone(), "/labels", json!({"x": "y"}));
    let r = post(TOKEN_B, "deploy-43", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = post(TOKEN_A, "deploy-43", &other).await;
    assert_eq!(
        r.status, 201,
        "A's key deploy-43 collides with B's: {}",
        r.text
    );

    // Each tenant's replays give its own wait; its own conflicts are its own.
    let r = post(TOKEN_A, "deploy-42", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.header("idempotent-replayed"), "true");
    assert_eq!(r.json()["id"], a["id"]);
    let r = post(TOKEN_B, "deploy-42", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.json()["id"], b["id"]);
    let r = post(TOKEN_B, "deploy-42", &other).await;
    assert_eq!(r.status, 409, "{}", r.text);
    assert_eq!(r.header("content-type"), "application/problem+json");

    for token in [TOKEN_A, TOKEN_B] {
        let (_, page) = app.get("/waits").bearer_auth(token).answer().await;
        assert_eq!(page["items"].as_array().map(Vec::len), Some(2), "{page}");
    }
    app.stop().await;
}

// ---------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------

/// The spec of the leak tests: both canaries as target headers.
fn secret_spec(url: &str) -> Value {
    let mut s = spec(url);
    s["target"]["headers"] = json!({"Authorization": CANARY, "X-Api-Key": CANARY2});
    s["labels"] = json!({"leak": "test"});
    s["retry"] = json!({"delay": "5ms", "max_delay": "20ms", "max_retries": 5});
    s
}

/// Every header the upstream got on `path` carried both canaries.
fn assert_upstream_got_secrets(up: &Upstream, path: &str) {
    let seen = up.headers_seen(path);
    assert!(!seen.is_empty(), "{path} was never polled");
    for h in &seen {
        assert_eq!(
            h.get("authorization").and_then(|v| v.to_str().ok()),
            Some(CANARY),
            "{path}: {h:?}"
        );
        assert_eq!(
            h.get("x-api-key").and_then(|v| v.to_str().ok()),
            Some(CANARY2),
            "{path}: {h:?}"
        );
    }
}

#[tokio::test]
async fn target_header_values_never_appear_in_any_response_nor_in_the_trace_logs_of_the_binary() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let ok_url = up.script(
        "/ok",
        vec![
            Reply::status("deploying"),
            Reply::status("deploying"),
            Reply::status("on"),
        ],
    );
    let bad_url = up.script(
        "/bad",
        vec![
            Reply::json(500, json!({"message": "try later"})),
            Reply::json(500, json!({"message": "try later"})),
            Reply::json(401, json!({"message": "bad credentials"})),
        ],
    );
    let dir = temp_path("waitd-sec-leak");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let tokens = format!("a:{TOKEN_A}");
    let mut proc = Proc::spawn(
        &[
            "serve",
            "--listen",
            &listen,
            "--database-url",
            &db.url,
            "--min-poll-interval",
            "1ms",
            "--allow-targets",
            "127.0.0.1",
            "--log-format",
            "json",
            "--tokens",
            &tokens,
            "--rate-limit",
            "0",
        ],
        "trace",
        dir.join("waitd.log"),
    );
    let base = format!("http://{listen}");
    proc.ready(&format!("{base}/readyz")).await;
    let c = client();
    let url = |p: &str| format!("{base}{p}");
    // Every response body and header value, to search afterwards.
    let mut seen: Vec<(String, String)> = Vec::new();
    macro_rules! record {
        ($what:expr, $req:expr) => {{
            let (status, headers, text) = send($req.bearer_auth(TOKEN_A)).await;
            for (k, v) in &headers {
                seen.push((
                    format!("{} header {k}", $what),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                ));
            }
            seen.push(($what.to_string(), text.clone()));
            (status, text)
        }};
    }

    // The global feed, followed from before the waits exist.
    let feed = c
        .get(url("/events"))
        .header("accept", "text/event-stream")
        .bearer_auth(TOKEN_A)
        .send()
        .await
        .unwrap();
    assert_eq!(feed.status(), 200);
    let feed = tokio::spawn(read_sse_until(feed, Duration::from_secs(20), |t| {
        t.contains("event: succeeded") && t.contains("event: error")
    }));

    let (status, text) = record!(
        "create ok",
        c.post(url("/waits")).json(&secret_spec(&ok_url))
    );
    assert_eq!(status, 201, "{text}");
    let ok_id = serde_json::from_str::<Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, text) = record!(
        "create bad",
        c.post(url("/waits"))
            .header("idempotency-key", "leak-1")
            .json(&secret_spec(&bad_url))
    );
    assert_eq!(status, 201, "{text}");
    let bad_id = serde_json::from_str::<Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // A wait whose token endpoint refuses its client with words that repeat
    // the client secret.
    let issuer = crate::support::issuer::Issuer::start(CANARY2).await;
    issuer.set_mode(crate::support::issuer::Mode::InvalidClient);
    let mut oauth = secret_spec(&issuer.target_url);
    oauth["target"]["headers"] = json!({"X-Api-Key": CANARY});
    oauth["target"]["auth"] = json!({"oauth2": {
        "token_url": issuer.token_url,
        "client_id": crate::support::issuer::CLIENT_ID,
        "client_secret": CANARY2,
    }});
    let (status, text) = record!("create oauth", c.post(url("/waits")).json(&oauth));
    assert_eq!(status, 201, "{text}");
    let oauth_id = serde_json::from_str::<Value>(&text).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    // Error responses to requests that carry the secrets.
    let invalid = |h: Value| set(secret_spec(&ok_url), "/target/headers", h);
    for (what, body) in [
        (
            "a CR LF value",
            invalid(json!({"Authorization": format!("{CANARY}\r\nX: y")})),
        ),
        (
            "an over-long value",
            invalid(json!({"Authorization": format!("{CANARY}{}", "x".repeat(9000))})),
        ),
        (
            "a value in an array",
            invalid(json!({"Authorization": [CANARY]})),
        ),
        (
            "a value as an object",
            invalid(json!({"Authorization": {"v": CANARY}})),
        ),
        ("a reserved header", invalid(json!({"Host": CANARY}))),
        (
            "a duplicated header",
            invalid(json!({"authorization": CANARY, "Authorization": CANARY2})),
        ),
        ("a bad header name", invalid(json!({"Bad Name": CANARY}))),
        ("an internal target", secret_spec("http://169.254.169.254/")),
        (
            "a wrong field beside",
            set(secret_spec(&ok_url), "/wnat", json!(["on"])),
        ),
    ] {
        let (status, text) = record!(format!("error: {what}"), c.post(url("/waits")).json(&body));
        assert!((400..500).contains(&status), "{what}: {status} {text}");
    }
    let (status, text) = record!(
        "error: an idempotency conflict",
        c.post(url("/waits"))
            .header("idempotency-key", "leak-1")
            .json(&set(
                secret_spec(&bad_url),
                "/labels",
                json!({"other": "body"})
            ))
    );
    assert_eq!(status, 409, "{text}");

    // Reads: blocked until the end, plain, listed, events as JSON and SSE.
    let (status, text) = record!(
        "get ok blocked",
        c.get(url(&format!("/waits/{ok_id}?wait=20s")))
    );
    assert_eq!(status, 200, "{text}");
    let (status, text) = record!(
        "get bad blocked",
        c.get(url(&format!("/waits/{bad_id}?wait=20s")))
    );
    assert_eq!(status, 424, "{text}");
    let bad: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(bad["status"], "error", "{bad}");
    assert!(
        bad["reason"].as_str().unwrap_or_default().contains("401"),
        "{bad}"
    );
    assert!(
        bad["retries"].as_u64().unwrap_or(0) >= 2,
        "the 500s were retried: {bad}"
    );
    let (status, text) = record!(
        "get oauth blocked",
        c.get(url(&format!("/waits/{oauth_id}?wait=20s")))
    );
    assert_eq!(status, 424, "{text}");
    assert!(text.contains("invalid_client"), "{text}");
    record!("get oauth", c.get(url(&format!("/waits/{oauth_id}"))));
    record!(
        "oauth events",
        c.get(url(&format!("/waits/{oauth_id}/events")))
    );
    for id in [&ok_id, &bad_id] {
        let (_, text) = record!("get", c.get(url(&format!("/waits/{id}"))));
        let w: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            w["spec"]["target"]["headers"]["Authorization"], "<redacted>",
            "{w}"
        );
        assert_eq!(
            w["spec"]["target"]["headers"]["X-Api-Key"], "<redacted>",
            "{w}"
        );
        record!("events", c.get(url(&format!("/waits/{id}/events"))));
        let (status, text) = record!(
            "events SSE",
            c.get(url(&format!("/waits/{id}/events")))
                .header("accept", "text/event-stream")
        );
        assert_eq!(status, 200);
        assert!(text.contains("event: created"), "{text}");
    }
    record!("list", c.get(url("/waits")));
    record!("list by label", c.get(url("/waits?label=leak:test")));
    record!("list errors", c.get(url("/waits?status=error")));
    record!("global events", c.get(url("/events")));
    record!(
        "cancel ended",
        c.post(url(&format!("/waits/{ok_id}/cancel")))
    );
    record!("metrics", c.get(url("/metrics")));
    let feed_text = feed.await.unwrap();
    assert!(
        feed_text.contains(&ok_id) && feed_text.contains(&bad_id),
        "{feed_text}"
    );
    seen.push(("global SSE feed".into(), feed_text));

    // The secrets did flow: the upstream got them on every poll.
    assert_upstream_got_secrets(&up, "/ok");
    assert_upstream_got_secrets(&up, "/bad");

    let leaks: Vec<&String> = seen
        .iter()
        .filter(|(_, t)| t.contains(NEEDLE))
        .map(|(w, _)| w)
        .collect();
    assert!(leaks.is_empty(), "a header value came back in: {leaks:?}");

    // The logs, at trace level, after a clean shutdown.
    let st = proc.terminate().await.expect("waitd exits on SIGTERM");
    assert!(st.success(), "waitd exited with {st}");
    let log = proc.log_text();
    assert!(
        log.contains("\"level\":\"TRACE\""),
        "the log is not at trace level:\n{}",
        &log[..log.len().min(2000)]
    );
    assert!(
        log.contains(&ok_id) && log.contains(&bad_id),
        "the waits left no trace in the log"
    );
    let leaked: Vec<&str> = log.lines().filter(|l| l.contains(NEEDLE)).take(5).collect();
    assert!(
        leaked.is_empty(),
        "the log carries a header value:\n{}",
        leaked.join("\n")
    );
    let leaked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(TOKEN_A))
        .take(5)
        .collect();
    assert!(
        leaked.is_empty(),
        "the log carries the API token:\n{}",
        leaked.join("\n")
    );
    drop(proc);
    remove_unless_kept(&dir);
    db.drop_db().await;
}

#[tokio::test]
async fn with_a_secret_key_header_values_are_not_stored_in_plain_text_yet_reach_the_target() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/sealed",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let app = App::start_with(&db, &["--secret-key", KEY1]).await;
    let (status, w) = app.create(secret_spec(&url)).await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_upstream_got_secrets(&up, "/sealed");

    let stored = db_texts(&db, "SELECT headers::text FROM wait_specs").await;
    assert_eq!(stored.len(), 1);
    assert!(
        !stored[0].contains(NEEDLE),
        "headers stored in plain text: {}",
        stored[0]
    );
    assert!(
        !stored[0].contains("Authorization"),
        "header names stored in plain text: {}",
        stored[0]
    );
    assert!(stored[0].len() > 40, "nothing stored: {}", stored[0]);
    let dump = db_dump(&db).await;
    assert!(
        !dump.contains(NEEDLE),
        "a header value is in the database in plain text"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn after_a_key_rotation_a_running_wait_sealed_under_the_old_key_keeps_polling_with_its_header()
 {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let old_url = up.script("/old", vec![Reply::status("deploying")]);
    let app = App::start_with(&db, &["--secret-key", KEY1]).await;
    let (status, w) = app.create(secret_spec(&old_url)).await;
    assert_eq!(status, 201, "{w}");
    let old_id = w["id"].as_str().unwrap().to_string();
    assert!(up.hit("/old", 2, Duration::from_secs(10)).await);
    app.stop().await.0.unwrap();
    let sealed_old = db_texts(&db, "SELECT headers::text FROM wait_specs").await;

    let before = up.hits("/old");
    let app = App::start_with(&db, &["--secret-key", KEY2, "--secret-key-previous", KEY1]).await;
    assert!(
        up.hit("/old", before + 3, Duration::from_secs(10)).await,
        "the old wait is not polled after the rotation"
    );
    assert_upstream_got_secrets(&up, "/old");
    let (_, w) = app.get(&format!("/waits/{old_id}")).await;
    assert_eq!(w["status"], "running", "{w}");

    // A new wait is sealed under the new key and works too.
    let new_url = up.script(
        "/new",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let (status, w) = app.create(secret_spec(&new_url)).await;
    assert_eq!(status, 201, "{w}");
    let new_id = w["id"].as_str().unwrap().to_string();
    assert_eq!(app.wait_end(&new_id).await["status"], "succeeded");
    assert_upstream_got_secrets(&up, "/new");
    let sealed_all = db_texts(&db, "SELECT headers::text FROM wait_specs").await;
    assert!(
        sealed_all.iter().all(|s| !s.contains(NEEDLE)),
        "{sealed_all:?}"
    );
    let sealed_new: Vec<&String> = sealed_all
        .iter()
        .filter(|s| !sealed_old.contains(s))
        .collect();
    assert_eq!(sealed_new.len(), 1, "{sealed_all:?}");

    // The old wait goes on to its end.
    up.script("/old", vec![Reply::status("on")]);
    let w = app.wait_end(&old_id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_upstream_got_secrets(&up, "/old");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_wait_sealed_under_a_key_the_server_no_longer_has_ends_in_error_and_is_never_polled_without_its_header()
 {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script("/lost", vec![Reply::status("deploying")]);
    let app = App::start_with(&db, &["--secret-key", KEY1]).await;
    let (_, w) = app.create(secret_spec(&url)).await;
    let id = w["id"].as_str().unwrap().to_string();
    assert!(up.hit("/lost", 1, Duration::from_secs(10)).await);
    app.stop().await.0.unwrap();

    let app = App::start_with(&db, &["--secret-key", KEY2]).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "error", "{w}");
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("WAITD_SECRET_KEY"),
        "the reason does not name the key: {w}"
    );
    assert!(
        !reason.contains(KEY1) && !reason.contains(KEY2),
        "the reason shows a key: {w}"
    );
    assert_upstream_got_secrets(&up, "/lost");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------

fn retry_after(r: &HeaderMap) -> u64 {
    r.get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After in seconds: {r:?}"))
}

#[tokio::test]
async fn a_tenant_over_its_active_wait_limit_gets_429_with_retry_after() {
    let db = TestDb::new().await;
    let app = App::start_with(
        &db,
        &[
            "--tokens",
            &tenant_flags(),
            "--rate-limit",
            "0",
            "--max-active-waits",
            "2",
        ],
    )
    .await;
    let body = quiet_spec("https://api.example.com/servers/1");
    let (_, first) = create_as(&app, TOKEN_A, &body).await;
    assert_eq!(create_as(&app, TOKEN_A, &body).await.0, 201);
    let (status, headers, text) = send(
        app.client
            .post(app.url("/waits"))
            .bearer_auth(TOKEN_A)
            .json(&body),
    )
    .await;
    assert_eq!(problem_fault(status, &headers, &text), None);
    assert_eq!(status, 429, "{text}");
    assert!(retry_after(&headers) >= 1);
    // Per tenant: B is not held back by A's waits.
    assert_eq!(create_as(&app, TOKEN_B, &body).await.0, 201);
    // Ending one frees a place.
    let id = first["id"].as_str().unwrap();
    let (status, _, _) = send(
        app.client
            .post(app.url(&format!("/waits/{id}/cancel")))
            .bearer_auth(TOKEN_A),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(create_as(&app, TOKEN_A, &body).await.0, 201);
    let (_, page) = get_as(&app, TOKEN_A, "/waits?status=running").await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(2), "{page}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn concurrent_creates_never_push_a_tenant_past_its_active_wait_limit() {
    let db = TestDb::new().await;
    let app = App::start_with(
        &db,
        &[
            "--tokens",
            &tenant_flags(),
            "--rate-limit",
            "0",
            "--max-active-waits",
            "2",
        ],
    )
    .await;
    let body = quiet_spec("https://api.example.com/servers/1");
    let sends = (0..20).map(|_| create_as(&app, TOKEN_A, &body));
    let results = futures_util::future::join_all(sends).await;
    let created = results.iter().filter(|(s, _)| *s == 201).count();
    assert!(
        results.iter().all(|(s, _)| *s == 201 || *s == 429),
        "{results:?}"
    );
    let (_, page) = get_as(&app, TOKEN_A, "/waits?status=running").await;
    let running = page["items"].as_array().map(Vec::len).unwrap_or(0);
    assert!(
        created <= 2 && running <= 2,
        "{created} created, {running} running, limit 2"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_retried_idempotent_create_at_the_active_wait_limit_replays_its_wait() {
    let db = TestDb::new().await;
    let app = App::start_with(
        &db,
        &[
            "--tokens",
            &tenant_flags(),
            "--rate-limit",
            "0",
            "--max-active-waits",
            "2",
        ],
    )
    .await;
    let body = quiet_spec("https://api.example.com/servers/1");
    assert_eq!(create_as(&app, TOKEN_A, &body).await.0, 201);
    let post = || {
        app.client
            .post(app.url("/waits"))
            .bearer_auth(TOKEN_A)
            .header("idempotency-key", "k-1")
            .json(&body)
    };
    let (status, _, text) = send(post()).await;
    assert_eq!(status, 201, "{text}");
    let first: Value = serde_json::from_str(&text).unwrap();
    // The client did not see that answer and retries: it must get the same wait.
    let (status, headers, text) = send(post()).await;
    assert_eq!(status, 201, "the retry was refused: {text}");
    assert_eq!(
        headers
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["id"],
        first["id"]
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_token_over_its_rate_limit_gets_429_with_retry_after_and_others_are_unaffected() {
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--tokens", &tenant_flags(), "--rate-limit", "1"]).await;
    let mut statuses = Vec::new();
    let mut limited = None;
    for _ in 0..10 {
        let (status, headers, text) =
            send(app.client.get(app.url("/waits")).bearer_auth(TOKEN_A)).await;
        if status == 429 && limited.is_none() {
            limited = Some((headers, text));
        }
        statuses.push(status);
    }
    assert_eq!(statuses[0], 200, "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
    assert!(
        statuses.iter().filter(|s| **s == 429).count() >= 7,
        "a burst of 10 at 1/s: {statuses:?}"
    );
    let (headers, text) = limited.expect("some request was limited");
    assert_eq!(problem_fault(429, &headers, &text), None);
    assert!(retry_after(&headers) >= 1);
    // Creates are limited too (at most one token comes back in the meantime).
    let mut create_statuses = Vec::new();
    for _ in 0..3 {
        let (status, _, text) = send(
            app.client
                .post(app.url("/waits"))
                .bearer_auth(TOKEN_A)
                .json(&quiet_spec("https://api.example.com/x")),
        )
        .await;
        assert!(status == 429 || status == 201, "{status}: {text}");
        create_statuses.push(status);
    }
    assert!(
        create_statuses.iter().filter(|s| **s == 429).count() >= 2,
        "{create_statuses:?}"
    );
    // Another tenant's token is not, nor are the open routes.
    let (status, _, text) = send(app.client.get(app.url("/waits")).bearer_auth(TOKEN_B)).await;
    assert_eq!(status, 200, "{text}");
    for _ in 0..5 {
        let (status, _, _) = send(app.client.get(app.url("/healthz")).bearer_auth(TOKEN_A)).await;
        assert_eq!(status, 200);
    }
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn anonymous_serving_on_a_non_loopback_address_is_refused_unless_allowed() {
    let dir = temp_path("waitd-sec-anon");
    let sqlite = format!("sqlite://{}", dir.join("waitd.db").display());

    let mut refused = Proc::spawn(
        &["serve", "--listen", "0.0.0.0:0", "--database-url", &sqlite],
        "info",
        dir.join("refused.log"),
    );
    let st = refused
        .exit_within(Duration::from_secs(15))
        .await
        .unwrap_or_else(|| {
            panic!(
                "waitd serves anonymously on 0.0.0.0:\n{}",
                refused.log_text()
            )
        });
    assert!(!st.success(), "waitd exited 0 instead of refusing");
    let log = refused.log_text();
    assert!(
        log.contains("--allow-anonymous"),
        "the refusal does not say how: {log}"
    );
    assert!(log.contains("anonymous"), "{log}");

    // With tokens it starts; with --allow-anonymous it starts and says so.
    for (name, extra) in [
        (
            "tokens",
            vec!["--tokens", "a:tok-tenant-a-0123456789abcdef"],
        ),
        ("allowed", vec!["--allow-anonymous"]),
    ] {
        let port = free_port();
        let listen = format!("0.0.0.0:{port}");
        let mut args = vec!["serve", "--listen", &listen, "--database-url", &sqlite];
        args.extend(extra);
        let mut p = Proc::spawn(&args, "info", dir.join(format!("{name}.log")));
        p.ready(&format!("http://127.0.0.1:{port}/healthz")).await;
        if name == "allowed" {
            assert!(
                p.log_text().contains("anonymous"),
                "no start-up warning: {}",
                p.log_text()
            );
            let (status, _, _) = send(client().get(format!("http://127.0.0.1:{port}/waits"))).await;
            assert_eq!(status, 200);
        }
        drop(p);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
