//! Nudges through the API, on both stores (docs/design.md §2.17): a POST to the
//! nudge URL a wait's create answered with polls it now, whatever its interval;
//! a storm of nudges is one poll; a nudge decides nothing; the URL's secret is
//! shown by the create's answer and nowhere else.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::stores::{Backend, each_store_with, finish};
use support::*;

/// A running app on each store with this minimum poll interval.
async fn each_store(floor: &str) -> Vec<(App, Backend)> {
    each_store_with(|url| set_flag(test_args(url), "--min-poll-interval", floor)).await
}

/// A wait on `url` polled every ten minutes, with a nudge URL: its id and URL.
async fn nudged_wait(app: &App, url: &str) -> (String, String) {
    let (status, w) = app
        .create(json!({
            "target": {"url": url},
            "state": "/data/attributes/status",
            "want": ["on"],
            "fail": ["failed"],
            "timeout": "30m",
            "poll": {"initial": "10m", "max": "10m"},
            "nudge": true,
        }))
        .await;
    assert_eq!(status, 201, "{w}");
    let nudge = w["nudge_url"].as_str().expect("the nudge URL").to_string();
    assert!(nudge.starts_with(&app.url("/nudges/")), "{nudge}");
    (w["id"].as_str().unwrap().to_string(), nudge)
}

async fn nudge(url: &str) -> (u16, Value) {
    let r = client().post(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_nudge_polls_a_wait_with_a_ten_minute_interval_at_once() {
    for (app, backend) in each_store("1ms").await {
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let (id, nudge_url) = nudged_wait(&app, &url).await;
        assert!(
            up.hit("/sv", 1, Duration::from_secs(10)).await,
            "the first poll"
        );
        up.script("/sv", vec![Reply::status("on")]);
        let (status, answer) = nudge(&nudge_url).await;
        assert_eq!(status, 202, "{answer}");
        assert_eq!(answer["id"], id.as_str());
        // Without the nudge the next poll is ten minutes away.
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(up.hits("/sv"), 2);
        let metrics = app.metrics().await;
        assert!(metrics.contains("waitd_nudges_total 1"), "{metrics}");
        assert!(metrics.contains("waitd_nudged_polls_total 1"), "{metrics}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_nudge_decides_nothing_the_poll_does() {
    for (app, backend) in each_store("1ms").await {
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let (id, nudge_url) = nudged_wait(&app, &url).await;
        assert!(up.hit("/sv", 1, Duration::from_secs(10)).await);
        // A body claiming success is not read: the target still says deploying.
        let r = client()
            .post(&nudge_url)
            .json(&json!({"status": "on", "data": {"attributes": {"status": "on"}}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        assert!(
            up.hit("/sv", 2, Duration::from_secs(10)).await,
            "the nudged poll"
        );
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running", "{w}");
        assert_eq!(w["state"], "deploying");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn a_storm_of_nudges_is_one_poll() {
    // Nudged polls are paced to one a minimum poll interval: a minute here.
    for (app, backend) in each_store("1m").await {
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let (id, nudge_url) = nudged_wait(&app, &url).await;
        assert!(
            up.hit("/sv", 1, Duration::from_secs(10)).await,
            "the first poll"
        );
        let sent = 10_000;
        let tasks: Vec<_> = (0..32)
            .map(|k| {
                let nudge_url = nudge_url.clone();
                tokio::spawn(async move {
                    let c = client();
                    let mut seen = (0usize, 0usize);
                    for _ in (k..sent).step_by(32) {
                        let r = c.post(&nudge_url).send().await.unwrap();
                        match r.status().as_u16() {
                            202 => seen.0 += 1,
                            429 => {
                                assert_eq!(r.headers()["retry-after"], "1");
                                seen.1 += 1
                            }
                            other => panic!("a nudge answered {other}"),
                        }
                    }
                    seen
                })
            })
            .collect();
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let accepted: usize = answers.iter().map(|a| a.0).sum();
        let limited: usize = answers.iter().map(|a| a.1).sum();
        assert_eq!(accepted + limited, sent);
        assert!(accepted >= 1, "the first nudges are accepted");
        assert!(
            up.hit("/sv", 2, Duration::from_secs(10)).await,
            "the nudged poll"
        );
        // Every nudge was answered and announced; the next nudged poll may come
        // a minute after the first at the soonest.
        let metrics = app.metrics().await;
        assert!(
            metrics.contains(&format!("waitd_nudges_total {accepted}")),
            "{metrics}"
        );
        assert_eq!(up.hits("/sv"), 2, "{accepted} nudges, one poll");
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running");
        finish(app, backend).await;
    }
}

/// A nudge that comes while a poll is in flight is kept for the poll after it
/// (the poll in flight may have been sent before what the nudge announces):
/// that poll comes at once when the first one is answered, not ten minutes on.
#[tokio::test]
async fn a_nudge_during_a_poll_brings_the_next_poll_forward() {
    for (app, backend) in each_store("1ms").await {
        let up = Upstream::start().await;
        // The first poll is answered three seconds after it comes; every later
        // one at once.
        let mut slow = Reply::status("deploying");
        slow.delay = Duration::from_secs(3);
        let url = up.script("/sv", vec![slow, Reply::status("on")]);
        let (id, nudge_url) = nudged_wait(&app, &url).await;
        assert!(
            up.hit("/sv", 1, Duration::from_secs(10)).await,
            "the first poll"
        );
        let (status, answer) = nudge(&nudge_url).await;
        assert_eq!(status, 202, "{answer}");
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(up.hits("/sv"), 2, "the slow poll, then the nudged one");
        let metrics = app.metrics().await;
        assert!(metrics.contains("waitd_nudged_polls_total 1"), "{metrics}");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn wrong_secrets_ended_waits_and_bad_requests_are_refused() {
    for (app, backend) in each_store("1ms").await {
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let (id, nudge_url) = nudged_wait(&app, &url).await;

        let (status, p) = nudge(&app.url("/nudges/0123456789abcdef")).await;
        assert_eq!(status, 404, "{p}");
        assert!(p["detail"].as_str().unwrap().contains("nudge_url"), "{p}");

        let (status, p) = app.create(json!({"callback": {}, "nudge": true})).await;
        assert_eq!(status, 400, "{p}");
        assert!(p.to_string().contains("nudge"), "{p}");
        let (status, p) = app
            .create(json!({"target": {"url": url}, "want": ["on"], "state": "/data/attributes/status", "nudge": "yes"}))
            .await;
        assert_eq!(status, 400, "{p}");
        let r = client()
            .post(app.url("/waits?wait=5s"))
            .json(&json!({"target": {"url": url}, "want": ["on"], "state": "/data/attributes/status", "nudge": true}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
        let p: Value = r.json().await.unwrap();
        assert!(p["detail"].as_str().unwrap().contains("nudge_url"), "{p}");

        // The secret is shown once: not by a read, a list or the events.
        let secret = nudge_url.rsplit('/').next().unwrap().to_string();
        for path in [
            format!("/waits/{id}"),
            "/waits".to_string(),
            format!("/waits/{id}/events"),
        ] {
            let r = client().get(app.url(&path)).send().await.unwrap();
            let text = r.text().await.unwrap();
            assert!(!text.contains(&secret), "{path} shows the secret");
        }

        let (status, _) = app.post(&format!("/waits/{id}/cancel")).await;
        assert_eq!(status, 200);
        let (status, w) = nudge(&nudge_url).await;
        assert_eq!(status, 409, "{w}");
        assert_eq!(w["status"], "canceled");
        finish(app, backend).await;
    }
}

#[tokio::test]
async fn an_idempotent_replay_and_a_group_member_answer_as_they_should() {
    for (app, backend) in each_store("1ms").await {
        let up = Upstream::start().await;
        let url = up.script("/sv", vec![Reply::status("deploying")]);
        let spec = json!({
            "target": {"url": url},
            "state": "/data/attributes/status",
            "want": ["on"],
            "nudge": true,
        });
        let create = || {
            client()
                .post(app.url("/waits"))
                .header("idempotency-key", "nudge-once")
                .json(&spec)
                .send()
        };
        let first: Value = create().await.unwrap().json().await.unwrap();
        assert!(first["nudge_url"].is_string(), "{first}");
        let again: Value = create().await.unwrap().json().await.unwrap();
        assert_eq!(again["id"], first["id"]);
        assert!(again.get("nudge_url").is_none(), "shown once: {again}");

        let (status, g) = app
            .create(json!({"all": [spec.clone(), {"callback": {}}], "timeout": "5m"}))
            .await;
        assert_eq!(status, 201, "{g}");
        let nudge_url = g["members"][0]["nudge_url"]
            .as_str()
            .expect("the member's nudge URL");
        assert!(g["members"][1]["callback_url"].is_string(), "{g}");
        let (status, a) = nudge(nudge_url).await;
        assert_eq!(status, 202, "{a}");
        assert_eq!(a["id"], g["members"][0]["id"]);
        finish(app, backend).await;
    }
}

/// `waitd create --nudge` prints the nudge URL on its own line after the wait's,
/// and a POST to it polls the wait now; `--on-event SOURCE:KEY` makes the wait
/// listen, and an event with its key polls it too; a malformed `--on-event` is
/// refused before anything is sent.
#[tokio::test]
async fn the_command_line_makes_nudged_and_listening_waits() {
    use crate::client::waitd;
    use crate::event_sources::{BEARER_SECRET, answered, signed, source};

    let dir = TempDir::new("waitd-cli-nudge");
    let app = App::start_args(set_flag(
        test_args(&dir.sqlite_url()),
        "--min-poll-interval",
        "1ms",
    ))
    .await;
    let up = Upstream::start().await;
    let flags = |url: &str| -> Vec<String> {
        [
            "create",
            "--url",
            url,
            "--state",
            "/data/attributes/status",
            "--want",
            "on",
            "--poll",
            "10m,1,10m",
            "--timeout",
            "30m",
        ]
        .map(String::from)
        .to_vec()
    };

    let url = up.script("/n", vec![Reply::status("deploying")]);
    let mut args = flags(&url);
    args.push("--nudge".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = waitd(&app.base, &args).await;
    assert_eq!(run.code, 0, "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{run:?}");
    let (id, rest) = lines[0].split_once(' ').unwrap();
    assert_eq!(rest, "running", "{run:?}");
    assert!(lines[1].starts_with(&app.url("/nudges/")), "{run:?}");
    assert!(
        up.hit("/n", 1, Duration::from_secs(10)).await,
        "the first poll"
    );
    up.script("/n", vec![Reply::status("on")]);
    let (status, answer) = nudge(lines[1]).await;
    assert_eq!((status, answer["id"].as_str()), (202, Some(id)), "{answer}");
    assert_eq!(app.wait_end(id).await["status"], "succeeded");

    let hook = source(&app, "ci", "bearer", "/key", "5m").await;
    let url = up.script("/e", vec![Reply::status("deploying")]);
    let mut args = flags(&url);
    args.extend(
        [
            "--on-event",
            "ci:run-42",
            "--on-event-match",
            "body.ok",
            "--output",
            "json",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = waitd(&app.base, &args).await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).expect("one JSON object");
    assert_eq!(
        w["spec"]["on_event"],
        json!({"source": "ci", "key": "run-42", "match": "body.ok", "then": "poll"}),
        "{w}"
    );
    let id = w["id"].as_str().unwrap();
    assert!(
        up.hit("/e", 1, Duration::from_secs(10)).await,
        "the first poll"
    );
    up.script("/e", vec![Reply::status("on")]);
    let event = json!({"key": "run-42", "ok": true});
    let (status, answer, _) = answered(signed(&hook, "bearer", BEARER_SECRET, "d1", &event)).await;
    assert_eq!((status, &answer["matched"]), (202, &json!(1)), "{answer}");
    assert_eq!(app.wait_end(id).await["status"], "succeeded");

    for bad in ["ci", ":run-42", "ci:"] {
        let mut args = flags(&url);
        args.extend(["--on-event", bad].map(String::from));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = waitd(&app.base, &args).await;
        assert_eq!(run.code, 5, "{bad}: {run:?}");
        assert!(
            run.stderr.contains("--on-event takes SOURCE:KEY"),
            "{bad}: {run:?}"
        );
    }
    let (r, _) = app.stop().await;
    r.unwrap();
}
