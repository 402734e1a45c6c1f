//! `waitd wait`, run as a process: one wait in the process, no server and nothing
//! stored, with the lines and exit codes of `create --wait` (0 succeeded, 1 failed,
//! 2 timed out, 3 error, 5 a problem with the request, 130 interrupted).

use crate::client::{Live, fast_spec_file, kind_of, status, waitd};
use crate::support::*;

use serde_json::{Value, json};

/// No server: a URL that answers nothing, so a test would fail if `wait` used it.
pub(crate) const NO_SERVER: &str = "http://127.0.0.1:1";

/// `waitd wait` with the spec in `file`, allowed to poll the local upstream, with
/// the test's fast timings allowed.
pub(crate) fn wait_args<'a>(file: &'a std::path::Path, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "wait",
        "--spec",
        file.to_str().unwrap(),
        "--allow-targets",
        "127.0.0.1",
        "--min-poll-interval",
        "5ms",
    ];
    args.extend_from_slice(more);
    args
}

fn state_spec(url: &str, extra: Value) -> std::path::PathBuf {
    let mut spec = json!({
        "target": {"url": url},
        "state": "/data/attributes/status",
        "want": ["on"],
        "fail": ["failed_deployment"],
    });
    if let Value::Object(m) = extra {
        for (k, v) in m {
            spec[k] = v;
        }
    }
    fast_spec_file(spec)
}

#[tokio::test]
async fn wait_runs_one_wait_in_the_process_and_prints_what_create_wait_prints() {
    let up = Upstream::start().await;
    let url = up.script(
        "/servers/sv_1",
        vec![status("deploying"), status("deploying"), status("on")],
    );
    let file = state_spec(&url, json!({}));
    let run = waitd(NO_SERVER, &wait_args(&file, &[])).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{run:?}");
    let (id, rest) = lines[0].split_once(' ').unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{run:?}");
    assert_eq!(rest, "running", "{run:?}");
    assert!(lines[1].ends_with(" state deploying"), "{run:?}");
    assert!(lines[2].ends_with(" state deploying -> on"), "{run:?}");
    assert!(
        lines[3].ends_with(" succeeded: the target reached \"on\""),
        "{run:?}"
    );
    assert_eq!(run.stderr, "", "{run:?}");
    assert_eq!(up.hits("/servers/sv_1"), 3, "one GET a poll");
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn each_ending_exits_with_the_code_create_wait_gives_it() {
    let up = Upstream::start().await;
    let failed = up.script("/failed", vec![status("failed_deployment")]);
    let stuck = up.script("/stuck", vec![status("deploying")]);
    let forbidden = up.script("/forbidden", vec![Reply::json(403, json!({}))]);
    for (url, extra, code, kind) in [
        (&failed, json!({}), 1, "failed"),
        (&stuck, json!({"timeout": "300ms"}), 2, "timed_out"),
        (&forbidden, json!({}), 3, "error"),
    ] {
        let file = state_spec(url, extra);
        let run = waitd(NO_SERVER, &wait_args(&file, &[])).await;
        assert_eq!(run.code, code, "{kind}: {run:?}");
        let last = run.stdout.lines().last().unwrap_or_default();
        assert_eq!(kind_of(last), kind, "{run:?}");
        let _ = std::fs::remove_file(file);
    }
}

#[tokio::test]
async fn the_flags_of_create_and_its_conditions_describe_an_in_process_wait() {
    let up = Upstream::start().await;
    let url = up.script("/servers/f", vec![status("deploying"), status("on")]);
    let timings = fast_spec_file(json!({}));
    let run = waitd(
        NO_SERVER,
        &wait_args(
            &timings,
            &[
                "--url",
                &url,
                "--state",
                "/data/attributes/status",
                "--want",
                "on",
                "--json",
            ],
        ),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("--json prints the ended wait");
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["state"], "on", "{w}");
    assert_eq!(w["polls"], 2, "{w}");
    assert!(
        run.stderr
            .lines()
            .last()
            .unwrap()
            .ends_with("succeeded: the target reached \"on\""),
        "progress goes to stderr with --json: {run:?}"
    );

    let gone = up.script("/volumes/v", vec![Reply::json(404, json!({}))]);
    let run = waitd(
        NO_SERVER,
        &wait_args(
            &timings,
            &["--url", &gone, "--success-condition", "status == 404"],
        ),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("the success_condition held"), "{run:?}");
    let _ = std::fs::remove_file(timings);
}

#[tokio::test]
async fn ctrl_c_stops_an_in_process_wait_with_130_and_one_line() {
    let up = Upstream::start().await;
    let url = up.script("/servers/c", vec![status("deploying")]);
    let file = state_spec(&url, json!({}));
    let live = Live::spawn(NO_SERVER, &wait_args(&file, &[]));
    live.wait_for_lines(2).await; // the wait, state deploying
    live.signal("-INT");
    let (code, _, stderr) = live.finish().await;
    assert_eq!(code, 130, "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        "waitd: interrupted; the wait ran in this process and ends with it"
    );
    let _ = std::fs::remove_file(file);
}

#[tokio::test]
async fn a_refused_target_or_a_bad_request_exits_5_with_the_servers_sentence() {
    let up = Upstream::start().await;
    let url = up.script("/servers/r", vec![status("on")]);
    let file = state_spec(&url, json!({}));

    // Without --allow-targets, the SSRF guard refuses the loopback target.
    let run = waitd(
        NO_SERVER,
        &[
            "wait",
            "--spec",
            file.to_str().unwrap(),
            "--min-poll-interval",
            "5ms",
        ],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("is a loopback address"), "{run:?}");
    assert!(run.stderr.contains("WAITD_ALLOW_TARGETS"), "{run:?}");
    assert_eq!(up.hits("/servers/r"), 0, "{run:?}");

    // Intervals under the floor are refused, as a server refuses them.
    let run = waitd(NO_SERVER, &["wait", "--spec", file.to_str().unwrap()]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("poll.initial"), "{run:?}");

    let bad = state_spec(&url, json!({"want": []}));
    let run = waitd(NO_SERVER, &wait_args(&bad, &[])).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.starts_with("waitd: "), "{run:?}");

    let hooked = state_spec(
        &url,
        json!({"notify": [{"url": "https://hooks.example/x", "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]}),
    );
    let run = waitd(NO_SERVER, &wait_args(&hooked, &[])).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("sends no webhooks"), "{run:?}");
    assert!(
        !run.stderr.contains("whsec_"),
        "the secret never echoes: {run:?}"
    );
    // A server has nothing to do with it: --server is a mistake, not ignored.
    let run = waitd(
        NO_SERVER,
        &wait_args(&file, &["--server", "http://127.0.0.1:8080"]),
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("waitd create --wait"), "{run:?}");
    for f in [file, bad, hooked] {
        let _ = std::fs::remove_file(f);
    }
}

#[tokio::test]
async fn wait_with_output_json_prints_the_values_the_spec_names() {
    let up = Upstream::start().await;
    let url = up.script(
        "/servers/sv_out",
        vec![Reply::json(
            200,
            json!({"data": {"attributes": {"status": "on", "ip": "10.0.0.9"}}}),
        )],
    );
    let file = state_spec(
        &url,
        json!({"output": {"ip": "/data/attributes/ip", "up": "body.data.attributes.status == 'on'"}}),
    );
    let run = waitd(NO_SERVER, &wait_args(&file, &["--output", "json"])).await;
    assert_eq!(run.code, 0, "{run:?}");
    // The ended wait is the last JSON object printed.
    let at = run.stdout.rfind("\n{").map_or(0, |i| i + 1);
    let last: Value = serde_json::from_str(&run.stdout[at..]).expect(&run.stdout);
    assert_eq!(last["status"], "succeeded", "{run:?}");
    assert_eq!(
        last["output"],
        json!({"ip": "10.0.0.9", "up": true}),
        "{run:?}"
    );
    let _ = std::fs::remove_file(file);
}
