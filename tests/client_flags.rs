//! The client's request flags beyond a URL and its conditions: `--poll` and
//! `--header`, for `create` and `wait` alike, and the bound on what `--spec` (a
//! file, a device or standard input), `--all`/`--any` and `--notify-secret-file`
//! read.

use std::io::Write;
use std::process::Stdio;

use serde_json::{Value, json};

use crate::client::{command, waitd};
use crate::support::*;

/// No server: a URL that answers nothing, so a test would fail if it were used.
const NO_SERVER: &str = "http://127.0.0.1:1";

/// The largest request body a server takes, which is the most `--spec` reads.
const LIMIT: usize = waitd::api::MAX_BODY;

const SECRET: &str = "Bearer s3cret-value-never-shown";

fn on() -> Reply {
    Reply::json(200, json!({"status": "on"}))
}

#[tokio::test]
async fn create_and_wait_take_the_poll_schedule_and_headers_from_flags() {
    let dir = TempDir::new("waitd-flags");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let up = Upstream::start().await;
    let url = up.script("/created", vec![Reply::json(200, json!({"status": "off"}))]);
    // A spec file's poll and headers are laid under the flags, not replaced.
    let file = dir.path.join("spec.json");
    std::fs::write(
        &file,
        json!({"poll": {"jitter": 0}, "target": {"url": url, "headers": {"X-From-File": "1"}}})
            .to_string(),
    )
    .unwrap();
    let run = waitd(
        &app.base,
        &[
            "create",
            "--spec",
            file.to_str().unwrap(),
            "--state",
            "/status",
            "--want",
            "on",
            "--poll",
            "5ms,2,40ms",
            "--header",
            &format!("Authorization: {SECRET}"),
            "--header",
            "X-Trace:1",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("--json prints the wait");
    assert_eq!(
        w["spec"]["poll"],
        json!({"initial": "5ms", "factor": 2.0, "max": "40ms", "jitter": 0.0, "delay": "0s"}),
        "{w}"
    );
    assert_eq!(
        w["spec"]["target"]["headers"],
        json!({"Authorization": "<redacted>", "X-From-File": "<redacted>", "X-Trace": "<redacted>"}),
        "{w}"
    );
    assert!(
        !run.stdout.contains("s3cret") && !run.stderr.contains("s3cret"),
        "{run:?}"
    );
    let polled = up
        .hit("/created", 1, std::time::Duration::from_secs(10))
        .await;
    assert!(polled, "the server polls the target");
    let sent = &up.headers_seen("/created")[0];
    assert_eq!(sent["authorization"], SECRET);
    assert_eq!(sent["x-trace"], "1");
    let (code, _) = app
        .post(&format!("/waits/{}/cancel", w["id"].as_str().unwrap()))
        .await;
    assert_eq!(code, 200);

    // The same flags describe a wait run in this process.
    let url = up.script(
        "/in-process",
        vec![Reply::json(200, json!({"status": "off"})), on()],
    );
    let run = waitd(
        NO_SERVER,
        &[
            "wait",
            "--url",
            &url,
            "--state",
            "/status",
            "--want",
            "on",
            "--poll",
            "5ms,1",
            "--header",
            &format!("Authorization: {SECRET}"),
            "--allow-targets",
            "127.0.0.1",
            "--min-poll-interval",
            "5ms",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("--json prints the ended wait");
    assert_eq!(
        (&w["spec"]["poll"]["initial"], &w["spec"]["poll"]["factor"]),
        (&json!("5ms"), &json!(1.0)),
        "{w}"
    );
    assert_eq!(
        w["spec"]["target"]["headers"]["Authorization"],
        "<redacted>"
    );
    assert!(!run.stdout.contains("s3cret") && !run.stderr.contains("s3cret"));
    for sent in up.headers_seen("/in-process") {
        assert_eq!(sent["authorization"], SECRET);
    }
    assert_eq!(up.hits("/in-process"), 2);
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_bad_poll_or_header_flag_exits_5_with_a_sentence_that_repeats_no_header_value() {
    let base = [
        "wait",
        "--url",
        "http://127.0.0.1:9/x",
        "--success-condition",
        "true",
    ];
    for (flags, says) in [
        (
            vec!["--poll", "1s,fast"],
            "the factor \"fast\" is not a number",
        ),
        (vec!["--poll", "1s,2,3s,4"], "has 4 parts"),
        (vec!["--poll", "soon"], "INITIAL"),
        (vec!["--poll", "1s,2,later"], "MAX"),
        // The validator's bounds, naming the field.
        (vec!["--poll", "5ms"], "poll.initial"),
        (vec!["--poll", "2s,11"], "poll.factor"),
        (vec!["--header", SECRET], "--header takes NAME:VALUE"),
        (
            vec!["--header", &format!(":{SECRET}")],
            "--header takes NAME:VALUE",
        ),
        (
            vec!["--header", &format!("Bad Name: {SECRET}")],
            "target.headers",
        ),
    ] {
        let mut args = base.to_vec();
        args.extend(&flags);
        let run = waitd(NO_SERVER, &args).await;
        assert_eq!(run.code, 5, "{flags:?}: {run:?}");
        assert!(
            run.stderr.contains(says),
            "{flags:?} says {says:?}: {run:?}"
        );
        assert!(!run.stderr.contains("s3cret"), "{flags:?}: {run:?}");
    }
    // A group's members say how they poll, in their files.
    let run = waitd(NO_SERVER, &["create", "--all", "a.json", "--poll", "1s"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("--poll"), "{run:?}");
}

/// A request of `n` bytes: a JSON object padded with spaces, which no limit on
/// JSON itself refuses.
fn padded_request(n: usize) -> Vec<u8> {
    let mut text = b"{\"timeout\": \"1m\"".to_vec();
    text.resize(n - 1, b' ');
    text.push(b'}');
    text
}

#[tokio::test]
async fn a_spec_longer_than_a_server_takes_is_refused_without_reading_the_rest() {
    let dir = TempDir::new("waitd-bound");
    // At the limit, the request is read (and then found to lack a target); one byte
    // past it, it is refused for its size.
    for (n, read) in [(LIMIT, true), (LIMIT + 1, false)] {
        let file = dir.path.join(format!("spec-{n}.json"));
        std::fs::write(&file, padded_request(n)).unwrap();
        let run = waitd(NO_SERVER, &["wait", "--spec", file.to_str().unwrap()]).await;
        assert_eq!(run.code, 5, "{run:?}");
        assert_eq!(run.stderr.contains("target"), read, "{n} bytes: {run:?}");
        assert_eq!(
            run.stderr
                .contains("is longer than 64 KiB, more than a wait request can be"),
            !read,
            "{n} bytes: {run:?}"
        );
    }
    // A device that never ends, and files for a group and a secret.
    for args in [
        vec!["wait", "--spec", "/dev/zero"],
        vec!["create", "--spec", "/dev/zero"],
        vec!["create", "--any", "/dev/zero"],
        vec![
            "create",
            "--url",
            "http://127.0.0.1:9/x",
            "--success-condition",
            "true",
            "--notify",
            "http://127.0.0.1:9/hook",
            "--notify-secret-file",
            "/dev/zero",
        ],
    ] {
        let run = waitd(NO_SERVER, &args).await;
        assert_eq!(run.code, 5, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains("/dev/zero is longer than"),
            "{args:?}: {run:?}"
        );
    }

    // Standard input that never ends: the client stops reading past the limit and
    // exits, and what it took in is measured by what could be written to it.
    let mut child = command(NO_SERVER, &["wait", "--spec", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waitd");
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = vec![b' '; 8192];
        let mut written = 0usize;
        // Up to 64 MiB: an unbounded reader takes it all.
        while written < 64 << 20 {
            match stdin.write(&chunk) {
                Ok(n) => written += n,
                Err(_) => break,
            }
        }
        written
    });
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let written = writer.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(
        stderr.contains("standard input is longer than 64 KiB"),
        "{stderr}"
    );
    // What it read (the limit and one byte, read through standard input's 8 KiB
    // buffer), and what the pipe holds (64 KiB on Linux) that it never read.
    let (buffer, pipe) = (8 * 1024, 64 * 1024);
    assert!(
        written <= LIMIT + 1 + buffer + pipe,
        "{written} bytes went into standard input, more than {} and the buffers between",
        LIMIT + 1
    );
}
