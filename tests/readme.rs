//! The README's examples, run as written: the first wait, the walkthrough, the CI
//! line and the webhook receiver are taken from README.md (the ```sh blocks after a
//! `<!-- readme-test: NAME -->` marker) and run in order in one shell, as a reader
//! following along in one terminal would, with `waitd` on the PATH. Only the ports
//! and the `/tmp/api` directory are changed, so that runs in parallel do not meet.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::TempDir;

const BIN: &str = env!("CARGO_BIN_EXE_waitd");
const README: &str = include_str!("../README.md");
const CI_RUN: &str = include_str!("../.ci/run");

/// The blocks the README marks for this test, in order, by name.
fn marked_blocks(readme: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = readme;
    while let Some(i) = rest.find("<!-- readme-test: ") {
        rest = &rest[i + "<!-- readme-test: ".len()..];
        let (name, after) = rest.split_once(" -->").expect("a marker ends with -->");
        let body = after
            .trim_start()
            .strip_prefix("```sh\n")
            .unwrap_or_else(|| panic!("the marker {name} is followed by a ```sh block"));
        let end = body.find("\n```").expect("the block ends");
        blocks.push((name.to_string(), body[..end].to_string()));
        rest = &body[end..];
    }
    blocks
}

/// A port free on 127.0.0.1 now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn the_readme_test_command_is_the_one_ci_runs() {
    let command = README
        .split("## Test it")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split('\n').next())
        .expect("the README's Test it section has a command");
    assert!(
        CI_RUN
            .lines()
            .any(|l| l.trim() == command || l.trim().starts_with(&format!("{command} "))),
        ".ci/run does not run the README's test command {command:?}"
    );
}

#[test]
fn the_readme_examples_run_as_written() {
    let blocks = marked_blocks(README);
    let names: Vec<&str> = blocks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["first-wait", "walkthrough", "ci", "webhook"]);

    let dir = TempDir::new("waitd-readme");
    let api = dir.path.join("api");
    let (target, receiver, server) = (free_port(), free_port(), free_port());
    let mut script = String::from("set -e\n");
    for (name, body) in &blocks {
        let body = body
            .replace("/tmp/api", api.to_str().unwrap())
            .replace("9000", &target.to_string())
            .replace("9001", &receiver.to_string())
            .replace("8080", &server.to_string());
        script.push_str(&format!("echo '=== {name}'\n{body}\n"));
    }
    // The server's --listen default is 8080: the walkthrough's waitd listens where
    // WAITD_URL says.
    let bin_dir = std::path::Path::new(BIN).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out_path = dir.path.join("out.log");
    let out = std::fs::File::create(&out_path).unwrap();
    let child = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .env("PATH", path)
        .env("WAITD_LISTEN", format!("127.0.0.1:{server}"))
        .env_remove("WAITD_URL")
        .env_remove("WAITD_TOKEN")
        .env_remove("WAITD_ALLOW_TARGETS")
        .env_remove("DATABASE_URL")
        .current_dir(&dir.path)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        // Its own process group, so that what it leaves running is stopped with it.
        .process_group(0)
        .spawn()
        .expect("run bash");
    let group = child.id();
    // Its exit, heard by a thread that reaps it.
    let (exited, exit) = std::sync::mpsc::channel();
    let reaper = std::thread::spawn(move || {
        let mut child = child;
        let status = child.wait();
        let _ = exited.send(());
        status
    });
    let finished = exit.recv_timeout(Duration::from_secs(120)).is_ok();
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{group}")])
        .status();
    let status = reaper
        .join()
        .expect("the reaper did not panic")
        .expect("wait for bash");
    let status = finished.then_some(status);
    let mut output = String::new();
    std::fs::File::open(&out_path)
        .unwrap()
        .read_to_string(&mut output)
        .unwrap();
    let status = status.unwrap_or_else(|| panic!("the examples did not finish:\n{output}"));
    assert!(
        status.success(),
        "the examples failed ({status}):\n{output}"
    );

    let section = |name: &str| {
        output
            .split(&format!("=== {name}\n"))
            .nth(1)
            .and_then(|s| s.split("\n=== ").next())
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        section("first-wait").contains("succeeded: the target reached \"on\""),
        "{output}"
    );
    assert!(
        section("walkthrough").contains("\"status\":\"canceled\""),
        "{output}"
    );
    assert!(
        section("walkthrough").contains("event: succeeded"),
        "the follower saw the end: {output}"
    );
    assert!(
        section("ci").contains("\"status\":\"succeeded\""),
        "{output}"
    );
    assert!(
        section("webhook").contains("wait.succeeded "),
        "the receiver verified and printed the event: {output}"
    );
    let log = std::fs::read_to_string(api.join("waitd.log")).unwrap_or_default();
    assert!(
        log.lines()
            .next()
            .unwrap_or_default()
            .contains("waitd starting"),
        "the first log line is the summary: {log}"
    );
}
