//! The GitHub run preset with and without an event source (docs/presets.md).

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::support::*;

#[tokio::test]
async fn the_github_run_preset_listens_to_a_source_when_given_one() {
    for (app, db) in each_store("1ms").await {
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        let up = Upstream::start().await;
        let run = |status: &str, conclusion: Value| {
            Reply::json(
                200,
                json!({"status": status, "conclusion": conclusion, "html_url": "https://github.test/run"}),
            )
        };
        up.script(
            "/repos/o/r/actions/runs/555",
            vec![run("in_progress", Value::Null)],
        );
        let request = |source: Option<&str>| {
            let mut params =
                json!({"base_url": up.base, "owner": "o", "repo": "r", "run_id": "555"});
            if let Some(s) = source {
                params["source"] = json!(s);
            }
            json!({"preset": "github.workflow_run", "params": params, "poll": {"initial": "10m", "max": "10m"}})
        };
        // Without a source, the wait only polls.
        let (status, w) = app.create(request(None)).await;
        assert_eq!(status, 201, "{w}");
        assert!(w["spec"].get("on_event").is_none(), "{w}");
        let (status, p) = app.create(request(Some("nope"))).await;
        assert_eq!(status, 400, "{p}");
        assert_eq!(p["errors"][0]["field"], "on_event.source", "{p}");
        let (status, w) = app.create(request(Some("gh"))).await;
        assert_eq!(status, 201, "{w}");
        assert_eq!(w["spec"]["on_event"]["key"], "555", "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        assert!(
            up.hit("/repos/o/r/actions/runs/555", 2, Duration::from_secs(10))
                .await
        );
        up.script(
            "/repos/o/r/actions/runs/555",
            vec![run("completed", json!("success"))],
        );
        // A push event for the run is not a workflow_run event: it matches nothing.
        let body = json!({"workflow_run": {"id": 555}});
        let push =
            signed(&hook, "github", GITHUB_SECRET, "p1", &body).header("x-github-event", "push");
        let (status, a, _) = answered(push).await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(0)), "{a}");
        let (status, a, _) = answered(signed(&hook, "github", GITHUB_SECRET, "w1", &body)).await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(1)), "{a}");
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        finish(app, db).await;
    }
}
