//! The operator's event sources (`sources` in `--credentials-file`), on both
//! stores: a signed event reaches the listening waits of the tenants it lists
//! and of no other; a forged one is refused; a tenant sees it without its
//! secret or hook id and cannot delete it; a wait made after its event sees it;
//! a source taken out of the file takes no event after a restart; and a bad
//! entry stops the start with a sentence naming the field.

use std::path::Path;

use serde_json::{Value, json};

use super::{
    GITHUB_SECRET, answered, each_store_with, ended_by_event_spec, finish, listening_spec,
    run_77_kept, run_event, signed,
};
use crate::support::stores::Backend;
use crate::support::*;

const TOKEN_A: &str = "tenant-a-token-0123456789";
const TOKEN_B: &str = "tenant-b-token-0123456789";
/// The hook id the operator chose for "ops" (configured at the sender).
const HOOK_ID: &str = "opsHook_0123456789-abcdefXYZ";

/// A credentials file in `dir` with the operator's source "ops" (GitHub, for
/// tenant `a`) and as many more as `more` declares.
fn file(dir: &Path, more: Value) -> String {
    let secret = dir.join("ops-secret");
    std::fs::write(&secret, format!("{GITHUB_SECRET}\n")).unwrap();
    let mut sources = json!({"ops": {
        "kind": "github", "secret_file": secret, "key": "/workflow_run/id",
        "lookback": "5m", "tenants": ["a"], "hook_id": HOOK_ID,
    }});
    for (k, v) in more.as_object().unwrap() {
        sources[k] = v.clone();
    }
    let path = dir.join("credentials.json");
    std::fs::write(
        &path,
        json!({"credentials": {}, "sources": sources}).to_string(),
    )
    .unwrap();
    path.display().to_string()
}

fn args(url: &str, creds: &str) -> Vec<String> {
    let mut args = set_flag(test_args(url), "--min-poll-interval", "1ms");
    args.extend([
        "--tokens".to_string(),
        format!("a:{TOKEN_A},b:{TOKEN_B}"),
        "--credentials-file".to_string(),
        creds.to_string(),
    ]);
    args
}

/// An app on each store with the operator's sources of `file(dir, more)`.
async fn apps(dir: &TempDir, more: Value) -> Vec<(App, Backend)> {
    let creds = file(&dir.path, more);
    each_store_with(|url| args(url, &creds)).await
}

/// A wait of the tenant of `token` on `url`, listening to `src` for `key`: its id.
async fn listening_as(app: &App, token: &str, url: &str, src: &str, key: &str) -> String {
    let (status, w) = app
        .create_as(
            token,
            &listening_spec(url, json!({"source": src, "key": key})),
        )
        .await;
    assert_eq!(status, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_operator_source_reaches_the_tenants_it_lists_and_no_other() {
    let dir = TempDir::new("waitd-opsrc");
    for (app, db) in apps(&dir, json!({})).await {
        let hook = app.url(&format!("/hooks/{HOOK_ID}"));
        let up = Upstream::start().await;
        let url = up.script("/a", vec![Reply::status("deploying")]);
        let other = up.script("/b", vec![Reply::status("deploying")]);
        let id = listening_as(&app, TOKEN_A, &url, "ops", "5").await;
        assert!(up.hit("/a", 1, std::time::Duration::from_secs(10)).await);
        // Tenant b is not listed: its waits cannot name the source.
        let (status, p) = app
            .create_as(
                TOKEN_B,
                &listening_spec(&other, json!({"source": "ops", "key": "5"})),
            )
            .await;
        assert_eq!(status, 400, "{p}");
        assert!(p.to_string().contains("on_event.source"), "{p}");
        // A source of b's own of that name is b's, with a hook of its own.
        let (status, own, _) = answered(
            client()
                .post(app.url("/sources"))
                .bearer_auth(TOKEN_B)
                .json(&json!({"name": "ops", "kind": "github", "secret": GITHUB_SECRET, "key": "/workflow_run/id"})),
        )
        .await;
        assert_eq!(status, 201, "{own}");
        assert_eq!(own["operator"], false, "{own}");
        let b_id = listening_as(&app, TOKEN_B, &other, "ops", "5").await;
        assert!(up.hit("/b", 1, std::time::Duration::from_secs(10)).await);
        // A forged signature is refused.
        let body = run_event(5, "success");
        let (status, p, _) = answered(signed(
            &hook,
            "github",
            "not-the-secret-at-all-0000",
            "f1",
            &body,
        ))
        .await;
        assert_eq!(status, 401, "{p}");
        // Signed, it nudges a's wait and not b's.
        let (status, a, _) = answered(signed(&hook, "github", GITHUB_SECRET, "d1", &body)).await;
        assert_eq!((status, a["matched"].as_u64()), (202, Some(1)), "{a}");
        assert!(
            up.hit("/a", 2, std::time::Duration::from_secs(10)).await,
            "the nudged poll"
        );
        let (status, a, _) = answered(signed(&hook, "github", GITHUB_SECRET, "d1", &body)).await;
        assert_eq!((status, a["replayed"].as_bool()), (200, Some(true)), "{a}");
        // matched: 1 above was a's; b's wait is not polled for it either.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert_eq!(
            up.hits("/b"),
            1,
            "b's wait was polled for the operator's event"
        );
        let (_, w) = app.get_as(TOKEN_B, &format!("/waits/{b_id}")).await;
        assert_eq!(w["status"], "running", "{w}");
        let (_, w) = app.get_as(TOKEN_A, &format!("/waits/{id}")).await;
        assert_eq!(w["status"], "running", "{w}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_tenant_sees_an_operator_source_without_its_secret_and_cannot_delete_it() {
    let dir = TempDir::new("waitd-opsrc");
    for (app, db) in apps(&dir, json!({})).await {
        let (status, s) = app.get_as(TOKEN_A, "/sources/ops").await;
        assert_eq!(status, 200, "{s}");
        assert_eq!(s["operator"], true, "{s}");
        assert_eq!(s["kind"], "github", "{s}");
        assert_eq!(s["key"], "/workflow_run/id", "{s}");
        assert!(s.get("id").is_none() && s.get("hook_url").is_none(), "{s}");
        let (status, list) = app.get_as(TOKEN_A, "/sources").await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(list["sources"][0]["name"], "ops", "{list}");
        for text in [s.to_string(), list.to_string()] {
            assert!(!text.contains(GITHUB_SECRET), "{text}");
            assert!(!text.contains(HOOK_ID), "{text}");
        }
        let (status, p) = answered(
            client()
                .delete(app.url("/sources/ops"))
                .bearer_auth(TOKEN_A),
        )
        .await
        .into_two();
        assert_eq!(status, 403, "{p}");
        assert!(p["detail"].as_str().unwrap().contains("operator"), "{p}");
        // Tenant b is not listed: for it there is no such source.
        let (status, _) = app.get_as(TOKEN_B, "/sources/ops").await;
        assert_eq!(status, 404);
        let (_, list) = app.get_as(TOKEN_B, "/sources").await;
        assert_eq!(list["sources"], json!([]), "{list}");
        let (status, _) = answered(
            client()
                .delete(app.url("/sources/ops"))
                .bearer_auth(TOKEN_B),
        )
        .await
        .into_two();
        assert_eq!(status, 404);
        // Still there, still taking events.
        let hook = app.url(&format!("/hooks/{HOOK_ID}"));
        let (status, a, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "x",
            &run_event(1, "success"),
        ))
        .await;
        assert_eq!(status, 202, "{a}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_wait_made_after_an_operator_sources_event_sees_it() {
    let dir = TempDir::new("waitd-opsrc");
    for (app, db) in apps(&dir, json!({})).await {
        let hook = app.url(&format!("/hooks/{HOOK_ID}"));
        let (_up, url) = run_77_kept(&hook).await;
        let (status, w) = app
            .create_as(TOKEN_A, &ended_by_event_spec(&url, "ops", "77"))
            .await;
        assert_eq!(status, 201, "{w}");
        assert_eq!(w["status"], "succeeded", "the kept event ended it: {w}");
        finish(app, db).await;
    }
}

/// Two replicas on one Postgres, started together from one file: the hook URL
/// is the same on each, and an event at either reaches a wait made at the other.
#[tokio::test]
async fn two_replicas_on_one_postgres_share_an_operator_source() {
    let dir = TempDir::new("waitd-opsrc");
    let creds = file(&dir.path, json!({}));
    let db = TestDb::new().await;
    let (one, two) = tokio::join!(
        App::start_args(args(&db.url, &creds)),
        App::start_args(args(&db.url, &creds)),
    );
    let up = Upstream::start().await;
    let url = up.script("/a", vec![Reply::status("deploying")]);
    let id = listening_as(&two, TOKEN_A, &url, "ops", "8").await;
    assert!(up.hit("/a", 1, std::time::Duration::from_secs(10)).await);
    let (_, list) = one.get_as(TOKEN_A, "/sources").await;
    assert_eq!(list["sources"].as_array().map(Vec::len), Some(1), "{list}");
    let body = run_event(8, "success");
    let hook = one.url(&format!("/hooks/{HOOK_ID}"));
    let (status, a, _) = answered(signed(&hook, "github", GITHUB_SECRET, "r1", &body)).await;
    assert_eq!((status, a["matched"].as_u64()), (202, Some(1)), "{a}");
    assert!(
        up.hit("/a", 2, std::time::Duration::from_secs(10)).await,
        "the nudged poll"
    );
    let hook = two.url(&format!("/hooks/{HOOK_ID}"));
    let (status, a, _) = answered(signed(&hook, "github", GITHUB_SECRET, "r1", &body)).await;
    assert_eq!((status, a["replayed"].as_bool()), (200, Some(true)), "{a}");
    let (_, w) = two.get_as(TOKEN_A, &format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    let _ = two.stop().await;
    finish(one, Backend::Postgres(db)).await;
}

/// The database URL of a backend, to start another app on it.
fn url_of(db: &Backend) -> String {
    match db {
        Backend::Postgres(db) => db.url.clone(),
        Backend::Sqlite(dir) => dir.sqlite_url(),
    }
}

#[tokio::test]
async fn a_source_taken_out_of_the_file_takes_no_event_after_a_restart() {
    let dir = TempDir::new("waitd-opsrc");
    let second = "otherHook_0123456789-abcdef";
    let more = json!({"more": {
        "kind": "bearer", "secret_file": dir.path.join("ops-secret"), "key": "/workflow_run/id",
        "tenants": ["*"], "hook_id": second,
    }});
    for (app, db) in apps(&dir, more).await {
        let body = run_event(3, "success");
        let ops = app.url(&format!("/hooks/{HOOK_ID}"));
        let (status, _, _) = answered(signed(&ops, "github", GITHUB_SECRET, "1", &body)).await;
        assert_eq!(status, 202);
        let (_, list) = app.get_as(TOKEN_B, "/sources").await;
        assert_eq!(list["sources"][0]["name"], "more", "every tenant: {list}");
        let _ = app.stop().await;
        // The file now holds "ops" alone, as every replica reads it.
        let creds = file(&dir.path, json!({}));
        let app = App::start_args(args(&url_of(&db), &creds)).await;
        let gone = app.url(&format!("/hooks/{second}"));
        let (status, p, _) = answered(signed(&gone, "bearer", GITHUB_SECRET, "2", &body)).await;
        assert_eq!(status, 404, "{p}");
        let (status, _) = app.get_as(TOKEN_B, "/sources/more").await;
        assert_eq!(status, 404);
        // "ops" kept its events through the restart: the delivery is a replay.
        let ops = app.url(&format!("/hooks/{HOOK_ID}"));
        let (status, a, _) = answered(signed(&ops, "github", GITHUB_SECRET, "1", &body)).await;
        assert_eq!((status, a["replayed"].as_bool()), (200, Some(true)), "{a}");
        finish(app, db).await;
    }
}

#[tokio::test]
async fn a_bad_source_entry_stops_the_start_with_a_sentence_naming_the_field() {
    let dir = TempDir::new("waitd-opsrc");
    let secret = dir.path.join("s");
    std::fs::write(&secret, GITHUB_SECRET).unwrap();
    let good = json!({"kind": "github", "secret_file": secret, "key": "/id", "tenants": ["a"], "hook_id": HOOK_ID});
    let with = |k: &str, v: Value| {
        let mut e = good.clone();
        if v.is_null() {
            e.as_object_mut().unwrap().remove(k);
        } else {
            e[k] = v;
        }
        e
    };
    for (entry, says) in [
        (with("kind", json!("gitlab")), "\"kind\""),
        (
            with("secret_file", Value::Null),
            "\"secret_file\" is required",
        ),
        (with("hook_id", json!("short-id")), "\"hook_id\""),
        (with("colour", json!("blue")), "unknown field `colour`"),
        (with("lookback", json!("2h")), "\"lookback\""),
        (with("key", json!("")), "\"key\""),
    ] {
        let path = dir.path.join("credentials.json");
        std::fs::write(
            &path,
            json!({"credentials": {}, "sources": {"ops": entry}}).to_string(),
        )
        .unwrap();
        let config =
            waitd::Config::from_args(args(&dir.sqlite_url(), &path.display().to_string())).unwrap();
        let addr = "127.0.0.1:0".parse().unwrap();
        let err = waitd::App::start(config, addr)
            .await
            .err()
            .unwrap_or_else(|| panic!("{entry} was taken"))
            .to_string();
        assert!(err.contains("source \"ops\""), "{err}");
        assert!(err.contains(says), "{entry}: {err}");
    }
}

trait IntoTwo {
    fn into_two(self) -> (u16, Value);
}

impl IntoTwo for (u16, Value, String) {
    fn into_two(self) -> (u16, Value) {
        (self.0, self.1)
    }
}
