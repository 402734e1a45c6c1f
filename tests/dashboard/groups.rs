//! A group in the dashboard, in a real Chromium: its row shows each member's
//! status as the members end, a member's row links to its group, and the group's
//! detail lists its members.

use super::*;

/// The row of wait `id` as {status, state, members: [status], ids: [id], group:
/// the href of its link to its group or null}, or null.
const GROUP_ROW: &str = "const r = document.querySelector(`[data-testid=\"wait-row\"][data-wait-id=\"${arguments[0]}\"]`); \
    if (!r) return null; \
    const marks = Array.from(r.querySelectorAll('[data-testid=\"row-member\"]')); \
    const g = r.querySelector('[data-testid=\"row-group\"]'); \
    return {status: r.dataset.status, \
            state: r.querySelector('[data-testid=\"wait-state\"]').textContent, \
            target: r.querySelector('[data-testid=\"wait-target\"]').textContent, \
            members: marks.map((m) => m.dataset.status), \
            ids: marks.map((m) => m.dataset.memberId), \
            group: g && !g.hidden ? g.getAttribute('href') : null};";

/// The open detail's members as [{id, status}], or null.
const DETAIL_MEMBERS: &str = "const d = document.querySelector('[data-testid=\"wait-detail\"]'); \
    const l = d && d.querySelector('[data-testid=\"group-members\"]'); \
    if (!l) return null; \
    return {id: d.dataset.waitId, members: Array.from(l.querySelectorAll('li')).map((li) => ({ \
        id: li.querySelector('a').textContent, \
        status: li.querySelector('[data-testid=\"member-status\"]').dataset.status}))};";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_group_row_with_its_members_as_they_end() {
    let _serial = SERIAL.lock().await;
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--tokens", TOKENS]).await;
    let up = Upstream::start().await;
    let browser = Browser::start().await;
    let b = &browser;
    let scenario = async {
        let api = Api::new(&app.base);
        let members: Vec<Value> = (0..3)
            .map(|i| {
                wait_spec(
                    &up.script(&format!("/pool/{i}"), vec![Reply::status("deploying")]),
                    json!({"pool": "edge"}),
                )
            })
            .collect();
        let gid = api
            .create(json!({"all": members, "timeout": "10m", "labels": {"deploy": "4480"}}))
            .await;
        let group = api.get(&format!("/waits/{gid}")).await;
        let ids: Vec<String> = group["members"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        b.c.goto(&format!("{}/", app.base)).await.unwrap();
        b.enter_token().await;
        let row = b
            .shows(
                "the group's row with its members",
                PATIENCE,
                GROUP_ROW,
                vec![json!(gid)],
                |v| v["members"] == json!(["running", "running", "running"]),
            )
            .await;
        assert_eq!(row["ids"], json!(ids), "{row}");
        assert_eq!(row["target"], "all of 3 waits", "{row}");
        assert_eq!(row["group"], Value::Null, "a group is in no group: {row}");

        // The first member ends: the group's row shows it at once, still running.
        up.script("/pool/0", vec![Reply::status("on")]);
        let row = b
            .shows(
                "the first member's end on the group's row",
                PATIENCE,
                GROUP_ROW,
                vec![json!(gid)],
                |v| v["members"][0] == "succeeded",
            )
            .await;
        assert_eq!(row["status"], "running", "{row}");
        b.shows(
            "the group's progress",
            PATIENCE,
            GROUP_ROW,
            vec![json!(gid)],
            |v| v["state"] == "1 of 3 succeeded",
        )
        .await;

        // A member's row links to its group, and the link opens it.
        let member = b
            .shows(
                "a member's row",
                PATIENCE,
                GROUP_ROW,
                vec![json!(ids[1])],
                |v| !v["group"].is_null(),
            )
            .await;
        assert_eq!(member["group"], format!("#/waits/{gid}"), "{member}");
        b.click(&format!(
            "[data-testid=\"wait-row\"][data-wait-id=\"{}\"] [data-testid=\"row-group\"]",
            ids[1]
        ))
        .await;
        let detail = b
            .shows(
                "the group's detail",
                PATIENCE,
                DETAIL_MEMBERS,
                vec![],
                |v| v["id"] == gid.as_str(),
            )
            .await;
        assert_eq!(detail["members"][0]["status"], "succeeded", "{detail}");

        // The second fails: the group fails, and its last member is canceled; the
        // row and the open detail both show every member's end.
        up.script("/pool/1", vec![Reply::status("failed_deployment")]);
        let row = b
            .shows(
                "the group failing with its members' ends",
                PATIENCE,
                GROUP_ROW,
                vec![json!(gid)],
                |v| v["members"] == json!(["succeeded", "failed", "canceled"]),
            )
            .await;
        assert_eq!(row["status"], "failed", "{row}");
        b.shows(
            "the members' ends in the group's detail",
            PATIENCE,
            DETAIL_MEMBERS,
            vec![],
            |v| {
                v["members"].as_array().is_some_and(|m| {
                    m.iter()
                        .map(|m| &m["status"])
                        .eq(["succeeded", "failed", "canceled"].iter())
                })
            },
        )
        .await;
        let shot = b.save_screenshot("dashboard-group.png").await;
        eprintln!("the group's screenshot: {}", shot.display());
    };
    let outcome = browser.run("groups", scenario).await;
    browser.finish(outcome).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
