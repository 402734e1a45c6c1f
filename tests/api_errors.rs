//! Black-box tests of bad requests: every one is a 4xx `application/problem+json`
//! (RFC 9457) with `type`, `title`, `status` (equal to the HTTP status) and a `detail`
//! sentence a person can act on; never a 5xx.
//!
//! Each request goes to waitd's router in this process, on an in-memory SQLite store
//! (`support::in_process`): what is refused here is refused before any socket or
//! database matters, so no Postgres is needed. What only a connection can show (the
//! HTTP layer's own 414, a malformed chunked body, header timeouts) is tested through
//! a socket, in tests/hostile_tenants.rs.

use crate::support;

use serde_json::{Value, json};
use support::in_process::{Call, InProcess};
use support::{set_flag, spec, test_args};

/// Sends `req` and checks that the answer is the problem document of `want` status;
/// returns the problem body.
async fn problem(req: Call, want: u16) -> Value {
    let r = req.send().await;
    let (status, ct, text) = (r.status, r.header("content-type"), &r.text);
    assert!(status < 500, "a bad request got a {status}: {text}");
    assert_eq!(status, want, "{text}");
    assert_eq!(ct, "application/problem+json", "content type of: {text}");
    let p: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("the problem is not JSON ({e}): {text}"));
    assert!(
        p["type"].as_str().is_some_and(|t| !t.is_empty()),
        "no type: {p}"
    );
    assert!(
        p["title"].as_str().is_some_and(|t| !t.is_empty()),
        "no title: {p}"
    );
    assert_eq!(p["status"], json!(want), "status field: {p}");
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(
        detail.trim().len() >= 10 && detail.split_whitespace().count() >= 3,
        "detail is not a sentence: {p}"
    );
    p
}

/// The `field`s of a validation problem's `errors`.
fn fields(p: &Value) -> Vec<String> {
    p["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors list: {p}"))
        .iter()
        .map(|e| {
            assert!(
                e["message"].as_str().is_some_and(|m| !m.is_empty()),
                "an error without a message: {p}"
            );
            e["field"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// A valid spec (that never polls during the test) pointed at an unused port.
fn valid() -> Value {
    let mut s = spec("http://127.0.0.1:9/servers/1");
    s["poll"]["delay"] = json!("15s");
    s
}

/// Posts `body` as JSON to `/waits` and expects a validation problem naming `field`.
async fn rejects_field(app: &InProcess, body: Value, field: &str) -> Value {
    let p = problem(app.post("/waits").json(&body), 400).await;
    let f = fields(&p);
    assert!(f.iter().any(|x| x == field), "{field} not in {f:?}: {p}");
    p
}

async fn setup() -> InProcess {
    InProcess::start().await
}

async fn teardown(app: InProcess) {
    // No bad request may have created a wait.
    let page = app.get("/waits").send().await;
    assert_eq!(page.status, 200);
    assert!(
        page.json()["items"]
            .as_array()
            .is_some_and(|a| a.is_empty()),
        "a refused request created a wait: {}",
        page.text
    );
    app.stop().await;
}

fn raw_post(app: &InProcess, path: &str, content_type: &str, body: impl Into<Vec<u8>>) -> Call {
    app.post(path)
        .header("content-type", content_type)
        .body(body)
}

// ---------------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn malformed_json_is_a_400_problem() {
    let app = setup().await;
    let p = problem(
        raw_post(&app, "/waits", "application/json", r#"{"target": {"url": "#),
        400,
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("JSON"), "{p}");
    teardown(app).await;
}

/// A key named twice means neither silently: `{"want": ["on"], "want": ["off"]}`
/// is refused, at any depth, and nothing is made.
#[tokio::test]
async fn a_key_named_twice_is_a_400_problem_that_names_it() {
    let app = setup().await;
    for body in [
        r#"{"target": {"url": "https://api.example.com/s/1"}, "state": "/status", "want": ["on"], "want": ["off"]}"#,
        r#"{"target": {"url": "https://api.example.com/s/1", "url": "https://other.example.com/"}, "state": "/status", "want": ["on"]}"#,
        r#"{"all": [{"target": {"url": "https://api.example.com/s/1"}, "state": "/s", "state": "/t", "want": ["on"]}]}"#,
    ] {
        let p = problem(raw_post(&app, "/waits", "application/json", body), 400).await;
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.contains("appears twice"), "{p}");
    }
    let (_, page) = app.get("/waits").answer().await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(0), "{page}");
    teardown(app).await;
}

#[tokio::test]
async fn an_empty_body_is_a_400_problem() {
    let app = setup().await;
    problem(raw_post(&app, "/waits", "application/json", ""), 400).await;
    problem(raw_post(&app, "/waits", "application/json", "  \n"), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_json_array_body_is_a_400_problem() {
    let app = setup().await;
    problem(
        raw_post(&app, "/waits", "application/json", r#"[{"want": ["on"]}]"#),
        400,
    )
    .await;
    problem(raw_post(&app, "/waits", "application/json", r#""on""#), 400).await;
    problem(raw_post(&app, "/waits", "application/json", "null"), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_text_plain_body_is_a_415_problem() {
    let app = setup().await;
    problem(
        raw_post(&app, "/waits", "text/plain", valid().to_string()),
        415,
    )
    .await;
    teardown(app).await;
}

#[tokio::test]
async fn a_body_over_64_kib_is_a_413_problem() {
    let app = setup().await;
    let mut body = valid();
    body["labels"] = json!({"pad": "x".repeat(70 * 1024)});
    problem(app.post("/waits").json(&body), 413).await;
    teardown(app).await;
}

#[tokio::test]
async fn deeply_nested_json_is_a_400_problem() {
    let app = setup().await;
    let body = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    problem(raw_post(&app, "/waits", "application/json", body), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_body_that_is_not_utf8_is_a_400_problem() {
    let app = setup().await;
    problem(
        raw_post(
            &app,
            "/waits",
            "application/json",
            vec![b'{', 0xff, 0xfe, b'}'],
        ),
        400,
    )
    .await;
    teardown(app).await;
}

// ---------------------------------------------------------------------------------
// Fields
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn an_unknown_field_wnat_is_a_400_naming_the_field() {
    let app = setup().await;
    let mut body = valid();
    body["wnat"] = json!(["on"]);
    let p = rejects_field(&app, body, "wnat").await;
    let msg = p["errors"][0]["message"].as_str().unwrap();
    assert!(msg.contains("want"), "no hint towards want: {p}");
    teardown(app).await;
}

#[tokio::test]
async fn an_unknown_nested_field_is_a_400_naming_its_dotted_path() {
    let app = setup().await;
    let mut body = valid();
    body["poll"]["intial"] = json!("1s");
    rejects_field(&app, body, "poll.intial").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_missing_want_is_a_400_naming_want() {
    let app = setup().await;
    let mut body = valid();
    body.as_object_mut().unwrap().remove("want");
    rejects_field(&app, body, "want").await;
    teardown(app).await;
}

#[tokio::test]
async fn an_empty_want_is_a_400_naming_want() {
    let app = setup().await;
    let mut body = valid();
    body["want"] = json!([]);
    rejects_field(&app, body, "want").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_want_that_is_not_a_list_is_a_400_naming_want() {
    let app = setup().await;
    let mut body = valid();
    body["want"] = json!("on");
    rejects_field(&app, body, "want").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_missing_target_and_state_are_both_reported() {
    let app = setup().await;
    let p = problem(app.post("/waits").json(&json!({"want": ["on"]})), 400).await;
    let f = fields(&p);
    assert!(f.contains(&"target".to_string()), "{f:?}");
    assert!(f.contains(&"state".to_string()), "{f:?}");
    teardown(app).await;
}

#[tokio::test]
async fn a_state_that_is_neither_pointer_nor_jsonpath_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["state"] = json!("data.attributes.status");
    rejects_field(&app, body, "state").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_bad_duration_is_a_400_naming_the_field() {
    let app = setup().await;
    let mut body = valid();
    body["timeout"] = json!("10 parsecs");
    rejects_field(&app, body, "timeout").await;
    let mut body = valid();
    body["poll"]["initial"] = json!(5);
    rejects_field(&app, body, "poll.initial").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_timeout_over_the_maximum_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["timeout"] = json!("25h");
    let p = rejects_field(&app, body, "timeout").await;
    assert!(p["detail"].as_str().unwrap().contains("24h"), "{p}");
    teardown(app).await;
}

#[tokio::test]
async fn a_negative_consecutive_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["consecutive"] = json!(-1);
    rejects_field(&app, body, "consecutive").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_jitter_of_1_5_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["poll"]["jitter"] = json!(1.5);
    rejects_field(&app, body, "poll.jitter").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_negative_max_retries_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["retry"]["max_retries"] = json!(-1);
    rejects_field(&app, body, "retry.max_retries").await;
    teardown(app).await;
}

#[tokio::test]
async fn an_unknown_not_found_mode_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["not_found"] = json!("maybe");
    rejects_field(&app, body, "not_found").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_state_in_both_want_and_fail_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["fail"] = json!(["on"]);
    rejects_field(&app, body, "fail").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_poll_interval_below_the_floor_is_a_400() {
    let app = InProcess::start_args(set_flag(
        test_args("sqlite::memory:"),
        "--min-poll-interval",
        "1s",
    ))
    .await;
    let mut body = valid();
    body["poll"] = json!({"initial": "100ms", "delay": "15s"});
    body.as_object_mut().unwrap().remove("retry");
    let p = rejects_field(&app, body, "poll.initial").await;
    assert_eq!(fields(&p), ["poll.initial"], "{p}");
    assert!(p["detail"].as_str().unwrap().contains("1s"), "{p}");
    teardown(app).await;
}

// ---------------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_private_address_target_is_refused_with_422() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["url"] = json!("http://10.0.0.1/x");
    problem(app.post("/waits").json(&body), 422).await;
    teardown(app).await;
}

#[tokio::test]
async fn the_cloud_metadata_address_is_refused_with_422() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["url"] = json!("http://169.254.169.254/latest/meta-data/");
    problem(app.post("/waits").json(&body), 422).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_localhost_target_is_refused_with_422() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["url"] = json!("http://localhost:1/");
    problem(app.post("/waits").json(&body), 422).await;
    teardown(app).await;
}

#[tokio::test]
async fn odd_spellings_of_loopback_outside_the_allow_list_are_refused_with_422() {
    let app = setup().await;
    // 127.0.0.1 is allowed in tests; these are other loopback or private addresses.
    for url in [
        "http://127.0.0.2/",
        "http://[::1]/",
        "http://0x0a000001/",
        "http://[::ffff:10.0.0.1]/",
        "http://0.0.0.0/",
    ] {
        let mut body = valid();
        body["target"]["url"] = json!(url);
        problem(app.post("/waits").json(&body), 422).await;
    }
    teardown(app).await;
}

#[tokio::test]
async fn a_url_with_credentials_is_a_400_that_does_not_echo_them() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["url"] = json!("http://user:hunter2pass@127.0.0.1:9/x");
    let p = rejects_field(&app, body, "target.url").await;
    assert!(!p.to_string().contains("hunter2pass"), "{p}");
    teardown(app).await;
}

#[tokio::test]
async fn an_ftp_url_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["url"] = json!("ftp://127.0.0.1/file");
    rejects_field(&app, body, "target.url").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_relative_url_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["url"] = json!("/servers/1");
    rejects_field(&app, body, "target.url").await;
    teardown(app).await;
}

#[tokio::test]
async fn a_header_value_with_cr_lf_is_a_400_that_does_not_echo_it() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["headers"] = json!({"X-Token": "abc\r\nX-Injected: s3cr3t"});
    let p = rejects_field(&app, body, "target.headers.X-Token").await;
    assert!(!p.to_string().contains("s3cr3t"), "{p}");
    teardown(app).await;
}

#[tokio::test]
async fn a_reserved_header_name_is_a_400() {
    let app = setup().await;
    let mut body = valid();
    body["target"]["headers"] = json!({"Host": "evil.example"});
    rejects_field(&app, body, "target.headers.Host").await;
    teardown(app).await;
}

// ---------------------------------------------------------------------------------
// Routes, methods, ids
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn an_unknown_route_is_a_404_problem() {
    let app = setup().await;
    problem(app.get("/nope"), 404).await;
    problem(app.get("/waits/x/y/z"), 404).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_wrong_method_is_a_405_problem() {
    let app = setup().await;
    problem(app.put("/waits"), 405).await;
    problem(
        app.delete("/waits/0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21"),
        405,
    )
    .await;
    problem(
        app.get("/waits/0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21/cancel"),
        405,
    )
    .await;
    teardown(app).await;
}

#[tokio::test]
async fn a_wait_id_that_is_not_a_uuid_is_a_404_problem() {
    let app = setup().await;
    problem(app.get("/waits/not-a-uuid"), 404).await;
    problem(app.post("/waits/not-a-uuid/cancel"), 404).await;
    problem(app.get("/waits/not-a-uuid/events"), 404).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_wait_id_that_is_not_utf8_is_a_problem() {
    let app = setup().await;
    let r = app.get("/waits/%FF").send().await;
    let status = r.status;
    assert!(status == 400 || status == 404, "got {status}: {}", r.text);
    problem(app.get("/waits/%FF"), status).await;
    problem(app.post("/waits/%C0%AF/cancel"), status).await;
    problem(app.get("/waits/%FF/events"), status).await;
    teardown(app).await;
}

#[tokio::test]
async fn an_unknown_wait_uuid_is_a_404_problem() {
    let app = setup().await;
    let id = "0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21";
    problem(app.get(&format!("/waits/{id}")), 404).await;
    problem(app.get(&format!("/waits/{id}?wait=1s")), 404).await;
    problem(app.post(&format!("/waits/{id}/cancel")), 404).await;
    problem(app.get(&format!("/waits/{id}/events")), 404).await;
    problem(
        app.get(&format!("/waits/{id}/events"))
            .header("accept", "text/event-stream"),
        404,
    )
    .await;
    teardown(app).await;
}

// ---------------------------------------------------------------------------------
// Query parameters and headers
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_bad_wait_parameter_is_a_400_problem() {
    let app = setup().await;
    problem(app.post("/waits?wait=forever").json(&valid()), 400).await;
    problem(app.post("/waits?wait=5").json(&valid()), 400).await;
    problem(
        app.get("/waits/0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21?wait=soon"),
        400,
    )
    .await;
    // A hold longer than anything can last is "as long as it takes" (the grammar
    // the document gives), not an error: here, on a wait that does not exist.
    problem(
        app.get(&format!(
            "/waits/0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21?wait={}h",
            "9".repeat(40)
        )),
        404,
    )
    .await;
    // A hold given twice is ambiguous.
    let p = problem(
        app.get("/waits/0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21?wait=1s&wait=2s"),
        400,
    )
    .await;
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains("\"wait\" is given more than once"),
        "{p}"
    );
    teardown(app).await;
}

#[tokio::test]
async fn a_bad_list_status_is_a_400_problem() {
    let app = setup().await;
    problem(app.get("/waits?status=done"), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_bad_list_limit_is_a_400_problem() {
    let app = setup().await;
    for l in ["0", "501", "-1", "ten", "1.5"] {
        problem(app.get(&format!("/waits?limit={l}")), 400).await;
    }
    teardown(app).await;
}

#[tokio::test]
async fn a_bad_list_cursor_is_a_400_problem() {
    let app = setup().await;
    problem(app.get("/waits?cursor=page-2"), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn a_bad_list_label_is_a_400_problem() {
    let app = setup().await;
    problem(app.get("/waits?label=pipeline"), 400).await;
    problem(app.get("/events?label=pipeline"), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn more_label_filters_than_a_wait_can_carry_are_a_400_even_with_one_key() {
    let app = setup().await;
    // 33 filters on one key: the count is of filters given, not of keys.
    let many: String = (0..33).map(|i| format!("&label=k:{i}")).collect();
    for path in ["/waits", "/events"] {
        let p = problem(app.get(&format!("{path}?{}", &many[1..])), 400).await;
        assert!(
            p["detail"].as_str().unwrap().contains("more than 32"),
            "{p}"
        );
    }
    teardown(app).await;
}

#[tokio::test]
async fn an_unknown_query_parameter_is_a_400_problem() {
    let app = setup().await;
    let id = "0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21";
    let p = problem(app.get("/waits?sttaus=running"), 400).await;
    assert!(p["detail"].as_str().unwrap().contains("sttaus"), "{p}");
    problem(app.get(&format!("/waits/{id}?wiat=1s")), 400).await;
    problem(app.post("/waits?block=true").json(&valid()), 400).await;
    problem(app.get("/events?folow=true"), 400).await;
    teardown(app).await;
}

#[tokio::test]
async fn bad_event_stream_parameters_are_400_problems() {
    let app = setup().await;
    problem(app.get("/events?follow=maybe"), 400).await;
    // A bare `follow` is not a boolean either: the document says true or false.
    let id = "0192f0c4-7e1a-7cc3-9a55-3c1f6f0e8b21";
    problem(app.get("/events?follow="), 400).await;
    problem(app.get(&format!("/waits/{id}/events?follow")), 400).await;
    problem(app.get("/events?after=-1"), 400).await;
    problem(
        app.get("/events")
            .header("accept", "text/event-stream")
            .header("last-event-id", "yesterday"),
        400,
    )
    .await;
    teardown(app).await;
}

#[tokio::test]
async fn an_idempotency_key_empty_too_long_with_spaces_or_twice_is_a_400_problem() {
    let app = setup().await;
    problem(
        app.post("/waits")
            .header("Idempotency-Key", "")
            .json(&valid()),
        400,
    )
    .await;
    problem(
        app.post("/waits")
            .header("Idempotency-Key", "k".repeat(300))
            .json(&valid()),
        400,
    )
    .await;
    // Spaces and tabs are not visible characters, and two keys are not one.
    for key in ["deploy 1", "deploy\t1", " deploy-1"] {
        problem(
            app.post("/waits")
                .header("Idempotency-Key", key)
                .json(&valid()),
            400,
        )
        .await;
    }
    problem(
        app.post("/waits")
            .header("Idempotency-Key", "deploy-1")
            .header("Idempotency-Key", "deploy-2")
            .json(&valid()),
        400,
    )
    .await;
    let (_, page) = app.get("/waits").answer().await;
    assert_eq!(page["items"].as_array().map(Vec::len), Some(0), "{page}");
    teardown(app).await;
}

// ---------------------------------------------------------------------------------
// Tenants
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn with_tokens_configured_a_request_without_a_valid_token_is_a_401_problem() {
    let app = InProcess::start_with(&[
        "--tokens",
        "alpha:alpha-token-0123456789,beta:beta-token-0123456789",
    ])
    .await;
    problem(app.get("/waits"), 401).await;
    problem(app.get("/waits").bearer_auth("not-a-token-at-all-xx"), 401).await;
    problem(app.post("/waits").json(&valid()), 401).await;

    // Another tenant's wait is a 404.
    let r = app
        .post("/waits")
        .bearer_auth("alpha-token-0123456789")
        .json(&valid())
        .send()
        .await;
    assert_eq!(r.status, 201);
    let w = r.json();
    let id = w["id"].as_str().unwrap();
    problem(
        app.get(&format!("/waits/{id}"))
            .bearer_auth("beta-token-0123456789"),
        404,
    )
    .await;
    problem(
        app.post(&format!("/waits/{id}/cancel"))
            .bearer_auth("beta-token-0123456789"),
        404,
    )
    .await;
    let r = app
        .get("/waits")
        .bearer_auth("beta-token-0123456789")
        .send()
        .await;
    let page = r.json();
    assert_eq!(page["items"], json!([]), "{page}");
    let r = app
        .get("/events")
        .bearer_auth("beta-token-0123456789")
        .send()
        .await;
    let page = r.json();
    assert_eq!(page["items"], json!([]), "{page}");
    let r = app
        .get(&format!("/waits/{id}"))
        .bearer_auth("alpha-token-0123456789")
        .send()
        .await;
    assert_eq!(r.status, 200);
    app.stop().await;
}
