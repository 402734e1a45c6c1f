//! Groups on both stores: the group's deadline caps a member given by id, held or
//! not when the group is made, and the metrics count groups' ends as waits' ends.

use crate::support::*;

use std::time::Duration;

use serde_json::{Value, json};

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = TempDir::new("waitd-group-deadlines");
                    let app = App::start_sqlite(&dir.sqlite_url()).await;
                    super::$name(&app).await;
                    app.stop().await.0.unwrap();
                }
            )*
        }
        mod on_postgres {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let db = TestDb::new().await;
                    let app = App::start(&db).await;
                    super::$name(&app).await;
                    app.stop().await.0.unwrap();
                    db.drop_db().await;
                }
            )*
        }
    };
}

on_both_stores!(
    the_group_deadline_caps_a_member_given_by_id_held_or_not,
    the_metrics_count_a_group_and_the_members_it_ends,
);

async fn post(app: &App, path: &str, body: &Value) -> (u16, Value) {
    let r = app
        .client
        .post(app.url(path))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn the_group_deadline_caps_a_member_given_by_id_held_or_not(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/c/held", vec![Reply::status("deploying")]);
    // Polled every few milliseconds: its replica holds it when the group is made.
    let mut held = spec(&url);
    held["timeout"] = json!("60s");
    let (_, held) = app.create(held).await;
    assert!(up.hit("/c/held", 1, Duration::from_secs(5)).await);
    // Its first poll an hour away: nobody holds it when the group is made.
    let quiet_url = up.script("/c/quiet", vec![Reply::status("deploying")]);
    let mut quiet = spec(&quiet_url);
    quiet["poll"] = json!({"delay": "1h", "initial": "1h", "max": "1h"});
    quiet["timeout"] = json!("2h");
    let (_, quiet) = app.create(quiet).await;
    let before = |w: &Value| w["deadline"].as_str().unwrap().to_string();
    let (held_own, quiet_own) = (before(&held), before(&quiet));

    // Kept running when the group is decided: only the cap ends them.
    let (code, g) = post(
        app,
        "/waits",
        &json!({"all": [{"id": held["id"]}, {"id": quiet["id"]}], "timeout": "1s", "keep_running": true}),
    )
    .await;
    assert_eq!(code, 201, "{g}");
    let deadline = g["deadline"].as_str().unwrap().to_string();
    for (w, own) in [(&held, &held_own), (&quiet, &quiet_own)] {
        let (_, m) = app
            .get(&format!("/waits/{}", w["id"].as_str().unwrap()))
            .await;
        assert_eq!(m["deadline"].as_str().unwrap(), deadline, "{m}");
        assert!(deadline.as_str() < own.as_str(), "{deadline} {own}");
        assert_eq!(m["group"], g["id"], "{m}");
    }
    let gid = g["id"].as_str().unwrap();
    let (_, g) = app.get(&format!("/waits/{gid}?wait=10s")).await;
    assert_eq!(g["status"], "timed_out", "{g}");

    // The held one is ended by its group's watcher (its replica still has the
    // deadline it was claimed with), the other by its own replica, which claims it
    // with the capped deadline: both long before their own deadlines.
    let (_, m) = app
        .get(&format!("/waits/{}?wait=15s", held["id"].as_str().unwrap()))
        .await;
    assert_eq!(m["status"], "timed_out", "{m}");
    let reason = m["reason"].as_str().unwrap();
    assert!(reason.contains(gid) && reason.contains("caps"), "{reason}");
    let (_, m) = app
        .get(&format!(
            "/waits/{}?wait=15s",
            quiet["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(m["status"], "timed_out", "{m}");
    let reason = m["reason"].as_str().unwrap();
    assert!(
        reason.contains("deadline") && !reason.contains("caps"),
        "{reason}"
    );
    assert!(
        m["finished_at"].as_str().unwrap() < quiet_own.as_str(),
        "{m}"
    );
}

/// `name{status="…"} n` in a Prometheus exposition.
fn counter(text: &str, name: &str, status: &str) -> u64 {
    let key = format!("{name}{{status=\"{status}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in:\n{text}"))
        .parse()
        .unwrap()
}

async fn the_metrics_count_a_group_and_the_members_it_ends(app: &App) {
    let up = Upstream::start().await;
    let ok = up.script("/m/ok", vec![Reply::status("on")]);
    let bad = up.script("/m/bad", vec![Reply::status("failed_deployment")]);
    let slow = up.script("/m/slow", vec![Reply::status("deploying")]);
    let (code, a) = post(
        app,
        "/waits?wait=10s",
        &json!({"all": [spec(&ok), spec(&ok)]}),
    )
    .await;
    assert_eq!(
        (code, a["status"].as_str()),
        (201, Some("succeeded")),
        "{a}"
    );
    let (code, b) = post(
        app,
        "/waits?wait=10s",
        &json!({"all": [spec(&bad), spec(&slow)]}),
    )
    .await;
    assert_eq!((code, b["status"].as_str()), (422, Some("failed")), "{b}");
    let slow_id = b["members"][1]["id"].as_str().unwrap();
    let (_, m) = app.get(&format!("/waits/{slow_id}?wait=10s")).await;
    assert_eq!(m["status"], "canceled", "{m}");
    // The counter follows the member's end as soon as the write that ended it
    // returns (the group's watcher gives no signal): read until it shows, then
    // check every count.
    let shown = poll_for(Duration::from_secs(10), || async move {
        let text = app.metrics().await;
        (counter(&text, "waitd_waits_ended_total", "canceled") > 0).then_some(text)
    })
    .await;
    let text = match shown {
        Some(text) => text,
        None => app.metrics().await,
    };
    let ended = |s| counter(&text, "waitd_waits_ended_total", s);
    let groups = |s| counter(&text, "waitd_groups_ended_total", s);
    // Two members and group a; the failing member and group b; b's slow member.
    assert_eq!(
        (ended("succeeded"), ended("failed"), ended("canceled")),
        (3, 2, 1),
        "{text}"
    );
    assert_eq!(
        (groups("succeeded"), groups("failed"), groups("canceled")),
        (1, 1, 0),
        "{text}"
    );
    assert!(
        text.contains("\nwaitd_waits_created_total 6\n"),
        "two groups and their four members: {text}"
    );
}
