//! Callback waits through the API, on both stores (docs/design.md §2.15): a POST
//! to the URL the create answered with ends the wait, once; `/fail` fails it with
//! the body as its detail; silence past the heartbeat and the deadline end it;
//! and the URL's secret is shown by the create's answer and nowhere else.

use crate::support;

use serde_json::{Value, json};
use support::in_process::InProcess;
use support::stores::{Backend, each_store, finish};
use support::*;

/// Creates a callback wait; its id and callback URL.
async fn callback_wait(app: &App, mut spec: Value) -> (String, String) {
    if spec.get("callback").is_none() {
        spec["callback"] = json!({});
    }
    let (status, w) = app.create(spec).await;
    assert_eq!(status, 201, "{w}");
    let url = w["callback_url"].as_str().expect("the URL").to_string();
    assert!(url.starts_with(&app.url("/callbacks/")), "{url}");
    (w["id"].as_str().unwrap().to_string(), url)
}

async fn post_json(url: &str, body: Value) -> (u16, Value) {
    let r = client().post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_post_to_the_url_ends_the_wait_succeeded_and_a_second_one_gets_409() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({"timeout": "1m"})).await;
        let (status, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!((status, w["status"].as_str()), (200, Some("running")));
        let (status, w) = post_json(&url, json!({"build": 42})).await;
        assert_eq!(status, 200, "{w}");
        assert_eq!(w["status"], "succeeded");
        let (status, w) = post_json(&format!("{url}/fail"), json!({"late": true})).await;
        assert_eq!(status, 409, "the first completion won: {w}");
        assert_eq!(w["status"], "succeeded");
        assert_eq!(app.wait_end(&id).await["status"], "succeeded");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn fail_ends_the_wait_failed_with_the_body_as_its_detail() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({})).await;
        let (status, w) = post_json(&format!("{url}/fail"), json!({"why": "disk full"})).await;
        assert_eq!(status, 200, "{w}");
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "failed");
        assert_eq!(w["error_detail"], json!({"why": "disk full"}));
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_canceled_wait_answers_a_late_callback_409() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({})).await;
        let (status, _) = app.post(&format!("/waits/{id}/cancel")).await;
        assert_eq!(status, 200);
        let (status, w) = post_json(&url, json!({})).await;
        assert_eq!(status, 409, "{w}");
        assert_eq!(w["status"], "canceled");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_body_over_64_kib_is_413_and_the_wait_goes_on() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({})).await;
        let big = json!({"pad": "x".repeat(65 * 1024)});
        let (status, _) = post_json(&url, big).await;
        assert_eq!(status, 413);
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running");
        let (status, _) = post_json(&url, json!({})).await;
        assert_eq!(status, 200);
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_wrong_or_unknown_secret_is_404_and_ends_nothing() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({})).await;
        let wrong = format!("{}0", &url[..url.len() - 1]);
        let wrong = if wrong == url {
            format!("{}1", &url[..url.len() - 1])
        } else {
            wrong
        };
        for u in [
            wrong.clone(),
            format!("{wrong}/fail"),
            app.url("/callbacks/x"),
        ] {
            let (status, body) = post_json(&u, json!({})).await;
            assert_eq!(status, 404, "{u}: {body}");
        }
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn silence_past_the_heartbeat_fails_the_wait_and_beats_keep_it_going() {
    for (app, backend) in each_store().await {
        let (quiet, _) = callback_wait(&app, json!({"callback": {"heartbeat": "300ms"}})).await;
        let w = app.wait_end(&quiet).await;
        assert_eq!(w["status"], "failed", "{w}");
        assert!(w["reason"].as_str().unwrap().contains("heartbeat"), "{w}");

        let (beating, url) = callback_wait(&app, json!({"callback": {"heartbeat": "1s"}})).await;
        let (status, w) = post_json(&format!("{url}/heartbeat"), json!({})).await;
        assert_eq!(
            (status, w["status"].as_str()),
            (200, Some("running")),
            "{w}"
        );
        let (status, _) = post_json(&url, json!({})).await;
        assert_eq!(status, 200);
        assert_eq!(app.wait_end(&beating).await["status"], "succeeded");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn the_deadline_ends_a_callback_wait_timed_out() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({"timeout": "1s"})).await;
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "timed_out", "{w}");
        let (status, _) = post_json(&url, json!({})).await;
        assert_eq!(status, 409);
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn the_secret_is_in_the_create_answer_and_on_no_other_surface() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(&app, json!({"labels": {"k": "v"}})).await;
        let secret = url.rsplit('/').next().unwrap().to_string();
        assert!(secret.len() >= 32, "at least 128 bits: {secret}");
        let (status, _) = post_json(&format!("{url}/heartbeat"), json!({})).await;
        assert_eq!(status, 200);
        let (status, _) = post_json(&url, json!({"done": true})).await;
        assert_eq!(status, 200);
        let mut seen = Vec::new();
        for path in [
            format!("/waits/{id}"),
            "/waits".to_string(),
            "/waits?label=k:v".to_string(),
            format!("/waits/{id}/events"),
            "/events?after=0".to_string(),
        ] {
            let r = client().get(app.url(&path)).send().await.unwrap();
            seen.push((path, r.text().await.unwrap()));
        }
        seen.push(("/metrics".into(), app.metrics().await));
        for (path, text) in seen {
            assert!(!text.contains(&secret), "{path} shows the secret");
        }
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_request_with_both_target_and_callback_is_refused() {
    for (app, backend) in each_store().await {
        let mut s = spec("http://127.0.0.1:9/x");
        s["callback"] = json!({});
        let (status, body) = app.create(s).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains("callback"), "{body}");
        let (status, body) = app
            .create(json!({"callback": {"heartbeat": "2h"}, "timeout": "1m"}))
            .await;
        assert_eq!(status, 400, "{body}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn what_a_callback_wait_would_never_use_is_refused_naming_it() {
    let app = InProcess::start().await;
    // Each callback's body is judged alone: nothing counts across callbacks.
    for (field, value) in [
        ("consecutive", json!(2)),
        ("require_transition", json!(true)),
    ] {
        let mut s = json!({"callback": {}, "timeout": "1m", "success_condition": "true"});
        s[field] = value;
        let (status, body) = app.create(s).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["errors"][0]["field"], field, "{body}");
    }
    // Held until its end, the create answer would show the URL to no one.
    let (status, body) = app
        .post("/waits?wait=true")
        .json(&json!({"callback": {}, "timeout": "1m"}))
        .answer()
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("callback_url"),
        "{body}"
    );
    let (_, list) = app.get("/waits").answer().await;
    assert_eq!(list["items"].as_array().map(Vec::len), Some(0), "{list}");
    app.stop().await;
}

#[tokio::test]
async fn a_group_of_a_callback_member_and_a_polled_member_ends_when_both_have() {
    for (app, backend) in each_store().await {
        let up = Upstream::start().await;
        let polled = up.script("/on", vec![Reply::status("on")]);
        let (cb, url) = callback_wait(&app, json!({})).await;
        let (status, g) = app
            .create(json!({"all": [{"id": cb}, spec(&polled)], "timeout": "20s"}))
            .await;
        assert_eq!(status, 201, "{g}");
        let gid = g["id"].as_str().unwrap().to_string();
        let (status, _) = post_json(&url, json!({"ok": true})).await;
        assert_eq!(status, 200);
        let g = app.wait_end(&gid).await;
        assert_eq!(g["status"], "succeeded", "{g}");
        let text = g.to_string();
        assert!(!text.contains(url.rsplit('/').next().unwrap()));
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn guessing_secrets_at_rate_from_one_address_is_refused_429() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    use waitd::api::callbacks::{BURST, PER_SECOND};
    // Guesses 40 at a time: however slowly the machine answers, a batch comes
    // faster than the limit refills. What was answered never passes the burst
    // and the refill since the first guess.
    let start = std::time::Instant::now();
    let (mut answered, mut refused) = (0u32, 0u32);
    for batch in 0..10 {
        let guesses = (0..40).map(|i| {
            let url = app.url(&format!("/callbacks/guess{batch}x{i}"));
            async move { post_json(&url, json!({})).await.0 }
        });
        for status in futures_util::future::join_all(guesses).await {
            assert!(status == 404 || status == 429, "{status}");
            refused += u32::from(status == 429);
            answered += u32::from(status == 404);
        }
        let allowed = BURST + (f64::from(PER_SECOND) * start.elapsed().as_secs_f64()).ceil() as u32;
        assert!(
            answered <= allowed,
            "{answered} guesses answered in {:?}, past the per-address limit",
            start.elapsed()
        );
        if refused > 0 {
            break;
        }
    }
    assert!(refused > 0, "guesses 40 at once meet the per-address limit");
    finish(app, Backend::Postgres(db)).await;
}
