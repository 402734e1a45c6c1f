//! `tcp://host:port` targets through the API: a listener that accepts, a port
//! that refuses and then opens, conditions on the map `tcp`, the guard, and
//! the mistakes refused by name.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::replica::closed_addr;
use crate::support::*;

fn tcp(addr: &str) -> Value {
    json!({
        "target": {"url": format!("tcp://{addr}")},
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

/// A port nothing listens on.
async fn closed_port() -> String {
    closed_addr().to_string()
}

async fn a_port_that_opens_is_waited_for(app: &App) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let id = created(app, tcp(&addr.to_string())).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["spec"]["want"], json!(["connected"]), "{w}");
    assert_eq!(w["spec"]["target"]["url"], format!("tcp://{addr}"));

    // Refused while nothing listens: polled, never ended, until it opens.
    drop(listener);
    let addr = closed_addr();
    let mut heard = app.heard();
    let id = created(app, tcp(&addr.to_string())).await;
    heard.recorded(&id).await;
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    assert_eq!(w["state"], "refused", "{w}");
    assert_eq!(
        w["retries"], 0,
        "a closed port is progress, not a retry: {w}"
    );
    let _open = TcpListener::bind(addr).await.unwrap();
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
}

#[tokio::test]
async fn a_tcp_wait_succeeds_when_the_port_accepts() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    a_port_that_opens_is_waited_for(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_tcp_wait_on_sqlite_succeeds_when_the_port_accepts() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    a_port_that_opens_is_waited_for(&app).await;
    app.stop().await.0.unwrap();
}

/// Conditions read `tcp.connected`, `tcp.elapsed`, `tcp.address`; `want:
/// ["refused"]` waits for a port to close.
#[tokio::test]
async fn conditions_and_want_read_the_connection() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = listener.local_addr().unwrap().to_string();
    let closed = closed_port().await;

    let mut fast = tcp(&open);
    fast["success_condition"] = json!(format!(
        "tcp.connected && tcp.elapsed < duration('5s') && tcp.address == '{open}' && tcp.error == null"
    ));
    let w = app.wait_end(&created(&app, fast).await).await;
    assert_eq!(w["status"], "succeeded", "{w}");

    let mut gone = tcp(&closed);
    gone["failure_condition"] = json!("!tcp.connected && tcp.error == 'connection refused'");
    let w = app.wait_end(&created(&app, gone).await).await;
    assert_eq!(w["status"], "failed", "{w}");

    let mut closes = tcp(&closed);
    closes["want"] = json!(["refused"]);
    let w = app.wait_end(&created(&app, closes).await).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    drop(listener);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// The guard judges the host as for any target; each mistake is a 400 naming
/// its field.
#[tokio::test]
async fn a_tcp_target_is_guarded_and_its_mistakes_named() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    // Never connected to: refused at creation, however the address is written.
    for addr in ["10.0.0.7:5432", "0x0a.7:5432", "[fd00::7]:5432"] {
        let (code, body) = app.create(tcp(addr)).await;
        assert_eq!(code, 422, "{addr}: {body}");
        assert!(body.to_string().contains("target.url"), "{body}");
    }
    let cases = [
        (json!({"url": "tcp://127.0.0.1"}), None, "has no port"),
        (
            json!({"url": "tcp://127.0.0.1:5432/db"}),
            None,
            "has a path",
        ),
        (
            json!({"url": "tcp://127.0.0.1:5432", "headers": {"A": "b"}}),
            None,
            "only connects",
        ),
        (
            json!({"url": "tcp://127.0.0.1:5432", "method": "POST"}),
            None,
            "only connects",
        ),
        (
            json!({"url": "tcp://127.0.0.1:5432"}),
            Some(("state", json!("/status"))),
            "\"connected\" or \"refused\"",
        ),
    ];
    for (target, extra, says) in cases {
        let mut s = tcp("127.0.0.1:1");
        s["target"] = target;
        if let Some((k, v)) = extra {
            s[k] = v;
        }
        let (code, body) = app.create(s).await;
        assert_eq!(code, 400, "{body}");
        assert!(
            body["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["message"].as_str().unwrap().contains(says)),
            "{says}: {body}"
        );
    }
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A listener whose backlog is full never accepts: the poll ends at the probe
/// timeout, a transient error, and the wait still ends by its deadline.
#[tokio::test]
async fn a_port_that_never_accepts_ends_by_the_deadline() {
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--probe-timeout", "300ms"]).await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    // Fill the backlog: later handshakes go unanswered.
    let mut held = Vec::new();
    for _ in 0..8 {
        if let Ok(Ok(s)) = tokio::time::timeout(
            Duration::from_millis(200),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            held.push(s);
        }
    }
    let mut s = tcp(&addr.to_string());
    s["timeout"] = json!("2s");
    let w = app.wait_end(&created(&app, s).await).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    // Each poll waited out the probe timeout, a retry: at most seven in 2 s.
    let retries = w["retries"].as_u64().unwrap();
    assert!((1..=7).contains(&retries), "{w}");
    drop(listener);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[test]
fn the_openapi_document_offers_tcp_targets() {
    let doc: Value = serde_json::from_str(waitd::api::openapi::document()).unwrap();
    let pattern = doc["components"]["schemas"]["PollUrl"]["pattern"]
        .as_str()
        .unwrap();
    let re = regex_automata::meta::Regex::new(pattern).unwrap();
    for ok in [
        "https://api.example.com/x",
        "tcp://db.internal:5432",
        "TCP://[::1]:80",
    ] {
        assert!(re.is_match(ok), "{ok}");
    }
    for refused in [
        "tcp://db.internal",
        "tcp://:80",
        "tcp://a b:80",
        "udp://a:53",
    ] {
        assert!(!re.is_match(refused), "{refused:?}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Any text after `tcp://` (past the length limit too) is refused by a
    /// sentence naming target.url, or accepted as `tcp://host:port` that reads
    /// back the same and that the guard can judge.
    #[test]
    fn any_tcp_address_is_refused_by_name_or_read_back_the_same(
        rest in "[ -~\u{80}-\u{10ffff}]{0,40}|[a-z0-9.:\\[\\]%@/?#-]{0,3000}",
    ) {
        let limits = waitd::engine::Limits::default();
        let request = json!({"target": {"url": format!("tcp://{rest}")}});
        match waitd::engine::Spec::from_request(&request, &limits) {
            Err(errors) => proptest::prop_assert!(
                errors.iter().any(|e| e.field == "target.url"),
                "{errors:?}"
            ),
            Ok(spec) => {
                let url = url::Url::parse(&spec.target.as_ref().unwrap().url).unwrap();
                proptest::prop_assert_eq!(url.scheme(), "tcp");
                proptest::prop_assert!(url.port().is_some());
                proptest::prop_assert!(spec.target.as_ref().unwrap().url.len() <= limits.max_url_len);
                let again = serde_json::to_value(&spec).unwrap();
                let back = waitd::engine::Spec::from_request(&again, &limits).unwrap();
                proptest::prop_assert_eq!(&back.target.as_ref().unwrap().url, &spec.target.as_ref().unwrap().url);
            }
        }
    }
}

#[test]
fn a_tcp_address_is_read_in_its_normal_form_and_back() {
    let limits = waitd::engine::Limits::default();
    for (given, normal) in [
        ("tcp://DB.Internal:5432", "tcp://db.internal:5432"),
        ("TCP://0x7f.1:80/", "tcp://127.0.0.1:80"),
        ("tcp://[::1]:8080", "tcp://[::1]:8080"),
    ] {
        let spec =
            waitd::engine::Spec::from_request(&json!({"target": {"url": given}}), &limits).unwrap();
        assert_eq!(spec.target.as_ref().unwrap().url, normal);
        assert_eq!(spec.want, ["connected"]);
        let again = serde_json::to_value(&spec).unwrap();
        let back = waitd::engine::Spec::from_request(&again, &limits).unwrap();
        assert_eq!(back, spec);
    }
}

/// Two waits of one tenant on one port share one connection a poll (counted
/// at the listener), as two on one URL share a request; each still counts its
/// own polls.
#[tokio::test]
async fn two_tcp_waits_on_one_port_share_its_connections() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(stream);
        }
    });
    // Connected is not what they wait for: both keep polling.
    let mut s = tcp(&addr);
    s["want"] = json!(["refused"]);
    s["poll"] = json!({"initial": "200ms", "max": "200ms", "factor": 1, "jitter": 0});
    let from = accepted.load(std::sync::atomic::Ordering::SeqCst);
    let ids = [created(&app, s.clone()).await, created(&app, s).await];
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut polls = 0;
    for id in &ids {
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["state"], "connected", "{w}");
        polls += w["polls"].as_i64().unwrap();
    }
    let made = accepted.load(std::sync::atomic::Ordering::SeqCst) - from;
    println!("two waits at 200 ms, 3 s: {made} connections for {polls} polls");
    // Alone, every poll connects; shared, two polls make one connection.
    assert!(polls >= 6, "each wait counts its own polls: {polls}");
    assert!(
        made as i64 * 3 <= polls * 2 + 6,
        "{made} connections for {polls} polls"
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}
