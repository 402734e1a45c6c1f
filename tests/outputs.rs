//! A wait's `output` (docs/design.md §2.16), on both stores: the values a polled
//! wait's spec names, taken from the response it ended on; a callback's body;
//! a group's members' outputs; in the read, the terminal event, the blocking read
//! and the webhook; bounded, and never carrying a secret of the spec's. And a
//! callback wait whose spec judges the body (§2.15).

use crate::support;

use serde_json::{Value, json};
use support::in_process::InProcess;
use support::receiver::Receiver;
use support::stores::{each_store, finish};
use support::*;

async fn post_json(url: &str, body: Value) -> (u16, Value) {
    let r = client().post(url).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The last event of a wait's history.
async fn last_event(app: &App, id: &str) -> Value {
    let (status, page) = app.get(&format!("/waits/{id}/events")).await;
    assert_eq!(status, 200, "{page}");
    page["items"].as_array().unwrap().last().unwrap().clone()
}

fn deployed() -> Value {
    json!({
        "status": "done",
        "release": {"version": "1.2.3"},
        "links": [{"self": "/d/1"}, {"self": "/d/2"}],
        "took_ms": 61000
    })
}

#[tokio::test]
async fn a_polled_wait_ends_with_the_values_its_spec_names() {
    for (app, backend) in each_store().await {
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let hook = rx.url("/hook");
        let url = up.script(
            "/d",
            vec![
                Reply::json(200, json!({"status": "building"})),
                Reply::json(200, deployed()).header("x-region", "eu-1"),
            ],
        );
        let spec = json!({
            "target": {"url": url},
            "state": "/status",
            "want": ["done"],
            "poll": {"initial": "10ms", "factor": 1, "max": "10ms", "jitter": 0},
            "timeout": "20s",
            "notify": [{"url": hook, "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSwMfKQ9r8GKYo=", "events": ["ended"]}],
            "output": {
                "version": "/release/version",
                "links": "$.links[*].self",
                "slow": "body.took_ms > 60000",
                "region": "headers['x-region']",
                "absent": "/no/such/field"
            }
        });
        let (status, w) = app.create(spec).await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        assert_eq!(w["output"], Value::Null, "no output while it runs: {w}");
        let want =
            json!({"version": "1.2.3", "links": ["/d/1", "/d/2"], "slow": true, "region": "eu-1"});
        // The blocking read carries it.
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(
            w["output"], want,
            "a pick that selects nothing is left out: {w}"
        );
        // The terminal event carries it.
        let end = last_event(&app, &id).await;
        assert_eq!(
            (end["kind"].as_str(), &end["output"]),
            (Some("succeeded"), &want)
        );
        // So does the webhook, in both the wait and the event.
        assert!(
            rx.until_got("/hook", 1, std::time::Duration::from_secs(20))
                .await
        );
        let sent = rx.got("/hook")[0].json();
        assert_eq!(sent["data"]["output"], want, "{sent}");
        assert_eq!(sent["event"]["output"], want, "{sent}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_wait_that_fails_on_a_response_keeps_its_output_and_a_timeout_has_none() {
    let app = InProcess::start().await;
    let up = Upstream::start().await;
    let failing = up.script(
        "/f",
        vec![Reply::json(200, json!({"status": "broken", "code": 7}))],
    );
    let (status, w) = app
        .create(json!({
            "target": {"url": failing}, "state": "/status", "want": ["done"], "fail": ["broken"],
            "timeout": "20s", "output": {"code": "/code"}
        }))
        .await;
    assert_eq!(status, 201, "{w}");
    let (_, w) = app
        .get(&format!("/waits/{}?wait=20s", w["id"].as_str().unwrap()))
        .answer()
        .await;
    assert_eq!(
        (w["status"].as_str(), &w["output"]),
        (Some("failed"), &json!({"code": 7}))
    );
    let slow = up.script(
        "/s",
        vec![Reply::json(200, json!({"status": "building", "code": 1}))],
    );
    let (_, w) = app
        .create(json!({
            "target": {"url": slow}, "state": "/status", "want": ["done"],
            "timeout": "300ms", "poll": {"initial": "100ms"}, "output": {"code": "/code"}
        }))
        .await;
    let (_, w) = app
        .get(&format!("/waits/{}?wait=20s", w["id"].as_str().unwrap()))
        .answer()
        .await;
    assert_eq!(w["status"], "timed_out", "{w}");
    assert_eq!(w["output"], Value::Null, "{w}");
    app.stop().await;
}

#[tokio::test]
async fn an_output_never_carries_a_secret_of_the_spec_and_is_cut_past_64_kib() {
    let app = InProcess::start().await;
    let up = Upstream::start().await;
    let secret = "tok-4f1c9a7e0d2b";
    let echo = up.script(
        "/echo",
        vec![Reply::json(
            200,
            json!({"status": "done", "seen": format!("Bearer {secret}"), "ok": "fine"}),
        )],
    );
    let (status, w) = app
        .create(json!({
            "target": {"url": echo, "headers": {"authorization": format!("Bearer {secret}")}},
            "state": "/status", "want": ["done"], "timeout": "20s",
            "output": {"seen": "/seen", "ok": "/ok", "all": "body"}
        }))
        .await;
    assert_eq!(status, 201, "{w}");
    let (_, w) = app
        .get(&format!("/waits/{}?wait=20s", w["id"].as_str().unwrap()))
        .answer()
        .await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["output"]["seen"], "<redacted>", "{w}");
    assert_eq!(w["output"]["ok"], "fine", "{w}");
    assert!(!w.to_string().contains(secret), "{w}");

    // A whole body of 200 KiB is kept as a preview, not whole.
    let big = up.script(
        "/big",
        vec![Reply::json(
            200,
            json!({"status": "done", "pad": "x".repeat(200 * 1024)}),
        )],
    );
    let (_, w) = app
        .create(json!({
            "target": {"url": big}, "state": "/status", "want": ["done"], "timeout": "20s",
            "output": {"all": "body"}
        }))
        .await;
    let (_, w) = app
        .get(&format!("/waits/{}?wait=20s", w["id"].as_str().unwrap()))
        .answer()
        .await;
    assert_eq!(w["status"], "succeeded", "{w}");
    let out = &w["output"];
    assert!(out["cut"].as_str().is_some(), "{out}");
    assert!(
        out.to_string().len() <= 64 * 1024,
        "{}",
        out.to_string().len()
    );
    app.stop().await;
}

#[tokio::test]
async fn a_bad_output_is_refused_naming_it() {
    let app = InProcess::start().await;
    let base = json!({"target": {"url": "http://127.0.0.1:9/x"}, "state": "/s", "want": ["on"]});
    let many: serde_json::Map<String, Value> =
        (0..17).map(|i| (format!("n{i}"), json!("/a"))).collect();
    for (output, field) in [
        (json!(["/a"]), "output"),
        (json!({"bad name": "/a"}), "output.bad name"),
        (json!({"n": 3}), "output.n"),
        (json!({"n": "body.("}), "output.n"),
        (json!({"n": "$[?("}), "output.n"),
        (json!({"n": "@status"}), "output.n"),
        (json!({"n": ""}), "output.n"),
        (Value::Object(many), "output"),
    ] {
        let mut s = base.clone();
        s["output"] = output.clone();
        let (status, body) = app.create(s).await;
        assert_eq!(status, 400, "{output}: {body}");
        assert_eq!(body["errors"][0]["field"], field, "{output}: {body}");
        assert!(
            body["errors"][0]["message"].as_str().unwrap().len() > 10,
            "{body}"
        );
    }
    let (status, body) = app
        .create(json!({"callback": {}, "output": {"a": "/a"}}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["errors"][0]["field"], "output", "{body}");
    app.stop().await;
}

/// Creates a callback wait; its id and callback URL.
async fn callback_wait(app: &App, spec: Value) -> (String, String) {
    let (status, w) = app.create(spec).await;
    assert_eq!(status, 201, "{w}");
    let url = w["callback_url"].as_str().expect("the URL").to_string();
    (w["id"].as_str().unwrap().to_string(), url)
}

#[tokio::test]
async fn a_callback_body_is_the_output_and_a_judged_body_may_be_progress() {
    for (app, backend) in each_store().await {
        // Unjudged: the body is the output.
        let (id, url) = callback_wait(&app, json!({"callback": {}})).await;
        let (status, w) = post_json(&url, json!({"artifact": "app-1.2.tgz"})).await;
        assert_eq!(status, 200, "{w}");
        assert_eq!(w["output"], json!({"artifact": "app-1.2.tgz"}), "{w}");
        let end = last_event(&app, &id).await;
        assert_eq!(end["output"], json!({"artifact": "app-1.2.tgz"}), "{end}");

        // Judged: progress, then the end.
        let (id, url) = callback_wait(
            &app,
            json!({"callback": {}, "state": "/phase", "want": ["done"], "fail": ["broken"], "error": "/why"}),
        )
        .await;
        let (status, w) = post_json(&url, json!({"phase": "building"})).await;
        assert_eq!(status, 202, "{w}");
        assert_eq!(
            (w["status"].as_str(), w["state"].as_str()),
            (Some("running"), Some("building"))
        );
        let (status, w) = post_json(&url, json!({"no": "phase"})).await;
        assert_eq!(status, 422, "{w}");
        assert!(w["detail"].as_str().unwrap().contains("goes on"), "{w}");
        let (status, w) = post_json(&url, json!({"phase": "done", "n": 1})).await;
        assert_eq!(status, 200, "{w}");
        assert_eq!(w["status"], "succeeded");
        assert_eq!(w["output"], json!({"phase": "done", "n": 1}));
        let (_, events) = app.get(&format!("/waits/{id}/events")).await;
        let kinds: Vec<&str> = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["created", "state", "succeeded"], "{events}");

        // A fail state or a failure condition ends it failed.
        let (_, url) = callback_wait(
            &app,
            json!({"callback": {}, "state": "/phase", "want": ["done"], "fail": ["broken"], "error": "/why"}),
        )
        .await;
        let (status, w) = post_json(&url, json!({"phase": "broken", "why": "disk"})).await;
        assert_eq!(status, 200, "{w}");
        assert_eq!(
            (w["status"].as_str(), &w["error_detail"]),
            (Some("failed"), &json!("disk"))
        );
        let (_, url) = callback_wait(
            &app,
            json!({"callback": {}, "failure_condition": "body.code != 0", "success_condition": "headers['x-ci'] == 'yes'"}),
        )
        .await;
        let r = client()
            .post(&url)
            .header("x-ci", "no")
            .json(&json!({"code": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "neither condition held");
        let r = client()
            .post(&url)
            .header("x-ci", "yes")
            .json(&json!({"code": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let w: Value = r.json().await.unwrap();
        assert_eq!(w["status"], "succeeded", "{w}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_group_made_with_a_callback_member_answers_its_url_and_ends_with_outputs() {
    for (app, backend) in each_store().await {
        let up = Upstream::start().await;
        let polled = up.script(
            "/on",
            vec![Reply::json(200, json!({"status": "on", "v": 9}))],
        );
        let (status, g) = app
            .create(json!({
                "all": [
                    {"callback": {}},
                    {"target": {"url": polled}, "state": "/status", "want": ["on"], "output": {"v": "/v"}}
                ],
                "timeout": "20s"
            }))
            .await;
        assert_eq!(status, 201, "{g}");
        let url = g["members"][0]["callback_url"]
            .as_str()
            .expect("the callback member's URL")
            .to_string();
        assert!(g["members"][1].get("callback_url").is_none(), "{g}");
        let gid = g["id"].as_str().unwrap().to_string();
        let cb = g["members"][0]["id"].as_str().unwrap().to_string();
        let pm = g["members"][1]["id"].as_str().unwrap().to_string();
        // The URL is shown once: not in the group's read.
        let (_, read) = app.get(&format!("/waits/{gid}")).await;
        let secret = url.rsplit('/').next().unwrap();
        assert!(!read.to_string().contains(secret), "{read}");
        let (status, _) = post_json(&url, json!({"approved": true})).await;
        assert_eq!(status, 200);
        let g = app.wait_end(&gid).await;
        assert_eq!(g["status"], "succeeded", "{g}");
        assert_eq!(
            g["output"],
            json!({cb.clone(): {"approved": true}, pm.clone(): {"v": 9}}),
            "{g}"
        );
        let end = last_event(&app, &gid).await;
        assert_eq!(end["output"], g["output"], "{end}");
        // Held, the answer would show the URL to no one.
        let r = client()
            .post(app.url("/waits?wait=true"))
            .json(&json!({"any": [{"callback": {}}], "timeout": "1m"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_callback_waits_recorded_state_outlives_its_deadline() {
    for (app, backend) in each_store().await {
        let (id, url) = callback_wait(
            &app,
            json!({"callback": {}, "state": "/phase", "want": ["done"], "timeout": "1s"}),
        )
        .await;
        let (status, w) = post_json(&url, json!({"phase": "building"})).await;
        assert_eq!(status, 202, "{w}");
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "timed_out", "{w}");
        assert_eq!(
            w["state"], "building",
            "the worker's end keeps what a callback recorded: {w}"
        );
        finish(app, backend).await;
    }
}
