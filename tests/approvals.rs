//! Approvals through the API, on both stores (docs/design.md §2.15): `POST
//! /waits/{id}/complete` and `/fail` end a running callback wait with a tenant's
//! token, once, as its callback URL would; a wait that had ended is a `409` with
//! the wait as it ended; a polled wait is a `422`, another tenant's a `404`, a
//! read-only token a `403` and a body over 64 KiB a `413`, none of which ends it.

use crate::support;

use serde_json::{Value, json};
use support::stores::{Backend, each_store_with, finish};
use support::*;

const FULL: &str = "approvals-token-of-tenant-a";
const READ: &str = "approvals-read-token-of-a";
const OTHER: &str = "approvals-token-of-tenant-b";

/// A running app on each store, with tenant `a`'s tokens and tenant `b`'s.
async fn each_store() -> Vec<(App, Backend)> {
    let tokens = format!("a:{FULL},a:{READ}:read,b:{OTHER}");
    each_store_with(|url| {
        let mut args = test_args(url);
        args.extend(["--tokens".to_string(), tokens.clone()]);
        args
    })
    .await
}

/// Creates a callback wait of tenant `a`; its id and callback URL.
async fn callback_wait(app: &App) -> (String, String) {
    let (status, w) = app
        .create_as(FULL, &json!({"callback": {}, "timeout": "1m"}))
        .await;
    assert_eq!(status, 201, "{w}");
    let url = w["callback_url"].as_str().expect("the URL").to_string();
    (w["id"].as_str().unwrap().to_string(), url)
}

/// POSTs `body` (none when `None`) to `path` with `token`.
async fn post(app: &App, token: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let mut r = client().post(app.url(path)).bearer_auth(token);
    if let Some(b) = body {
        r = r.json(b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn status_of(app: &App, id: &str) -> Value {
    let (status, w) = app.get_as(FULL, &format!("/waits/{id}")).await;
    assert_eq!(status, 200, "{w}");
    w["status"].clone()
}

const TERMINAL: [&str; 5] = ["succeeded", "failed", "timed_out", "canceled", "error"];

/// The kinds of the terminal events in the wait's history.
async fn terminal_events(app: &App, id: &str) -> Vec<String> {
    let (status, page) = app.get_as(FULL, &format!("/waits/{id}/events")).await;
    assert_eq!(status, 200, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .filter(|k| TERMINAL.contains(k))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn complete_ends_a_callback_wait_succeeded_and_a_later_end_gets_409_with_it() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app).await;
        let (status, w) = post(&app, FULL, &format!("/waits/{id}/complete"), None).await;
        assert_eq!(status, 200, "{w}");
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(w["reason"], "approved through the API", "{w}");
        assert_eq!(w["error_detail"], Value::Null, "{w}");
        let (status, w) = post(
            &app,
            FULL,
            &format!("/waits/{id}/fail"),
            Some(&json!({"reason": "too late"})),
        )
        .await;
        assert_eq!(status, 409, "the first end won: {w}");
        assert_eq!(
            (&w["status"], &w["reason"]),
            (&json!("succeeded"), &json!("approved through the API")),
            "{w}"
        );
        let (status, w) = post(&app, FULL, &format!("/waits/{id}/complete"), None).await;
        assert_eq!((status, &w["status"]), (409, &json!("succeeded")), "{w}");
        let r = client().post(&url).json(&json!({})).send().await.unwrap();
        assert_eq!(r.status(), 409, "its callback URL ends it no more");
        assert_eq!(terminal_events(&app, &id).await, ["succeeded"]);
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn fail_ends_a_callback_wait_failed_with_the_body_as_its_detail() {
    for (app, backend) in each_store().await {
        let (id, _) = callback_wait(&app).await;
        let body = json!({"reason": "not during the freeze"});
        let (status, w) = post(&app, FULL, &format!("/waits/{id}/fail"), Some(&body)).await;
        assert_eq!(status, 200, "{w}");
        assert_eq!(w["status"], "failed", "{w}");
        assert_eq!(w["reason"], "rejected through the API", "{w}");
        assert_eq!(w["error_detail"], body, "{w}");
        let (status, w) = post(
            &app,
            FULL,
            &format!("/waits/{id}/complete"),
            Some(&json!({"approved": true})),
        )
        .await;
        assert_eq!(status, 409, "{w}");
        assert_eq!(
            (&w["status"], &w["error_detail"]),
            (&json!("failed"), &body)
        );

        // Without a body: failed, with no detail.
        let (id, _) = callback_wait(&app).await;
        let (status, w) = post(&app, FULL, &format!("/waits/{id}/fail"), None).await;
        assert_eq!((status, &w["status"]), (200, &json!("failed")), "{w}");
        assert_eq!(w["error_detail"], Value::Null, "{w}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_canceled_callback_wait_answers_409_as_it_ended() {
    for (app, backend) in each_store().await {
        let (id, _) = callback_wait(&app).await;
        let (status, _) = app.post_as(FULL, &format!("/waits/{id}/cancel")).await;
        assert_eq!(status, 200);
        for route in ["complete", "fail"] {
            let (status, w) = post(&app, FULL, &format!("/waits/{id}/{route}"), None).await;
            assert_eq!((status, &w["status"]), (409, &json!("canceled")), "{w}");
        }
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_polled_wait_is_422_saying_only_callback_waits_end_so_and_goes_on() {
    for (app, backend) in each_store().await {
        let up = Upstream::start().await;
        let url = up.script("/servers/p", vec![Reply::status("deploying")]);
        let (status, w) = app.create_as(FULL, &spec(&url)).await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        for route in ["complete", "fail"] {
            let (status, p) = post(&app, FULL, &format!("/waits/{id}/{route}"), None).await;
            assert_eq!(status, 422, "{p}");
            let detail = p["detail"].as_str().unwrap();
            assert!(
                detail.contains("not a callback wait") && detail.contains("\"callback\""),
                "{p}"
            );
        }
        assert_eq!(status_of(&app, &id).await, "running");
        assert_eq!(terminal_events(&app, &id).await, Vec::<String>::new());
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn another_tenants_wait_and_an_unknown_one_are_404_and_end_nothing() {
    for (app, backend) in each_store().await {
        let (id, _) = callback_wait(&app).await;
        let unknown = uuid::Uuid::now_v7();
        for path in [format!("/waits/{id}/complete"), format!("/waits/{id}/fail")] {
            let (status, p) = post(&app, OTHER, &path, None).await;
            assert_eq!(status, 404, "{path}: {p}");
        }
        for path in [
            format!("/waits/{unknown}/complete"),
            format!("/waits/{unknown}/fail"),
            "/waits/not-a-wait/complete".to_string(),
        ] {
            let (status, p) = post(&app, FULL, &path, None).await;
            assert_eq!(status, 404, "{path}: {p}");
        }
        assert_eq!(status_of(&app, &id).await, "running");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_read_only_token_is_403_and_ends_nothing() {
    for (app, backend) in each_store().await {
        let (id, _) = callback_wait(&app).await;
        for route in ["complete", "fail"] {
            let (status, p) = post(&app, READ, &format!("/waits/{id}/{route}"), None).await;
            assert_eq!(status, 403, "{p}");
            assert!(p["detail"].as_str().unwrap().contains("read-only"), "{p}");
        }
        assert_eq!(status_of(&app, &id).await, "running");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_body_over_64_kib_is_413_one_not_json_400_and_the_wait_goes_on() {
    for (app, backend) in each_store().await {
        let (id, _) = callback_wait(&app).await;
        let big = json!({"reason": "x".repeat(65 * 1024)});
        for route in ["complete", "fail"] {
            let (status, p) = post(&app, FULL, &format!("/waits/{id}/{route}"), Some(&big)).await;
            assert_eq!(status, 413, "{p}");
            let r = client()
                .post(app.url(&format!("/waits/{id}/{route}")))
                .bearer_auth(FULL)
                .header("content-type", "application/json")
                .body("approved")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 400);
        }
        assert_eq!(status_of(&app, &id).await, "running");
        let (status, w) = post(
            &app,
            FULL,
            &format!("/waits/{id}/complete"),
            Some(&json!({"approved": true})),
        )
        .await;
        assert_eq!((status, &w["status"]), (200, &json!("succeeded")), "{w}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn complete_racing_the_callback_url_ends_the_wait_once() {
    for (app, backend) in each_store().await {
        for _ in 0..5 {
            let (id, url) = callback_wait(&app).await;
            // The API approves while the callback URL reports a failure: whichever
            // commits first decides, and both answers show its end.
            let complete = format!("/waits/{id}/complete");
            let api = post(&app, FULL, &complete, None);
            let hook = async {
                let r = client()
                    .post(format!("{url}/fail"))
                    .json(&json!({"from": "the job"}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap())
            };
            let ((a, wa), (b, wb)) = tokio::join!(api, hook);
            let mut codes = [a, b];
            codes.sort();
            assert_eq!(codes, [200, 409], "one end, one refusal: {wa} {wb}");
            let (end, reason) = if a == 200 {
                ("succeeded", "approved through the API")
            } else {
                ("failed", "the callback reported a failure")
            };
            for w in [&wa, &wb] {
                assert_eq!(
                    (&w["status"], &w["reason"]),
                    (&json!(end), &json!(reason)),
                    "{w}"
                );
            }
            assert_eq!(terminal_events(&app, &id).await, [end]);
        }
        finish(app, backend).await;
    }
}
