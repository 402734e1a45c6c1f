//! Event sources through the API, on both stores (docs/design.md §2.18): signed
//! events at a source's hook URL poll or end the waits listening for their key;
//! a forged one is refused and forgotten; a replay is one effect; a wait made
//! after its event still sees it within the source's lookback window; a `match`
//! that fails harms neither the event nor the wait; the secret is never shown.

use crate::support;

mod operator;
mod preset;
mod refusals;

use std::time::Duration;

use base64::Engine;
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};
pub(super) use support::stores::{Backend, each_store_with, finish};
use support::*;

pub(super) const GITHUB_SECRET: &str = "gh-secret-0123456789-abcdef";
pub(super) const BEARER_SECRET: &str = "bearer-secret-0123456789-xyz";
/// `whsec_` and base64 of 24 bytes.
pub(super) const WHSEC: &str = "whsec_c2VjcmV0LWtleS1ieXRlcy0wMTIzNDU2Nzg5";

/// A running app on each store with this minimum poll interval.
pub(super) async fn each_store(floor: &str) -> Vec<(App, Backend)> {
    each_store_with(|url| set_flag(test_args(url), "--min-poll-interval", floor)).await
}

pub(super) async fn answered(req: reqwest::RequestBuilder) -> (u16, Value, String) {
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        text,
    )
}

/// Creates a source; its hook URL.
pub(super) async fn source(app: &App, name: &str, kind: &str, key: &str, lookback: &str) -> String {
    let secret = match kind {
        "github" => GITHUB_SECRET,
        "bearer" => BEARER_SECRET,
        _ => WHSEC,
    };
    let (status, s, text) = answered(client().post(app.url("/sources")).json(&json!({
        "name": name, "kind": kind, "secret": secret, "key": key, "lookback": lookback,
    })))
    .await;
    assert_eq!(status, 201, "{s}");
    assert!(!text.contains(secret), "the secret is echoed: {text}");
    let hook = s["hook_url"].as_str().unwrap().to_string();
    assert!(hook.starts_with(&app.url("/hooks/")), "{hook}");
    hook
}

pub(super) fn github_signature(secret: &str, body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A request carrying `body` to `hook`, signed as `kind` signs with `secret`,
/// with delivery id `delivery`.
pub(super) fn signed(
    hook: &str,
    kind: &str,
    secret: &str,
    delivery: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    let bytes = body.to_string().into_bytes();
    let req = client()
        .post(hook)
        .header("content-type", "application/json");
    let req = match kind {
        "github" => req
            .header("x-github-event", "workflow_run")
            .header("x-github-delivery", delivery)
            .header("x-hub-signature-256", github_signature(secret, &bytes)),
        "bearer" => req.bearer_auth(secret).header("idempotency-key", delivery),
        _ => {
            let key = base64::engine::general_purpose::STANDARD
                .decode(secret.trim_start_matches("whsec_"))
                .unwrap();
            let ts = chrono::Utc::now().timestamp();
            req.header("webhook-id", delivery)
                .header("webhook-timestamp", ts.to_string())
                .header(
                    "webhook-signature",
                    waitd::notify::sign(&key, delivery, ts, &bytes),
                )
        }
    };
    req.body(bytes)
}

pub(super) fn run_event(id: u64, conclusion: &str) -> Value {
    json!({"action": "completed", "workflow_run": {"id": id, "status": "completed", "conclusion": conclusion}})
}

/// The spec of a wait on `url` polled every ten minutes, listening as
/// `on_event` says.
pub(super) fn listening_spec(url: &str, on_event: Value) -> Value {
    json!({
        "target": {"url": url},
        "state": "/data/attributes/status",
        "want": ["on", "success"],
        "fail": ["failed", "failure"],
        "timeout": "30m",
        "poll": {"initial": "10m", "max": "10m"},
        "on_event": on_event,
    })
}

/// A wait on `url` polled every ten minutes, listening to `src` for `key`.
pub(super) async fn listening(app: &App, url: &str, on_event: Value) -> String {
    let (status, w) = app.create(listening_spec(url, on_event)).await;
    assert_eq!(status, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

/// The spec of a wait whose events are judged by a state at the event's
/// `/workflow_run/conclusion`.
pub(super) fn ended_by_event_spec(url: &str, src: &str, key: &str) -> Value {
    json!({
        "target": {"url": url},
        "state": "/workflow_run/conclusion",
        "want": ["success"],
        "fail": ["failure"],
        "timeout": "30m",
        "poll": {"initial": "10m", "max": "10m"},
        "on_event": {"source": src, "key": key, "then": "end"},
    })
}

/// A wait whose events are judged by a state at the event's `/workflow_run/conclusion`.
pub(super) async fn ended_by_event(app: &App, url: &str, src: &str, key: &str) -> (u16, Value) {
    app.create(ended_by_event_spec(url, src, key)).await
}

#[tokio::test]
async fn a_forged_signature_is_refused_for_every_kind_and_nothing_is_kept() {
    for (app, db) in each_store("1ms").await {
        for (kind, secret) in [
            ("github", GITHUB_SECRET),
            ("standard-webhooks", WHSEC),
            ("bearer", BEARER_SECRET),
        ] {
            let name = format!("src-{kind}");
            let hook = source(&app, &name, kind, "/workflow_run/id", "5m").await;
            let body = run_event(7, "success");
            let forged = match kind {
                "standard-webhooks" => "whsec_b3RoZXItc2VjcmV0LWtleS1ieXRlcy0wMQ==",
                _ => "not-the-secret-at-all-0000",
            };
            let (status, p, _) = answered(signed(&hook, kind, forged, "d-1", &body)).await;
            assert_eq!(status, 401, "{kind}: {p}");
            assert!(p["detail"].as_str().unwrap().contains("not kept"), "{p}");
            // No signature at all.
            let (status, p, _) = answered(client().post(&hook).json(&body)).await;
            assert_eq!(status, 401, "{kind}: {p}");
            // The same delivery, signed, is new: the forged one was not kept.
            let (status, a, _) = answered(signed(&hook, kind, secret, "d-1", &body)).await;
            assert_eq!(status, 202, "{kind}: {a}");
            assert_eq!(a["replayed"], false);
            assert_eq!(a["key"], "7");
        }
        let metrics = app.metrics().await;
        assert!(
            metrics.contains("waitd_source_events_refused_total 6"),
            "{metrics}"
        );
        assert!(metrics.contains("waitd_source_events_total 3"), "{metrics}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_replayed_delivery_is_one_effect() {
    for (app, db) in each_store("1ms").await {
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let id = listening(&app, &url, json!({"source": "gh", "key": "42"})).await;
        assert!(up.hit("/sv", 1, Duration::from_secs(10)).await);
        let body = run_event(42, "success");
        let (status, a, _) = answered(signed(&hook, "github", GITHUB_SECRET, "dup", &body)).await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(1)), "{a}");
        for _ in 0..3 {
            let (status, a, _) =
                answered(signed(&hook, "github", GITHUB_SECRET, "dup", &body)).await;
            assert_eq!(status, 200, "{a}");
            assert_eq!(a["replayed"], true, "{a}");
            assert_eq!(a["matched"], 0, "{a}");
        }
        let metrics = app.metrics().await;
        assert!(
            metrics.contains("waitd_source_matches_total 1"),
            "{metrics}"
        );
        assert!(metrics.contains("waitd_source_events_total 1"), "{metrics}");
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running", "{w}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn then_poll_nudges_the_wait_and_the_poll_decides() {
    for (app, db) in each_store("1ms").await {
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let id = listening(&app, &url, json!({"source": "gh", "key": "9"})).await;
        assert!(
            up.hit("/sv", 1, Duration::from_secs(10)).await,
            "the first poll"
        );
        // An event claiming success decides nothing: the target still deploys.
        let (status, a, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "e1",
            &run_event(9, "success"),
        ))
        .await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(1)), "{a}");
        assert!(
            up.hit("/sv", 2, Duration::from_secs(10)).await,
            "the nudged poll"
        );
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running", "{w}");
        // Another key reaches no wait.
        let (status, a, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "e2",
            &run_event(10, "success"),
        ))
        .await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(0)), "{a}");
        // The target flips; the next event's poll sees it (well within the 10m interval).
        up.script("/sv", vec![Reply::status("on")]);
        let (status, _, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "e3",
            &run_event(9, "success"),
        ))
        .await;
        assert_eq!(status, 202);
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn then_end_ends_the_wait_through_its_conditions() {
    for (app, db) in each_store("1ms").await {
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        let up = Upstream::start().await;
        let url = up.script(
            "/sv",
            vec![Reply::json(
                200,
                json!({"workflow_run": {"conclusion": null}}),
            )],
        );
        let (status, w) = ended_by_event(&app, &url, "gh", "5").await;
        assert_eq!(status, 201, "{w}");
        let ok = w["id"].as_str().unwrap().to_string();
        let (_, w) = ended_by_event(&app, &url, "gh", "6").await;
        let bad = w["id"].as_str().unwrap().to_string();
        // In progress: recorded as the state, the wait goes on.
        let mut progress = run_event(5, "in_progress");
        progress["workflow_run"]["conclusion"] = json!("queued");
        let (status, _, _) = answered(signed(&hook, "github", GITHUB_SECRET, "p", &progress)).await;
        assert_eq!(status, 202);
        let (_, w) = app.get(&format!("/waits/{ok}")).await;
        assert_eq!(
            (w["status"].as_str(), w["state"].as_str()),
            (Some("running"), Some("queued")),
            "{w}"
        );
        let (status, _, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "s",
            &run_event(5, "success"),
        ))
        .await;
        assert_eq!(status, 202);
        let w = app.wait_end(&ok).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(w["output"]["workflow_run"]["id"], 5, "{w}");
        let (status, _, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "f",
            &run_event(6, "failure"),
        ))
        .await;
        assert_eq!(status, 202);
        let w = app.wait_end(&bad).await;
        assert_eq!(w["status"], "failed", "{w}");
        finish(app, db).await;
    }
}

/// Sends the GitHub source at `hook` run 77's success (delivery "early"), and
/// starts a target on which the run has no conclusion yet: it and its URL.
pub(super) async fn run_77_kept(hook: &str) -> (Upstream, String) {
    let (status, a, _) = answered(signed(
        hook,
        "github",
        GITHUB_SECRET,
        "early",
        &run_event(77, "success"),
    ))
    .await;
    assert_eq!(status, 202, "{a}");
    let up = Upstream::start().await;
    let url = up.script(
        "/sv",
        vec![Reply::json(
            200,
            json!({"workflow_run": {"conclusion": null}}),
        )],
    );
    (up, url)
}

#[tokio::test]
async fn an_event_before_its_wait_is_seen_within_the_window_and_not_after() {
    for (app, db) in each_store("1ms").await {
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        let brief = source(&app, "brief", "bearer", "/workflow_run/id", "1s").await;
        let (up, url) = run_77_kept(&hook).await;
        let (status, w) = ended_by_event(&app, &url, "gh", "77").await;
        assert_eq!(status, 201, "{w}");
        // The create's answer shows the wait as the kept event left it.
        assert_eq!(w["status"], "succeeded", "the kept event ended it: {w}");
        assert_eq!(w["output"]["workflow_run"]["id"], 77, "{w}");
        // A then: poll wait sees its kept event too, as a poll.
        let (status, _, _) = answered(signed(
            &brief,
            "bearer",
            BEARER_SECRET,
            "late",
            &run_event(78, "success"),
        ))
        .await;
        assert_eq!(status, 202);
        // Past the brief source's one-second window, the event is not seen.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let (status, w) = ended_by_event(&app, &url, "brief", "78").await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        app.turns(&up, 2).await;
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running", "an expired event ended it: {w}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_match_that_fails_or_runs_past_its_budget_harms_neither_event_nor_wait() {
    for (app, db) in each_store("1ms").await {
        let hook = source(
            &app,
            "sw",
            "standard-webhooks",
            "body.workflow_run.id",
            "5m",
        )
        .await;
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let erring = listening(
            &app,
            &url,
            json!({"source": "sw", "key": "3", "match": "body.no_such_field == 1", "then": "end"}),
        )
        .await;
        let burning = listening(&app, &url, json!({"source": "sw", "key": "3",
            "match": "body.items.all(i, body.items.all(j, body.items.all(k, k >= 0)))", "then": "end"})).await;
        let mut body = run_event(3, "success");
        body["items"] = json!((0..300).collect::<Vec<_>>());
        let (status, a, _) = answered(signed(&hook, "standard-webhooks", WHSEC, "m1", &body)).await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(0)), "{a}");
        for id in [&erring, &burning] {
            let (_, w) = app.get(&format!("/waits/{id}")).await;
            assert_eq!(w["status"], "running", "{w}");
        }
        let metrics = app.metrics().await;
        assert!(
            metrics.contains("waitd_source_match_errors_total 2"),
            "{metrics}"
        );
        // The event was kept: a wait made now, without a match, is ended by it.
        let (status, w) = ended_by_event(&app, &url, "sw", "3").await;
        assert_eq!(status, 201, "{w}");
        let w = app.wait_end(w["id"].as_str().unwrap()).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_storm_of_events_is_paced_and_costs_bounded_work() {
    for (app, db) in each_store("1m").await {
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let id = listening(&app, &url, json!({"source": "gh", "key": "1"})).await;
        assert!(up.hit("/sv", 1, Duration::from_secs(10)).await);
        let tasks: Vec<_> = (0..16)
            .map(|k| {
                let hook = hook.clone();
                tokio::spawn(async move {
                    let mut seen = (0usize, 0usize);
                    for n in (k..1000).step_by(16) {
                        let (status, a, _) = answered(signed(
                            &hook,
                            "github",
                            GITHUB_SECRET,
                            &format!("storm-{n}"),
                            &run_event(1, "success"),
                        ))
                        .await;
                        match status {
                            202 => seen.0 += 1,
                            429 => seen.1 += 1,
                            other => panic!("an event answered {other}: {a}"),
                        }
                    }
                    seen
                })
            })
            .collect();
        let mut accepted = 0;
        for t in tasks {
            let (ok, limited) = t.await.unwrap();
            assert!(ok + limited > 0);
            accepted += ok;
        }
        assert!(accepted >= 100, "only {accepted} accepted");
        assert!(
            up.hit("/sv", 2, Duration::from_secs(10)).await,
            "the nudged poll"
        );
        // Every accepted event matched the wait; the paced wait was polled once.
        let metrics = app.metrics().await;
        assert!(
            metrics.contains(&format!("waitd_source_matches_total {accepted}")),
            "{metrics}"
        );
        assert_eq!(up.hits("/sv"), 2, "{accepted} events, one poll");
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running", "{w}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_callback_wait_listens_with_then_end() {
    for (app, db) in each_store("1ms").await {
        let hook = source(&app, "sw", "standard-webhooks", "/workflow_run/id", "5m").await;
        let (status, w) = app
            .create(json!({
                "callback": {},
                "success_condition": "body.workflow_run.conclusion == 'success'",
                "failure_condition": "body.workflow_run.conclusion == 'failure'",
                "on_event": {"source": "sw", "key": "12", "then": "end"},
            }))
            .await;
        assert_eq!(status, 201, "{w}");
        assert!(w["callback_url"].is_string(), "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        let (status, _, _) = answered(signed(
            &hook,
            "standard-webhooks",
            WHSEC,
            "cb",
            &run_event(12, "failure"),
        ))
        .await;
        assert_eq!(status, 202);
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "failed", "{w}");
        finish(app, db).await;
    }
}
