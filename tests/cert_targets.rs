//! `tls://host:port` targets through the API: the chain a server serves, whether
//! it verifies (against the wait's `tls.ca`, or the platform's roots), and the
//! fields conditions read, on certificates made by each test (valid, expiring
//! in 3 days, expired, for another name); and the certificate reader on
//! generated input.

use rcgen::{CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, KeyPair};
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};

use crate::support::*;
use crate::tls_targets::pki::{TlsTarget, authority};

/// A server certificate of `ca` for `names`, valid from 30 days ago until
/// the midnight `days` days from now (negative: expired); its PEM and its key's PEM.
pub(crate) fn valid_for(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    days: i64,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    use chrono::Datelike;
    let day = |d: i64| {
        let t = chrono::Utc::now() + chrono::Duration::days(d);
        rcgen::date_time_ymd(t.year(), t.month() as u8, t.day() as u8)
    };
    params.not_before = day(-30);
    // Midnight of that day: `days` days less a part of one from now.
    params.not_after = day(days);
    let key = KeyPair::generate().unwrap();
    (
        params.signed_by(&key, ca).unwrap().pem(),
        key.serialize_pem(),
    )
}

fn tls(addr: &str, ca: Option<&str>) -> Value {
    let mut s = json!({
        "target": {"url": format!("tls://{addr}")},
        "timeout": "20s",
        "poll": {"initial": "5ms", "max": "5ms", "factor": 1, "jitter": 0},
        "retry": {"delay": "5ms", "max_delay": "5ms"}
    });
    if let Some(ca) = ca {
        s["target"]["tls"] = json!({"ca": ca});
    }
    s
}

pub(crate) async fn served(cert: &(String, String)) -> String {
    let target = TlsTarget::start(&cert.0, &cert.1, None).await;
    let url = target.url();
    // Kept running for the test: the server task holds its listener.
    std::mem::forget(target);
    url.trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string()
}

async fn ended(app: &App, spec: Value) -> Value {
    let (code, w) = app.create(spec).await;
    assert_eq!(code, 201, "{w}");
    app.wait_end(w["id"].as_str().unwrap()).await
}

#[tokio::test]
async fn a_tls_wait_succeeds_when_the_chain_verifies_and_conditions_read_it() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let ca = authority("Test CA");
    let ca_pem = ca.pem();
    let good = served(&valid_for(&ca, &["127.0.0.1", "localhost"], 90)).await;
    let soon = served(&valid_for(&ca, &["127.0.0.1"], 3)).await;
    let expired = served(&valid_for(&ca, &["127.0.0.1"], -2)).await;
    let elsewhere = served(&valid_for(&ca, &["other.example"], 90)).await;

    let w = ended(&app, tls(&good, Some(&ca_pem))).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["spec"]["want"], json!(["verified"]), "{w}");
    assert_eq!(w["state"], "verified", "{w}");

    let mut fields = tls(&good, Some(&ca_pem));
    fields["success_condition"] = json!(
        "tls.verified && tls.error == null && tls.days_left >= 88 && tls.days_left <= 90 \
         && '127.0.0.1' in tls.sans && 'localhost' in tls.sans && tls.issuer.contains('Test CA') \
         && tls.subject.contains('127.0.0.1') && tls.chain == 1 \
         && tls.not_after > now + duration('2000h') && tls.elapsed < duration('10s')"
    );
    let w = ended(&app, fields).await;
    assert_eq!(w["status"], "succeeded", "{w}");

    // Verified, but not for long enough: the preset's check.
    let mut renew = tls(&soon, Some(&ca_pem));
    renew["failure_condition"] = json!("tls.days_left < 14");
    let w = ended(&app, renew).await;
    assert_eq!(w["status"], "failed", "{w}");

    for (addr, says) in [(&expired, "xpired"), (&elsewhere, "not valid for")] {
        let mut s = tls(addr, Some(&ca_pem));
        s["success_condition"] = json!(format!(
            "!tls.verified && tls.error.contains('{says}') && state == 'unverified'"
        ));
        let w = ended(&app, s).await;
        assert_eq!(w["status"], "succeeded", "{addr}: {w}");
    }

    // Asked for the name it serves: verified for that name.
    let mut named = tls(&elsewhere, Some(&ca_pem));
    named["target"]["tls"]["server_name"] = json!("other.example");
    named["success_condition"] = json!("tls.verified && tls.sans == ['other.example']");
    let w = ended(&app, named).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["spec"]["target"]["tls"]["server_name"], "other.example");

    // Without the authority, the platform's roots do not know it: unverified,
    // polled on until the deadline unless that is what the wait wants.
    let mut s = tls(&good, None);
    s["want"] = json!(["unverified"]);
    let w = ended(&app, s).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    let mut s = tls(&expired, Some(&ca_pem));
    s["timeout"] = json!("300ms");
    let w = ended(&app, s).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    assert_eq!(w["state"], "unverified", "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_tls_target_refuses_what_it_cannot_use_by_name() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let ca = authority("Test CA");
    let (cert, key) = valid_for(&ca, &["waitd-client"], 30);
    for (target, field) in [
        (
            json!({"url": "tls://127.0.0.1:443", "tls": {"client_cert": cert, "client_key": key}}),
            "target.tls.client_cert",
        ),
        (
            json!({"url": "tls://127.0.0.1:443", "headers": {"A": "b"}}),
            "target.headers",
        ),
        (json!({"url": "tls://127.0.0.1"}), "target.url"),
        (
            json!({"url": "tls://127.0.0.1:443", "tls": {"server_name": "not a name"}}),
            "target.tls.server_name",
        ),
        (
            json!({"url": "https://127.0.0.1/", "tls": {"server_name": "a.example"}}),
            "target.tls.server_name",
        ),
        (
            json!({"url": "tcp://127.0.0.1:5432", "tls": {"ca": ca.pem()}}),
            "target.tls",
        ),
    ] {
        let mut s = tls("127.0.0.1:1", None);
        s["target"] = target;
        let (code, body) = app.create(s).await;
        assert_eq!(code, 400, "{body}");
        assert!(
            body["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["field"] == field),
            "{field}: {body}"
        );
    }
    let (code, body) = app.create(tls("10.0.0.9:443", None)).await;
    assert_eq!(code, 422, "{body}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A certificate with more names than are read keeps the first 64.
#[test]
fn a_certificate_with_many_names_is_read_within_bounds() {
    let ca = authority("Test CA");
    let names: Vec<String> = (0..300).map(|i| format!("n{i}.example")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (pem, _) = valid_for(&ca, &names, 10);
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    let served = waitd::probe::served(&der).unwrap();
    assert_eq!(served.sans.len(), 64);
    assert_eq!(served.sans[0], "n0.example");
    assert!(served.issuer.contains("Test CA"));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Any bytes, and a real certificate cut or with a byte changed anywhere,
    /// are read or refused without a panic, within the bounds.
    #[test]
    fn any_certificate_bytes_are_read_or_refused(
        noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096),
        at in 0usize..2048,
        byte in proptest::prelude::any::<u8>(),
    ) {
        let _ = waitd::probe::served(&noise);
        let der = real_certificate();
        let _ = waitd::probe::served(&der[..at.min(der.len())]);
        let mut changed = der.clone();
        let i = at % changed.len();
        changed[i] = byte;
        if let Some(s) = waitd::probe::served(&changed) {
            proptest::prop_assert!(s.sans.len() <= 64);
            proptest::prop_assert!(s.subject.chars().count() <= 512);
        }
    }
}

fn real_certificate() -> Vec<u8> {
    use std::sync::OnceLock;
    static DER: OnceLock<Vec<u8>> = OnceLock::new();
    DER.get_or_init(|| {
        let ca = authority("Test CA");
        let (pem, _) = valid_for(&ca, &["127.0.0.1", "a.example"], 30);
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    })
    .clone()
}

/// Two waits on one `tls://` address share a handshake a poll only when they
/// ask for the same server name (and trust the same authorities): a wait that
/// asks for another name makes its own.
#[tokio::test]
async fn tls_waits_share_a_handshake_only_when_they_ask_the_same() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    // A listener that takes each connection and closes it: every handshake
    // fails (a retry), and each one is counted.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let (told, mut heard) = tokio::sync::watch::channel(0usize);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            told.send_replace(count.fetch_add(1, SeqCst) + 1);
            drop(stream);
        }
    });
    let every = |name: &str| {
        let mut s = tls(&addr, None);
        s["target"]["tls"] = json!({"server_name": name});
        s["timeout"] = json!("20s");
        s["retry"] = json!({"delay": "200ms", "max_delay": "200ms", "max_retries": null});
        s
    };
    // Handshakes per poll, over a window of at least 20 handshakes: the
    // waits' own poll counts make it a ratio, whatever the machine's speed.
    let polls = |ids: Vec<String>| {
        let app = &app;
        async move {
            let mut n = 0;
            for id in ids {
                let (_, w) = app.get(&format!("/waits/{id}")).await;
                n += w["polls"].as_u64().unwrap();
            }
            n
        }
    };
    let mut per_poll = Vec::new();
    for names in [["a.example", "a.example"], ["a.example", "b.example"]] {
        let mut ids = Vec::new();
        for name in names {
            let (code, w) = app.create(every(name)).await;
            assert_eq!(code, 201, "{w}");
            ids.push(w["id"].as_str().unwrap().to_string());
        }
        let (from, polled) = (accepted.load(SeqCst), polls(ids.clone()).await);
        heard.wait_for(|n| *n >= from + 20).await.unwrap();
        let shook = accepted.load(SeqCst) - from;
        let polled = polls(ids.clone()).await - polled;
        per_poll.push(shook as f64 / polled.max(1) as f64);
        for id in ids {
            app.post(&format!("/waits/{id}/cancel")).await;
        }
    }
    println!("handshakes a poll, one name then two: {per_poll:?}");
    assert!(
        per_poll[0] < 0.75 && per_poll[1] > 0.75,
        "one name shares a handshake between two waits' polls, two names do not: {per_poll:?}"
    );
    app.stop().await.0.unwrap();
}
