//! Callback waits from the command line, run as a process: `waitd create
//! --callback` prints the URL the server answered with, and `waitd wait
//! --callback` listens for the callback itself, on loopback, ending as a server
//! would (0 succeeded, 1 failed, 2 timed out); `--output json` prints the ended
//! wait as one JSON object.

use crate::client::{Live, waitd};
use crate::client_wait::NO_SERVER;
use crate::support::*;

use std::time::Duration;

use serde_json::{Value, json};

/// The URL a running `waitd` printed: the first line that is one, on stdout or
/// (with `--output json`) on stderr.
async fn printed_url(live: &Live, on_stderr: bool) -> String {
    let find = |lines: &[String], stderr: &str| -> Option<String> {
        if on_stderr {
            stderr
                .lines()
                .find(|l| l.starts_with("http://"))
                .map(str::to_string)
        } else {
            lines.iter().find(|l| l.starts_with("http://")).cloned()
        }
    };
    let seen = std::sync::Mutex::new(None);
    let ok = live
        .printed(Duration::from_secs(15), |lines, stderr| {
            let url = find(lines, stderr);
            let found = url.is_some();
            *seen.lock().unwrap() = url;
            found
        })
        .await;
    assert!(ok, "no callback URL printed: {:?}", live.lines());
    seen.into_inner().unwrap().unwrap()
}

async fn post(url: &str, body: Value) -> (u16, Value) {
    let r = client().post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The 64 hex digits of a callback URL's secret, after `/callbacks/`.
fn secret_of(url: &str) -> &str {
    let secret = url.rsplit_once("/callbacks/").expect("a callback URL").1;
    assert_eq!(secret.len(), 64, "{url}");
    assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()), "{url}");
    secret
}

#[tokio::test]
async fn create_callback_prints_the_url_and_a_post_to_it_ends_create_wait() {
    let dir = TempDir::new("waitd-client-callback");
    let app = App::start_sqlite(&dir.sqlite_url()).await;

    // Without --wait: the wait's line, then the URL on a line of its own.
    let run = waitd(&app.base, &["create", "--callback", "--timeout", "1m"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{run:?}");
    let (id, rest) = lines[0].split_once(' ').unwrap();
    assert_eq!(rest, "running", "{run:?}");
    assert!(lines[1].starts_with(&app.url("/callbacks/")), "{run:?}");
    secret_of(lines[1]);
    let (status, w) = post(&format!("{}/fail", lines[1]), json!({"step": "migrate"})).await;
    assert_eq!((status, w["id"].as_str()), (200, Some(id)), "{w}");

    // --output json: the create's answer as the server gave it, URL and all.
    let run = waitd(
        &app.base,
        &[
            "create",
            "--callback",
            "--heartbeat",
            "5m",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("one JSON object");
    assert_eq!(w["status"], "running", "{w}");
    assert_eq!(w["spec"]["callback"]["heartbeat"], "5m", "{w}");
    let url = w["callback_url"].as_str().expect("the URL").to_string();
    let (status, _) = post(&url, json!({"artifact": "app.tar"})).await;
    assert_eq!(status, 200);
    let id = w["id"].as_str().unwrap();
    let run = waitd(&app.base, &["get", id, "--output", "json"]).await;
    let got: Value = serde_json::from_str(&run.stdout).expect("one JSON object");
    assert_eq!(got["status"], "succeeded", "{run:?}");
    assert_eq!(got["output"], json!({"artifact": "app.tar"}), "{run:?}");

    // With --wait: the URL comes before it blocks; a POST ends it, exit 0.
    let live = Live::spawn(
        &app.base,
        &["create", "--callback", "--wait", "--timeout", "1m"],
    );
    let url = printed_url(&live, false).await;
    assert!(url.starts_with(&app.url("/callbacks/")), "{url}");
    let (status, w) = post(&url, json!({"build": 42})).await;
    assert_eq!(
        (status, w["status"].as_str()),
        (200, Some("succeeded")),
        "{w}"
    );
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 0, "{lines:?} {stderr}");
    assert!(lines[0].ends_with(" running"), "{lines:?}");
    assert_eq!(lines[1], url, "{lines:?}");
    assert!(
        lines
            .last()
            .unwrap()
            .ends_with(" succeeded: the callback reported success"),
        "{lines:?}"
    );

    // --wait --output json: the URL on stderr, the ended wait alone on stdout.
    let live = Live::spawn(
        &app.base,
        &["create", "--callback", "--wait", "--output", "json"],
    );
    let url = printed_url(&live, true).await;
    let (status, _) = post(&format!("{url}/fail"), json!({"exit": 3})).await;
    assert_eq!(status, 200);
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 1, "{lines:?} {stderr}");
    let w: Value = serde_json::from_str(&lines.join("\n")).expect("one JSON object");
    assert_eq!(w["status"], "failed", "{w}");
    assert_eq!(w["error_detail"], json!({"exit": 3}), "{w}");
    assert!(
        w.get("callback_url").is_none(),
        "only the create's answer carries it: {w}"
    );

    let (r, _) = app.stop().await;
    r.unwrap();
}

#[tokio::test]
async fn wait_callback_listens_on_loopback_and_fail_exits_1_with_the_detail() {
    let live = Live::spawn(NO_SERVER, &["wait", "--callback", "--timeout", "1m"]);
    let url = printed_url(&live, false).await;
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(url.contains("/callbacks/"), "{url}");
    secret_of(&url);
    let (status, w) = post(&format!("{url}/fail"), json!({"error": "disk full"})).await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["status"], "failed", "{w}");
    assert_eq!(w["reason"], "the callback reported a failure", "{w}");
    assert_eq!(w["error_detail"], json!({"error": "disk full"}), "{w}");
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 1, "{lines:?} {stderr}");
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].ends_with(" running"), "{lines:?}");
    assert_eq!(lines[1], url);
    assert!(
        lines[2].ends_with(" failed: the callback reported a failure"),
        "{lines:?}"
    );
    assert_eq!(stderr, "");
}

#[tokio::test]
async fn wait_callback_refuses_what_a_server_refuses_and_the_wait_goes_on() {
    let live = Live::spawn(NO_SERVER, &["wait", "--callback", "--timeout", "1m"]);
    let url = printed_url(&live, false).await;
    let secret = secret_of(&url);

    // A wrong secret, of the right shape or not.
    let flipped = if secret.starts_with('0') { "1" } else { "0" };
    let wrong = format!("{}{flipped}{}", &url[..url.len() - 64], &secret[1..]);
    for bad in [wrong.as_str(), &url[..url.len() - 1]] {
        let (status, p) = post(bad, json!({})).await;
        assert_eq!(status, 404, "{p}");
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains("no callback wait has this URL"),
            "{p}"
        );
    }
    // A body over 64 KiB, one that is not JSON, one of another type, a GET.
    let (status, p) = post(&url, json!({"pad": "x".repeat(65 * 1024)})).await;
    assert_eq!(status, 413, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("64 KiB"), "{p}");
    let r = client().post(&url).body("{not json").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = client()
        .post(&url)
        .header("content-type", "text/plain")
        .body("done")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = client().get(&url).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let r = client()
        .post(format!("{url}/heartbeat"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "a heartbeat needs no body");

    // None of them ended it: a good POST still does.
    let (status, w) = post(&url, json!({"artifact": "app.tar"})).await;
    assert_eq!(
        (status, w["status"].as_str()),
        (200, Some("succeeded")),
        "{w}"
    );
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 0, "{lines:?} {stderr}");
    assert!(
        lines
            .last()
            .unwrap()
            .ends_with(" succeeded: the callback reported success"),
        "{lines:?}"
    );
}

#[tokio::test]
async fn heartbeat_silence_fails_the_wait_and_the_deadline_times_it_out() {
    let live = Live::spawn(
        NO_SERVER,
        &[
            "wait",
            "--callback",
            "--heartbeat",
            "400ms",
            "--timeout",
            "1m",
        ],
    );
    let url = printed_url(&live, false).await;
    let (status, w) = post(&format!("{url}/heartbeat"), json!({})).await;
    assert_eq!(
        (status, w["status"].as_str()),
        (200, Some("running")),
        "{w}"
    );
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 1, "{lines:?} {stderr}");
    assert!(
        lines.last().unwrap().ends_with(
            " failed: no heartbeat or completion came to the callback URL for 400ms (the wait's callback.heartbeat)"
        ),
        "{lines:?}"
    );

    let run = waitd(
        NO_SERVER,
        &[
            "wait",
            "--callback",
            "--timeout",
            "300ms",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("one JSON object on stdout");
    assert_eq!(w["status"], "timed_out", "{w}");
    assert_eq!(
        w["reason"], "the deadline passed before a callback completed the wait",
        "{w}"
    );
    assert!(w["finished_at"].is_string(), "{w}");
    assert!(
        run.stderr
            .lines()
            .any(|l| l.starts_with("http://127.0.0.1:")),
        "with --output json the URL goes to stderr: {run:?}"
    );
}

#[tokio::test]
async fn wait_callback_output_json_prints_the_ended_wait() {
    let live = Live::spawn(
        NO_SERVER,
        &[
            "wait",
            "--callback",
            "--label",
            "job=build-7",
            "--output",
            "json",
        ],
    );
    let url = printed_url(&live, true).await;
    let (status, _) = post(&url, json!({"ok": true})).await;
    assert_eq!(status, 200);
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 0, "{lines:?} {stderr}");
    let w: Value = serde_json::from_str(&lines.join("\n")).expect("one JSON object");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["reason"], "the callback reported success", "{w}");
    assert_eq!(w["labels"], json!({"job": "build-7"}), "{w}");
    assert_eq!(
        w["output"],
        json!({"ok": true}),
        "the body is its output: {w}"
    );
    assert_eq!(w["spec"]["callback"], json!({}), "{w}");
    assert!(
        !w.to_string().contains(secret_of(&url)),
        "the secret is not in the wait: {w}"
    );
}

#[tokio::test]
async fn wait_callback_judges_bodies_by_the_state_and_conditions_given() {
    let live = Live::spawn(
        NO_SERVER,
        &[
            "wait",
            "--callback",
            "--state",
            "/phase",
            "--want",
            "done",
            "--fail",
            "broken",
        ],
    );
    let url = printed_url(&live, false).await;
    let (status, w) = post(&url, json!({"phase": "building"})).await;
    assert_eq!(status, 202, "a body that meets neither is progress: {w}");
    assert_eq!(
        (w["status"].as_str(), w["state"].as_str()),
        (Some("running"), Some("building")),
        "{w}"
    );
    let (status, p) = post(&url, json!({"stage": "done"})).await;
    assert_eq!(status, 422, "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("the wait goes on"),
        "{p}"
    );
    let (status, w) = post(&url, json!({"phase": "done", "version": 7})).await;
    assert_eq!(
        (status, w["status"].as_str()),
        (200, Some("succeeded")),
        "{w}"
    );
    assert_eq!(w["output"], json!({"phase": "done", "version": 7}), "{w}");
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 0, "{lines:?} {stderr}");
    assert!(lines[2].ends_with(" state building"), "{lines:?}");
    assert!(lines[3].contains(" succeeded: "), "{lines:?}");

    let live = Live::spawn(
        NO_SERVER,
        &[
            "wait",
            "--callback",
            "--failure-condition",
            "body.exit != 0",
        ],
    );
    let url = printed_url(&live, false).await;
    let (status, w) = post(&url, json!({"exit": 2})).await;
    assert_eq!((status, w["status"].as_str()), (200, Some("failed")), "{w}");
    assert_eq!(w["error_detail"], json!({"exit": 2}), "{w}");
    let (code, lines, stderr) = live.finish().await;
    assert_eq!(code, 1, "{lines:?} {stderr}");
}

#[tokio::test]
async fn a_listen_address_beyond_loopback_is_refused_unless_asked() {
    let run = waitd(NO_SERVER, &["wait", "--callback", "--listen", "0.0.0.0:0"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("is not a loopback address"), "{run:?}");
    assert!(run.stderr.contains("--allow-remote"), "{run:?}");

    let run = waitd(
        NO_SERVER,
        &["wait", "--callback", "--listen", "localhost:80"],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("IP:PORT"), "{run:?}");

    let run = waitd(
        NO_SERVER,
        &[
            "wait",
            "--url",
            "https://example.com/x",
            "--want",
            "on",
            "--state",
            "/s",
            "--listen",
            "127.0.0.1:0",
        ],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("add --callback"), "{run:?}");

    let run = waitd(
        NO_SERVER,
        &["wait", "--callback", "--url", "https://example.com/x"],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("--callback"), "{run:?}");
}
