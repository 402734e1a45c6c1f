//! `grpc://host:port[/service]` targets through the API, against a health server
//! written here with hyper (HTTP/2 without TLS): a service that flips to
//! SERVING, one the server does not know yet, a server without the health
//! service, answers that are not a health check's, conditions on the map `grpc`,
//! and the mistakes refused by name.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::*;

/// How the server answers a `Check` for one service, in turn; the last repeats.
#[derive(Clone, Debug)]
pub(crate) enum Says {
    /// A serving status by number (1 SERVING, 2 NOT_SERVING).
    Status(u8),
    /// A gRPC status other than OK, trailers-only.
    Code(u32),
    /// A body of this many bytes of junk.
    Junk(usize),
}

#[derive(Clone, Default)]
pub(crate) struct Health {
    script: Arc<Mutex<HashMap<String, Vec<Says>>>>,
    checks: Arc<Mutex<Vec<String>>>,
}

impl Health {
    pub(crate) async fn start(self) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let me = self.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let me = me.clone();
                        async move { Ok::<_, Infallible>(me.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    pub(crate) fn says(&self, service: &str, turns: Vec<Says>) {
        self.script
            .lock()
            .unwrap()
            .insert(service.to_string(), turns);
    }

    async fn answer(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<
        StreamBody<
            futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>,
        >,
    > {
        assert_eq!(req.headers()["content-type"], "application/grpc");
        assert_eq!(req.headers()["te"], "trailers");
        let path = req.uri().path().to_string();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let service = if body.len() > 7 {
            String::from_utf8_lossy(&body[7..]).into_owned()
        } else {
            String::new()
        };
        self.checks.lock().unwrap().push(service.clone());
        let says = if path != "/grpc.health.v1.Health/Check" {
            Says::Code(12)
        } else {
            let mut script = self.script.lock().unwrap();
            match script.get_mut(&service) {
                None => Says::Code(5),
                Some(turns) if turns.len() > 1 => turns.remove(0),
                Some(turns) => turns[0].clone(),
            }
        };
        let trailers = |code: u32| {
            let mut t = http::HeaderMap::new();
            t.insert("grpc-status", code.to_string().parse().unwrap());
            t
        };
        let frames: Vec<Result<Frame<Bytes>, Infallible>> = match says {
            Says::Status(s) => vec![
                Ok(Frame::data(Bytes::from(vec![0, 0, 0, 0, 2, 0x08, s]))),
                Ok(Frame::trailers(trailers(0))),
            ],
            Says::Junk(n) => vec![
                Ok(Frame::data(Bytes::from(vec![7u8; n]))),
                Ok(Frame::trailers(trailers(0))),
            ],
            Says::Code(_) => vec![],
        };
        let mut res = hyper::Response::builder()
            .status(200)
            .header("content-type", "application/grpc");
        if let Says::Code(code) = says {
            res = res.header("grpc-status", code.to_string());
        }
        res.body(StreamBody::new(futures_util::stream::iter(frames)))
            .unwrap()
    }
}

fn grpc(url: &str) -> Value {
    json!({
        "target": {"url": url},
        "timeout": "20s",
        "poll": {"initial": "5ms", "max": "5ms", "factor": 1, "jitter": 0},
        "retry": {"delay": "5ms", "max_delay": "5ms"}
    })
}

async fn created(app: &App, spec: Value) -> String {
    let (code, w) = app.create(spec).await;
    assert_eq!(code, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

async fn a_service_that_comes_up_is_waited_for(app: &App) {
    let health = Health::default();
    health.says("", vec![Says::Status(2), Says::Status(2), Says::Status(1)]);
    let addr = health.clone().start().await;
    let id = created(app, grpc(&format!("grpc://{addr}"))).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["state"], "SERVING", "{w}");
    assert_eq!(w["spec"]["want"], json!(["SERVING"]), "{w}");
    assert!(w["polls"].as_i64().unwrap() >= 3, "{w}");

    // A service the server does not know yet is progress, not a retry, until
    // it is registered.
    let mut heard = app.heard();
    let id = created(app, grpc(&format!("grpc://{addr}/shop.Orders"))).await;
    heard.recorded(&id).await;
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(
        (w["status"].as_str(), w["state"].as_str()),
        (Some("running"), Some("SERVICE_UNKNOWN")),
        "{w}"
    );
    assert_eq!(w["retries"], 0, "{w}");
    health.says("shop.Orders", vec![Says::Status(1)]);
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(
        health
            .checks
            .lock()
            .unwrap()
            .contains(&"shop.Orders".to_string())
    );
}

#[tokio::test]
async fn a_grpc_wait_succeeds_when_the_service_is_serving() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    a_service_that_comes_up_is_waited_for(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_grpc_wait_on_sqlite_succeeds_when_the_service_is_serving() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    a_service_that_comes_up_is_waited_for(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn conditions_read_the_map_grpc_and_bad_answers_are_retried_then_bounded() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let health = Health::default();
    health.says("a.A", vec![Says::Status(2)]);
    // An answer past the read bound, then a good one.
    health.says("b.B", vec![Says::Junk(64 * 1024), Says::Status(1)]);
    let addr = health.clone().start().await;
    let mut s = grpc(&format!("grpc://{addr}/a.A"));
    s["success_condition"] =
        json!("grpc.status == 'NOT_SERVING' && grpc.code == 0 && grpc.elapsed < duration('10s')");
    let id = created(&app, s).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");

    let id = created(&app, grpc(&format!("grpc://{addr}/b.B"))).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(w["retries"].as_i64().unwrap() >= 1, "{w}");
    let (_, events) = app.get(&format!("/waits/{id}/events")).await;
    assert!(
        events.to_string().contains("could not be read"),
        "the oversized answer is a retry that says so: {events}"
    );

    // A server without the health service ends the wait in error.
    let mut s = grpc(&format!("grpc://{addr}/c.C"));
    s["target"]["url"] = json!(format!("grpc://{addr}/c.C"));
    health.says("c.C", vec![Says::Code(12)]);
    let id = created(&app, s).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        w["reason"].as_str().unwrap().contains("UNIMPLEMENTED"),
        "{w}"
    );
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn grpc_mistakes_are_refused_naming_the_field() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    for (spec, field) in [
        (grpc("grpc://127.0.0.1"), "target.url"),
        (grpc("grpc://127.0.0.1:50051/bad service"), "target.url"),
        (grpc("grpc://127.0.0.1:50051/a/b"), "target.url"),
        (grpc("grpc://127.0.0.1:50051?x=1"), "target.url"),
        (
            {
                let mut s = grpc("grpc://127.0.0.1:50051");
                s["state"] = json!("/status");
                s
            },
            "state",
        ),
        (
            {
                let mut s = grpc("grpc://127.0.0.1:50051");
                s["target"]["headers"] = json!({"a": "b"});
                s
            },
            "target.headers",
        ),
    ] {
        let (code, body) = app.create(spec.clone()).await;
        assert_eq!(code, 400, "{spec}: {body}");
        assert_eq!(body["errors"][0]["field"], field, "{spec}: {body}");
    }
    // The guard judges the address at creation, as for http.
    let (code, body) = app.create(grpc("grpc://10.0.0.7:50051")).await;
    assert_eq!(code, 422, "{body}");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn the_grpc_serving_preset_waits_for_a_service() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let health = Health::default();
    health.says("", vec![Says::Status(1)]);
    health.says("shop.Orders", vec![Says::Status(2), Says::Status(1)]);
    let addr = health.clone().start().await;
    for params in [
        json!({"address": addr}),
        json!({"address": addr, "service": "/shop.Orders"}),
    ] {
        let (code, w) = app
            .create(json!({"preset": "grpc.serving", "params": params, "poll": {"initial": "5ms", "max": "5ms"}}))
            .await;
        assert_eq!(code, 201, "{w}");
        let w = app.wait_end(w["id"].as_str().unwrap()).await;
        assert_eq!(w["status"], "succeeded", "{params}: {w}");
    }
    app.stop().await.0.unwrap();
}

/// Two waits of one tenant asking one service's health share one check a
/// poll (counted at the server); each still counts its own polls.
#[tokio::test]
async fn two_grpc_waits_on_one_service_share_its_checks() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    let health = Health::default();
    health.says("shop.Orders", vec![Says::Status(2)]);
    let addr = health.clone().start().await;
    let mut s = grpc(&format!("grpc://{addr}/shop.Orders"));
    s["poll"] = json!({"initial": "200ms", "max": "200ms", "factor": 1, "jitter": 0});
    let from = health.checks.lock().unwrap().len();
    let ids = [created(&app, s.clone()).await, created(&app, s).await];
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let mut polls = 0;
    for id in &ids {
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["state"], "NOT_SERVING", "{w}");
        polls += w["polls"].as_i64().unwrap();
    }
    let checked = health.checks.lock().unwrap().len() - from;
    println!("two waits at 200 ms, 3 s: {checked} checks for {polls} polls");
    // Alone, every poll checks; shared, two polls make one check.
    assert!(polls >= 6, "each wait counts its own polls: {polls}");
    assert!(
        checked as i64 * 3 <= polls * 2 + 6,
        "{checked} checks for {polls} polls"
    );
    app.stop().await.0.unwrap();
}
