//! Tokens an operator can scope and change: a read-only token reads every reading
//! route and is refused every route that changes something; a reload (a changed
//! `--tokens-file`, or `SIGHUP`) takes a removed token out of force from the next
//! request and ends its open event streams; a reload that fails keeps the old set.

use crate::support;

use std::time::Duration;

use axum::http::Method;
use futures_util::StreamExt;
use serde_json::Value;

use support::in_process::InProcess;
use support::replica::Replica;
use support::signals::Signal;
use support::{App, TempDir};

const FULL: &str = "token-of-tenant-a-0001";
const READ: &str = "token-of-the-dashboard-01";

/// Every API route of the OpenAPI document (those that take a token), as
/// (method, path template).
fn api_routes() -> Vec<(Method, String)> {
    let doc: Value = serde_json::from_str(waitd::api::openapi::document()).unwrap();
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Ok(m) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            // The operational routes say they need no token.
            let open = op["security"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|r| r.as_object().is_some_and(|o| o.is_empty()))
            });
            if !open {
                routes.push((m, path.clone()));
            }
        }
    }
    routes
}

#[tokio::test]
async fn a_read_only_token_reads_every_reading_route_and_gets_a_403_on_every_other() {
    let tokens = format!("a:{FULL},a:{READ}:read");
    let app = InProcess::start_with(&["--tokens", &tokens]).await;
    let upstream = support::Upstream::start().await;
    let url = upstream.script("/s/1", vec![support::Reply::status("on")]);
    let (st, w) = app
        .post("/waits")
        .bearer_auth(FULL)
        .json(&support::spec(&url))
        .answer()
        .await;
    assert!(st == 201 || st == 200, "{st} {w}");
    let id = w["id"].as_str().unwrap().to_string();
    // Ended, so its event stream ends too and its body can be read whole.
    let (st, ended) = app
        .get(&format!("/waits/{id}?wait=20s"))
        .bearer_auth(READ)
        .answer()
        .await;
    assert_eq!(st, 200, "{ended}");
    let (_, presets) = app.get("/presets").bearer_auth(READ).answer().await;
    let preset = presets["items"][0]["name"]
        .as_str()
        .or_else(|| presets[0]["name"].as_str())
        .unwrap_or_else(|| panic!("no preset name in {presets}"))
        .to_string();

    // An event source named as the preset is, so that {name} names one of each.
    let source = serde_json::json!({
        "name": preset, "kind": "bearer", "secret": "a-source-secret-0123456789", "key": "/id",
    });
    let routes = api_routes();
    let (mut reads, mut writes) = (0, 0);
    for (method, template) in &routes {
        // A write through the full token below may have deleted it.
        let _ = app
            .post("/sources")
            .bearer_auth(FULL)
            .json(&source)
            .send()
            .await;
        let path = template
            .replace("{id}", &id)
            .replace("{delivery}", &uuid::Uuid::now_v7().to_string())
            .replace("{name}", &preset);
        let call = app.request(method.clone(), &path).bearer_auth(READ);
        if *method == Method::GET {
            reads += 1;
            let a = call.send().await;
            assert_eq!(
                a.status, 200,
                "GET {template} with a read-only token: {}",
                a.text
            );
        } else {
            writes += 1;
            let a = call.json(&support::spec(&url)).send().await;
            assert_eq!(
                a.status, 403,
                "{method} {template} with a read-only token: {}",
                a.text
            );
            assert_eq!(a.header("content-type"), "application/problem+json");
            assert!(a.text.contains("read-only"), "{}", a.text);
            // The full token of the same tenant is not refused.
            let a = app
                .request(method.clone(), &path)
                .bearer_auth(FULL)
                .json(&support::spec(&url))
                .send()
                .await;
            assert_ne!(
                a.status, 403,
                "{method} {template} with a full token: {}",
                a.text
            );
        }
    }
    assert!(reads >= 7 && writes >= 3, "{routes:?}");
    app.stop().await;
}

/// Opens `GET /events?follow=true` with `token`; the returned receiver answers
/// when the stream ends.
async fn follow(app: &App, token: &str) -> tokio::sync::oneshot::Receiver<()> {
    let r = app
        .client
        .get(app.url("/events?follow=true"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut body = r.bytes_stream();
        while let Some(Ok(_)) = body.next().await {}
        let _ = tx.send(());
    });
    rx
}

async fn status_with(client: &reqwest::Client, url: &str, token: &str) -> u16 {
    client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// The value of the metric line that starts with `series`.
async fn metric(client: &reqwest::Client, url: &str, series: &str) -> Option<f64> {
    let text = client.get(url).send().await.ok()?.text().await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_changed_tokens_file_takes_a_removed_token_out_and_ends_its_streams() {
    let dir = TempDir::new("waitd-tokens");
    let file = dir.path.join("tokens");
    std::fs::write(&file, format!("a:{FULL}\na:{READ}:read\n")).unwrap();
    let mut args = support::test_args("sqlite::memory:");
    args.extend(["--tokens-file".into(), file.display().to_string()]);
    let app = App::start_args(args).await;
    let waits = app.url("/waits");
    let metrics = app.url("/metrics");
    assert_eq!(status_with(&app.client, &waits, READ).await, 200);
    let ended = follow(&app, READ).await;
    let kept = follow(&app, FULL).await;
    // A read held until a wait ends, with the token about to go.
    let upstream = support::Upstream::start().await;
    let url = upstream.script("/held", vec![support::Reply::status("deploying")]);
    let created = app
        .client
        .post(app.url("/waits"))
        .bearer_auth(FULL)
        .json(&support::spec(&url))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let held = tokio::spawn({
        let (c, url) = (
            app.client.clone(),
            app.url(&format!("/waits/{id}?wait=60s")),
        );
        async move {
            let r = c.get(url).bearer_auth(READ).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        }
    });
    assert!(
        upstream.hit("/held", 1, Duration::from_secs(10)).await,
        "the held wait is polled"
    );

    let mut heard = app.heard();
    std::fs::write(&file, format!("a:{FULL}\n")).unwrap();
    heard
        .expect("the changed file reloaded", |s| {
            matches!(s, Signal::TokensReloaded { ok: true })
        })
        .await;
    let done = r#"waitd_token_reloads_total{outcome="done"} "#;
    assert_eq!(metric(&app.client, &metrics, done).await, Some(1.0));
    assert_eq!(status_with(&app.client, &waits, READ).await, 401);
    assert_eq!(status_with(&app.client, &waits, FULL).await, 200);
    tokio::time::timeout(Duration::from_secs(3), ended)
        .await
        .expect("the removed token's stream ended within 3 s")
        .unwrap();
    let (status, text) = tokio::time::timeout(Duration::from_secs(3), held)
        .await
        .expect("the removed token's held read was answered within 3 s")
        .unwrap();
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("removed"), "{text}");

    // A file that cannot be read as tokens: the tokens in force stay.
    std::fs::write(&file, "not a token entry\n").unwrap();
    heard
        .expect("the broken file looked at", |s| {
            matches!(s, Signal::TokensReloaded { ok: false })
        })
        .await;
    let failed = r#"waitd_token_reloads_total{outcome="failed"} "#;
    assert_eq!(metric(&app.client, &metrics, failed).await, Some(1.0));
    assert_eq!(status_with(&app.client, &waits, FULL).await, 200);
    // The other token's stream is still open.
    let mut kept = kept;
    assert!(kept.try_recv().is_err(), "the kept token's stream ended");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn sighup_reloads_the_tokens_file() {
    const OLD: &str = "token-of-tenant-b-0001";
    const NEW: &str = "token-of-tenant-b-0002";
    let dir = TempDir::new("waitd-sighup");
    let file = dir.path.join("tokens");
    std::fs::write(&file, format!("a:{FULL}\nb:{OLD}\n")).unwrap();
    let stamp = std::fs::metadata(&file).unwrap().modified().unwrap();
    let tokens_file = file.display().to_string();
    let r = Replica::start(
        "hup",
        &dir.path,
        &dir.sqlite_url(),
        "3s",
        &["--tokens-file", &tokens_file],
    )
    .await;
    let client = support::client();
    let waits = r.url("/waits");
    assert_eq!(status_with(&client, &waits, OLD).await, 200);
    // The same length and modification time: only the signal can tell waitd.
    std::fs::write(&file, format!("a:{FULL}\nb:{NEW}\n")).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&file)
        .unwrap()
        .set_modified(stamp)
        .unwrap();
    r.signal("HUP");
    let done = r#"waitd_token_reloads_total{outcome="done"} "#;
    let metrics = r.url("/metrics");
    assert!(
        support::eventually(Duration::from_secs(10), || async {
            metric(&client, &metrics, done).await == Some(1.0)
        })
        .await,
        "SIGHUP did not reload; log:\n{}",
        r.log_tail(20)
    );
    assert_eq!(status_with(&client, &waits, OLD).await, 401);
    assert_eq!(status_with(&client, &waits, NEW).await, 200);
    assert_eq!(status_with(&client, &waits, FULL).await, 200);
}
