//! Traces (docs/replicas.md §6.11): a wait created with a `traceparent` is one trace
//! from its create through every poll to the target's own request and to the
//! webhook's receiver, exported to an OTLP/HTTP collector that decodes it with the
//! protocol's types; a collector that never answers costs bounded memory and the
//! waits go on; without an endpoint nothing is traced.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::collector::{Collector, Span};
use crate::support::issuer::{CLIENT_ID, Issuer};
use crate::support::receiver::Receiver;
use crate::support::replica::{Replica, rss_kib};
use crate::support::*;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER: &str = "00f067aa0ba902b7";

/// The trace id and parent id of a `traceparent` header.
fn parts(traceparent: &str) -> (String, String) {
    let p: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(p.len(), 4, "a traceparent has four parts: {traceparent}");
    (p[1].to_string(), p[2].to_string())
}

async fn create_traced(app: &App, spec: &Value) -> String {
    let r = app
        .client
        .post(app.url("/waits"))
        .header("traceparent", format!("00-{TRACE}-{CALLER}-01"))
        .json(spec)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let w: Value = r.json().await.unwrap();
    w["id"].as_str().unwrap().to_string()
}

fn fast(url: &str) -> Value {
    let mut s = spec(url);
    s["poll"] = json!({"initial": "20ms", "factor": 1, "max": "20ms", "jitter": 0});
    s
}

/// The create's span, the polls under it, the requests under them (each the
/// `traceparent` its peer received), and the webhook attempt: one trace.
async fn one_trace_from_create_to_target_and_receiver(app: &App, collector: &Collector) {
    let upstream = Upstream::start().await;
    let url = upstream.script(
        "/traced",
        vec![Reply::status("deploying"), Reply::status("on")],
    );
    let receiver = Receiver::start().await;
    let mut s = fast(&url);
    s["notify"] = json!([{
        "url": receiver.url("/hook"),
        "secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
        "events": ["ended"],
    }]);
    let id = create_traced(app, &s).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(
        receiver
            .until_got("/hook", 1, Duration::from_secs(20))
            .await
    );

    let sent: Vec<(String, String)> = upstream
        .headers_seen("/traced")
        .iter()
        .map(|h| {
            parts(
                h.get("traceparent")
                    .expect("every probe carries a traceparent")
                    .to_str()
                    .unwrap(),
            )
        })
        .collect();
    assert!(sent.len() >= 2, "{sent:?}");
    assert!(sent.iter().all(|(t, _)| t == TRACE), "{sent:?}");
    let hook = parts(&receiver.got("/hook")[0].header("traceparent"));
    assert_eq!(hook.0, TRACE, "the webhook joins the wait's trace");

    let complete = |spans: &[Span]| {
        let ids: Vec<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
        sent.iter().all(|(_, p)| ids.contains(&p.as_str()))
            && ids.contains(&hook.1.as_str())
            && spans.iter().any(|s| s.name == "POST /waits")
    };
    assert!(
        collector.until(Duration::from_secs(20), complete).await,
        "the collector got every span: {:#?}",
        collector.spans()
    );
    let spans: Vec<Span> = collector
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == TRACE)
        .collect();
    let by_id = |id: &str| spans.iter().find(|s| s.span_id == id).cloned();

    let create = spans.iter().find(|s| s.name == "POST /waits").unwrap();
    assert_eq!(create.parent, CALLER, "the create is the caller's child");
    assert_eq!(create.kind, 2, "a server span");
    assert_eq!(create.attr("http.response.status_code"), "201");
    assert_eq!(create.service, "waitd");

    for (_, parent) in &sent {
        let request = by_id(parent).expect("the target's parent is a span");
        assert_eq!(request.kind, 3, "a client span: {request:?}");
        assert_eq!(request.attr("waitd.peer"), "target");
        assert_eq!(request.attr("http.response.status_code"), "200");
        let poll = by_id(&request.parent).expect("the request is a poll's");
        assert_eq!(poll.name, "poll");
        assert_eq!(poll.attr("waitd.wait.id"), id);
        assert_eq!(poll.attr("waitd.poll.outcome"), "answered");
        assert_eq!(poll.attr("http.response.status_code"), "200");
        assert_eq!(poll.parent, create.span_id, "a poll is the create's child");
    }
    let attempts: Vec<&str> = spans
        .iter()
        .filter(|s| s.name == "poll")
        .map(|s| s.attr("waitd.poll.attempt"))
        .collect();
    assert!(
        attempts.contains(&"1") && attempts.contains(&"2"),
        "{attempts:?}"
    );

    let post = by_id(&hook.1).expect("the receiver's parent is a span");
    assert_eq!(post.attr("waitd.peer"), "receiver");
    let attempt = by_id(&post.parent).expect("the POST is an attempt's");
    assert_eq!(attempt.name, "webhook attempt");
    assert_eq!(attempt.attr("waitd.delivery.status"), "delivered");
    assert_eq!(attempt.parent, create.span_id);
    assert!(
        collector
            .content_types()
            .iter()
            .all(|c| c == "application/x-protobuf"),
        "{:?}",
        collector.content_types()
    );
    println!(
        "one trace: {} spans, {} polls, the receiver's parent {}",
        spans.len(),
        attempts.len(),
        hook.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_one_trace_from_its_create_to_its_target_on_postgres() {
    let collector = Collector::start().await;
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--otlp-endpoint", &collector.base]).await;
    one_trace_from_create_to_target_and_receiver(&app, &collector).await;
    let _ = app.stop().await;
    db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_is_one_trace_from_its_create_to_its_target_on_sqlite() {
    let collector = Collector::start().await;
    let dir = TempDir::new("waitd-traces");
    let args = test_args(&dir.sqlite_url());
    let args = set_flag(args, "--otlp-endpoint", &collector.base);
    let app = App::start_args(args).await;
    one_trace_from_create_to_target_and_receiver(&app, &collector).await;
    let _ = app.stop().await;
}

/// A token mint is a request of the poll that needed the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_mint_is_a_span_of_the_poll_that_needed_it() {
    let collector = Collector::start().await;
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--otlp-endpoint", &collector.base]).await;
    let issuer = Issuer::start("trace-secret-0123456789").await;
    issuer.on_after(1);
    let mut s = fast(&issuer.target_url);
    s["target"]["auth"] = json!({"oauth2": {
        "token_url": issuer.token_url,
        "client_id": CLIENT_ID,
        "client_secret": "trace-secret-0123456789",
    }});
    let id = create_traced(&app, &s).await;
    assert_eq!(app.wait_end(&id).await["status"], "succeeded");
    let minted = |spans: &[Span]| {
        spans
            .iter()
            .any(|s| s.attr("waitd.peer") == "token endpoint")
    };
    assert!(collector.until(Duration::from_secs(20), minted).await);
    let spans = collector.spans();
    let mint = spans
        .iter()
        .find(|s| s.attr("waitd.peer") == "token endpoint")
        .unwrap();
    assert_eq!(mint.trace_id, TRACE);
    assert_eq!(mint.name, "POST");
    assert_eq!(mint.attr("http.response.status_code"), "200");
    let poll = spans.iter().find(|s| s.span_id == mint.parent).unwrap();
    assert_eq!(poll.name, "poll");
    assert_eq!(poll.attr("waitd.wait.id"), id);
    let json =
        serde_json::to_string(&spans.iter().map(|s| &s.attributes).collect::<Vec<_>>()).unwrap();
    assert!(!json.contains("trace-secret"), "no span carries the secret");
    let _ = app.stop().await;
    db.drop_db().await;
}

/// Without an endpoint no span is made: the target sees no `traceparent`, not
/// even the one the create carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_traced() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let upstream = Upstream::start().await;
    let url = upstream.script("/plain", vec![Reply::status("on")]);
    let id = create_traced(&app, &fast(&url)).await;
    assert_eq!(app.wait_end(&id).await["status"], "succeeded");
    let seen = upstream.headers_seen("/plain");
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|h| h.get("traceparent").is_none()));
    assert!(!app.metrics().await.contains("waitd_trace_spans_total"));
    let _ = app.stop().await;
    db.drop_db().await;
}

/// An endpoint that is not an http(s) URL stops the start with a sentence.
#[tokio::test]
async fn an_endpoint_that_is_not_a_url_is_refused_at_start() {
    for bad in [
        "ftp://collector:4318",
        "collector:4318",
        "http://bad host:4318",
    ] {
        let args = set_flag(test_args("sqlite::memory:"), "--otlp-endpoint", bad);
        let config = waitd::Config::from_args(args).unwrap();
        let addr = "127.0.0.1:0".parse().unwrap();
        let Err(e) = waitd::App::start(config, addr).await else {
            panic!("{bad} was taken");
        };
        let said = e.to_string();
        assert!(
            said.contains("OTLP endpoint") && said.contains("http://"),
            "{bad}: {said}"
        );
    }
}

fn metric(text: &str, line: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(line))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A collector that takes the connection and never answers: the spans past the
/// queue are dropped and counted, the replica's memory stays flat while tens of
/// thousands more are made, and the waits go on to their ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_costs_bounded_memory() {
    const DROPPED: &str = "waitd_trace_spans_total{outcome=\"dropped\"}";
    const MORE: u64 = 60_000;
    let collector = Collector::hung().await;
    let dir = TempDir::new("waitd-traces-hung");
    let replica = Replica::start(
        "a",
        &dir.path,
        &dir.sqlite_url(),
        "3s",
        &["--otlp-endpoint", &collector.base],
    )
    .await;
    let upstream = Upstream::start().await;
    let url = upstream.script("/busy", vec![Reply::status("deploying")]);
    let http = client();
    let mut ids = Vec::new();
    for _ in 0..40 {
        let mut s = spec(&url);
        s["poll"] = json!({"initial": "1ms", "factor": 1, "max": "1ms", "jitter": 0});
        s["timeout"] = json!("120s");
        let r = http
            .post(replica.url("/waits"))
            .json(&s)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let w: Value = r.json().await.unwrap();
        ids.push(w["id"].as_str().unwrap().to_string());
    }
    let dropped = || async {
        let text = http
            .get(replica.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric(&text, DROPPED)
    };
    assert!(
        until(Duration::from_secs(60), || async { dropped().await > 0 })
            .await
            .is_some(),
        "the queue fills"
    );
    let (first, rss_full) = (dropped().await, rss_kib(replica.pid));
    let took = until(Duration::from_secs(120), || async {
        dropped().await >= first + MORE
    })
    .await;
    assert!(took.is_some(), "{MORE} more spans are made and dropped");
    let (last, rss_after) = (dropped().await, rss_kib(replica.pid));
    let grew = rss_after.saturating_sub(rss_full);
    println!(
        "queue full at {rss_full} KiB RSS; {} more spans dropped in {:?}; RSS {rss_after} KiB (+{grew} KiB)",
        last - first,
        took.unwrap()
    );
    assert!(
        grew < 12 * 1024,
        "{} spans dropped grew RSS by {grew} KiB",
        last - first
    );
    upstream.script("/busy", vec![Reply::status("on")]);
    for id in &ids {
        let w: Value = http
            .get(replica.url(&format!("/waits/{id}?wait=30s")))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(w["status"], "succeeded", "{w}");
    }
}

/// `traceparent` and `tracestate` as a stranger may send them: well formed, of
/// every wrong length, version and flag, with extra fields, and past any size
/// a header should have (8 KiB; `tracestate` with hundreds of members).
fn trace_headers() -> impl proptest::strategy::Strategy<Value = (String, String)> {
    use proptest::prelude::*;
    let hex = |n: std::ops::RangeInclusive<usize>| {
        proptest::collection::vec(
            prop::sample::select(b"0123456789abcdefABCDEF-xz".to_vec()),
            n,
        )
        .prop_map(|b| String::from_utf8(b).unwrap())
    };
    let parent = prop_oneof![
        (hex(32..=32), hex(16..=16), hex(2..=2)).prop_map(|(t, s, f)| format!("00-{t}-{s}-{f}")),
        (
            hex(2..=2),
            hex(0..=40),
            hex(0..=20),
            hex(0..=4),
            hex(0..=64)
        )
            .prop_map(|(v, t, s, f, x)| format!("{v}-{t}-{s}-{f}-{x}")),
        Just(format!("00-{}-{}-01", "0".repeat(32), "0".repeat(16))),
        hex(0..=8192),
        "[ -~]{0,300}",
    ];
    let member = ("[a-z0-9_*/@-]{0,300}", "[ -~]{0,300}").prop_map(|(k, v)| format!("{k}={v}"));
    let state = prop_oneof![
        Just(String::new()),
        proptest::collection::vec(member, 0..=600).prop_map(|m| {
            let mut s = m.join(",");
            s.truncate(8192);
            s
        }),
        "[ -~]{0,8192}",
    ];
    (parent, state)
}

/// 300 generated headers on `POST /waits`: every one is a `201` (a bad trace
/// context is a new trace, never a refusal), the process answers throughout,
/// and every create is a span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_trace_headers_never_fail_a_create() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    const CASES: usize = 300;
    let collector = Collector::start().await;
    let app =
        crate::support::in_process::InProcess::start_with(&["--otlp-endpoint", &collector.base])
            .await;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[11; 32]),
    );
    let spec = spec("http://127.0.0.1:9/never");
    let (mut longest, mut valid) = (0, 0);
    for _ in 0..CASES {
        let (parent, state) = trace_headers().new_tree(&mut runner).unwrap().current();
        longest = longest.max(parent.len() + state.len());
        let well_formed = parent.len() == 55
            && parent.starts_with("00-")
            && parent[3..35]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            && parent[3..35].bytes().any(|b| b != b'0');
        valid += usize::from(well_formed);
        let (code, w) = app
            .post("/waits")
            .header("traceparent", parent.as_str())
            .header("tracestate", state.as_str())
            .json(&spec)
            .answer()
            .await;
        assert_eq!(
            code, 201,
            "traceparent {parent:?}, tracestate {state:?}: {w}"
        );
    }
    let (code, _) = app.get("/healthz").answer().await;
    assert_eq!(code, 200);
    assert!(
        collector
            .until(Duration::from_secs(20), |s| {
                s.iter().filter(|s| s.name == "POST /waits").count() >= CASES
            })
            .await,
        "every create is a span"
    );
    println!(
        "{CASES} generated trace headers (the longest pair {longest} bytes, {valid} shaped like a valid traceparent): every create 201"
    );
    app.stop().await;
}
