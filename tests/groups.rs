//! Groups through the API, on both stores: `all` and `any` of several waits under
//! one deadline, decided once, with the members still running canceled.

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
                    let dir = TempDir::new("waitd-groups");
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
    all_of_three_succeeds_after_the_last_and_shows_each_member,
    all_fails_at_once_when_one_fails_and_the_others_are_polled_no_more,
    any_is_decided_by_the_first_success_and_fails_when_every_member_fails,
    an_optional_member_may_fail_and_a_member_by_id_may_have_ended_already,
    a_hundred_members_are_allowed_and_a_hundred_and_first_is_a_400,
    the_group_deadline_ends_it_timed_out_and_cancels_its_members,
    bad_groups_are_refused_with_a_sentence,
    canceling_a_group_cancels_its_members_and_labels_filter_groups,
    curl_f_and_the_cli_wait_for_a_whole_group_and_exit_as_it_ended,
);

fn member(url: &str) -> Value {
    spec(url)
}

fn deploying_then(n: usize, last: &str) -> Vec<Reply> {
    let mut r = vec![Reply::status("deploying"); n];
    r.push(Reply::status(last));
    r
}

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

fn ids(group: &Value) -> Vec<String> {
    group["members"]
        .as_array()
        .unwrap_or_else(|| panic!("members: {group}"))
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect()
}

async fn all_of_three_succeeds_after_the_last_and_shows_each_member(app: &App) {
    let up = Upstream::start().await;
    let urls: Vec<String> = (0..3)
        .map(|i| up.script(&format!("/a/{i}"), deploying_then(i * 3, "on")))
        .collect();
    let body = json!({"all": urls.iter().map(|u| member(u)).collect::<Vec<_>>(), "timeout": "20s"});
    let (code, g) = post(app, "/waits?wait=20s", &body).await;
    assert_eq!(code, 201, "{g}");
    assert_eq!(g["status"], "succeeded", "{g}");
    assert_eq!(g["mode"], "all");
    assert_eq!(g["state"], "3 of 3 succeeded", "{g}");
    let gid = g["id"].as_str().unwrap();
    let finished = g["finished_at"].as_str().unwrap().to_string();
    for (i, id) in ids(&g).iter().enumerate() {
        assert_eq!(g["members"][i]["status"], "succeeded", "{g}");
        let (_, m) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(m["group"], gid, "{m}");
        assert_eq!(m["status"], "succeeded");
        assert!(
            m["finished_at"].as_str().unwrap() <= finished.as_str(),
            "{m}\n{g}"
        );
    }
    // The group's history: created, its progress as state events, then its end.
    let (_, ev) = app.get(&format!("/waits/{gid}/events")).await;
    let kinds: Vec<&str> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.first(), Some(&"created"), "{ev}");
    assert_eq!(kinds.last(), Some(&"succeeded"), "{ev}");
    assert_eq!(kinds.iter().filter(|k| **k == "succeeded").count(), 1);
}

async fn all_fails_at_once_when_one_fails_and_the_others_are_polled_no_more(app: &App) {
    let up = Upstream::start().await;
    let bad = up.script("/f/bad", deploying_then(1, "failed_deployment"));
    let slow1 = up.script("/f/s1", vec![Reply::status("deploying")]);
    let slow2 = up.script("/f/s2", vec![Reply::status("deploying")]);
    let body = json!({"all": [member(&slow1), member(&bad), member(&slow2)]});
    let (code, g) = post(app, "/waits?wait=20s", &body).await;
    assert_eq!(code, 422, "{g}");
    assert_eq!(g["status"], "failed");
    let members = ids(&g);
    let reason = g["reason"].as_str().unwrap();
    assert!(
        reason.contains(&members[1]) && reason.contains("failed"),
        "{reason}"
    );
    let gid = g["id"].as_str().unwrap();
    for id in [&members[0], &members[2]] {
        let (code, m) = app.get(&format!("/waits/{id}?wait=10s")).await;
        assert_eq!((code, m["status"].as_str()), (409, Some("canceled")), "{m}");
        assert!(m["reason"].as_str().unwrap().contains(gid), "{m}");
    }
    // A probe already under way when the cancel commits may still land, before the
    // replica polling it hears the notice (as for any cancel, §2.4); after that,
    // nothing more is polled. The count is taken at a control wait's first poll
    // (claimed after the cancels' notices), and read again after four more of its
    // polls: four of the members' longest interval, with the worker going round.
    let (control, control_id) = control(app, &up).await;
    assert!(
        up.hit(&control, 1, signals::BOUND).await,
        "{control} polled"
    );
    let paths = ["/f/s1", "/f/s2"];
    let hits = paths.map(|p| up.hits(p));
    assert!(
        up.hit(&control, 5, signals::BOUND).await,
        "{control} polled"
    );
    assert_eq!(
        paths.map(|p| up.hits(p)),
        hits,
        "{paths:?} were polled after the decision"
    );
    let (code, _) = app.post(&format!("/waits/{control_id}/cancel")).await;
    assert_eq!(code, 200);
}

/// A wait of its own on `up` that never ends, polled every 20 ms (the longest
/// interval of [`member`]): its path, and its id. How often it is polled shows how
/// long the worker has gone round.
async fn control(app: &App, up: &Upstream) -> (String, String) {
    let path = "/control";
    let mut s = spec(&up.script(path, vec![Reply::status("deploying")]));
    s["poll"] = json!({"initial": "20ms", "factor": 1, "max": "20ms", "jitter": 0});
    let (code, w) = app.create(s).await;
    assert_eq!(code, 201, "{w}");
    (path.to_string(), w["id"].as_str().unwrap().to_string())
}

async fn any_is_decided_by_the_first_success_and_fails_when_every_member_fails(app: &App) {
    let up = Upstream::start().await;
    let slow = up.script("/y/slow", vec![Reply::status("deploying")]);
    let fast = up.script("/y/fast", deploying_then(2, "on"));
    let (code, g) = post(
        app,
        "/waits?wait=20s",
        &json!({"any": [member(&slow), member(&fast)]}),
    )
    .await;
    assert_eq!(code, 201, "{g}");
    assert_eq!(
        (g["status"].as_str(), g["mode"].as_str()),
        (Some("succeeded"), Some("any"))
    );
    let members = ids(&g);
    assert!(g["reason"].as_str().unwrap().contains(&members[1]), "{g}");
    let (code, m) = app.get(&format!("/waits/{}?wait=10s", members[0])).await;
    assert_eq!((code, m["status"].as_str()), (409, Some("canceled")), "{m}");

    let f1 = up.script("/y/f1", vec![Reply::status("failed_deployment")]);
    let f2 = up.script("/y/f2", deploying_then(2, "failed_deployment"));
    let (code, g) = post(
        app,
        "/waits?wait=20s",
        &json!({"any": [member(&f1), member(&f2)]}),
    )
    .await;
    assert_eq!((code, g["status"].as_str()), (422, Some("failed")), "{g}");
    assert!(
        g["reason"].as_str().unwrap().contains("every member"),
        "{g}"
    );
}

async fn an_optional_member_may_fail_and_a_member_by_id_may_have_ended_already(app: &App) {
    let up = Upstream::start().await;
    let ok = up.script("/o/ok", deploying_then(1, "on"));
    let bad = up.script("/o/bad", vec![Reply::status("failed_deployment")]);
    let mut optional = member(&bad);
    optional["required"] = json!(false);
    let (code, g) = post(
        app,
        "/waits?wait=20s",
        &json!({"all": [member(&ok), optional]}),
    )
    .await;
    assert_eq!(
        (code, g["status"].as_str()),
        (201, Some("succeeded")),
        "{g}"
    );
    assert_eq!(g["members"][1]["required"], false, "{g}");
    assert_eq!(g["members"][1]["status"], "failed", "{g}");

    // A member by id that succeeded before the group was made.
    let done = up.script("/o/done", vec![Reply::status("on")]);
    let (_, w) = post(app, "/waits?wait=20s", &member(&done)).await;
    assert_eq!(w["status"], "succeeded");
    let (code, g) = post(app, "/waits", &json!({"all": [{"id": w["id"]}]})).await;
    assert_eq!(
        (code, g["status"].as_str()),
        (201, Some("succeeded")),
        "{g}"
    );
}

async fn a_hundred_members_are_allowed_and_a_hundred_and_first_is_a_400(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/h/x", vec![Reply::status("deploying")]);
    let mut quiet = member(&url);
    quiet["poll"] = json!({"delay": "1h", "initial": "1h", "max": "1h"});
    quiet["timeout"] = json!("2h");
    let (code, p) = post(app, "/waits", &json!({"all": vec![quiet.clone(); 101]})).await;
    assert_eq!(code, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("at most 100"), "{p}");
    let (code, g) = post(
        app,
        "/waits",
        &json!({"all": vec![quiet; 100], "timeout": "1h"}),
    )
    .await;
    assert_eq!(code, 201, "{g}");
    assert_eq!(g["members"].as_array().unwrap().len(), 100);
    assert_eq!(g["state"], "0 of 100 succeeded");
    // Capped by the group's deadline.
    let (_, m) = app.get(&format!("/waits/{}", ids(&g)[0])).await;
    assert!(
        m["deadline"].as_str().unwrap() <= g["deadline"].as_str().unwrap(),
        "{m}"
    );
    let (code, c) = app
        .post(&format!("/waits/{}/cancel", g["id"].as_str().unwrap()))
        .await;
    assert_eq!((code, c["status"].as_str()), (200, Some("canceled")));
}

async fn the_group_deadline_ends_it_timed_out_and_cancels_its_members(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/t/x", vec![Reply::status("deploying")]);
    let (_, w) = app.create(member(&url)).await;
    // Held by its replica, under its own deadline, when the group is made: the
    // group's deadline passes while it runs.
    assert!(up.hit("/t/x", 1, Duration::from_secs(5)).await);
    let (code, g) = post(
        app,
        "/waits?wait=true",
        &json!({"all": [{"id": w["id"]}], "timeout": "300ms"}),
    )
    .await;
    assert_eq!(
        (code, g["status"].as_str()),
        (412, Some("timed_out")),
        "{g}"
    );
    let reason = g["reason"].as_str().unwrap();
    assert!(
        reason.contains("deadline") && reason.contains("running"),
        "{reason}"
    );
    let (code, m) = app
        .get(&format!("/waits/{}?wait=10s", w["id"].as_str().unwrap()))
        .await;
    assert_eq!((code, m["status"].as_str()), (409, Some("canceled")), "{m}");
}

async fn bad_groups_are_refused_with_a_sentence(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/b/x", vec![Reply::status("deploying")]);
    let cases = [
        (json!({"all": []}), 400, "at least one"),
        (
            json!({"all": [{"all": [member(&url)]}]}),
            400,
            "cannot be a member of a group",
        ),
        (
            json!({"all": [member(&url)], "any": [member(&url)]}),
            400,
            "either all or any",
        ),
        (
            json!({"all": [member(&url)], "target": {"url": url}}),
            400,
            "inside its entry",
        ),
        (json!({"any": [{"id": "x"}]}), 400, "UUID"),
        (json!({"all": [{"target": {"url": url}}]}), 400, "all[0]"),
        (
            json!({"all": [{"id": uuid::Uuid::now_v7()}]}),
            404,
            "there is no wait",
        ),
        // A member's first poll past the group's timeout, which is its own.
        (
            json!({"all": [{"target": {"url": url}, "state": "/data/attributes/status", "want": ["on"],
                            "timeout": "1h", "poll": {"delay": "30m"}}],
                   "timeout": "1m"}),
            400,
            "all[0].poll.delay",
        ),
    ];
    for (body, want, says) in cases {
        let (code, p) = post(app, "/waits", &body).await;
        assert_eq!(code, want, "{body} → {p}");
        assert!(p.to_string().contains(says), "{body} → {p}");
    }
    // A member's preset refusal names the member.
    let body =
        json!({"all": [member(&url), {"preset": "http.ok", "params": {"url": url, "zz": 1}}]});
    let (code, p) = post(app, "/waits", &body).await;
    assert_eq!(code, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "all[1].params.zz", "{p}");
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .starts_with("all[1].params.zz "),
        "{p}"
    );
    let body = json!({"any": [member(&url), {"preset": "no.such"}]});
    let (code, p) = post(app, "/waits", &body).await;
    assert_eq!(code, 422, "{p}");
    assert_eq!(p["errors"][0]["field"], "any[1].preset", "{p}");
    let (_, g) = app.create(json!({"all": [member(&url)]})).await;
    let (code, p) = post(app, "/waits", &json!({"all": [{"id": g["id"]}]})).await;
    assert_eq!(code, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("is a group"), "{p}");
    app.post(&format!("/waits/{}/cancel", g["id"].as_str().unwrap()))
        .await;
    // The served document names the presets this server has, the only ones it takes.
    let (_, doc) = app.get("/openapi.json").await;
    let names = &doc["components"]["schemas"]["CreateWait"]["properties"]["preset"]["enum"];
    assert!(
        names.as_array().unwrap().contains(&json!("http.ok")),
        "{names}"
    );
    let (code, _) = post(app, "/waits", &json!({"preset": ""})).await;
    assert_eq!(code, 422);
}

async fn canceling_a_group_cancels_its_members_and_labels_filter_groups(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/c/x", vec![Reply::status("deploying")]);
    let body = json!({"all": [member(&url), member(&url)], "labels": {"deploy": "d1"}});
    let (code, g) = app.create(body).await;
    assert_eq!(code, 201, "{g}");
    let gid = g["id"].as_str().unwrap();
    let (_, page) = app.get("/waits?label=deploy:d1").await;
    assert_eq!(page["items"].as_array().unwrap().len(), 1, "{page}");
    assert_eq!(page["items"][0]["id"], gid);
    assert_eq!(page["items"][0]["members"].as_array().unwrap().len(), 2);
    let (code, c) = app.post(&format!("/waits/{gid}/cancel")).await;
    assert_eq!((code, c["status"].as_str()), (200, Some("canceled")));
    for id in ids(&g) {
        let (code, m) = app.get(&format!("/waits/{id}?wait=10s")).await;
        assert_eq!((code, m["status"].as_str()), (409, Some("canceled")), "{m}");
        assert!(m["reason"].as_str().unwrap().contains(gid), "{m}");
    }
}

/// Runs a command to its end off the runtime; its exit code.
async fn exit_code(mut c: std::process::Command) -> i32 {
    let out = tokio::task::spawn_blocking(move || c.output().expect("run the command"))
        .await
        .unwrap();
    assert!(out.status.code().is_some_and(|c| c != 101), "{out:?}");
    out.status.code().unwrap()
}

async fn curl_f_and_the_cli_wait_for_a_whole_group_and_exit_as_it_ended(app: &App) {
    let up = Upstream::start().await;
    let ok = up.script("/k/ok", deploying_then(1, "on"));
    let bad = up.script("/k/bad", deploying_then(1, "failed_deployment"));
    let curl = |body: Value| {
        let mut c = std::process::Command::new("curl");
        c.args([
            "-sS",
            "-f",
            "-o",
            "/dev/null",
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
        ])
        .arg("--data")
        .arg(body.to_string())
        .arg(app.url("/waits?wait=true"));
        c
    };
    assert_eq!(
        exit_code(curl(json!({"all": [member(&ok), member(&ok)]}))).await,
        0
    );
    assert_eq!(
        exit_code(curl(json!({"all": [member(&ok), member(&bad)]}))).await,
        22
    );

    let dir = TempDir::new("waitd-group-cli");
    let (a, b) = (dir.path.join("a.json"), dir.path.join("b.json"));
    std::fs::write(&a, member(&ok).to_string()).unwrap();
    std::fs::write(&b, member(&bad).to_string()).unwrap();
    let cli = |mode: &str| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_waitd"));
        c.args(["create", mode])
            .arg(&a)
            .arg(&b)
            .args(["--wait", "--timeout", "30s"])
            .env("WAITD_URL", &app.base)
            .env_remove("WAITD_TOKEN");
        c
    };
    assert_eq!(
        exit_code(cli("--any")).await,
        i32::from(waitd::client::EXIT_SUCCEEDED)
    );
    assert_eq!(
        exit_code(cli("--all")).await,
        i32::from(waitd::client::EXIT_FAILED)
    );
}

#[test]
fn the_openapi_document_offers_a_group_and_states_the_url_refusals() {
    let doc: Value = serde_json::from_str(waitd::api::openapi::document()).unwrap();
    let body =
        &doc["paths"]["/waits"]["post"]["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(
        body["oneOf"][1]["$ref"], "#/components/schemas/CreateGroup",
        "{body}"
    );
    let group = &doc["components"]["schemas"]["CreateGroup"];
    assert_eq!(group["properties"]["all"]["maxItems"], 100, "{group}");
    let pattern = doc["components"]["schemas"]["TargetUrl"]["pattern"]
        .as_str()
        .unwrap();
    let re = regex_automata::meta::Regex::new(pattern).unwrap();
    for ok in ["https://api.example.com/x?y=1", "http://127.0.0.1:8080/"] {
        assert!(re.is_match(ok), "{ok}");
    }
    for refused in [
        "http://a b",
        "http://a\\b",
        "http://x\u{1}",
        "http:///x",
        "http://",
    ] {
        assert!(!re.is_match(refused), "{refused:?}");
    }
}

const TOKEN_A: &str = "tok-tenant-a-0123456789abcdef";
const TOKEN_B: &str = "tok-tenant-b-0123456789abcdef";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

#[tokio::test]
async fn another_tenants_wait_is_no_member_and_a_group_announces_its_end_by_webhook() {
    use crate::support::receiver::Receiver;
    let dir = TempDir::new("waitd-groups-tenants");
    let mut args = test_args(&dir.sqlite_url());
    args.extend(
        [
            "--tokens",
            &format!("a:{TOKEN_A},b:{TOKEN_B}"),
            "--rate-limit",
            "0",
        ]
        .map(String::from),
    );
    let app = App::start_args(args).await;
    let up = Upstream::start().await;
    let url = up.script("/i/x", vec![Reply::status("deploying")]);
    let as_ = |token: &'static str, body: Value| {
        app.client
            .post(app.url("/waits"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };
    // B's wait, and B's group, are unknown to A: the same 404 as a read.
    let b_wait: Value = as_(TOKEN_B, member(&url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let b_group: Value = as_(TOKEN_B, json!({"all": [member(&url)]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for id in [&b_wait["id"], &b_group["id"]] {
        let r = as_(TOKEN_A, json!({"all": [{"id": id}]})).await.unwrap();
        assert_eq!(r.status(), 404);
        let p: Value = r.json().await.unwrap();
        assert_eq!(
            p["detail"],
            format!("there is no wait {}", id.as_str().unwrap()),
            "{p}"
        );
    }
    // A group's end goes to its webhook like a wait's.
    let rx = Receiver::start().await;
    let hook = rx.script("/hook", vec![crate::support::receiver::Answer::code(200)]);
    // A member's own webhook names its group; a wait in no group's names none.
    let member_hook = rx.script("/member", vec![crate::support::receiver::Answer::code(200)]);
    let alone_hook = rx.script("/alone", vec![crate::support::receiver::Answer::code(200)]);
    let ok = up.script("/i/ok", vec![Reply::status("on")]);
    let mut with_hook = member(&ok);
    with_hook["notify"] = json!([{"url": member_hook, "secret": SECRET, "events": ["succeeded"]}]);
    let r = as_(
        TOKEN_A,
        json!({"all": [with_hook], "notify": [{"url": hook, "secret": SECRET}]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let group: Value = r.json().await.unwrap();
    let mut alone = member(&ok);
    alone["notify"] = json!([{"url": alone_hook, "secret": SECRET, "events": ["succeeded"]}]);
    assert_eq!(as_(TOKEN_A, alone).await.unwrap().status(), 201);
    assert!(rx.until_got("/hook", 1, Duration::from_secs(10)).await);
    let got = rx.got("/hook")[0].json();
    assert_eq!(got["type"], "wait.succeeded", "{got}");
    assert_eq!(got["data"]["mode"], "all", "{got}");
    assert!(rx.until_got("/member", 1, Duration::from_secs(10)).await);
    let got = rx.got("/member")[0].json();
    assert_eq!(got["data"]["group"], group["id"], "{got}");
    assert!(rx.until_got("/alone", 1, Duration::from_secs(10)).await);
    let got = rx.got("/alone")[0].json();
    assert_eq!(got["type"], "wait.succeeded", "{got}");
    assert!(got["data"].get("group").is_none_or(Value::is_null), "{got}");
    app.stop().await.0.unwrap();
}

/// A group is a running wait of its tenant's: it counts against
/// `--max-active-waits` as its members do, whether they are given by spec or by id.
async fn a_group_counts_against_the_running_wait_limit(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/limit", vec![Reply::status("deploying")]);
    let running = || async {
        let r = app.client.get(app.url("/waits?status=running")).send();
        let page: Value = r.await.unwrap().json().await.unwrap();
        page["items"].as_array().map_or(0, Vec::len)
    };
    // Three members fit under the limit of 3; the group itself does not, and
    // the members made for it are undone.
    let (status, p) = post(
        app,
        "/waits",
        &json!({"all": [member(&url), member(&url), member(&url)]}),
    )
    .await;
    assert_eq!(status, 429, "{p}");
    assert!(
        p["detail"].as_str().unwrap_or("").contains("running waits"),
        "{p}"
    );
    assert_eq!(running().await, 0);
    let r = app.client.get(app.url("/waits?status=canceled")).send();
    let page: Value = r.await.unwrap().json().await.unwrap();
    let undone = page["items"].as_array().unwrap();
    assert_eq!(undone.len(), 3, "{page}");
    for w in undone {
        let reason = w["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("running-wait limit"), "{reason}");
    }
    // A member past the limit: the ones made before it are canceled, saying why.
    let four = json!({"all": [member(&url), member(&url), member(&url), member(&url)]});
    let (status, p) = post(app, "/waits", &four).await;
    assert_eq!(status, 429, "{p}");
    assert_eq!(running().await, 0);
    let r = app.client.get(app.url("/waits?status=canceled")).send();
    let page: Value = r.await.unwrap().json().await.unwrap();
    let undone = page["items"].as_array().unwrap();
    assert_eq!(undone.len(), 6, "{page}");
    for w in undone {
        let reason = w["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("running-wait limit"), "{reason}");
    }
    let (status, group) = post(app, "/waits", &json!({"all": [member(&url), member(&url)]})).await;
    assert_eq!(status, 201, "{group}");
    assert_eq!(running().await, 3);
    // A group of members by id makes no new member, but is one more running wait.
    let first = &ids(&group)[0];
    let (status, p) = post(app, "/waits", &json!({"any": [{"id": first}]})).await;
    assert_eq!(status, 429, "{p}");
    assert_eq!(running().await, 3);
}

/// Creates with one key racing near the limit: the group the winner made is every
/// answer, never a 429 for the places the winner's own rows take.
async fn racing_creates_with_one_key_near_the_limit_answer_with_the_winner(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/race", vec![Reply::status("deploying")]);
    // Each request makes three members before its group: the losers pass the
    // key's first look before the winner's group is in, and count its rows after.
    let body = json!({"all": [member(&url), member(&url), member(&url)]});
    let sends = (0..4).map(|_| {
        app.client
            .post(app.url("/waits"))
            .header("Idempotency-Key", "one-group")
            .json(&body)
            .send()
    });
    let mut ids = std::collections::BTreeSet::new();
    for r in futures_util::future::join_all(sends).await {
        let r = r.unwrap();
        let status = r.status().as_u16();
        let w: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "{w}");
        ids.insert(w["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
}

#[tokio::test]
async fn racing_creates_with_one_key_near_the_limit_answer_with_the_winner_on_both_stores() {
    let dir = TempDir::new("waitd-groups-race");
    let mut args = test_args(&dir.sqlite_url());
    // Four requests' twelve members and the winner's group fill the limit.
    args.extend(["--max-active-waits", "13"].map(String::from));
    let app = App::start_args(args).await;
    racing_creates_with_one_key_near_the_limit_answer_with_the_winner(&app).await;
    app.stop().await.0.unwrap();
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--max-active-waits", "13"]).await;
    racing_creates_with_one_key_near_the_limit_answer_with_the_winner(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_group_counts_against_the_running_wait_limit_on_sqlite() {
    let dir = TempDir::new("waitd-groups-limit");
    let mut args = test_args(&dir.sqlite_url());
    args.extend(["--max-active-waits", "3"].map(String::from));
    let app = App::start_args(args).await;
    a_group_counts_against_the_running_wait_limit(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_group_counts_against_the_running_wait_limit_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--max-active-waits", "3"]).await;
    a_group_counts_against_the_running_wait_limit(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
