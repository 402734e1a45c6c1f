use crate::support;

use support::*;

#[tokio::test]
async fn a_wait_is_created_polled_and_succeeds() {
    let db = TestDb::new().await;
    let up = Upstream::start().await;
    let url = up.script(
        "/servers/1",
        vec![
            Reply::status("deploying"),
            Reply::status("deploying"),
            Reply::status("on"),
        ],
    );
    let app = App::start(&db).await;
    let (status, w) = app.create(spec(&url)).await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let end = app.wait_end(&id).await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["state"], "on");
    assert_eq!(up.hits("/servers/1"), 3);
    let (_, events) = app.get(&format!("/waits/{id}/events")).await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["created", "state", "state", "succeeded"]);
    let (r, _) = app.stop().await;
    r.unwrap();
    db.drop_db().await;
}
