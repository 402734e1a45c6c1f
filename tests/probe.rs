//! The prober against a real HTTP server on 127.0.0.1: one scripted upstream per test
//! (status, headers, body, delay), and the SSRF guard around it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Response, StatusCode};
use serde_json::{Value, json};
use waitd::engine::{Limits, Observation, Spec};
use waitd::probe::{Guard, Polled, ProbeConfig, Prober};

/// One scripted answer.
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    delay: Duration,
    /// Stream an endless body instead of `body` (no Content-Length).
    endless: bool,
}

impl Reply {
    fn new(status: u16, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
            endless: false,
        }
    }

    fn json(status: u16, body: Value) -> Reply {
        Reply::new(status, body.to_string()).header("content-type", "application/json")
    }

    fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    fn delay(mut self, d: Duration) -> Reply {
        self.delay = d;
        self
    }
}

/// What the upstream saw.
#[derive(Clone, Default)]
struct Seen {
    hits: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    headers: Arc<Mutex<Vec<HeaderMap>>>,
    /// Told of every request, for [`Seen::hit`].
    arrived: Arc<tokio::sync::Notify>,
}

impl Seen {
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Whether at least `n` requests have come within `within`: woken by each one.
    async fn hit(&self, n: usize, within: Duration) -> bool {
        crate::support::heard_that(&self.arrived, within, || self.hits() >= n).await
    }
}

/// Serves `reply` on every path of a fresh server on 127.0.0.1:0.
async fn upstream(reply: Reply) -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let s = seen.clone();
    let app = Router::new().fallback(move |headers: HeaderMap| {
        let reply = reply.clone();
        let s = s.clone();
        async move {
            s.hits.fetch_add(1, Ordering::SeqCst);
            s.headers.lock().unwrap().push(headers);
            s.arrived.notify_waiters();
            let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            s.max_in_flight.fetch_max(now, Ordering::SeqCst);
            // Pacing: a reply's scripted delay.
            tokio::time::sleep(reply.delay).await;
            s.in_flight.fetch_sub(1, Ordering::SeqCst);
            let mut response =
                Response::builder().status(StatusCode::from_u16(reply.status).unwrap());
            for (name, value) in &reply.headers {
                response = response.header(*name, value);
            }
            let body = if reply.endless {
                Body::from_stream(futures_util::stream::repeat_with(|| {
                    Ok::<_, std::convert::Infallible>(Bytes::from_static(&[b' '; 512]))
                }))
            } else {
                Body::from(reply.body)
            };
            response.body(body).unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (addr, seen)
}

/// A validated spec polling `url` for `/status`, with `extra` fields merged in.
fn spec(url: &str, extra: Value) -> Spec {
    let mut request = json!({
        "target": { "url": url },
        "state": "/status",
        "want": ["on"],
    });
    for (k, v) in extra.as_object().unwrap() {
        request[k] = v.clone();
    }
    Spec::from_request(&request, &Limits::default()).unwrap()
}

/// The tests' guard opens 127.0.0.1 explicitly.
fn config() -> ProbeConfig {
    ProbeConfig {
        timeout: Duration::from_secs(5),
        guard: Guard::new(&["127.0.0.1".to_string()]).unwrap(),
        ..ProbeConfig::default()
    }
}

fn prober(config: ProbeConfig) -> Prober {
    Prober::new(config).unwrap()
}

/// Probes one scripted reply with the default test prober and the default spec.
async fn observe(reply: Reply) -> Observation {
    let (addr, _) = upstream(reply).await;
    prober(config())
        .probe(&spec(&format!("http://{addr}/target"), json!({})))
        .await
}

fn permanent(o: Observation) -> String {
    match o {
        Observation::Permanent { error } => error,
        other => panic!("expected a permanent error, got {other:?}"),
    }
}

fn transient(o: Observation) -> (String, Option<Duration>) {
    match o {
        Observation::Transient { error, retry_after } => (error, retry_after),
        other => panic!("expected a transient error, got {other:?}"),
    }
}

fn missing(o: Observation) -> String {
    match o {
        Observation::Missing { reason } => reason,
        other => panic!("expected a missing state, got {other:?}"),
    }
}

// ---- 2xx bodies ----

#[tokio::test]
async fn a_2xx_json_body_with_the_state_is_a_state_observation() {
    let o = observe(Reply::json(200, json!({"status": "deploying"}))).await;
    assert_eq!(
        o,
        Observation::State {
            values: vec!["deploying".into()],
            detail: None
        }
    );
}

#[tokio::test]
async fn any_2xx_status_with_json_counts_and_content_type_is_not_required() {
    let o =
        observe(Reply::new(201, r#"{"status": true}"#).header("content-type", "text/plain")).await;
    assert_eq!(
        o,
        Observation::State {
            values: vec!["true".into()],
            detail: None
        }
    );
}

#[tokio::test]
async fn the_error_detail_is_read_from_the_error_path() {
    let (addr, _) = upstream(Reply::json(
        200,
        json!({"properties": {"provisioningState": "Failed",
                "status": {"provisioningError": {"code": "SkuNotAvailable", "message": "no"}}}}),
    ))
    .await;
    let s = spec(
        &format!("http://{addr}/vm"),
        json!({"state": "/properties/provisioningState", "want": ["Succeeded"], "fail": ["Failed"],
               "error": "/properties/status/provisioningError"}),
    );
    let o = prober(config()).probe(&s).await;
    assert_eq!(
        o,
        Observation::State {
            values: vec!["Failed".into()],
            detail: Some(json!({"code": "SkuNotAvailable", "message": "no"}))
        }
    );
}

#[tokio::test]
async fn a_jsonpath_state_yields_every_matching_value() {
    let (addr, _) = upstream(Reply::json(
        200,
        json!({"items": [{"ready": "yes"}, {"ready": "no"}, {"ready": 3}, {"other": 1}]}),
    ))
    .await;
    let s = spec(
        &format!("http://{addr}/"),
        json!({"state": "$.items[*].ready", "want": ["yes"]}),
    );
    let o = prober(config()).probe(&s).await;
    assert_eq!(
        o,
        Observation::State {
            values: vec!["yes".into(), "no".into(), "3".into()],
            detail: None
        }
    );
}

#[tokio::test]
async fn a_2xx_body_with_a_null_state_is_missing() {
    let reason = missing(observe(Reply::json(200, json!({"status": null}))).await);
    assert_eq!(reason, "the value at /status is null");
}

#[tokio::test]
async fn a_2xx_body_without_the_state_is_missing() {
    let reason = missing(observe(Reply::json(200, json!({"data": {}}))).await);
    assert_eq!(reason, "the response has no value at /status");
}

#[tokio::test]
async fn a_2xx_body_that_is_not_json_is_missing() {
    let reason = missing(observe(Reply::new(200, "<html>hello</html>")).await);
    assert_eq!(reason, "the response body is not JSON");
}

#[tokio::test]
async fn an_empty_2xx_body_is_missing() {
    let reason = missing(observe(Reply::new(204, "")).await);
    assert!(reason.contains("empty"), "{reason}");
}

// ---- statuses ----

#[tokio::test]
async fn not_found_and_gone_are_not_found_observations() {
    for status in [404, 410] {
        let o = observe(Reply::json(status, json!({"status": "on"}))).await;
        assert_eq!(o, Observation::NotFound { status }, "{status}");
    }
}

#[tokio::test]
async fn the_retryable_statuses_are_transient_and_named() {
    for (status, words) in [
        (408, "408 Request Timeout"),
        (425, "425 Too Early"),
        (429, "429 Too Many Requests"),
        (500, "500 Internal Server Error"),
        (502, "502 Bad Gateway"),
        (503, "503 Service Unavailable"),
        (504, "504 Gateway Timeout"),
    ] {
        let (error, retry_after) = transient(observe(Reply::new(status, "busy")).await);
        assert_eq!(error, format!("the target answered {words}"));
        assert_eq!(retry_after, None, "{status}");
    }
}

#[tokio::test]
async fn every_other_status_is_permanent_and_named() {
    for (status, words) in [
        (400, "400 Bad Request"),
        (401, "401 Unauthorized"),
        (403, "403 Forbidden"),
        (405, "405 Method Not Allowed"),
        (422, "422 Unprocessable Entity"),
        (501, "501 Not Implemented"),
        (505, "505 HTTP Version Not Supported"),
    ] {
        let error = permanent(observe(Reply::json(status, json!({"status": "on"}))).await);
        assert_eq!(error, format!("the target answered {words}"));
    }
}

#[tokio::test]
async fn a_redirect_is_not_followed_and_is_permanent() {
    for status in [301, 302, 307, 308] {
        let (addr, seen) =
            upstream(Reply::new(status, "").header("location", "/elsewhere?sig=s3cr3t")).await;
        let error = permanent(
            prober(config())
                .probe(&spec(&format!("http://{addr}/target"), json!({})))
                .await,
        );
        assert!(
            error.starts_with(&format!("the target answered {status}")),
            "{error}"
        );
        assert!(error.contains("does not follow redirects"), "{error}");
        assert!(!error.contains("s3cr3t"), "{error}");
        assert_eq!(seen.hits(), 1, "the redirect to /elsewhere was followed");
    }
}

// ---- Retry-After ----

#[tokio::test]
async fn retry_after_in_seconds_is_the_transient_lower_bound() {
    let (_, ra) = transient(observe(Reply::new(503, "").header("retry-after", "7")).await);
    assert_eq!(ra, Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn retry_after_as_an_http_date_counts_from_now() {
    let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
    let (_, ra) = transient(observe(Reply::new(429, "").header("retry-after", at)).await);
    let ra = ra.expect("a bound");
    assert!(
        ra >= Duration::from_secs(110) && ra <= Duration::from_secs(120),
        "{ra:?}"
    );
}

#[tokio::test]
async fn retry_after_in_the_past_sets_no_bound() {
    let at = httpdate::fmt_http_date(SystemTime::now() - Duration::from_secs(120));
    let (_, ra) = transient(observe(Reply::new(503, "").header("retry-after", at)).await);
    assert_eq!(ra, None);
}

#[tokio::test]
async fn retry_after_in_milliseconds_wins_over_seconds() {
    let (_, ra) = transient(
        observe(
            Reply::new(429, "")
                .header("retry-after-ms", "250")
                .header("retry-after", "9"),
        )
        .await,
    );
    assert_eq!(ra, Some(Duration::from_millis(250)));
    let (_, ra) =
        transient(observe(Reply::new(503, "").header("x-ms-retry-after-ms", "1500")).await);
    assert_eq!(ra, Some(Duration::from_millis(1500)));
}

// ---- limits and failures ----

#[tokio::test]
async fn a_body_over_the_cap_is_permanent() {
    let (addr, _) = upstream(Reply::json(
        200,
        json!({"status": "on", "pad": "x".repeat(2000)}),
    ))
    .await;
    let p = prober(ProbeConfig {
        max_body: 1024,
        ..config()
    });
    let error = permanent(p.probe(&spec(&format!("http://{addr}/"), json!({}))).await);
    assert_eq!(error, "the response body exceeded the 1 KiB limit");
}

#[tokio::test]
async fn a_body_at_the_cap_is_read() {
    let body = format!(r#"{{"status":"on","pad":"{}"}}"#, "x".repeat(100));
    let len = body.len();
    let (addr, _) = upstream(Reply::new(200, body)).await;
    let p = prober(ProbeConfig {
        max_body: len,
        ..config()
    });
    let o = p.probe(&spec(&format!("http://{addr}/"), json!({}))).await;
    assert!(matches!(o, Observation::State { .. }), "{o:?}");
}

#[tokio::test]
async fn an_endless_body_is_cut_off_at_the_cap_while_streaming() {
    let mut reply = Reply::new(200, "");
    reply.endless = true;
    let (addr, _) = upstream(reply).await;
    let p = prober(ProbeConfig {
        max_body: 64 * 1024,
        timeout: Duration::from_secs(5),
        ..config()
    });
    let started = Instant::now();
    let error = permanent(p.probe(&spec(&format!("http://{addr}/"), json!({}))).await);
    assert_eq!(error, "the response body exceeded the 64 KiB limit");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_hanging_target_times_out_as_transient() {
    let (addr, _) =
        upstream(Reply::json(200, json!({"status": "on"})).delay(Duration::from_secs(30))).await;
    let p = prober(ProbeConfig {
        timeout: Duration::from_millis(200),
        ..config()
    });
    let started = Instant::now();
    let (error, ra) = transient(p.probe(&spec(&format!("http://{addr}/"), json!({}))).await);
    assert_eq!(error, "the target did not answer within 200ms");
    assert_eq!(ra, None);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_refused_connection_is_transient() {
    let addr = crate::support::replica::closed_addr();
    let (error, _) = transient(
        prober(config())
            .probe(&spec(&format!("http://{addr}/?token=t0ken"), json!({})))
            .await,
    );
    assert!(
        error.starts_with("could not connect to the target: "),
        "{error}"
    );
    assert!(error.to_lowercase().contains("refused"), "{error}");
    assert!(!error.contains("t0ken"), "the URL leaked into: {error}");
}

#[tokio::test]
async fn a_tls_failure_is_transient() {
    // An https URL against a plain-HTTP server: the handshake fails (and the client,
    // with its ring provider, was built).
    let (addr, _) = upstream(Reply::json(200, json!({"status": "on"}))).await;
    let (error, _) = transient(
        prober(config())
            .probe(&spec(&format!("https://{addr}/"), json!({})))
            .await,
    );
    assert!(
        error.starts_with("could not connect to the target: "),
        "{error}"
    );
}

/// A self-signed server certificate for 127.0.0.1 and localhost (no authority signed
/// it), valid until 2126, and its key: made for this test with `openssl req -x509`
/// (`basicConstraints=CA:FALSE`, `extendedKeyUsage=serverAuth`).
const SELF_SIGNED_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBvjCCAWSgAwIBAgIUPyNJ2YrmYsNKitkVBWMVpRR3YdgwCgYIKoZIzj0EAwIw
FTETMBEGA1UEAwwKd2FpdGQtdGVzdDAgFw0yNjEyMDMwODM4MTZaGA8yMTI2MTEw
OTA4MzgxNlowFTETMBEGA1UEAwwKd2FpdGQtdGVzdDBZMBMGByqGSM49AgEGCCqG
SM49AwEHA0IABH/uodSyc+5Oq0Ume05YKx1NEXYp4sdS+OcUqlEMgm3rE6/orhWv
tUH+xgboChwbduJJURpKAwTtL/3pLfEtSq+jgY8wgYwwHQYDVR0OBBYEFC0NAghR
aMstF0kIQyfhRm8jePRtMB8GA1UdIwQYMBaAFC0NAghRaMstF0kIQyfhRm8jePRt
MBoGA1UdEQQTMBGHBH8AAAGCCWxvY2FsaG9zdDAMBgNVHRMBAf8EAjAAMBMGA1Ud
JQQMMAoGCCsGAQUFBwMBMAsGA1UdDwQEAwIHgDAKBggqhkjOPQQDAgNIADBFAiEA
5MWJ/vgAXSyklKbf1G8n0pL1/zb4ewzTyN8X4TQwdO4CICd5cosLgaJce7FMVcho
R62iIFmQyIe38FFHTh7nQAoI
-----END CERTIFICATE-----";
const SELF_SIGNED_KEY: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg5bJ6z57MQPtS3Q4a
1jvPBvltIuAJjUBwafCARM8o8NShRANCAAR/7qHUsnPuTqtFJntOWCsdTRF2KeLH
UvjnFKpRDIJt6xOv6K4Vr7VB/sYG6AocG3biSVEaSgME7S/96S3xLUqv
-----END PRIVATE KEY-----";

#[tokio::test]
async fn a_target_whose_certificate_no_authority_signed_is_never_sent_the_request() {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = CertificateDer::from_pem_slice(SELF_SIGNED_CERT.as_bytes()).unwrap();
    let key = PrivateKeyDer::from_pem_slice(SELF_SIGNED_KEY.as_bytes()).unwrap();
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handshakes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let done = handshakes.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if acceptor.accept(tcp).await.is_ok() {
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    for host in ["127.0.0.1".to_string(), "localhost".to_string()] {
        let mut c = config();
        c.guard = Guard::new(&["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
        let url = format!("https://{host}:{}/", addr.port());
        let (error, _) = transient(prober(c).probe(&spec(&url, json!({}))).await);
        assert!(
            error.starts_with("could not connect to the target: ")
                && error.to_lowercase().contains("certificate"),
            "{host}: {error}"
        );
    }
    assert_eq!(
        handshakes.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the client went on with a certificate it cannot trust"
    );
}

#[tokio::test]
async fn the_target_headers_reach_the_server_and_never_an_error_text() {
    let (addr, seen) = upstream(Reply::new(401, "")).await;
    let s = spec(
        &format!("http://{addr}/"),
        json!({"target": {"url": format!("http://{addr}/"),
                          "headers": {"Authorization": "Bearer s3cr3t-token", "X-Api-Key": "k3y-value"}}}),
    );
    let error = permanent(prober(config()).probe(&s).await);
    assert_eq!(error, "the target answered 401 Unauthorized");
    let headers = seen.headers.lock().unwrap()[0].clone();
    assert_eq!(headers["authorization"], "Bearer s3cr3t-token");
    assert_eq!(headers["x-api-key"], "k3y-value");
    assert_eq!(headers["accept"], "application/json");
    assert!(
        headers["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("waitd/"),
        "{:?}",
        headers["user-agent"]
    );
}

#[tokio::test]
async fn a_probe_names_its_replica_only_when_one_is_configured() {
    let (addr, seen) = upstream(Reply::json(200, json!({"status": "on"}))).await;
    let s = spec(&format!("http://{addr}/"), json!({}));
    prober(config()).probe(&s).await;
    prober(ProbeConfig {
        identity: Some("replica-b".into()),
        ..config()
    })
    .probe(&s)
    .await;
    let headers = seen.headers.lock().unwrap().clone();
    assert!(
        headers[0].get("waitd-replica").is_none(),
        "{:?}",
        headers[0]
    );
    assert_eq!(headers[1]["waitd-replica"], "replica-b");
    let bad = Prober::new(ProbeConfig {
        identity: Some("two\nlines".into()),
        ..config()
    })
    .expect_err("a header value with a newline is refused at start-up");
    assert!(bad.to_string().contains("--probe-identity"), "{bad}");
}

#[tokio::test]
async fn a_target_accept_header_replaces_the_default() {
    let (addr, seen) = upstream(Reply::json(200, json!({"status": "on"}))).await;
    let s = spec(
        &format!("http://{addr}/"),
        json!({"target": {"url": format!("http://{addr}/"),
                          "headers": {"Accept": "application/vnd.api+json"}}}),
    );
    prober(config()).probe(&s).await;
    let headers = seen.headers.lock().unwrap()[0].clone();
    assert_eq!(headers.get_all("accept").iter().count(), 1);
    assert_eq!(headers["accept"], "application/vnd.api+json");
}

#[tokio::test]
async fn probes_to_one_host_are_limited_in_number() {
    let (addr, seen) =
        upstream(Reply::json(200, json!({"status": "on"})).delay(Duration::from_millis(100))).await;
    let p = prober(ProbeConfig {
        per_host_concurrency: 2,
        ..config()
    });
    let s = spec(&format!("http://{addr}/"), json!({}));
    let probes: Vec<_> = (0..6)
        .map(|_| {
            let p = p.clone();
            let s = s.clone();
            tokio::spawn(async move { p.probe(&s).await })
        })
        .collect();
    for probe in probes {
        assert!(matches!(probe.await.unwrap(), Observation::State { .. }));
    }
    assert_eq!(seen.hits(), 6);
    assert_eq!(seen.max_in_flight.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_per_host_limit_tracks_only_hosts_in_flight() {
    let p = prober(config());
    let mut hosts = Vec::new();
    for _ in 0..3 {
        let (addr, _) = upstream(Reply::json(200, json!({"status": "on"}))).await;
        hosts.push(spec(&format!("http://{addr}/"), json!({})));
    }
    for s in &hosts {
        assert!(matches!(p.probe(s).await, Observation::State { .. }));
    }
    assert_eq!(
        p.hosts_tracked(),
        0,
        "finished probes leave their hosts behind"
    );

    // One probe in flight holds its host; abandoned, it lets it go.
    let (addr, seen) =
        upstream(Reply::json(200, json!({"status": "on"})).delay(Duration::from_secs(30))).await;
    let slow = spec(&format!("http://{addr}/"), json!({}));
    let in_flight = {
        let (p, slow) = (p.clone(), slow.clone());
        tokio::spawn(async move { p.probe(&slow).await })
    };
    assert!(
        seen.hit(1, Duration::from_secs(10)).await,
        "the probe arrived"
    );
    assert_eq!(p.hosts_tracked(), 1);
    assert!(matches!(
        p.probe(&hosts[0]).await,
        Observation::State { .. }
    ));
    assert_eq!(p.hosts_tracked(), 1, "the slow host is still in flight");
    in_flight.abort();
    let _ = in_flight.await;
    assert_eq!(
        p.hosts_tracked(),
        0,
        "an abandoned probe leaves its host behind"
    );
}

// ---- the SSRF guard ----

fn guard(entries: &[&str]) -> Guard {
    Guard::new(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
}

fn url(s: &str) -> url::Url {
    url::Url::parse(s).unwrap()
}

#[test]
fn every_forbidden_literal_form_is_refused_by_check_url() {
    let g = Guard::default();
    for (target, words) in [
        ("http://127.0.0.1/", "loopback"),
        ("http://127.0.0.1:8080/x", "loopback"),
        ("http://127.1/", "loopback"),
        ("http://2130706433/", "loopback"),
        ("http://0x7f.1/", "loopback"),
        ("http://0x7f000001/", "loopback"),
        ("http://0177.0.0.1/", "loopback"),
        ("http://localhost/", "localhost"),
        ("http://LOCALHOST./", "localhost"),
        ("http://api.localhost/", "localhost"),
        ("http://0/", "unspecified"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://[::]/", "unspecified"),
        ("http://[::1]/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::ffff:7f00:1]/", "loopback"),
        ("http://[::127.0.0.1]/", "loopback"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://[::ffff:10.0.0.1]/", "private"),
        ("http://10.0.0.1/", "private"),
        ("http://172.16.5.4/", "private"),
        ("http://192.168.0.1/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://100.64.0.1/", "carrier-grade NAT"),
        ("http://[fc00::1]/", "unique-local"),
        ("http://[fd00:ec2::254]/", "unique-local"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[ff02::1]/", "multicast"),
        ("http://255.255.255.255/", "broadcast"),
        ("https://[64:ff9b::7f00:1]/", "loopback"),
    ] {
        let err = g
            .check_url(&url(target))
            .expect_err(&format!("{target} was let through"))
            .to_string();
        assert!(err.contains(words), "{target}: {err}");
        assert!(err.contains("--allow-targets"), "{target}: {err}");
    }
}

#[test]
fn public_targets_pass_check_url() {
    let g = Guard::default();
    for target in [
        "https://api.example.com/servers/1",
        "http://8.8.8.8/",
        "http://[2606:4700::1111]/",
        "https://localhost.example.com/",
        "http://172.32.0.1/",
    ] {
        assert_eq!(g.check_url(&url(target)), Ok(()), "{target}");
    }
}

#[test]
fn only_http_https_and_tcp_targets_pass_check_url() {
    let err = Guard::default()
        .check_url(&url("ftp://example.com/"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("only http, https, tcp, tls, grpc and dns"),
        "{err}"
    );
    // A tcp:// host is opaque to the URL parser; an address in it is judged.
    let err = Guard::default()
        .check_url(&url("tcp://10.0.0.7:5432"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("10.0.0.7") || err.contains("private"), "{err}");
    assert_eq!(
        Guard::default().check_url(&url("tcp://db.example.com:5432")),
        Ok(())
    );
}

#[test]
fn allow_list_entries_open_exactly_what_they_name() {
    let g = guard(&[
        "127.0.0.1",
        "localhost",
        "db.corp.test",
        "*.internal.test",
        "10.0.0.0/8",
        "fd00::/8",
    ]);
    for allowed in [
        "http://127.0.0.1:9000/",
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
        "http://localhost/",
        "http://10.2.3.4/",
        "http://[fd00::5]/",
    ] {
        assert_eq!(g.check_url(&url(allowed)), Ok(()), "{allowed}");
    }
    for refused in [
        "http://127.0.0.2/",
        "http://[::1]/",
        "http://api.localhost/",
        "http://172.16.0.1/",
        "http://[fc00::1]/",
        "http://169.254.169.254/",
    ] {
        assert!(g.check_url(&url(refused)).is_err(), "{refused}");
    }
    // Names are judged on the addresses they resolve to.
    let private = "192.168.1.1".parse().unwrap();
    assert!(g.check_ip("db.corp.test", private).is_ok());
    assert!(g.check_ip("DB.corp.test.", private).is_ok());
    assert!(g.check_ip("other.corp.test", private).is_err());
    assert!(g.check_ip("a.internal.test", private).is_ok());
    assert!(g.check_ip("a.b.internal.test", private).is_ok());
    assert!(g.check_ip("internal.test", private).is_err());
    assert!(
        g.check_ip("anything.test", "10.200.0.1".parse().unwrap())
            .is_ok()
    );
    assert!(
        g.check_ip("anything.test", "11.0.0.1".parse().unwrap())
            .is_ok()
    );
}

#[test]
fn a_malformed_allow_list_entry_is_refused_with_a_sentence() {
    let err = Guard::new(&["https://api.internal/".to_string()])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("https://api.internal/") && err.contains("host name"),
        "{err}"
    );
}

#[tokio::test]
async fn a_forbidden_literal_target_is_refused_before_any_request() {
    let (addr, seen) = upstream(Reply::json(200, json!({"status": "on"}))).await;
    let p = prober(ProbeConfig {
        guard: Guard::default(),
        ..config()
    });
    let error = permanent(p.probe(&spec(&format!("http://{addr}/"), json!({}))).await);
    assert!(error.contains("127.0.0.1 is a loopback address"), "{error}");
    assert_eq!(seen.hits(), 0);
}

#[tokio::test]
async fn a_name_that_resolves_to_loopback_is_refused_when_connecting() {
    let (addr, seen) = upstream(Reply::json(200, json!({"status": "on"}))).await;
    let p = prober(ProbeConfig {
        guard: Guard::default(),
        resolve_overrides: vec![("evil.test".into(), "127.0.0.1:0".parse().unwrap())],
        ..config()
    });
    let s = spec(&format!("http://evil.test:{}/", addr.port()), json!({}));
    // The name itself passes the creation-time check...
    assert_eq!(
        p.guard().check_url(&url(&s.target.as_ref().unwrap().url)),
        Ok(())
    );
    // ...and is refused on the address it resolves to, for good.
    let error = permanent(p.probe(&s).await);
    assert!(
        error.contains("the host evil.test resolves only to forbidden addresses"),
        "{error}"
    );
    assert!(error.contains("127.0.0.1 is a loopback address"), "{error}");
    assert!(error.contains("--allow-targets"), "{error}");
    assert_eq!(seen.hits(), 0);
}

#[tokio::test]
async fn a_name_that_resolves_to_the_metadata_address_is_refused() {
    let p = prober(ProbeConfig {
        guard: Guard::default(),
        resolve_overrides: vec![("meta.test".into(), "169.254.169.254:0".parse().unwrap())],
        ..config()
    });
    let error = permanent(
        p.probe(&spec("http://meta.test/latest/meta-data/", json!({})))
            .await,
    );
    assert!(error.contains("metadata"), "{error}");
}

#[tokio::test]
async fn allowed_names_suffixes_and_ranges_reach_loopback_through_the_resolver() {
    let (addr, seen) = upstream(Reply::json(200, json!({"status": "on"}))).await;
    let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
    for (entry, host) in [
        ("api.test", "api.test"),
        ("*.svc.test", "a.svc.test"),
        ("127.0.0.0/8", "anything.test"),
    ] {
        let p = prober(ProbeConfig {
            guard: guard(&[entry]),
            resolve_overrides: vec![(host.into(), loopback)],
            ..config()
        });
        let o = p
            .probe(&spec(&format!("http://{host}:{}/", addr.port()), json!({})))
            .await;
        assert!(matches!(o, Observation::State { .. }), "{entry}: {o:?}");
    }
    assert_eq!(seen.hits(), 3);
    // A suffix does not open the bare name.
    let p = prober(ProbeConfig {
        guard: guard(&["*.svc.test"]),
        resolve_overrides: vec![("svc.test".into(), loopback)],
        ..config()
    });
    let error = permanent(
        p.probe(&spec(
            &format!("http://svc.test:{}/", addr.port()),
            json!({}),
        ))
        .await,
    );
    assert!(error.contains("forbidden"), "{error}");
    assert_eq!(seen.hits(), 3);
}

#[tokio::test]
async fn a_name_that_does_not_resolve_is_transient() {
    let p = prober(config());
    let (error, _) = transient(
        p.probe(&spec("http://no-such-host.invalid/", json!({})))
            .await,
    );
    assert!(error.contains("no-such-host.invalid"), "{error}");
}

/// A wait keeps the state it read from the last body when that was one value of
/// a few bytes: the same response again is read from the memo, and any other
/// (another body, another status) afresh. Each body here comes twice in a row;
/// every reading through the memo is the one a fresh read of the same response
/// gives.
#[tokio::test]
async fn an_unchanged_body_is_read_as_before_and_a_changed_one_afresh() {
    use crate::support::{Reply as Scripted, Upstream};
    let raw = |status: u16, body: &str| Scripted {
        status,
        body: body.to_string(),
        headers: Vec::new(),
        delay: Duration::ZERO,
    };
    // Each response, and whether its state is one the memo keeps.
    let responses = [
        (
            Scripted::json(200, json!({"status": "creating", "n": 1})),
            true,
        ),
        (
            Scripted::json(200, json!({"status": "creating", "n": 2})),
            true,
        ),
        (
            Scripted::json(200, json!({"status": "CREATE_COMPLETE"})),
            true,
        ),
        (
            Scripted::json(200, json!({"status": "UPDATE_IN_PROGRESS"})),
            false,
        ),
        (Scripted::json(200, json!({"status": "été"})), true),
        (Scripted::json(200, json!({"status": "on", "n": 3})), true),
        (Scripted::json(200, json!({"status": null})), false),
        (Scripted::json(200, json!({"status": 7})), true),
        (raw(200, "not json"), false),
        (
            Scripted::json(200, json!({"status": "creating", "n": 1})),
            true,
        ),
        (
            Scripted::json(200, json!({"status": "failed", "err": {"code": "E1"}})),
            false,
        ),
    ];
    let twice: Vec<Scripted> = responses
        .iter()
        .flat_map(|(r, _)| [r.clone(), r.clone()])
        .collect();
    let up = Upstream::start().await;
    let extra = json!({"fail": ["failed"], "error": "/err"});
    let remembered = spec(&up.script("/memo", twice.clone()), extra.clone());
    let fresh = spec(&up.script("/fresh", twice), extra);
    let p = prober(config());
    let target = p.target(&remembered).unwrap();
    let mut memo = None;
    for (i, (_, kept)) in responses.iter().enumerate() {
        for n in 0..2 {
            let Polled::Observed(read, _) = p
                .probe_memo(uuid::Uuid::nil(), &remembered, &target, &mut memo)
                .await
            else {
                panic!("response {i}: held")
            };
            let afresh = p.probe(&fresh).await;
            assert_eq!(read, afresh, "response {i}, poll {n}");
            if *kept {
                let m = memo.expect("a short state is kept");
                assert!(!m.judged(), "response {i}: no conditions, no verdict");
            } else {
                assert_eq!(memo, None, "response {i}: nothing to keep");
            }
        }
    }
    // A 503 with a body the wait read before is read afresh: the status is part
    // of what the memo is kept under.
    let up = Upstream::start().await;
    let body = json!({"status": "creating"});
    let url = up.script(
        "/s",
        vec![Scripted::json(200, body.clone()), Scripted::json(503, body)],
    );
    let s = spec(&url, json!({}));
    let target = p.target(&s).unwrap();
    let mut memo = None;
    let Polled::Observed(first, _) = p
        .probe_memo(uuid::Uuid::nil(), &s, &target, &mut memo)
        .await
    else {
        panic!("held")
    };
    assert!(matches!(first, Observation::State { .. }), "{first:?}");
    let Polled::Observed(second, _) = p
        .probe_memo(uuid::Uuid::nil(), &s, &target, &mut memo)
        .await
    else {
        panic!("held")
    };
    assert!(
        matches!(second, Observation::Transient { .. }),
        "{second:?}"
    );
}
