//! The README's examples, run as written: the first wait, the walkthrough, the CI
//! line and the webhook receiver are taken from README.md (the ```sh blocks after a
//! `<!-- readme-test: NAME -->` marker) and run in order in one shell, as a reader
//! following along in one terminal would, with `waitd` on the PATH and the server
//! of "Run it" still running. Only the ports and the `/tmp/api` directory are
//! changed, so that runs in parallel do not meet. The conditions example (a
//! ```json block) is created on a server as written, with its URL pointed at a
//! scripted target; the install line is run as written, offline, until it builds.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use serde_json::{Value, json};

use crate::support::replica::free_port;
use crate::support::{App, Reply, TempDir, Upstream};

const BIN: &str = env!("CARGO_BIN_EXE_waitd");
const README: &str = include_str!("../README.md");
const CI_RUN: &str = include_str!("../.ci/run");

/// The blocks in `lang` the README marks for this test, in order, by name.
fn marked_blocks(readme: &str, lang: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut rest = readme;
    while let Some(i) = rest.find("<!-- readme-test: ") {
        rest = &rest[i + "<!-- readme-test: ".len()..];
        let (name, after) = rest.split_once(" -->").expect("a marker ends with -->");
        let (block_lang, body) = after
            .trim_start()
            .strip_prefix("```")
            .and_then(|b| b.split_once('\n'))
            .unwrap_or_else(|| panic!("the marker {name} is followed by a ``` block"));
        let end = body.find("\n```").expect("the block ends");
        if block_lang == lang {
            blocks.push((name.to_string(), body[..end].to_string()));
        }
        rest = &body[end..];
    }
    blocks
}

/// The first ```sh block of the README's section `heading`.
fn section_command(heading: &str) -> String {
    README
        .split(&format!("\n## {heading}\n"))
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("\n```").next())
        .unwrap_or_else(|| panic!("the README's {heading} section has a command"))
        .to_string()
}

#[test]
fn the_readme_test_command_is_the_one_ci_runs() {
    let command = README
        .split("## Test it")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split('\n').next())
        .expect("the README's Test it section has a command");
    // A line of .ci/run that runs it: the command, perhaps after environment
    // assignments (`NAME=value cargo test`) and with more arguments, but not one
    // that only builds.
    let runs = |line: &str| {
        let mut rest = line.trim();
        while let Some((word, after)) = rest.split_once(' ') {
            let assigns = word.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if !assigns {
                break;
            }
            rest = after.trim_start();
        }
        (rest == command || rest.starts_with(&format!("{command} "))) && !rest.contains("--no-run")
    };
    assert!(
        CI_RUN.lines().any(runs),
        ".ci/run does not run the README's test command {command:?}"
    );
}

/// The server "Run it" starts (`cargo run --release` runs `waitd` with no flags),
/// on `port` in place of 8080, kept running in `dir` as a reader leaves it.
struct RunIt(std::process::Child);

impl RunIt {
    fn start(dir: &std::path::Path, port: u16) -> RunIt {
        assert_eq!(section_command("Run it"), "cargo run --release");
        std::fs::create_dir_all(dir).unwrap();
        let mut child = Command::new(BIN)
            .env("WAITD_LISTEN", format!("127.0.0.1:{port}"))
            .env_remove("WAITD_ALLOW_TARGETS")
            .env_remove("DATABASE_URL")
            .env_remove("WAITD_TOKENS")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start waitd");
        // Its log says when it listens.
        let log = BufReader::new(child.stderr.take().unwrap());
        let mut lines = log.lines().map_while(Result::ok);
        let listening = lines.any(|l| l.contains("waitd listening"));
        assert!(listening, "the server of Run it started");
        std::thread::spawn(move || lines.for_each(drop));
        RunIt(child)
    }

    fn running(&mut self) -> bool {
        self.0.try_wait().ok().flatten().is_none()
    }
}

impl Drop for RunIt {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_readme_examples_run_as_written_after_run_it() {
    let blocks = marked_blocks(README, "sh");
    let names: Vec<&str> = blocks.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["first-wait", "walkthrough", "ci", "webhook"]);

    let dir = TempDir::new("waitd-readme");
    let api = dir.path.join("api");
    let (target, receiver, server, run_it) = (free_port(), free_port(), free_port(), free_port());
    // "Run it" holds its port; the walkthrough starts a server of its own.
    let mut first = RunIt::start(&dir.path.join("run-it"), run_it);
    let mut script = String::from("set -e\n");
    for (name, body) in &blocks {
        let body = body
            .replace("/tmp/api", api.to_str().unwrap())
            .replace("9000", &target.to_string())
            .replace("9001", &receiver.to_string())
            .replace("8090", &server.to_string())
            .replace("8080", &run_it.to_string());
        script.push_str(&format!("echo '=== {name}'\n{body}\n"));
    }
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
        .env_remove("WAITD_LISTEN")
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
    assert!(
        first.running(),
        "the server of Run it kept running beside the walkthrough's"
    );
}

/// A Kubernetes Deployment whose `Available` condition has been true for an hour,
/// as the API server sends it: no `x-phase` header.
fn available_deployment() -> Value {
    let since = Utc::now() - chrono::Duration::hours(1);
    json!({"kind": "Deployment", "status": {"conditions": [
        {"type": "Progressing", "status": "True", "lastTransitionTime": since.to_rfc3339_opts(SecondsFormat::Secs, true)},
        {"type": "Available", "status": "True", "lastTransitionTime": since.to_rfc3339_opts(SecondsFormat::Secs, true)},
    ]}})
}

#[tokio::test]
async fn the_conditions_example_decides_on_the_first_answer_of_a_target_without_the_header() {
    let blocks = marked_blocks(README, "json");
    let (name, example) = blocks.first().expect("the conditions example is marked");
    assert_eq!(name, "conditions");
    let example: Value = serde_json::from_str(example).expect("the example is JSON");
    let dir = TempDir::new("waitd-readme-conditions");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let up = Upstream::start().await;
    let path = "/apis/apps/v1/namespaces/default/deployments/web";
    for (reply, ends) in [
        (Reply::json(200, available_deployment()), "succeeded"),
        (
            Reply::json(200, json!({"status": {}})).header("x-phase", "Failed"),
            "failed",
        ),
    ] {
        let mut request = example.clone();
        request["target"]["url"] = json!(up.script(path, vec![reply]));
        let mut heard = app.heard();
        let (code, w) = app.create(request).await;
        assert_eq!(code, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        // The first answer decides: a condition that errors on it would leave the
        // wait running, to be retried.
        heard.recorded(&id).await;
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], ends, "{w}");
    }
    app.stop().await.0.unwrap();
}

#[test]
fn the_install_line_builds_the_locked_versions_offline() {
    let readme_line = README
        .lines()
        .find_map(|l| l.split('`').find(|part| part.starts_with("cargo install ")))
        .expect("the README says how to install");
    let dir = TempDir::new("waitd-readme-install");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // As written, offline, into this test's own directories; stopped once it
    // compiles, which it reaches only with every crate it needs at hand.
    let mut args: Vec<String> = readme_line
        .split_whitespace()
        .skip(1)
        .map(String::from)
        .collect();
    args.extend(
        [
            "--offline",
            "--root",
            dir.path.join("root").to_str().unwrap(),
            "--target-dir",
        ]
        .map(String::from),
    );
    args.push(dir.path.join("target").to_str().unwrap().into());
    let mut child = Command::new(cargo)
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("CARGO_TERM_COLOR", "never")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run cargo");
    let group = child.id();
    let mut said = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap())
        .lines()
        .map_while(Result::ok)
    {
        let compiling = line.trim_start().starts_with("Compiling");
        said.push(line);
        if compiling {
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", "--", &format!("-{group}")])
        .status();
    let _ = child.wait();
    let said = said.join("\n");
    assert!(
        said.contains("Compiling"),
        "`{readme_line} --offline` builds: {said}"
    );
    assert!(
        !said.contains("Locking") && !said.contains("Updating"),
        "`{readme_line}` builds the versions of Cargo.lock, without resolving them again: {said}"
    );
}
