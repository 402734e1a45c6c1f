//! Callback URLs against what a stranger may send them (docs/design.md §2.15,
//! §7.6): generated bodies (nested past the depth limit, very wide, not UTF-8,
//! not JSON, of the wrong type, over 64 KiB, empty) always get a clear answer and
//! leave the wait ended once or still running, with a bounded detail; guessed
//! secrets at rate are refused `429` per client address and never find a wait;
//! and a callback wait's whole life, read on every surface (the API's reads and
//! streams, a webhook's requests, the process's log at debug level, its trace
//! spans), never shows the URL's secret.
//!
//! Every client here comes from an address of its own on 127.0.0.0/8 (a socket
//! bound to, say, 127.1.0.7 before it connects to 127.0.0.1), since the server
//! limits callback requests per client address.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

use crate::support::collector::Collector;
use crate::support::receiver::Receiver;
use crate::support::replica::{Watched, free_port, replica_args};
use crate::support::*;

/// The most bytes of a stored `error_detail` as JSON text (§7.6).
const MAX_DETAIL: usize = 8 * 1024;
/// The largest callback body taken (§7.6).
const MAX_BODY: usize = 64 * 1024;
/// A callback answer that is a problem is a sentence, not an echo of the body.
const MAX_PROBLEM: usize = 2 * 1024;

/// A loopback address no other client of this test binary has used: 127.N.x.y,
/// counting up. 127.0.0.0/8 all reaches the server on 127.0.0.1.
fn fresh_address() -> IpAddr {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    // Per process; tests run in processes of their own under nextest and on
    // different second octets here, so two tests never share an address.
    let salt = (std::process::id() % 200) as u8 + 20;
    IpAddr::V4(Ipv4Addr::new(127, salt, (n >> 8) as u8, (n & 0xff) as u8))
}

/// A client whose connections come from `from`, giving up after `within`.
fn client_from(from: IpAddr, within: Duration) -> reqwest::Client {
    client_builder()
        .local_address(from)
        .timeout(within)
        .build()
        .unwrap()
}

/// A running app on each store, with what keeps its database alive.
async fn each_store(prefix: &str) -> Vec<(&'static str, App, Option<TestDb>, TempDir)> {
    let db = TestDb::new().await;
    let pg = App::start(&db).await;
    let dir = TempDir::new(prefix);
    let lite = App::start_sqlite(&dir.sqlite_url()).await;
    vec![
        ("postgres", pg, Some(db), TempDir::new(prefix)),
        ("sqlite", lite, None, dir),
    ]
}

async fn finish(app: App, db: Option<TestDb>) {
    let (stopped, _) = app.stop().await;
    assert!(stopped.is_ok());
    if let Some(db) = db {
        db.drop_db().await;
    }
}

/// Creates a callback wait on `app`; its id and callback URL.
async fn callback_wait(app: &App, spec: Value) -> (String, String) {
    let (status, w) = app.create(spec).await;
    assert_eq!(status, 201, "{w}");
    let url = w["callback_url"].as_str().expect("the URL").to_string();
    (w["id"].as_str().unwrap().to_string(), url)
}

/// The terminal events of wait `id`, as its event page lists them.
async fn terminal_events(app: &App, id: &str) -> Vec<Value> {
    let (status, page) = app.get(&format!("/waits/{id}/events")).await;
    assert_eq!(status, 200, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            ["succeeded", "failed", "timed_out", "canceled", "error"]
                .contains(&e["kind"].as_str().unwrap_or(""))
        })
        .cloned()
        .collect()
}

/// Where a generated request goes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Complete,
    Fail,
    Heartbeat,
}

impl Route {
    fn suffix(self) -> &'static str {
        match self {
            Route::Complete => "",
            Route::Fail => "/fail",
            Route::Heartbeat => "/heartbeat",
        }
    }
}

/// One generated request to a callback URL.
#[derive(Clone)]
struct Case {
    route: Route,
    /// The `Content-Type` header's bytes; none sent when `None`.
    content_type: Option<Vec<u8>>,
    body: Vec<u8>,
    /// An object in the body names a key twice (which JSON parsers disagree on,
    /// so the server refuses it).
    twice: bool,
    /// Sent chunked, without a `Content-Length`.
    chunked: bool,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = String::from_utf8_lossy(&self.body[..self.body.len().min(120)]).into_owned();
        f.debug_struct("Case")
            .field("route", &self.route)
            .field(
                "content_type",
                &self
                    .content_type
                    .as_ref()
                    .map(|c| String::from_utf8_lossy(c)),
            )
            .field("len", &self.body.len())
            .field("body", &shown)
            .field("twice", &self.twice)
            .field("chunked", &self.chunked)
            .finish()
    }
}

/// What the server must answer a body, by §2.1 and §2.15: taken (the route's own
/// answer), or refused with this status, leaving the wait as it was.
#[derive(Debug, PartialEq)]
enum Verdict {
    Taken,
    Refused(u16),
}

/// A header value `HeaderValue::to_str` reads: visible ASCII and tabs.
fn readable(b: &[u8]) -> bool {
    b.iter().all(|&c| (32..127).contains(&c) || c == b'\t')
}

fn verdict(case: &Case) -> Verdict {
    if case.route == Route::Heartbeat {
        // A heartbeat has no body to read.
        return Verdict::Taken;
    }
    let json_type = case.content_type.as_deref().is_none_or(|ct| {
        let ct = if readable(ct) {
            String::from_utf8_lossy(ct).to_ascii_lowercase()
        } else {
            String::new()
        };
        let mime = ct.split(';').next().unwrap_or("").trim().to_string();
        mime == "application/json"
            || mime.ends_with("+json")
            || mime == "application/x-www-form-urlencoded"
    });
    if !json_type {
        Verdict::Refused(415)
    } else if case.body.len() > MAX_BODY {
        Verdict::Refused(413)
    } else if case.twice || serde_json::from_slice::<Value>(&case.body).is_err() {
        // Empty, blank, not UTF-8, not JSON, nested past 128 levels.
        Verdict::Refused(400)
    } else {
        Verdict::Taken
    }
}

fn nested(depth: usize, object: bool, closed: bool) -> Vec<u8> {
    let (open, close) = if object { ("{\"a\":", "}") } else { ("[", "]") };
    let mut s = open.repeat(depth);
    s.push('0');
    if closed {
        s.push_str(&close.repeat(depth));
    }
    s.into_bytes()
}

/// JSON values, with the text a stranger might put in them: NUL and other
/// control characters, quotes and backslashes (which grow when escaped), and
/// characters outside the BMP.
fn json_value() -> impl Strategy<Value = Value> {
    let text = prop_oneof![
        "[ -~]{0,40}",
        "[\\x00-\\x1f\"\\\\]{0,64}",
        "[\\u{80}-\\u{10ffff}]{0,20}",
        (
            1usize..3000,
            prop::sample::select(vec!['x', '"', '\\', '\0', 'é'])
        )
            .prop_map(|(n, c)| c.to_string().repeat(n)),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text.clone().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 200, 40, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..40).prop_map(Value::Array),
            prop::collection::btree_map(text.clone(), inner, 0..40)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body and whether it names a key twice.
fn body() -> impl Strategy<Value = (Vec<u8>, bool)> {
    let plain = |s: BoxedStrategy<Vec<u8>>| s.prop_map(|b| (b, false));
    let nest = (1usize..4000, any::<bool>(), prop::bool::weighted(0.8))
        .prop_map(|(d, o, c)| nested(d, o, c))
        .boxed();
    let wide_array = (1usize..40_000)
        .prop_map(|n| format!("[{}0]", "1,".repeat(n)).into_bytes())
        .boxed();
    let wide_object = (1usize..8_000)
        .prop_map(|n| {
            let fields: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            format!("{{{}}}", fields.join(",")).into_bytes()
        })
        .boxed();
    // Wide, deep and escaped at once: the detail is cut, then previewed.
    let heavy = (
        32usize..200,
        100usize..600,
        prop::sample::select(vec!["\\\\", "\\\"", "\\u0000", "x"]),
    )
        .prop_map(|(n, len, unit)| {
            let s = unit.repeat(len);
            let fields: Vec<String> = (0..n).map(|i| format!("\"{i}{s}\":[\"{s}\"]")).collect();
            format!("{{{}}}", fields.join(",")).into_bytes()
        })
        .boxed();
    let not_utf8 = (prop::collection::vec(any::<u8>(), 0..64), 0usize..64)
        .prop_map(|(mut junk, at)| {
            junk.insert(at.min(junk.len()), 0xff);
            let mut b = b"{\"a\":\"".to_vec();
            b.extend(junk);
            b.extend(b"\"}");
            b
        })
        .boxed();
    let random = prop::collection::vec(any::<u8>(), 0..512).boxed();
    let text = prop_oneof![
        "[ -~]{0,200}".prop_map(String::into_bytes),
        prop::sample::select(vec![
            "{'a': 1}",
            "{\"a\": 1} trailing",
            "NaN",
            "1e400",
            "-",
            "\"\\ud800\"",
            "[1,]",
            "{\"a\"}",
            "<xml/>",
            "a=1&b=2",
            "\u{feff}{}",
            "null",
            "0",
            "\"done\"",
            "[]",
            "{}",
        ])
        .prop_map(|s| s.as_bytes().to_vec()),
    ]
    .boxed();
    let blank = "[ \\t\\r\\n]{0,20}".prop_map(String::into_bytes).boxed();
    // Around the 64 KiB limit, and past it.
    let sized = (MAX_BODY - 64..MAX_BODY + 40_000)
        .prop_map(|n| {
            let pad = n.saturating_sub(10);
            format!("{{\"pad\":\"{}\"}}", "x".repeat(pad)).into_bytes()
        })
        .boxed();
    let valid = json_value()
        .prop_map(|v| serde_json::to_vec(&v).unwrap())
        .boxed();
    let twice = prop::sample::select(vec![
        "{\"a\":1,\"a\":2}",
        "{\"x\":{\"k\":[],\"k\":null}}",
        "[{\"why\":\"one\",\"why\":\"two\"}]",
    ])
    .prop_map(|s| (s.as_bytes().to_vec(), true));
    prop_oneof![
        2 => plain(nest),
        1 => plain(wide_array),
        1 => plain(wide_object),
        2 => plain(heavy),
        1 => plain(not_utf8),
        1 => plain(random),
        2 => plain(text),
        1 => plain(blank),
        2 => plain(sized),
        4 => plain(valid),
        1 => twice,
    ]
}

fn content_type() -> impl Strategy<Value = Option<Vec<u8>>> {
    let named = prop::sample::select(vec![
        "application/json",
        "application/json; charset=utf-8",
        "APPLICATION/JSON",
        "application/cloudevents+json",
        "application/x-www-form-urlencoded",
        "text/plain",
        "application/xml",
        "multipart/form-data; boundary=x",
        "application/octet-stream",
        "json",
        "",
    ])
    .prop_map(|s| Some(s.as_bytes().to_vec()));
    prop_oneof![
        3 => Just(None),
        4 => named,
        1 => Just(Some(vec![b'a', 0xff, 0xfe, b'/', b'j'])),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let route = prop_oneof![
        3 => Just(Route::Complete),
        3 => Just(Route::Fail),
        2 => Just(Route::Heartbeat),
    ];
    (route, content_type(), body(), prop::bool::weighted(0.25)).prop_map(
        |(route, content_type, (body, twice), chunked)| Case {
            route,
            content_type,
            body,
            twice,
            chunked,
        },
    )
}

/// Sends `case` to the callback URL `url`: the status, the content type and the
/// answer's text. A request that gets no answer in 20 s fails the test.
async fn send_case(
    http: &reqwest::Client,
    url: &str,
    case: &Case,
) -> Result<(u16, String, String), reqwest::Error> {
    let mut req = http.post(format!("{url}{}", case.route.suffix()));
    if let Some(ct) = &case.content_type {
        req = req.header(
            reqwest::header::CONTENT_TYPE,
            reqwest::header::HeaderValue::from_bytes(ct).expect("a header value"),
        );
    }
    req = if case.chunked {
        let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            case.body.chunks(7_000).map(|c| Ok(c.to_vec())).collect();
        req.body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            chunks,
        )))
    } else {
        req.body(case.body.clone())
    };
    let r = req.send().await?;
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let text = r.text().await?;
    Ok((status, ct, text))
}

/// 60 callback waits on each store, each sent 4 generated requests: every answer
/// is the one §2.15 names (a `200` or `409` with the wait for what is taken; a
/// `400`, `413` or `415` problem for what is not), none is a `5xx` or missing; the
/// wait ends at most once, as the first taken completion said, or goes on; its
/// stored detail, its read and its terminal event stay within their bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_bodies_get_a_clear_answer_and_end_a_wait_at_most_once() {
    const WAITS: usize = 60;
    const PER_WAIT: usize = 4;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[15; 32]),
    );
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut longest_detail = 0;
    for (store, app, db, _dir) in each_store("waitd-cb-hostile").await {
        for _ in 0..WAITS {
            let (id, url) = callback_wait(
                &app,
                json!({"callback": {"heartbeat": "1h"}, "timeout": "1h"}),
            )
            .await;
            // At most 4 callback requests from this address: far below the limit.
            let http = client_from(fresh_address(), Duration::from_secs(20));
            // The end the first taken completion made, if one did.
            let mut ended: Option<&'static str> = None;
            let mut cases = Vec::new();
            for _ in 0..PER_WAIT {
                let case = case().new_tree(&mut runner).unwrap().current();
                let want = verdict(&case);
                let (status, ct, text) = send_case(&http, &url, &case).await.unwrap_or_else(|e| {
                    panic!("{store}: no answer to {case:?} after {cases:?}: {e:?}")
                });
                *seen.entry(format!("{status}")).or_default() += 1;
                assert!(status < 500, "{store}: {status} for {case:?}: {text}");
                match want {
                    Verdict::Taken => {
                        let expected = if ended.is_some() { 409 } else { 200 };
                        assert_eq!(status, expected, "{store}: {case:?}: {text}");
                        let w: Value = serde_json::from_str(&text).expect("the wait");
                        assert_eq!(w["id"], id.as_str(), "{text}");
                        if ended.is_none() {
                            ended = match case.route {
                                Route::Complete => Some("succeeded"),
                                Route::Fail => Some("failed"),
                                Route::Heartbeat => None,
                            };
                        }
                        assert_eq!(
                            w["status"].as_str(),
                            Some(ended.unwrap_or("running")),
                            "{store}: {case:?}: {text}"
                        );
                        assert!(w.get("callback_url").is_none(), "{text}");
                    }
                    Verdict::Refused(code) => {
                        assert_eq!(status, code, "{store}: {case:?}: {text}");
                        assert!(ct.starts_with("application/problem+json"), "{ct}: {text}");
                        assert!(text.len() <= MAX_PROBLEM, "{store}: {} bytes", text.len());
                        let p: Value = serde_json::from_str(&text).expect("a problem");
                        assert!(
                            p["detail"].as_str().is_some_and(|d| !d.is_empty()),
                            "{text}"
                        );
                    }
                }
                cases.push(case);
            }
            // What a read shows: the end the first taken completion made, once.
            let (status, w) = app.get(&format!("/waits/{id}")).await;
            assert_eq!(status, 200);
            assert_eq!(
                w["status"].as_str(),
                Some(ended.unwrap_or("running")),
                "{store}: {cases:?}: {w}"
            );
            let terminal = terminal_events(&app, &id).await;
            assert_eq!(
                terminal.len(),
                usize::from(ended.is_some()),
                "{store}: {terminal:?}"
            );
            let detail = serde_json::to_string(&w["error_detail"]).unwrap();
            longest_detail = longest_detail.max(detail.len());
            assert!(
                detail.len() <= MAX_DETAIL,
                "{store}: error_detail is {} bytes: {}…",
                detail.len(),
                &detail[..200.min(detail.len())]
            );
            let output = serde_json::to_string(&w["output"]).unwrap();
            assert!(
                output.len() <= 64 * 1024,
                "{store}: output is {} bytes",
                output.len()
            );
            let read = w.to_string();
            assert!(
                read.len() <= 3 * MAX_DETAIL + output.len(),
                "{store}: {} bytes",
                read.len()
            );
            if let Some(e) = terminal.first() {
                let text = e.to_string();
                assert!(
                    text.len() <= 3 * MAX_DETAIL + output.len(),
                    "{store}: {} bytes",
                    text.len()
                );
                assert_eq!(e["error_detail"], w["error_detail"], "{store}");
                assert_eq!(
                    e.get("output").unwrap_or(&Value::Null),
                    &w["output"],
                    "{store}"
                );
            }
        }
        // The server answered throughout, and still does.
        let (status, _) = app.get("/healthz").await;
        assert_eq!(status, 200);
        finish(app, db).await;
    }
    println!(
        "{} generated callback requests on each store, answers {seen:?}, the longest stored detail {longest_detail} bytes",
        WAITS * PER_WAIT
    );
    for code in ["200", "409", "400", "413", "415"] {
        assert!(
            seen.contains_key(code),
            "no request was answered {code}: {seen:?}"
        );
    }
}

/// Guessed secrets: generated near misses of a real one (a digit changed, its
/// case changed, cut, lengthened, encoded) are each a `404`, never the wait; 200
/// guesses at once from one address get `429` with `Retry-After: 1` past the
/// burst, and then the right secret from that address is limited too, while the
/// right secret from another address completes the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guessed_secrets_never_find_the_wait_and_are_limited_per_address() {
    let dir = TempDir::new("waitd-cb-guess");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let (id, url) = callback_wait(&app, json!({"callback": {}, "timeout": "1h"})).await;
    let secret = url.rsplit('/').next().unwrap().to_string();
    let base = app.url("/callbacks/");

    // Near misses, each from an address of its own, so none is limited.
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[16; 32]),
    );
    let s = secret.clone();
    let near = (0usize..64, 0usize..16, 0usize..8, "[ -~]{0,80}").prop_map(
        move |(at, digit, how, junk)| {
            let hex = b"0123456789abcdef";
            let mut b = s.clone().into_bytes();
            match how {
                0 => {
                    b[at] = if b[at] == hex[digit] {
                        hex[(digit + 1) % 16]
                    } else {
                        hex[digit]
                    };
                    String::from_utf8(b).unwrap()
                }
                1 => s.to_ascii_uppercase(),
                2 => s[..at].to_string(),
                3 => format!("{s}{}", hex[digit] as char),
                4 => format!("{s}%20"),
                5 => format!("{s}/"),
                6 => format!("{}{}", &s[..at], percent_encode(&junk)),
                _ => "f".repeat(64 + at * 200),
            }
        },
    );
    let mut guesses = 0;
    for _ in 0..120 {
        let guess = near.new_tree(&mut runner).unwrap().current();
        if guess == secret || guess.is_empty() {
            continue;
        }
        let http = client_from(fresh_address(), Duration::from_secs(20));
        for suffix in ["", "/fail", "/heartbeat"] {
            let r = http
                .post(format!("{base}{guess}{suffix}"))
                .json(&json!({}))
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            // A guess with a `/` in it is another route, or none.
            assert!(
                status == 404 || status == 405,
                "{guess}{suffix}: {status} {}",
                r.text().await.unwrap_or_default()
            );
            guesses += 1;
        }
    }
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");

    // 200 guesses at once from one address.
    let guesser = client_from(fresh_address(), Duration::from_secs(20));
    let started = std::time::Instant::now();
    let answers = futures_util::future::join_all((0..200).map(|i| {
        let guesser = guesser.clone();
        let u = format!("{base}{:064x}", i + 1);
        async move {
            let r = guesser.post(u).json(&json!({})).send().await.unwrap();
            let retry = r
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            (r.status().as_u16(), retry)
        }
    }))
    .await;
    let took = started.elapsed();
    let found = answers.iter().filter(|(s, _)| *s == 404).count();
    let limited = answers.iter().filter(|(s, _)| *s == 429).count();
    assert_eq!(found + limited, 200, "{answers:?}");
    // The burst, and what the rate gave back meanwhile.
    let allowed = 20 + (took.as_secs_f64() * 10.0).ceil() as usize + 1;
    assert!(found <= allowed, "{found} guesses looked up in {took:?}");
    assert!(limited > 0);
    assert!(
        answers
            .iter()
            .filter(|(s, _)| *s == 429)
            .all(|(_, r)| r.as_deref() == Some("1")),
        "{answers:?}"
    );
    // Right secrets from that address are limited as well (the limit comes
    // before any lookup): heartbeats of the real wait, 50 at once.
    let beats = futures_util::future::join_all((0..50).map(|_| {
        let r = guesser.post(format!("{url}/heartbeat")).send();
        async move {
            let r = r.await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    }))
    .await;
    let beat_limited = beats.iter().filter(|(s, _)| *s == 429).count();
    assert!(beat_limited > 0, "{beats:?}");
    for (status, body) in &beats {
        assert!(*status == 429 || *status == 200, "{status} {body}");
        if *status == 200 {
            assert_eq!(body["status"], "running", "{body}");
        }
    }
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    // Another address is not limited by the guesser's requests.
    let other = client_from(fresh_address(), Duration::from_secs(20));
    let r = other
        .post(&url)
        .json(&json!({"ok": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(app.wait_end(&id).await["status"], "succeeded");
    println!(
        "{guesses} near-miss guesses: all 404; 200 guesses at once from one address in {} ms: {found} looked up, {limited} refused 429; then {beat_limited} of 50 right heartbeats from it refused; another address completed the wait",
        took.as_millis()
    );
    let _ = app.stop().await;
}

fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The raw text of a server-sent event stream at `url`, read until `done` holds
/// of it or `within` passes.
async fn stream_text(url: String, within: Duration, done: impl Fn(&str) -> bool) -> String {
    use futures_util::StreamExt;
    let r = client()
        .get(&url)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{url}");
    let mut text = String::new();
    let mut body = r.bytes_stream();
    let _ = tokio::time::timeout(within, async {
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            if done(&text) {
                break;
            }
        }
    })
    .await;
    text
}

/// Whether a stream's text has the terminal event of a wait that succeeded.
fn ended(text: &str) -> bool {
    text.contains("event: succeeded") || text.contains("event:succeeded")
}

/// A callback wait's whole life on the `waitd` binary (log at debug level, as
/// JSON; spans exported to a collector), on `db_url`: created with a webhook and
/// a `traceparent`, beaten, completed, completed again, failed late and asked
/// with the wrong method. Then every read, stream, blocking read, webhook
/// request, log line and span is searched for the secret and the URL.
async fn secret_on_no_surface(db_url: &str, dir: &TempDir) {
    let collector = Collector::start().await;
    let rx = Receiver::start().await;
    let port = free_port();
    let log = dir.path.join("waitd.log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_waitd"));
    command
        .args(replica_args(
            db_url,
            port,
            "3s",
            &[
                "--otlp-endpoint",
                &collector.base,
                "--webhook-retry-base",
                "20ms",
            ],
        ))
        .env("RUST_LOG", "debug")
        .env("NO_COLOR", "1");
    let proc = Watched::spawn(command, &log);
    if let Err(why) = proc.listening(Duration::from_secs(20)).await {
        panic!("waitd {why}: {}", proc.log_text());
    }
    let base = format!("http://127.0.0.1:{port}");
    let http = client();
    let hook = rx.url("/hook");
    let created = http
        .post(format!("{base}/waits"))
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .json(&json!({
            "callback": {"heartbeat": "1m"},
            "timeout": "5m",
            "labels": {"job": "deploy-7"},
            "notify": [{
                "url": hook,
                "secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
                "events": ["created", "ended"],
            }],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let w: Value = created.json().await.unwrap();
    let id = w["id"].as_str().unwrap().to_string();
    let url = w["callback_url"].as_str().unwrap().to_string();
    let secret = url.rsplit('/').next().unwrap().to_string();
    assert_eq!(secret.len(), 64, "{url}");

    // Followed and blocked on while it runs.
    let wait_stream = tokio::spawn(stream_text(
        format!("{base}/waits/{id}/events"),
        Duration::from_secs(30),
        ended,
    ));
    let feed = tokio::spawn(stream_text(
        format!("{base}/events?follow=true&after=0"),
        Duration::from_secs(30),
        ended,
    ));
    let blocked = tokio::spawn({
        let (http, u) = (http.clone(), format!("{base}/waits/{id}?wait=30s"));
        async move { http.get(u).send().await.unwrap().text().await.unwrap() }
    });

    let caller = client_from(fresh_address(), Duration::from_secs(20));
    let post = |suffix: &str, body: Value| {
        let r = caller.post(format!("{url}{suffix}")).json(&body).send();
        async move { r.await.unwrap().status().as_u16() }
    };
    assert_eq!(post("/heartbeat", json!({})).await, 200);
    assert_eq!(post("/heartbeat", json!({"n": 2})).await, 200);
    let wrong = caller.get(&url).send().await.unwrap().status().as_u16();
    assert_eq!(wrong, 405);
    assert_eq!(post("", json!({"build": 42})).await, 200);
    assert_eq!(post("", json!({"again": true})).await, 409);
    assert_eq!(post("/fail", json!({"late": true})).await, 409);
    assert_eq!(post("/heartbeat", json!({})).await, 409);

    let mut seen: Vec<(String, String)> = Vec::new();
    seen.push(("blocking read".into(), blocked.await.unwrap()));
    seen.push(("wait's stream".into(), wait_stream.await.unwrap()));
    seen.push(("event feed".into(), feed.await.unwrap()));
    assert!(seen[0].1.contains("succeeded"), "{}", seen[0].1);
    assert!(ended(&seen[1].1), "{}", seen[1].1);
    assert!(ended(&seen[2].1), "{}", seen[2].1);
    for path in [
        format!("/waits/{id}"),
        format!("/waits/{id}?wait=1s"),
        "/waits".to_string(),
        "/waits?label=job:deploy-7".to_string(),
        "/waits?status=succeeded".to_string(),
        format!("/waits/{id}/events"),
        "/events?after=0".to_string(),
        format!("/waits/{id}/deliveries"),
        "/metrics".to_string(),
    ] {
        let r = http.get(format!("{base}{path}")).send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        seen.push((path, r.text().await.unwrap()));
    }

    // The webhook: its created and succeeded events, bodies and headers.
    assert!(
        rx.received(Duration::from_secs(20), |got| {
            let has = |t: &str| {
                got.iter()
                    .any(|r| String::from_utf8_lossy(&r.body).contains(t))
            };
            has("wait.created") && has("wait.succeeded")
        })
        .await,
        "the create and the end were delivered: {:?}",
        rx.all()
    );
    for r in rx.all() {
        let headers: Vec<String> = r
            .headers
            .iter()
            .map(|(k, v)| format!("{k}: {}", String::from_utf8_lossy(v.as_bytes())))
            .collect();
        seen.push((
            format!("webhook to /{}", r.path),
            format!(
                "{}\n{}",
                headers.join("\n"),
                String::from_utf8_lossy(&r.body)
            ),
        ));
    }

    // The spans of the callback requests, exported.
    assert!(
        collector
            .until(Duration::from_secs(20), |spans| {
                spans
                    .iter()
                    .filter(|s| s.attr("http.route").starts_with("/callbacks/"))
                    .count()
                    >= 7
            })
            .await,
        "the callback requests' spans were exported: {:#?}",
        collector.spans()
    );
    for s in collector.spans() {
        seen.push((format!("span {}", s.name), format!("{s:?}")));
    }

    // The log, at debug level: every line it wrote about these requests.
    let log = proc.log_text();
    assert!(
        log.contains("/callbacks/{secret}"),
        "the log names the callback route: {log}"
    );
    for (i, line) in log.lines().enumerate() {
        seen.push((format!("log line {}", i + 1), line.to_string()));
    }

    let mut shown = Vec::new();
    for (where_, text) in &seen {
        if text.contains(&secret) || text.contains(&url) {
            shown.push(where_.clone());
        }
    }
    assert!(
        shown.is_empty(),
        "the secret is shown by: {shown:?}\n{}",
        seen.iter()
            .filter(|(w, _)| shown.contains(w))
            .map(|(w, t)| format!("{w}: {t}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!(
        "{} surfaces searched ({} log lines, {} spans, {} webhook requests): no secret",
        seen.len(),
        log.lines().count(),
        collector.spans().len(),
        rx.all().len()
    );
    drop(proc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_is_on_no_surface_of_a_whole_life_on_postgres() {
    let dir = TempDir::new("waitd-cb-surfaces");
    let db = TestDb::new().await;
    secret_on_no_surface(&db.url, &dir).await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secret_is_on_no_surface_of_a_whole_life_on_sqlite() {
    let dir = TempDir::new("waitd-cb-surfaces");
    secret_on_no_surface(&dir.sqlite_url(), &dir).await;
}

/// A body refused before it is read (a type that is not JSON, a length over
/// 64 KiB) ends its connection: the answer says so (`Connection: close`), so a
/// client that keeps connections sends its next request on a new one, and gets
/// its answer, rather than losing it on the closed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_refused_unread_leaves_the_clients_next_request_answered() {
    let dir = TempDir::new("waitd-cb-refused");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let (id, url) = callback_wait(&app, json!({"callback": {}, "timeout": "1h"})).await;
    let big = vec![b'x'; 100 * 1024];
    for round in 0..10 {
        // One client, whose pool keeps the connection the refusal came on.
        let http = client_from(fresh_address(), Duration::from_secs(20));
        let (ct, body, code) = if round % 2 == 0 {
            ("text/plain", big.clone(), 415)
        } else {
            ("application/json", big.clone(), 413)
        };
        let body = if round % 4 == 1 {
            let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
                body.chunks(7_000).map(|c| Ok(c.to_vec())).collect();
            reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
        } else {
            reqwest::Body::from(body)
        };
        let r = http
            .post(&url)
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("round {round}: no answer: {e:?}"));
        assert_eq!(r.status().as_u16(), code);
        let says = r.headers().get("connection").and_then(|v| v.to_str().ok());
        assert_eq!(
            says,
            Some("close"),
            "round {round}: the {code} must say the connection ends"
        );
        let next = http
            .post(format!("{url}/heartbeat"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("round {round}: the next request was lost: {e:?}"));
        assert_eq!(next.status().as_u16(), 200);
    }
    // A heartbeat reads no body: one sent with a body is answered, says the
    // connection ends, and the next request on the same client is answered.
    for round in 0..4 {
        let http = client_from(fresh_address(), Duration::from_secs(20));
        let r = http
            .post(format!("{url}/heartbeat"))
            .header("content-type", "text/plain")
            .body(vec![b'y'; 44 * 1024])
            .send()
            .await
            .unwrap_or_else(|e| panic!("heartbeat {round}: no answer: {e:?}"));
        assert_eq!(r.status().as_u16(), 200);
        let says = r.headers().get("connection").and_then(|v| v.to_str().ok());
        assert_eq!(says, Some("close"), "heartbeat {round}");
        let next = http
            .post(format!("{url}/heartbeat"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("heartbeat {round}: the next request was lost: {e:?}"));
        assert_eq!(next.status().as_u16(), 200);
        assert!(
            next.headers().get("connection").is_none(),
            "a bodiless request keeps its connection"
        );
    }
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running");
    let _ = app.stop().await;
}
