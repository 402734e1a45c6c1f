//! Waits of one tenant that send the identical request share its polls: the target
//! sees about one request an interval however many waits ask, while each wait
//! keeps its own polls, its own `consecutive` and its own verdict. Never across
//! tenants, never between requests that differ in a header.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::*;

const TOKEN_A: &str = "tenant-a-token-0123456789";
const TOKEN_B: &str = "tenant-b-token-0123456789";

/// A spec polling `url` every second, never reaching its state.
fn every_second(url: &str) -> Value {
    let mut s = spec(url);
    s["poll"] = json!({"initial": "1s", "factor": 1, "max": "1s", "jitter": 0});
    s["timeout"] = json!("1m");
    s
}

async fn create_as(app: &App, token: Option<&str>, spec: &Value) -> String {
    let mut req = client().post(app.url("/waits")).json(spec);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let res = req.send().await.unwrap();
    let code = res.status().as_u16();
    let body: Value = res.json().await.unwrap();
    assert_eq!(code, 201, "{body}");
    body["id"].as_str().unwrap().to_string()
}

async fn ended_as(app: &App, token: Option<&str>, id: &str) -> Value {
    let mut req = client().get(app.url(&format!("/waits/{id}?wait=20s")));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let w: Value = req.send().await.unwrap().json().await.unwrap();
    assert_ne!(w["status"], "running", "{w}");
    w
}

/// 200 waits on one URL at 1 s send at most 12 requests in 10 s, and each counts
/// its own polls; a wait with `consecutive: 3` still needs three polls of its own.
async fn many_waits_on_one_url_send_about_one_request_a_second(app: &App) {
    let up = Upstream::start().await;
    let url = up.script("/shared/one", vec![Reply::status("deploying")]);
    let (code, created) = app.create(every_second(&url)).await;
    assert_eq!(code, 201, "{created}");
    assert!(
        created["last_poll"].is_null(),
        "no poll before creation: {created}"
    );
    let mut ids = vec![created["id"].as_str().unwrap().to_string()];
    for _ in 1..200 {
        ids.push(create_as(app, None, &every_second(&url)).await);
    }
    let from = up.hits("/shared/one");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let sent = up.hits("/shared/one") - from;
    assert!(sent <= 12, "200 waits at 1 s sent {sent} requests in 10 s");
    // Counted as it is sent, so a request counted before the metrics were read
    // has been sent; one may be in flight, and more may arrive after the read.
    let seen_before = up.hits("/shared/one");
    let metrics = client()
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |line: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line} in {metrics}"))
    };
    assert!(count("waitd_probe_requests_total{outcome=\"shared\"}") >= 1000.0);
    let sent = count("waitd_probe_requests_total{outcome=\"sent\"}") as usize;
    let seen_after = up.hits("/shared/one");
    assert!(
        seen_before <= sent && sent <= seen_after + 1,
        "{sent} sent; {seen_before} seen before the metrics were read, {seen_after} after"
    );
    assert_eq!(count("waitd_probe_distinct_requests"), 1.0);
    let mut shared = 0;
    for id in &ids {
        let (code, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(code, 200, "{w}");
        let polls = w["polls"].as_i64().unwrap();
        assert!(polls >= 9, "each wait counts its own polls: {w}");
        let how = w["last_poll"].as_str().unwrap_or_default();
        assert!(how == "sent" || how == "shared", "{w}");
        shared += usize::from(how == "shared");
    }
    assert!(
        shared >= 150,
        "{shared} of 200 waits show a shared last poll"
    );
    let (code, list) = app.get("/waits?limit=50").await;
    assert_eq!(code, 200, "{list}");
    let items = list["items"].as_array().unwrap();
    assert!(!items.is_empty(), "{list}");
    for w in items.iter().filter(|w| w["status"] == "running") {
        let how = w["last_poll"].as_str().unwrap_or_default();
        assert!(
            how == "sent" || how == "shared",
            "the list shows it too: {w}"
        );
    }

    // Ten waits that need three polls in a row of their own each poll three
    // times, a second apart, while the target sees fewer requests than polls.
    let url = up.script("/shared/three", vec![Reply::status("on")]);
    let mut three = every_second(&url);
    three["consecutive"] = json!(3);
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(create_as(app, None, &three).await);
    }
    for id in &ids {
        let w = ended_as(app, None, id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(w["polls"], 3, "three polls of its own: {w}");
        let took = chrono::DateTime::parse_from_rfc3339(w["finished_at"].as_str().unwrap())
            .unwrap()
            - chrono::DateTime::parse_from_rfc3339(w["created_at"].as_str().unwrap()).unwrap();
        assert!(
            took >= chrono::TimeDelta::milliseconds(1900),
            "the third poll comes two intervals after the first: {w}"
        );
    }
    let sent = up.hits("/shared/three");
    assert!(sent < 30, "30 polls were served by {sent} requests");
}

#[tokio::test]
async fn many_waits_on_one_url_share_their_polls_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    many_waits_on_one_url_send_about_one_request_a_second(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn many_waits_on_one_url_share_their_polls_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    many_waits_on_one_url_send_about_one_request_a_second(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// An upstream that answers `/auth` with the request's `Authorization` as the
/// state, 300 ms late (so that requests overlap), and counts requests per value.
async fn per_credential_upstream() -> (String, Arc<Mutex<HashMap<String, usize>>>) {
    let seen: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let counts = seen.clone();
    let app = axum::Router::new().route(
        "/auth",
        axum::routing::get(move |headers: HeaderMap| {
            let seen = seen.clone();
            async move {
                let auth = headers
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_string();
                *seen.lock().unwrap().entry(auth.clone()).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                axum::Json(json!({"data": {"attributes": {"status": auth}}}))
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/auth", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, counts)
}

/// A wait that succeeds only on the answer to `credential` and fails on any other.
/// Its first poll comes a second after its creation, so that waits created
/// together are all held by then and fall due together.
fn wants_its_own(url: &str, credential: Option<&str>) -> Value {
    let mut s = every_second(url);
    s["poll"]["delay"] = json!("1s");
    let own = credential.unwrap_or("none");
    if let Some(c) = credential {
        s["target"]["headers"] = json!({"Authorization": c});
    }
    s["want"] = json!([own]);
    s["fail"] = json!(
        ["none", "Bearer one", "Bearer two"]
            .into_iter()
            .filter(|v| *v != own)
            .collect::<Vec<_>>()
    );
    s
}

/// Two tenants, and one tenant with two `Authorization` headers: every distinct
/// request is sent and each wait sees the answer to its own; the same request
/// of one tenant is sent once.
async fn distinct_requests_are_never_shared(app: &App) {
    let (url, counts) = per_credential_upstream().await;
    // Created together: each first poll falls due while another is in flight.
    let (one, two, none) = (
        wants_its_own(&url, Some("Bearer one")),
        wants_its_own(&url, Some("Bearer two")),
        wants_its_own(&url, None),
    );
    let a1 = create_as(app, Some(TOKEN_A), &one);
    let a2 = create_as(app, Some(TOKEN_A), &two);
    let a3 = create_as(app, Some(TOKEN_A), &none);
    let a4 = create_as(app, Some(TOKEN_A), &none);
    let b1 = create_as(app, Some(TOKEN_B), &none);
    let (a1, a2, a3, a4, b1) = tokio::join!(a1, a2, a3, a4, b1);
    for (token, id) in [
        (TOKEN_A, &a1),
        (TOKEN_A, &a2),
        (TOKEN_A, &a3),
        (TOKEN_A, &a4),
        (TOKEN_B, &b1),
    ] {
        let w = ended_as(app, Some(token), id).await;
        assert_eq!(
            w["status"], "succeeded",
            "each wait sees its own answer: {w}"
        );
        assert_eq!(w["polls"], 1, "{w}");
    }
    let counts = counts.lock().unwrap().clone();
    assert_eq!(counts.get("Bearer one"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("Bearer two"), Some(&1), "{counts:?}");
    // Tenant A's two identical waits share one request; tenant B sends its own.
    assert_eq!(counts.get("none"), Some(&2), "{counts:?}");
}

fn with_tenants(args: Vec<String>) -> Vec<String> {
    set_flag(args, "--tokens", &format!("a:{TOKEN_A},b:{TOKEN_B}"))
}

#[tokio::test]
async fn distinct_requests_are_never_shared_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(with_tenants(test_args(&dir.sqlite_url()))).await;
    distinct_requests_are_never_shared(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn distinct_requests_are_never_shared_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start_args(with_tenants(test_args(&db.url))).await;
    distinct_requests_are_never_shared(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A wait that opts out, and a replica with sharing off, send a request a poll.
#[tokio::test]
async fn a_wait_that_opts_out_sends_its_own_requests() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    let (url, counts) = per_credential_upstream().await;
    let mut own = wants_its_own(&url, None);
    own["target"]["share"] = json!(false);
    let (a, b) = tokio::join!(create_as(&app, None, &own), create_as(&app, None, &own));
    for id in [&a, &b] {
        let w = ended_as(&app, None, id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(w["spec"]["target"]["share"], false, "{w}");
    }
    assert_eq!(counts.lock().unwrap().get("none"), Some(&2));
    app.stop().await.0.unwrap();

    let app = App::start_args(set_flag(
        test_args(&dir.sqlite_url()),
        "--share-window",
        "0s",
    ))
    .await;
    let (url, counts) = per_credential_upstream().await;
    let shared = wants_its_own(&url, None);
    let started = Instant::now();
    let (a, b) = tokio::join!(
        create_as(&app, None, &shared),
        create_as(&app, None, &shared)
    );
    for id in [&a, &b] {
        let w = ended_as(&app, None, id).await;
        assert_eq!(w["status"], "succeeded", "{w}");
    }
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(counts.lock().unwrap().get("none"), Some(&2));
    app.stop().await.0.unwrap();
}

/// `share` must be a boolean.
#[tokio::test]
async fn share_that_is_not_a_boolean_is_a_400() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    let mut s = spec("http://127.0.0.1:9/x");
    s["target"]["share"] = json!("no");
    let (code, body) = app.create(s).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("target.share"), "{body}");
    app.stop().await.0.unwrap();
}

/// An upstream at `/tagged` that answers the state in `state` with the `ETag`
/// `"<state>"`, and `304` to an `If-None-Match` naming it; it records every
/// `If-None-Match` it saw. `always_304`: every answer is a `304`.
#[derive(Clone, Default)]
struct Tagged {
    state: Arc<Mutex<String>>,
    conditions: Arc<Mutex<Vec<Option<String>>>>,
    /// Told of every request.
    asked: Arc<tokio::sync::Notify>,
}

impl Tagged {
    /// Whether `check` holds of the requests so far within `within`: looked at
    /// again as each request comes, not on a clock.
    async fn asked(&self, within: Duration, check: impl Fn(&[Option<String>]) -> bool) -> bool {
        let heard = async {
            loop {
                let next = self.asked.notified();
                tokio::pin!(next);
                next.as_mut().enable();
                if check(&self.conditions.lock().unwrap()) {
                    return;
                }
                next.await;
            }
        };
        tokio::time::timeout(within, heard).await.is_ok()
    }
}

async fn tagged_upstream(always_304: bool) -> (String, Tagged) {
    let tagged = Tagged::default();
    *tagged.state.lock().unwrap() = "deploying".into();
    let t = tagged.clone();
    let app = axum::Router::new().route(
        "/tagged",
        axum::routing::get(move |headers: HeaderMap| {
            let t = t.clone();
            async move {
                use axum::response::IntoResponse;
                let seen = headers
                    .get("if-none-match")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                t.conditions.lock().unwrap().push(seen.clone());
                t.asked.notify_waiters();
                let state = t.state.lock().unwrap().clone();
                let tag = format!("\"{state}\"");
                if always_304 || seen.as_deref() == Some(tag.as_str()) {
                    return axum::http::StatusCode::NOT_MODIFIED.into_response();
                }
                (
                    [("etag", tag)],
                    axum::Json(json!({"data": {"attributes": {"status": state}}})),
                )
                    .into_response()
            }
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/tagged", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, tagged)
}

/// `ETag` then `304`: the next requests carry `If-None-Match` with the tag, a
/// `304` reads as the response before, and a body that changes is seen at the
/// next `200`. Shared or not.
async fn a_tag_makes_the_next_request_conditional(app: &App, share: bool) {
    let (url, tagged) = tagged_upstream(false).await;
    let mut s = spec(&url);
    s["target"]["share"] = json!(share);
    let (code, created) = app.create(s).await;
    assert_eq!(code, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let conditional = |seen: &[Option<String>]| {
        seen.iter()
            .filter(|c| c.as_deref() == Some("\"deploying\""))
            .count()
    };
    assert!(
        tagged
            .asked(Duration::from_secs(10), |seen| conditional(seen) >= 3)
            .await,
        "{:?}",
        tagged.conditions.lock().unwrap()
    );
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "a 304 is the state before: {w}");
    assert_eq!(w["state"], "deploying", "{w}");
    assert!(w["last_error"].is_null(), "{w}");
    assert_eq!(w["last_poll"], "not_modified", "{w}");
    *tagged.state.lock().unwrap() = "on".into();
    let w = app.wait_end(id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    let seen = tagged.conditions.lock().unwrap().clone();
    assert_eq!(
        seen[0], None,
        "the first request is unconditional: {seen:?}"
    );
}

#[tokio::test]
async fn a_tag_makes_the_next_request_conditional_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    a_tag_makes_the_next_request_conditional(&app, true).await;
    a_tag_makes_the_next_request_conditional(&app, false).await;
    let metrics = client()
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let not_modified: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("waitd_probe_requests_total{outcome=\"not_modified\"}"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(not_modified >= 6.0, "{metrics}");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_tag_makes_the_next_request_conditional_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    a_tag_makes_the_next_request_conditional(&app, true).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A `304` with no response before it is a transient error that says so.
#[tokio::test]
async fn a_304_to_an_unconditional_request_is_a_transient_error() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    let (url, _) = tagged_upstream(true).await;
    let mut s = spec(&url);
    s["retry"]["max_retries"] = json!(2);
    let (code, created) = app.create(s).await;
    assert_eq!(code, 201, "{created}");
    let w = app.wait_end(created["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        w.to_string()
            .contains("304 Not Modified to a request that was not conditional"),
        "{w}"
    );
    app.stop().await.0.unwrap();
}

/// One host answers `429 Retry-After: 20` to 100 waits of one tenant on it: after
/// the first answer the replica sends it nothing, and a wait whose deadline falls
/// inside the pause ends `timed_out` on time, its reason naming the pause.
async fn a_host_that_asks_for_quiet_gets_it_from_every_wait(app: &App) {
    let up = Upstream::start().await;
    let quiet = || vec![Reply::json(429, json!({})).header("retry-after", "20")];
    let mut paths = Vec::new();
    let mut last = String::new();
    let mut heard = app.heard();
    for i in 0..100 {
        let path = format!("/quiet/{i}");
        let url = up.script(&path, quiet());
        let mut s = every_second(&url);
        s["retry"]["max_retries"] = json!(null);
        let id = create_as(app, None, &s).await;
        last = id.clone();
        paths.push(path);
        if i == 0 {
            // The first answer has paused the host once the wait has read it.
            heard.recorded(&id).await;
            let (_, w) = app.get(&format!("/waits/{id}")).await;
            assert!(
                !w["last_error"].is_null(),
                "the first wait reads its 429: {w}"
            );
        }
    }
    // A wait that falls due while its host is paused sends nothing, and says so.
    let paused = poll_for(Duration::from_secs(10), || async {
        let (_, w) = app.get(&format!("/waits/{last}")).await;
        (w["last_poll"] == "paused").then_some(())
    })
    .await;
    assert!(paused.is_some(), "a wait on a paused host shows it");
    let url = up.script("/quiet/deadline", quiet());
    let mut s = every_second(&url);
    s["timeout"] = json!("3s");
    s["retry"]["max_retries"] = json!(null);
    let created = Instant::now();
    let id = create_as(app, None, &s).await;
    let w = ended_as(app, None, &id).await;
    let took = created.elapsed();
    assert_eq!(w["status"], "timed_out", "{w}");
    assert!(
        took < Duration::from_millis(4500),
        "ended {took:?} after creation: {w}"
    );
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("its polls were held back"), "{w}");
    // Counted over the pause so far: at least the deadline wait's three seconds, in
    // which each of the 100 waits fell due at least twice.
    let sent: usize = paths.iter().map(|p| up.hits(p)).sum::<usize>() + up.hits("/quiet/deadline");
    assert!(
        sent <= 2,
        "{sent} requests to a host that asked for 20 s of quiet"
    );
}

#[tokio::test]
async fn a_host_that_asks_for_quiet_gets_it_on_sqlite() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_args(test_args(&dir.sqlite_url())).await;
    a_host_that_asks_for_quiet_gets_it_from_every_wait(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_host_that_asks_for_quiet_gets_it_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    a_host_that_asks_for_quiet_gets_it_from_every_wait(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// How the last poll came lives in the polling worker's memory: the replica that
/// polls the wait shows it, a replica that does not shows null, and so does the
/// wait once it has ended.
#[tokio::test]
async fn only_the_polling_replica_shows_how_the_last_poll_came() {
    let db = TestDb::new().await;
    let polling = App::start_args(test_args(&db.url)).await;
    let mut api_only = test_args(&db.url);
    api_only.push("--no-worker".into());
    let reading = App::start_args(api_only).await;
    let up = Upstream::start().await;
    let path = "/shared/elsewhere";
    let url = up.script(path, vec![Reply::status("deploying")]);
    let mut heard = polling.heard();
    let id = create_as(&polling, None, &every_second(&url)).await;
    // The first poll's state is in the store once the worker has taken in its answer.
    heard.recorded(&id).await;
    let (_, w) = polling.get(&format!("/waits/{id}")).await;
    assert_eq!(
        w["last_poll"], "sent",
        "the polling replica shows its own request: {w}"
    );
    let (code, there) = reading.get(&format!("/waits/{id}")).await;
    assert_eq!(code, 200, "{there}");
    assert_eq!(there["status"], "running", "{there}");
    assert!(there["last_poll"].is_null(), "{there}");

    up.script(path, vec![Reply::status("on")]);
    let w = ended_as(&polling, None, &id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(w["last_poll"].is_null(), "an ended wait shows null: {w}");

    reading.stop().await.0.unwrap();
    polling.stop().await.0.unwrap();
    db.drop_db().await;
}

/// The sum of a metric's samples in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A host that asks one replica for quiet gets it from every replica: the pause
/// goes to the others through Postgres, and the waits they hold on that host send
/// nothing until it ends.
#[tokio::test]
async fn a_host_pause_reaches_the_other_replicas() {
    let db = TestDb::new().await;
    // `a` holds at most ten waits, so `b` holds the rest.
    let a = App::start_with(&db, &["--capacity", "10"]).await;
    let b = App::start(&db).await;
    let up = Upstream::start().await;
    let (mut heard_a, mut heard_b) = (a.heard(), b.heard());
    let mut calm = Vec::new();
    for i in 0..20 {
        let path = format!("/calm/{i}");
        let mut s = every_second(&up.script(&path, vec![Reply::status("deploying")]));
        s["poll"] = json!({"initial": "100ms", "factor": 1, "max": "100ms", "jitter": 0});
        create_as(&a, None, &s).await;
        calm.push(path);
    }
    for heard in [&mut heard_a, &mut heard_b] {
        heard
            .expect(
                "a claim of waits on the host",
                |s| matches!(s, signals::Signal::Claimed(ids) if !ids.is_empty()),
            )
            .await;
    }
    let owners = db_count(
        &db,
        "SELECT count(DISTINCT s.holder) FROM waits w JOIN slots s ON s.id = w.owner
         WHERE w.status = 'running'",
    )
    .await;
    assert_eq!(owners, 2, "both replicas hold waits on the host");
    let hits = |up: &Upstream| calm.iter().map(|p| up.hits(p)).sum::<usize>();
    // The calm paths are being polled (about 200 requests a second) before the pause.
    let before = hits(&up);
    assert!(
        up.requested(Duration::from_secs(10), |up| hits(up) >= before + 20)
            .await,
        "the calm paths are polled"
    );

    let limited = up.script(
        "/limited",
        vec![Reply::json(429, json!({})).header("retry-after", "20")],
    );
    create_as(&b, None, &every_second(&limited)).await;
    assert!(up.hit("/limited", 1, Duration::from_secs(10)).await);
    // Both replicas keep the host quiet within a second or two of the answer.
    let both = poll_for(Duration::from_secs(3), || async {
        let (ma, mb) = (a.metrics().await, b.metrics().await);
        let paused = |m: &str| metric(m, "waitd_host_paused_seconds_total") > 10.0;
        (paused(&ma) && paused(&mb)).then_some(())
    })
    .await;
    assert!(both.is_some(), "a replica did not hear of the pause");
    let from = hits(&up);
    // 20 waits at 100 ms would send about 600 requests in these 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = hits(&up) - from;
    assert!(sent <= 2, "{sent} requests to a paused host in 3 s");
    b.stop().await.0.unwrap();
    a.stop().await.0.unwrap();
    db.drop_db().await;
}

/// `--host-rate`: two replicas with a rate of 10 a second to one host send about
/// 10 a second between them, however many waits they hold on it.
#[tokio::test]
async fn a_host_rate_is_shared_by_the_replicas_alive() {
    let db = TestDb::new().await;
    let a = App::start_with(&db, &["--capacity", "10", "--host-rate", "10"]).await;
    let b = App::start_with(&db, &["--host-rate", "10"]).await;
    let up = Upstream::start().await;
    let mut paths = Vec::new();
    for i in 0..20 {
        let path = format!("/rated/{i}");
        let mut s = every_second(&up.script(&path, vec![Reply::status("deploying")]));
        s["poll"] = json!({"initial": "50ms", "factor": 1, "max": "50ms", "jitter": 0});
        create_as(&a, None, &s).await;
        paths.push(path);
    }
    // Both replicas hold waits and count each other.
    let counted = poll_for(Duration::from_secs(15), || async {
        let (ma, mb) = (a.metrics().await, b.metrics().await);
        let two = |m: &str| metric(m, "waitd_host_rate_replicas") == 2.0;
        (two(&ma) && two(&mb)).then_some(())
    })
    .await;
    assert!(counted.is_some(), "the replicas did not count each other");
    let owners = db_count(
        &db,
        "SELECT count(DISTINCT s.holder) FROM waits w JOIN slots s ON s.id = w.owner
         WHERE w.status = 'running'",
    )
    .await;
    assert_eq!(owners, 2, "both replicas hold waits on the host");
    // Turns each replica took alone (10 a second) before they counted each other
    // are used up within a second: at most one a held wait.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hits = |up: &Upstream| paths.iter().map(|p| up.hits(p)).sum::<usize>();
    let from = hits(&up);
    let started = Instant::now();
    // 20 waits at 50 ms would send 400 requests a second without the rate.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let per_second = (hits(&up) - from) as f64 / started.elapsed().as_secs_f64();
    println!("two replicas, --host-rate 10, 20 waits at 50 ms: {per_second:.1} requests/s");
    assert!(
        (5.0..=12.0).contains(&per_second),
        "{per_second:.1} requests a second to a host limited to 10"
    );
    b.stop().await.0.unwrap();
    a.stop().await.0.unwrap();
    db.drop_db().await;
}
