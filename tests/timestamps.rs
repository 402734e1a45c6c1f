//! One timestamp precision everywhere: a wait's times read the same in the answer
//! to its create as in every later read, on either store, to the millisecond.

use crate::support::*;

use serde_json::Value;

/// Every timestamp of a wait, as its JSON shows them.
fn times(w: &Value) -> Vec<String> {
    ["created_at", "updated_at", "deadline", "next_poll_at"]
        .iter()
        .map(|k| w[k].as_str().unwrap_or_default().to_string())
        .collect()
}

async fn created_and_read_agree(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/s/t", vec![Reply::status("deploying")]);
    let mut s = spec(&url);
    // No poll before the read, so nothing but the precision could tell them apart.
    s["poll"] = serde_json::json!({"delay": "1h", "initial": "1h", "max": "1h"});
    s["timeout"] = serde_json::json!("2h");
    let (code, created) = app.create(s).await;
    assert_eq!(code, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let (_, read) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(times(&created), times(&read), "{created}\n{read}");
    for t in times(&created) {
        // 2026-12-03T19:08:36.677Z: three digits after the second, then Z.
        let frac = t.rsplit_once('.').map(|(_, f)| f).unwrap_or_default();
        assert_eq!(frac.len(), 4, "milliseconds: {t}");
        assert!(frac.ends_with('Z'), "{t}");
    }
    let (_, events) = app.get(&format!("/waits/{id}/events")).await;
    let at = events["items"][0]["at"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        at.rsplit_once('.').map(|(_, f)| f.len()),
        Some(4),
        "{events}"
    );
}

#[tokio::test]
async fn a_wait_reads_the_same_times_on_create_and_after_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    created_and_read_agree(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_wait_reads_the_same_times_on_create_and_after_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    created_and_read_agree(&app).await;
    app.stop().await.0.unwrap();
}
