//! `dns://NAME?type=TYPE` targets through the API, against a DNS server scripted
//! here on 127.0.0.1 (UDP and TCP): a name that comes to resolve, NXDOMAIN and
//! SERVFAIL, a record set that changes, a truncated answer asked again over TCP,
//! answers past the bounds, a resolver that never answers, a resolver a wait
//! names (refused unless the operator allows it), the preset, the command line,
//! two waits sharing one question's queries, and answers made of any bytes.

pub(crate) mod server;

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use crate::support::*;
use server::{Dns, Says};

fn dns(url: &str) -> Value {
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

/// waitd asking `server` as its operator's resolver.
async fn app_on(db: &TestDb, server: &Dns, extra: &[&str]) -> App {
    let at = server.start().await.to_string();
    let mut args = vec!["--dns-resolver", at.as_str()];
    args.extend_from_slice(extra);
    App::start_with(db, &args).await
}

async fn a_name_that_comes_to_resolve_is_waited_for(app: &App, server: &Dns) {
    server.says(
        "db.example.com",
        "A",
        vec![
            Says::Rcode(3),
            Says::Records(vec![]),
            Says::Records(vec!["10.0.0.7".into()]),
        ],
    );
    let id = created(app, dns("dns://DB.example.com.")).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["state"], "resolved", "{w}");
    assert_eq!(w["spec"]["want"], json!(["resolved"]), "{w}");
    assert_eq!(
        w["spec"]["target"]["url"], "dns://db.example.com?type=A",
        "{w}"
    );
    assert_eq!(w["retries"], 0, "NXDOMAIN and NODATA are progress: {w}");
    assert!(w["polls"].as_i64().unwrap() >= 3, "{w}");
}

#[tokio::test]
async fn a_dns_wait_succeeds_when_the_name_resolves() {
    let db = TestDb::new().await;
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    a_name_that_comes_to_resolve_is_waited_for(&app, &server).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn a_dns_wait_on_sqlite_succeeds_when_the_name_resolves() {
    let dir = TempDir::new("waitd-test");
    let db = TestDb {
        name: String::new(),
        url: dir.sqlite_url(),
    };
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    a_name_that_comes_to_resolve_is_waited_for(&app, &server).await;
    app.stop().await.0.unwrap();
}

/// Conditions read `dns.records`, `dns.rcode`, `dns.ttl`, `dns.elapsed`; each
/// type's records read as text; NXDOMAIN can be failed on, SERVFAIL is retried.
#[tokio::test]
async fn dns_conditions_read_the_answer_and_servfail_is_retried() {
    let db = TestDb::new().await;
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    for (name, t, values, expr) in [
        (
            "a.test",
            "A",
            vec!["10.0.0.8", "10.0.0.7"],
            "dns.records == ['10.0.0.7', '10.0.0.8'] && dns.rcode == 'NOERROR' && dns.ttl == 60 && dns.elapsed < duration('5s') && dns.error == null && !dns.tcp && dns.type == 'A' && dns.name == 'a.test'",
        ),
        (
            "a.test",
            "AAAA",
            vec!["fd00::7"],
            "'fd00::7' in dns.records",
        ),
        (
            "m.test",
            "MX",
            vec!["10 Mail.Example.com"],
            "dns.records == ['10 mail.example.com']",
        ),
        (
            "_sip._tcp.test",
            "SRV",
            vec!["0 5 5060 sip.test"],
            "dns.records[0] == '0 5 5060 sip.test'",
        ),
        (
            "t.test",
            "TXT",
            vec!["v=spf1 -all"],
            "dns.records == ['v=spf1 -all']",
        ),
        (
            "c.test",
            "CNAME",
            vec!["target.test"],
            "'target.test' in dns.records",
        ),
        (
            "n.test",
            "NS",
            vec!["ns1.test"],
            "dns.records == ['ns1.test'] && state == 'resolved'",
        ),
    ] {
        server.says(
            name,
            t,
            vec![Says::Records(
                values.iter().map(|v| v.to_string()).collect(),
            )],
        );
        let mut s = dns(&format!("dns://{name}?type={t}"));
        s["success_condition"] = json!(expr);
        s["timeout"] = json!("3s");
        let w = app.wait_end(&created(&app, s).await).await;
        assert_eq!(w["status"], "succeeded", "{t}: {w}");
    }

    let mut gone = dns("dns://gone.test?type=A");
    gone["failure_condition"] = json!("dns.rcode == 'NXDOMAIN' && dns.records == []");
    let w = app.wait_end(&created(&app, gone).await).await;
    assert_eq!(w["status"], "failed", "{w}");

    server.says(
        "flaky.test",
        "A",
        vec![
            Says::Rcode(2),
            Says::Rcode(2),
            Says::Records(vec!["10.0.0.9".into()]),
        ],
    );
    let w = app
        .wait_end(&created(&app, dns("dns://flaky.test")).await)
        .await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(w["retries"].as_i64().unwrap() >= 1, "{w}");
    let (_, events) = app
        .get(&format!("/waits/{}/events", w["id"].as_str().unwrap()))
        .await;
    assert!(events.to_string().contains("SERVFAIL"), "{events}");

    server.says("broken.test", "A", vec![Says::Rcode(5)]);
    let mut s = dns("dns://broken.test");
    s["retry"]["max_retries"] = json!(2);
    let w = app.wait_end(&created(&app, s).await).await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(w["last_error"].as_str().unwrap().contains("REFUSED"), "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A wait for a record to change ends when the answer does.
#[tokio::test]
async fn a_dns_wait_ends_when_the_record_set_changes() {
    let db = TestDb::new().await;
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    server.says(
        "web.test",
        "A",
        vec![Says::Records(vec!["10.0.0.7".into()])],
    );
    let mut s = dns("dns://web.test");
    s["success_condition"] = json!("'10.0.0.8' in dns.records");
    let id = created(&app, s).await;
    let mut heard = app.heard();
    heard.recorded(&id).await;
    heard.recorded(&id).await;
    let (_, w) = app.get(&format!("/waits/{id}")).await;
    assert_eq!(w["status"], "running", "{w}");
    server.says(
        "web.test",
        "A",
        vec![Says::Records(vec!["10.0.0.8".into(), "10.0.0.7".into()])],
    );
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A truncated answer is asked again over TCP; one past the bounds ends the
/// wait with a sentence naming the bound; junk is retried.
#[tokio::test]
async fn dns_answers_are_bounded_and_truncated_ones_asked_over_tcp() {
    let db = TestDb::new().await;
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    server.says(
        "big.test",
        "TXT",
        vec![Says::Truncated(vec!["x".repeat(600)])],
    );
    let mut s = dns("dns://big.test?type=TXT");
    s["success_condition"] = json!("dns.tcp && size(dns.records[0]) == 600");
    let w = app.wait_end(&created(&app, s).await).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(server.tcp.load(std::sync::atomic::Ordering::SeqCst) >= 1);

    server.says("many.test", "A", vec![Says::Many(300)]);
    let w = app
        .wait_end(&created(&app, dns("dns://many.test")).await)
        .await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        w["reason"]
            .as_str()
            .unwrap()
            .contains("300 A records, more than the 64"),
        "{w}"
    );

    server.says(
        "long.test",
        "TXT",
        vec![Says::Truncated(vec!["y".repeat(2000)])],
    );
    let w = app
        .wait_end(&created(&app, dns("dns://long.test?type=TXT")).await)
        .await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        w["reason"].as_str().unwrap().contains("more than the 1024"),
        "{w}"
    );

    server.says(
        "junk.test",
        "A",
        vec![Says::Junk, Says::Records(vec!["10.0.0.1".into()])],
    );
    let w = app
        .wait_end(&created(&app, dns("dns://junk.test")).await)
        .await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(w["retries"].as_i64().unwrap() >= 1, "{w}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A resolver that never answers holds no wait past its deadline.
#[tokio::test]
async fn a_hanging_dns_resolver_does_not_outlast_the_deadline() {
    let db = TestDb::new().await;
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    server.says("slow.test", "A", vec![Says::Silent]);
    let mut s = dns("dns://slow.test");
    s["timeout"] = json!("1500ms");
    let started = std::time::Instant::now();
    let w = app.wait_end(&created(&app, s).await).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A wait names its own resolver only where the operator allows it, and that
/// resolver is judged by the SSRF guard like any target.
#[tokio::test]
async fn a_tenant_named_dns_resolver_is_refused_unless_allowed() {
    let db = TestDb::new().await;
    let own = Dns::default();
    own.says(
        "own.test",
        "A",
        vec![Says::Records(vec!["10.0.0.5".into()])],
    );
    let at = own.start().await;
    let url = format!("dns://own.test?resolver={at}");

    let app = app_on(&db, &Dns::default(), &[]).await;
    let (code, body) = app.create(dns(&url)).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["errors"][0]["field"], "target.url", "{body}");
    assert!(
        body.to_string().contains("--dns-tenant-resolvers"),
        "{body}"
    );
    app.stop().await.0.unwrap();

    let app = app_on(&db, &Dns::default(), &["--dns-tenant-resolvers"]).await;
    let w = app.wait_end(&created(&app, dns(&url)).await).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(
        w["spec"]["target"]["url"],
        format!("dns://own.test?type=A&resolver={at}")
    );
    assert_eq!(own.queries(), 1, "the wait's own resolver was asked");
    let (code, body) = app.create(dns("dns://own.test?resolver=10.0.0.2:53")).await;
    assert_eq!(code, 422, "{body}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn dns_mistakes_are_refused_naming_the_field() {
    let dir = TempDir::new("waitd-test");
    let app = App::start_sqlite(&dir.sqlite_url()).await;
    for (spec, field, says) in [
        (dns("dns:example.com"), "target.url", "dns://NAME?type=TYPE"),
        (
            dns("dns://example.com/x"),
            "target.url",
            "the record type goes in the query",
        ),
        (
            dns("dns://example.com:53"),
            "target.url",
            "resolver=HOST:PORT",
        ),
        (dns("dns://example.com?type=PTR"), "target.url", "PTR"),
        (
            dns("dns://example.com?record_type=A"),
            "target.url",
            "type and resolver only",
        ),
        (dns("dns://ex ample.com"), "target.url", "space"),
        (
            dns(&format!("dns://{}.com", "a".repeat(64))),
            "target.url",
            "63",
        ),
        (
            {
                let mut s = dns("dns://example.com");
                s["state"] = json!("/status");
                s
            },
            "state",
            "NXDOMAIN",
        ),
        (
            {
                let mut s = dns("dns://example.com");
                s["target"]["type"] = json!("A");
                s
            },
            "target.type",
            "",
        ),
        (
            {
                let mut s = dns("dns://example.com");
                s["target"]["headers"] = json!({"a": "b"});
                s
            },
            "target.headers",
            "only asks a resolver",
        ),
    ] {
        let (code, body) = app.create(spec.clone()).await;
        assert_eq!(code, 400, "{spec}: {body}");
        assert_eq!(body["errors"][0]["field"], field, "{spec}: {body}");
        assert!(body.to_string().contains(says), "{spec}: {body}");
    }
    app.stop().await.0.unwrap();
}

/// The preset `dns.resolves_to` waits for a value among a name's records.
#[tokio::test]
async fn the_dns_resolves_to_preset_waits_for_a_value() {
    let dir = TempDir::new("waitd-test");
    let db = TestDb {
        name: String::new(),
        url: dir.sqlite_url(),
    };
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    server.says(
        "mail.test",
        "MX",
        vec![Says::Rcode(3), Says::Records(vec!["10 mx1.test".into()])],
    );
    let (code, w) = app
        .create(json!({
            "preset": "dns.resolves_to",
            "params": {"name": "mail.test", "type": "MX", "value": "10 mx1.test"},
            "poll": {"initial": "5ms", "max": "5ms", "factor": 1}
        }))
        .await;
    assert_eq!(code, 201, "{w}");
    assert_eq!(w["spec"]["target"]["url"], "dns://mail.test?type=MX", "{w}");
    assert_eq!(
        w["spec"]["success_condition"],
        "'10 mx1.test' in dns.records"
    );
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn waitd_wait_dns_asks_the_resolver_given() {
    use crate::client::{fast_spec_file, waitd};
    use crate::client_wait::{NO_SERVER, wait_args};
    let timings = fast_spec_file(json!({}));
    let server = Dns::default();
    server.says(
        "cli.test",
        "AAAA",
        vec![Says::Rcode(3), Says::Records(vec!["fd00::1".into()])],
    );
    let at = server.start().await.to_string();
    let mut args = wait_args(&timings, &["--json"]);
    args.extend_from_slice(&["--dns", "cli.test", "--type", "AAAA", "--resolver", &at]);
    let run = waitd(NO_SERVER, &args).await;
    assert_eq!(run.code, 0, "{run:?}");
    let w: Value = serde_json::from_str(&run.stdout).unwrap();
    assert_eq!(w["state"], "resolved", "{w}");
    assert_eq!(
        w["spec"]["target"]["url"], "dns://cli.test?type=AAAA",
        "{w}"
    );

    let run = waitd(
        NO_SERVER,
        &["wait", "--type", "A", "--url", "http://x.test/"],
    )
    .await;
    assert_eq!(run.code, 5, "--type without --dns: {run:?}");
    let _ = std::fs::remove_file(timings);
}

/// Two waits of one tenant that ask the same question share one query a
/// poll, counted as shared polls; another tenant's, or another type's, asks
/// its own.
#[tokio::test]
async fn two_dns_waits_asking_one_question_share_its_queries() {
    let db = TestDb::new().await;
    let server = Dns::default();
    let app = app_on(&db, &server, &[]).await;
    let every = |url: &str| {
        let mut s = dns(url);
        s["poll"] = json!({"initial": "200ms", "max": "200ms", "factor": 1, "jitter": 0});
        s
    };
    let from = server.queries();
    let ids = [
        created(&app, every("dns://same.test")).await,
        created(&app, every("dns://same.test")).await,
    ];
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut polls = 0;
    for id in &ids {
        let (_, w) = app.get(&format!("/waits/{id}")).await;
        assert_eq!(w["state"], "NXDOMAIN", "{w}");
        polls += w["polls"].as_i64().unwrap();
    }
    let asked = server.queries() - from;
    println!("two waits at 200 ms, 3 s: {asked} questions for {polls} polls");
    // Alone, every poll asks its own question; shared, two polls ask one.
    assert!(polls >= 6, "each wait counts its own polls: {polls}");
    assert!(
        asked as i64 * 3 <= polls * 2 + 6,
        "{asked} questions for {polls} polls"
    );
    let metrics = app.metrics().await;
    let shared: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("waitd_probe_requests_total{outcome=\"shared\"}"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(shared >= 3.0, "{metrics}");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any text after dns:// is read as one question or refused with a
    /// sentence; what is read is written in its one form, which reads back
    /// the same.
    #[test]
    fn any_dns_url_is_read_in_one_form_or_refused(
        name in "[A-Za-z0-9_.:/@?&=%#\\[\\] -]{0,300}",
        query in "(type=[A-Za-z]{0,6}|resolver=[0-9a-z.:\\[\\]]{0,30}|[a-z]{1,8}=[a-z]{0,4}|&){0,4}",
    ) {
        use waitd::engine::spec::dns::question;
        let url = format!("dns://{name}?{query}");
        match question(&url) {
            Err(why) => prop_assert!(!why.is_empty()),
            Ok(q) => {
                prop_assert!(q.name.len() <= 253);
                let again = question(&q.url()).unwrap();
                prop_assert_eq!(again, q);
            }
        }
    }

    /// Any bytes are an answer, a sentence or a truncation, never a panic; a
    /// well-formed answer is read within the bounds and refused past them.
    #[test]
    fn any_bytes_as_a_dns_answer_are_read_without_a_panic(
        junk in prop::collection::vec(any::<u8>(), 0..600),
        records in 0usize..100,
        len in 1usize..1400,
    ) {
        use hickory_proto::op::{Message, MessageType, OpCode, Query};
        use hickory_proto::rr::{Name, RData, Record, RecordType, rdata::TXT};
        use waitd::probe::dns::wire::{MAX_RECORD_LEN, MAX_RECORDS};
        use waitd::probe::dns::{Failure, read_answer};
        let id = if junk.len() >= 2 { u16::from_be_bytes([junk[0], junk[1]]) } else { 0 };
        if let Ok(Err(f)) = read_answer(&junk, id, "x.test", "TXT") {
            prop_assert!(!f.sentence().is_empty());
        }
        let name = Name::from_ascii("x.test.").unwrap();
        let mut m = Message::new(7, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::TXT));
        for i in 0..records {
            let text = format!("{i:04}{}", "z".repeat(len));
            // TXT strings are at most 255 bytes each: split as a server would.
            let parts: Vec<String> = text.as_bytes().chunks(255).map(|c| String::from_utf8(c.to_vec()).unwrap()).collect();
            m.add_answer(Record::from_rdata(name.clone(), 30, RData::TXT(TXT::new(parts))));
        }
        let Ok(bytes) = m.to_vec() else { return Ok(()) };
        let Ok(read) = read_answer(&bytes, 7, "x.test", "TXT") else {
            // Past 64 KiB the writer itself truncates, as a server would.
            prop_assert!(records * len > 60_000, "{} records of {}", records, len);
            return Ok(());
        };
        if records == 0 {
            prop_assert_eq!(read.unwrap().rcode, "NOERROR");
        } else if records > MAX_RECORDS || len + 4 > MAX_RECORD_LEN {
            prop_assert!(matches!(read, Err(Failure::Bounded(_))), "{:?}", read);
        } else {
            let answer = read.unwrap();
            prop_assert_eq!(answer.records.len(), records);
            prop_assert_eq!(answer.ttl, Some(30));
        }
    }
}
