//! `waitd wait` on targets beyond a GET, from flags: `--tcp` against a listener,
//! `--tls` (with `--ca` and `--server-name`) against a server with a generated
//! certificate, `--method` and `--data` against a target that requires an
//! Idempotency-Key; and the mistakes each flag is refused for, by name.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::cert_targets::{served, valid_for};
use crate::client::{fast_spec_file, waitd};
use crate::client_wait::{NO_SERVER, wait_args};
use crate::methods::Target;
use crate::tls_targets::pki::authority;

/// `waitd wait` with fast timings from `timings`, allowed to reach this machine,
/// printing the ended wait as JSON.
fn wait_json<'a>(timings: &'a std::path::Path, more: &[&'a str]) -> Vec<&'a str> {
    let mut args = wait_args(timings, &["--json"]);
    args.extend_from_slice(more);
    args
}

fn ended(stdout: &str) -> Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn temp_file(text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("waitd-probe-{}", uuid::Uuid::now_v7()));
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test]
async fn tcp_waits_for_a_port_to_accept() {
    let timings = fast_spec_file(json!({}));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let run = waitd(NO_SERVER, &wait_json(&timings, &["--tcp", &addr])).await;
    assert_eq!(run.code, 0, "{run:?}");
    let w = ended(&run.stdout);
    assert_eq!(w["state"], "connected", "{w}");
    assert_eq!(w["spec"]["target"]["url"], format!("tcp://{addr}"), "{w}");

    // Closed: refused at every poll, until the deadline.
    drop(listener);
    let closed = crate::support::replica::closed_addr().to_string();
    let run = waitd(
        NO_SERVER,
        &wait_json(&timings, &["--tcp", &closed, "--timeout", "300ms"]),
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(ended(&run.stdout)["state"], "refused", "{run:?}");
    let _ = std::fs::remove_file(timings);
}

#[tokio::test]
async fn grpc_waits_for_a_service_to_report_serving() {
    use crate::grpc_targets::{Health, Says};
    let timings = fast_spec_file(json!({}));
    let health = Health::default();
    health.says("shop.Orders", vec![Says::Status(2), Says::Status(1)]);
    let addr = health.clone().start().await;
    let at = format!("{addr}/shop.Orders");
    let run = waitd(NO_SERVER, &wait_json(&timings, &["--grpc", &at])).await;
    assert_eq!(run.code, 0, "{run:?}");
    let w = ended(&run.stdout);
    assert_eq!(w["state"], "SERVING", "{w}");
    assert_eq!(w["spec"]["target"]["url"], format!("grpc://{at}"), "{w}");
    let _ = std::fs::remove_file(timings);
}

#[tokio::test]
async fn tls_waits_for_a_chain_that_verifies_with_the_ca_and_name_given() {
    let timings = fast_spec_file(json!({}));
    let ca = authority("Client CA");
    let ca_file = temp_file(&ca.pem());
    let addr = served(&valid_for(&ca, &["svc.example"], 90)).await;
    let ca_path = ca_file.to_str().unwrap();
    let run = waitd(
        NO_SERVER,
        &wait_json(
            &timings,
            &[
                "--tls",
                &addr,
                "--ca",
                ca_path,
                "--server-name",
                "svc.example",
                "--success-condition",
                "tls.verified && tls.days_left >= 30 && tls.sans == ['svc.example']",
            ],
        ),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w = ended(&run.stdout);
    assert_eq!(w["spec"]["target"]["url"], format!("tls://{addr}"), "{w}");
    assert_eq!(w["spec"]["target"]["tls"]["server_name"], "svc.example");

    // Asked for the address, the chain is for another name: never verified.
    let run = waitd(
        NO_SERVER,
        &wait_json(
            &timings,
            &["--tls", &addr, "--ca", ca_path, "--timeout", "300ms"],
        ),
    )
    .await;
    assert_eq!(run.code, 2, "{run:?}");
    assert_eq!(ended(&run.stdout)["state"], "unverified", "{run:?}");

    // The preset, with the same flags laid over it.
    let run = waitd(
        NO_SERVER,
        &wait_json(
            &timings,
            &[
                "--preset",
                "tls.valid_for",
                "--param",
                &format!("address={addr}"),
                "--param",
                "days=30",
                "--ca",
                ca_path,
                "--server-name",
                "svc.example",
            ],
        ),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let _ = std::fs::remove_file(ca_file);
    let _ = std::fs::remove_file(timings);
}

#[tokio::test]
async fn method_and_data_send_a_body_with_a_key_at_each_poll() {
    let timings = fast_spec_file(json!({}));
    let target = Target::start(2, Duration::ZERO).await;
    let query = r#"{"query": "{ deployment { status } }"}"#;
    let body_file = temp_file(query);
    let data = format!("@{}", body_file.display());
    let url = target.url("/graphql");
    let run = waitd(
        NO_SERVER,
        &wait_json(
            &timings,
            &[
                "--url",
                &url,
                "--method",
                "put",
                "--data",
                &data,
                "--state",
                "/data/status",
                "--want",
                "on",
            ],
        ),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let seen = target.seen("/graphql");
    assert_eq!(seen.len(), 2, "{seen:?}");
    for s in &seen {
        assert_eq!(s.method, "PUT");
        assert_eq!(s.content_type.as_deref(), Some("application/json"));
        let body: Value = serde_json::from_slice(&s.body).unwrap();
        assert_eq!(body, serde_json::from_str::<Value>(query).unwrap());
    }
    assert!(
        seen[0].key.is_some() && seen[0].key != seen[1].key,
        "{seen:?}"
    );

    // Text without --method: a POST of that text.
    let url = target.url("/text");
    let run = waitd(
        NO_SERVER,
        &wait_json(
            &timings,
            &[
                "--url",
                &url,
                "--data",
                "ping",
                "--success-condition",
                "status == 200",
            ],
        ),
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let seen = target.seen("/text");
    assert_eq!(seen[0].method, "POST");
    assert_eq!(&seen[0].body[..], b"ping");
    assert!(seen[0].key.is_some());
    let _ = std::fs::remove_file(body_file);
    let _ = std::fs::remove_file(timings);
}

#[tokio::test]
async fn each_flag_that_cannot_be_used_is_refused_by_name() {
    let timings = fast_spec_file(json!({}));
    let long = temp_file(&"x".repeat(64 * 1024));
    let long_at = format!("@{}", long.display());
    let long_path = long.to_str().unwrap();
    let url = "http://127.0.0.1:9/";
    for (flags, says) in [
        (vec!["--tcp", "127.0.0.1:9", "--url", url], "--url"),
        (
            vec!["--tls", "127.0.0.1:9", "--tcp", "127.0.0.1:9"],
            "--tcp",
        ),
        (vec!["--tcp", "127.0.0.1:9", "--method", "POST"], "--method"),
        (vec!["--tls", "127.0.0.1:9", "--data", "x"], "--data"),
        (vec!["--tcp", "127.0.0.1:9", "--ca", long_path], "--ca"),
        (vec!["--tcp", "127.0.0.1:9", "--header", "A: b"], "--header"),
        (
            vec!["--url", url, "--server-name", "a.example"],
            "--server-name",
        ),
        (vec!["--tcp", "db.internal"], "--tcp takes HOST:PORT"),
        (
            vec!["--grpc", "127.0.0.1:9", "--method", "POST"],
            "--method",
        ),
        (
            vec!["--grpc", "127.0.0.1:9", "--tls", "127.0.0.1:9"],
            "--tls",
        ),
        (
            vec!["--grpc", "grpc.internal/a.B"],
            "--grpc takes HOST:PORT",
        ),
        (
            vec!["--tls", "https://a.example:443"],
            "--tls takes HOST:PORT",
        ),
        (
            vec!["--url", url, "--method", "TRACE"],
            "--method takes GET",
        ),
        (
            vec!["--url", url, "--method", "GET", "--data", "x"],
            "--data is sent only",
        ),
        (vec!["--url", url, "--data", &long_at], "--data:"),
        (vec!["--tls", "127.0.0.1:9", "--ca", long_path], "--ca:"),
        (
            vec!["--url", url, "--data", "@-", "--ca", "-"],
            "--ca - and --data @- would each read standard input",
        ),
    ] {
        let run = waitd(NO_SERVER, &wait_json(&timings, &flags)).await;
        assert_eq!(run.code, 5, "{flags:?}: {run:?}");
        assert!(run.stderr.contains(says), "{flags:?}: {run:?}");
    }
    let _ = std::fs::remove_file(long);
    let _ = std::fs::remove_file(timings);
}

#[tokio::test]
async fn create_takes_the_same_flags_for_a_server() {
    let dir = crate::support::TempDir::new("waitd-probe-create");
    let app = crate::support::App::start_sqlite(&dir.sqlite_url()).await;
    let timings = fast_spec_file(json!({}));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let run = waitd(
        &app.base,
        &[
            "create",
            "--spec",
            timings.to_str().unwrap(),
            "--tcp",
            &addr,
            "--wait",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.code, 0, "{run:?}");
    let w = ended(&run.stdout);
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["spec"]["target"]["url"], format!("tcp://{addr}"), "{w}");

    let run = waitd(
        &app.base,
        &["create", "--tcp", &addr, "--all", timings.to_str().unwrap()],
    )
    .await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("--tcp"), "{run:?}");
    let _ = std::fs::remove_file(timings);
    app.stop().await.0.unwrap();
}
