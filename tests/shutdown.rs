//! Shutdown in order: `App::stop` returns only once every task the app started has
//! ended, so none is left mid-query when the store closes.

use serde_json::json;

use crate::support::in_process::InProcess;

/// The tasks alive on this test's runtime (its own: one runtime a test).
fn alive() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test]
async fn no_task_the_app_started_outlives_its_stop() {
    let before = alive();
    // With --host-rate, the replica count is kept too: every task there is runs.
    let app = InProcess::start_with(&["--host-rate", "4"]).await;
    let mut heard = app.heard();
    let (status, wait) = app
        .create(json!({
            // Nothing listens there: each poll is a retry, and no connection
            // (nor a server's task for it) stays open.
            "target": {"url": "http://127.0.0.1:1/status"},
            "state": "/status",
            "want": ["never"],
            "timeout": "1h",
        }))
        .await;
    assert_eq!(status, 201, "{wait}");
    heard.recorded(wait["id"].as_str().unwrap()).await;
    assert!(alive() > before, "the app runs tasks");
    app.stop().await;
    assert_eq!(
        alive(),
        before,
        "a task the app started is still running after it stopped"
    );
}
