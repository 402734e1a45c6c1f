//! `target.tls`: a target whose certificate a private authority signed, one that
//! asks for a client certificate, the client key never shown back nor stored in
//! plain text, and every bad input refused with the field it is about.
//!
//! The authorities and certificates are made by each test, and the targets are
//! rustls servers on 127.0.0.1 ([`pki`]).

pub(crate) mod pki;

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use pki::*;
use proptest::prelude::*;
use rcgen::{CertifiedIssuer, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use support::in_process::InProcess;
use support::*;
use waitd::engine::{Limits, Spec};

/// The usual test spec for `url` with `tls`, and `retry.max_retries`.
fn tls_spec(url: &str, tls: Value, max_retries: Value) -> Value {
    let mut s = spec(url);
    s["target"]["tls"] = tls;
    s["retry"]["max_retries"] = max_retries;
    s
}

/// The error a wait ended with (or last met).
fn error_of(w: &Value) -> String {
    format!(
        "{} {}",
        w["reason"].as_str().unwrap_or_default(),
        w["last_error"].as_str().unwrap_or_default()
    )
}

// ---------------------------------------------------------------------------------
// Trust
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_target_signed_by_a_private_authority_is_trusted_with_it_and_refused_without() {
    let db = TestDb::new().await;
    let ca = authority("waitd test CA");
    let (cert, key) = server_cert(&ca);
    let target = TlsTarget::start(&cert, &key, None).await;
    target.set("on");
    let app = App::start(&db).await;

    // Without `tls`: the platform's roots, which never signed it.
    let (status, w) = app
        .create(tls_spec(&target.url(), Value::Null, json!(1)))
        .await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        error_of(&w).contains("invalid peer certificate"),
        "the reason does not say the certificate was refused: {w}"
    );

    // With another authority: the wait trusts exactly the ones it names.
    let other = authority("another CA");
    let (status, w) = app
        .create(tls_spec(
            &target.url(),
            json!({"ca": other.pem()}),
            json!(1),
        ))
        .await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(error_of(&w).contains("invalid peer certificate"), "{w}");
    assert_eq!(target.served(), 0, "a request went to an untrusted target");

    // With its authority (among others): trusted.
    let bundle = format!("{}\n{}", other.pem(), ca.pem());
    let (status, w) = app
        .create(tls_spec(&target.url(), json!({"ca": bundle}), json!(1)))
        .await;
    assert_eq!(status, 201, "{w}");
    assert_eq!(
        w["spec"]["target"]["tls"]["ca"], bundle,
        "the authorities read back"
    );
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(target.served() >= 1);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_wait_with_its_own_authorities_never_reads_a_poll_made_without_them() {
    let db = TestDb::new().await;
    let ca = authority("waitd test CA");
    let (cert, key) = server_cert(&ca);
    let target = TlsTarget::start(&cert, &key, None).await;
    target.set("on");
    let app = App::start(&db).await;

    // A wait of the same tenant and URL without `tls` keeps failing and retrying.
    let (status, plain) = app
        .create(tls_spec(&target.url(), Value::Null, Value::Null))
        .await;
    assert_eq!(status, 201, "{plain}");
    let plain = plain["id"].as_str().unwrap().to_string();
    assert!(target.refused_at_least(2, Duration::from_secs(10)).await);

    // The same request but for `tls`, with no retry: a poll of the other wait's
    // (begun within the share window) would end it in error.
    let mut s = tls_spec(&target.url(), json!({"ca": ca.pem()}), json!(0));
    s["poll"]["delay"] = json!("100ms");
    let (status, w) = app.create(s).await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");

    let (_, w) = app.post(&format!("/waits/{plain}/cancel")).await;
    assert!(error_of(&w).contains("invalid peer certificate"), "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// Client certificates
// ---------------------------------------------------------------------------------

#[tokio::test]
async fn a_target_that_asks_for_a_client_certificate_accepts_the_waits_and_refuses_none() {
    let db = TestDb::new().await;
    let ca = authority("waitd test CA");
    let clients = authority("client CA");
    let (cert, key) = server_cert(&ca);
    let target = TlsTarget::start(&cert, &key, Some(&clients.pem())).await;
    target.set("on");
    let app = App::start(&db).await;

    let (status, w) = app
        .create(tls_spec(&target.url(), json!({"ca": ca.pem()}), json!(1)))
        .await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "error", "{w}");
    assert_eq!(target.served(), 0, "served without a client certificate");

    // A certificate of an authority the target does not take.
    let (stranger, stranger_key) = client_cert(&authority("stranger CA"));
    let (status, w) = app
        .create(tls_spec(
            &target.url(),
            json!({"ca": ca.pem(), "client_cert": stranger, "client_key": stranger_key}),
            json!(1),
        ))
        .await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "error", "{w}");
    assert_eq!(target.served(), 0, "served a certificate it does not trust");

    let (mine, mine_key) = client_cert(&clients);
    let (status, w) = app
        .create(tls_spec(
            &target.url(),
            json!({"ca": ca.pem(), "client_cert": mine, "client_key": mine_key}),
            json!(1),
        ))
        .await;
    assert_eq!(status, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(target.served() >= 1);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

// ---------------------------------------------------------------------------------
// The key: never shown, sealed at rest, and there after a restart
// ---------------------------------------------------------------------------------

const KEY1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/// Where the waits are stored.
enum Store {
    Postgres(TestDb),
    Sqlite(TempDir),
}

impl Store {
    fn args(&self) -> Vec<String> {
        let url = match self {
            Store::Postgres(db) => db.url.clone(),
            Store::Sqlite(dir) => dir.sqlite_url(),
        };
        let mut args = test_args(&url);
        args.extend(["--secret-key".to_string(), KEY1.to_string()]);
        args
    }

    /// Everything stored, as text.
    async fn dump(&self) -> String {
        match self {
            Store::Postgres(db) => {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
                let mut all = String::new();
                for sql in [
                    "SELECT t::text FROM waits t",
                    "SELECT t::text FROM wait_specs t",
                    "SELECT t::text FROM wait_events t",
                ] {
                    let rows: Vec<Option<String>> =
                        sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap();
                    all.extend(rows.into_iter().flatten());
                }
                all
            }
            // The database file and its journal, byte for byte.
            Store::Sqlite(dir) => std::fs::read_dir(&dir.path)
                .unwrap()
                .flatten()
                .map(|f| String::from_utf8_lossy(&std::fs::read(f.path()).unwrap()).into_owned())
                .collect(),
        }
    }

    async fn drop_store(self) {
        if let Store::Postgres(db) = self {
            db.drop_db().await;
        }
    }
}

async fn the_client_key_is_never_shown_nor_stored_and_survives_a_restart(store: Store) {
    let ca = authority("waitd test CA");
    let clients = authority("client CA");
    let (cert, key) = server_cert(&ca);
    let target = TlsTarget::start(&cert, &key, Some(&clients.pem())).await;
    let (mine, mine_key) = client_cert(&clients);
    // A line of the key's base64: no read and no stored row may hold it.
    let needle = mine_key.lines().nth(1).unwrap().to_string();
    assert!(needle.len() > 40, "{mine_key}");

    let rx = support::receiver::Receiver::start().await;
    let app = App::start_args(store.args()).await;
    let mut s = tls_spec(
        &target.url(),
        json!({"ca": ca.pem(), "client_cert": mine, "client_key": mine_key}),
        json!(5),
    );
    s["notify"] =
        json!([{"url": rx.url("/hook"), "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]);
    let (status, w) = app.create(s).await;
    assert_eq!(status, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    assert_eq!(
        w["spec"]["target"]["tls"]["client_key"], "<redacted>",
        "{w}"
    );
    assert_eq!(w["spec"]["target"]["tls"]["client_cert"], mine, "{w}");
    assert!(target.served_at_least(1, Duration::from_secs(10)).await);
    for path in [
        format!("/waits/{id}"),
        "/waits".to_string(),
        "/events".to_string(),
        format!("/waits/{id}/events"),
    ] {
        let r = app.client.get(app.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let text = r.text().await.unwrap();
        assert!(text.contains(&id), "{path} does not show the wait: {text}");
        assert!(
            !text.contains(&needle) && !text.contains("PRIVATE KEY"),
            "{path} shows the client key: {text}"
        );
    }
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(
        w["spec"]["target"]["tls"]["client_key"], "<redacted>",
        "{w}"
    );
    app.stop().await.0.unwrap();

    let stored = store.dump().await;
    let ca_line = ca.pem().lines().nth(1).unwrap().to_string();
    assert!(stored.contains(&ca_line), "the spec is not stored in text");
    assert!(
        !stored.contains(&needle),
        "the client key is stored in plain text"
    );

    // Taken up from the store, the wait still presents its certificate.
    let before = target.served();
    let app = App::start_args(store.args()).await;
    assert!(
        target
            .served_at_least(before + 1, Duration::from_secs(10))
            .await,
        "the wait is not polled with its certificate after the restart"
    );
    target.set("on");
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(
        w["spec"]["target"]["tls"]["client_key"], "<redacted>",
        "{w}"
    );
    // The webhook's body shows the wait as a read does.
    assert!(rx.until_got("/hook", 1, Duration::from_secs(10)).await);
    let hook = rx.got("/hook")[0].json();
    assert_eq!(hook["data"]["id"], id.as_str(), "{hook}");
    assert_eq!(
        hook["data"]["spec"]["target"]["tls"]["client_key"], "<redacted>",
        "{hook}"
    );
    assert!(!hook.to_string().contains(&needle), "{hook}");
    app.stop().await.0.unwrap();
    store.drop_store().await;
}

#[tokio::test]
async fn the_client_key_is_never_shown_nor_stored_and_survives_a_restart_on_postgres() {
    the_client_key_is_never_shown_nor_stored_and_survives_a_restart(Store::Postgres(
        TestDb::new().await,
    ))
    .await;
}

#[tokio::test]
async fn the_client_key_is_never_shown_nor_stored_and_survives_a_restart_on_sqlite() {
    the_client_key_is_never_shown_nor_stored_and_survives_a_restart(Store::Sqlite(TempDir::new(
        "waitd-tls",
    )))
    .await;
}

// ---------------------------------------------------------------------------------
// Bad inputs
// ---------------------------------------------------------------------------------

/// The fields of a refusal's errors, and its whole text.
async fn refused(app: &InProcess, tls: Value) -> (Vec<String>, String) {
    let (status, body) = app
        .create(tls_spec("https://127.0.0.1:1/", tls.clone(), json!(1)))
        .await;
    assert_eq!(status, 400, "{tls}: {body}");
    let fields = body["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors: {body}"))
        .iter()
        .map(|e| e["field"].as_str().unwrap_or_default().to_string())
        .collect();
    (fields, body.to_string())
}

#[tokio::test]
async fn each_bad_tls_setting_is_refused_naming_its_field_and_never_the_key() {
    let app = InProcess::start().await;
    let ca = authority("waitd test CA");
    let (cert, key) = client_cert(&ca);
    let (_, other_key) = client_cert(&ca);
    let key_line = key.lines().nth(1).unwrap().to_string();
    let broken_key = key.replace(&key_line, &format!("{key_line}!"));
    let truncated = cert.lines().take(3).collect::<Vec<_>>().join("\n");
    let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    let many = ca.pem().repeat(17);
    let long = format!("{}{}", "x".repeat(40 * 1024), ca.pem());
    for (tls, field, says) in [
        (json!("pem"), "target.tls", "must be an object"),
        (json!({"cert": cert}), "target.tls.cert", "not a field"),
        (json!({"ca": 7}), "target.tls.ca", "must be a string"),
        (
            json!({"ca": "hello"}),
            "target.tls.ca",
            "no PEM certificate",
        ),
        (json!({"ca": truncated}), "target.tls.ca", "does not end"),
        (json!({"ca": garbage}), "target.tls.ca", "not a valid X.509"),
        (json!({"ca": many}), "target.tls.ca", "more than 16"),
        (json!({"ca": long}), "target.tls.ca", "the limit is 32 KiB"),
        (
            json!({"ca": format!("{}\u{0}", ca.pem())}),
            "target.tls.ca",
            "NUL",
        ),
        (
            json!({"ca": format!("{}{key}", ca.pem())}),
            "target.tls.ca",
            "private key",
        ),
        (
            json!({"client_cert": cert}),
            "target.tls.client_key",
            "is required",
        ),
        (
            json!({"client_key": key}),
            "target.tls.client_cert",
            "is required",
        ),
        (
            json!({"client_cert": garbage, "client_key": key}),
            "target.tls.client_cert",
            "not a valid X.509",
        ),
        (
            json!({"client_cert": cert, "client_key": "secret"}),
            "target.tls.client_key",
            "no PEM private key",
        ),
        (
            json!({"client_cert": cert, "client_key": broken_key}),
            "target.tls.client_key",
            "base64",
        ),
        (
            json!({"client_cert": cert, "client_key": cert}),
            "target.tls.client_key",
            "a certificate",
        ),
        (
            json!({"client_cert": cert, "client_key": format!("{key}{other_key}")}),
            "target.tls.client_key",
            "more than one",
        ),
        (
            json!({"client_cert": cert, "client_key": other_key}),
            "target.tls.client_key",
            "does not belong",
        ),
        (
            json!({"client_cert": cert, "client_key": "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}),
            "target.tls.client_key",
            "not a private key waitd can sign with",
        ),
        (
            json!({"client_cert": cert, "client_key": "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"}),
            "target.tls.client_key",
            "encrypted",
        ),
    ] {
        let (fields, text) = refused(&app, tls.clone()).await;
        assert_eq!(fields, vec![field.to_string()], "{tls}: {text}");
        assert!(text.contains(says), "{tls}: says not \"{says}\": {text}");
        for secret in [&key_line, other_key.lines().nth(1).unwrap()] {
            assert!(!text.contains(secret), "the key is echoed: {text}");
        }
    }
    // Over http, TLS settings would mean nothing.
    let (status, body) = app
        .create(tls_spec(
            "http://127.0.0.1:1/",
            json!({"ca": ca.pem()}),
            json!(1),
        ))
        .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["errors"][0]["field"], "target.tls", "{body}");
    assert!(body.to_string().contains("https targets only"), "{body}");
    // A key in each of its forms, with its certificate and with another's.
    for (pkcs8, written) in [
        (EC_PKCS8, EC_SEC1),
        (RSA_PKCS8, RSA_PKCS1),
        (EC_PKCS8, EC_PKCS8),
    ] {
        let tls = json!({"client_cert": client_cert_for(&ca, pkcs8), "client_key": written});
        let (status, w) = app
            .create(tls_spec("https://127.0.0.1:1/", tls, json!(1)))
            .await;
        assert_eq!(status, 201, "{}: {w}", written.lines().next().unwrap());
        let (fields, text) =
            refused(&app, json!({"client_cert": cert, "client_key": written})).await;
        assert_eq!(fields, vec!["target.tls.client_key"], "{text}");
        assert!(text.contains("does not belong"), "{text}");
    }
    // A good setting, and an empty one, are accepted.
    let (status, w) = app
        .create(tls_spec(
            "https://127.0.0.1:1/",
            json!({"ca": ca.pem(), "client_cert": cert, "client_key": key}),
            json!(1),
        ))
        .await;
    assert_eq!(status, 201, "{w}");
    let (status, w) = app
        .create(tls_spec("https://127.0.0.1:1/", json!({}), json!(1)))
        .await;
    assert_eq!(status, 201, "{w}");
    assert!(w["spec"]["target"].get("tls").is_none(), "{w}");
    app.stop().await;
}

/// Text that looks like PEM, often broken: BEGIN and END lines of the kinds the
/// parser knows (and some it does not), base64 and not, blank lines, random
/// bytes; sometimes long enough to pass the limit.
fn pem_ish() -> impl Strategy<Value = String> {
    let label = prop::sample::select(vec![
        "CERTIFICATE",
        "PRIVATE KEY",
        "RSA PRIVATE KEY",
        "EC PRIVATE KEY",
        "ENCRYPTED PRIVATE KEY",
        "PUBLIC KEY",
        "X509 CRL",
        "FOO",
        "",
    ]);
    let line = prop_oneof![
        label.clone().prop_map(|l| format!("-----BEGIN {l}-----")),
        label.prop_map(|l| format!("-----END {l}-----")),
        "[A-Za-z0-9+/]{0,64}={0,2}",
        "-----BEGIN [A-Z ]{0,12}-{0,6}",
        ".{0,80}",
        Just(String::new()),
    ];
    prop_oneof![
        4 => prop::collection::vec(line, 0..40).prop_map(|l| l.join("\n")),
        1 => prop::collection::vec(any::<u8>(), 0..2048)
            .prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
        1 => (0usize..3, "[A-Za-z0-9+/]{64}").prop_map(|(n, l)| format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            vec![l; 520 + n * 10].join("\n")
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn generated_tls_settings_are_refused_with_a_field_or_accepted_never_a_panic(
        ca in prop::option::of(pem_ish()),
        cert in prop::option::of(pem_ish()),
        key in prop::option::of(pem_ish()),
    ) {
        let mut tls = serde_json::Map::new();
        for (name, v) in [("ca", &ca), ("client_cert", &cert), ("client_key", &key)] {
            if let Some(v) = v {
                tls.insert(name.into(), json!(v));
            }
        }
        let request = tls_spec("https://127.0.0.1:1/", Value::Object(tls), json!(1));
        let limits = Limits {
            min_poll_interval: Duration::from_millis(1),
            ..Limits::default()
        };
        match Spec::from_request(&request, &limits) {
            Ok(spec) => {
                let shown = serde_json::to_string(&spec.redacted()).unwrap();
                if let Some(k) = key.as_ref().filter(|k| k.len() > 16) {
                    prop_assert!(!shown.contains(k.as_str()), "the key is shown: {}", shown);
                }
            }
            Err(errors) => {
                prop_assert!(!errors.is_empty());
                for e in &errors {
                    prop_assert!(e.field.starts_with("target.tls"), "{:?}", e);
                    prop_assert!(!e.message.is_empty());
                    if let Some(k) = key.as_ref() {
                        // A line of the key, not its BEGIN or END line, which the
                        // messages name.
                        for line in k.lines().filter(|l| l.len() > 24 && !l.starts_with("-----")) {
                            prop_assert!(!e.message.contains(line), "the key is echoed: {:?}", e);
                        }
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// One client a setting
// ---------------------------------------------------------------------------------

#[test]
fn equal_settings_share_one_client_which_goes_when_no_one_holds_it() {
    use waitd::outbound::{Client, Guard, TlsClients, TlsSettings};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let base = Client::new(Arc::new(Guard::default()), &[]).unwrap();
    let clients = TlsClients::new(base);
    let roots = |ca: &CertifiedIssuer<'static, KeyPair>| TlsSettings {
        roots: vec![ca.der().clone()],
        identity: None,
    };
    let (a, b) = (authority("a"), authority("b"));
    let (cert, key) = client_cert(&a);
    let identity = || TlsSettings {
        roots: vec![a.der().clone()],
        identity: Some((
            vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )),
    };

    let first = clients.client(&roots(&a)).unwrap();
    let again = clients.client(&roots(&a)).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "equal settings, two clients");
    let other = clients.client(&roots(&b)).unwrap();
    let with_cert = clients.client(&identity()).unwrap();
    assert!(!Arc::ptr_eq(&first, &other));
    assert!(!Arc::ptr_eq(&first, &with_cert));
    assert!(Arc::ptr_eq(
        &with_cert,
        &clients.client(&identity()).unwrap()
    ));
    assert_eq!(clients.held(), 3);

    drop((first, other));
    assert_eq!(clients.held(), 2, "a client no one holds is kept");
    drop(again);
    assert_eq!(clients.held(), 1);
    drop(with_cert);
    assert_eq!(clients.held(), 0);
}
