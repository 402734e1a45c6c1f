//! Webhooks (`notify`), from the outside: what a receiver gets, checked by the
//! `standardwebhooks` package; the retry schedule, `Retry-After`, 410 and
//! redelivery; what a create refuses; the SSRF guard at creation and at connect
//! time; bounded attempts; one tenant's hung receiver against another tenant's
//! deliveries; the bounds on pending deliveries; redeliveries in a loop. On both
//! stores. The crash and two-replica cases are in `tests/webhook_replicas.rs`, the
//! store's claim turns and bounds in `tests/store_conformance/outbox.rs`.

use crate::support;

use std::time::Duration;

use serde_json::{Value, json};
use support::receiver::{Answer, Receiver, verify_with_standardwebhooks};
use support::*;

/// A secret of 32 random bytes, as `whsec_$(openssl rand -base64 32)` makes one.
fn secret() -> String {
    use std::fmt::Write;
    let bytes: Vec<u8> = (0..32).map(|_| fastrand::u8(..)).collect();
    let mut b64 = String::new();
    // Standard base64, written out here so the test does not share waitd's encoder.
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for c in bytes.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                let _ = write!(b64, "{}", A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    format!("whsec_{b64}")
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Sqlite,
    Postgres,
}

const BOTH: [Kind; 2] = [Kind::Sqlite, Kind::Postgres];

/// waitd on a store of `kind`, with millisecond webhook retries (`--webhook-retry-base`).
struct Running {
    app: App,
    db: Option<TestDb>,
    dir: TempDir,
}

impl Running {
    async fn start(kind: Kind, extra: &[&str]) -> Running {
        let dir = TempDir::new("waitd-webhooks");
        let db = match kind {
            Kind::Postgres => Some(TestDb::new().await),
            Kind::Sqlite => None,
        };
        let url = db
            .as_ref()
            .map_or_else(|| dir.sqlite_url(), |d| d.url.clone());
        let mut args = set_flag(test_args(&url), "--webhook-retry-base", "20ms");
        args.extend(["--rate-limit", "0"].map(String::from));
        for pair in extra.chunks(2) {
            args = set_flag(args, pair[0], pair[1]);
        }
        let app = App::start_args(args).await;
        Running { app, db, dir }
    }

    async fn stop(self) {
        self.app.stop().await.0.unwrap();
        if let Some(db) = self.db {
            db.drop_db().await;
        }
    }
}

/// A wait that succeeds at once, announcing `events` to `hook`.
fn notifying(up: &Upstream, path: &str, hook: &str, secret: &str, events: Value) -> Value {
    let mut s = spec(&up.script(path, vec![Reply::status("on")]));
    s["notify"] = json!([{"url": hook, "secret": secret, "events": events}]);
    s
}

async fn deliveries(app: &App, id: &str) -> Vec<Value> {
    let (status, page) = app.get(&format!("/waits/{id}/deliveries")).await;
    assert_eq!(status, 200, "{page}");
    page["items"].as_array().unwrap().clone()
}

/// Once the wait's deliveries all stand as `f` says: them. Read again on each
/// signal that its outbox changed: an outcome written (with an attempt or
/// without) or a wait's events written by the worker. What else changes it (a
/// create, a cancel, a redelivery) is the test's own request, done before this
/// reads. Fails after [`signals::BOUND`] with no signal that gets there.
async fn deliveries_when(app: &App, id: &str, f: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut heard = app.heard();
    loop {
        let d = deliveries(app, id).await;
        if f(&d) {
            return d;
        }
        let changed = heard
            .next(signals::BOUND, |s| {
                matches!(
                    s,
                    signals::Signal::Attempted { .. }
                        | signals::Signal::Returned { .. }
                        | signals::Signal::Recorded { .. }
                )
            })
            .await;
        assert!(changed.is_some(), "the deliveries never got there: {d:#?}");
    }
}

#[tokio::test]
async fn every_announced_event_arrives_signed_so_that_the_standardwebhooks_package_verifies_it() {
    for kind in BOTH {
        let run = Running::start(kind, &[]).await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let secret = secret();
        let hook = rx.url("/hook");
        let (status, w) = run
            .app
            .create(notifying(
                &up,
                "/s/1",
                &hook,
                &secret,
                json!(["created", "state", "ended"]),
            ))
            .await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        assert_eq!(w["spec"]["notify"][0]["secret"], "<redacted>", "{w}");
        assert!(
            rx.until_got("/hook", 3, Duration::from_secs(10)).await,
            "{kind:?}: got {:?}",
            rx.all().len()
        );
        let got = rx.got("/hook");
        let verdicts = verify_with_standardwebhooks(&secret, &got);
        assert_eq!(
            verdicts,
            ["ok wait.created", "ok wait.state", "ok wait.succeeded"],
            "{kind:?}"
        );
        // Tampered, the same message fails: the verifier does check.
        let mut forged = got[2].clone();
        forged.body = String::from_utf8(forged.body)
            .unwrap()
            .replace("succeeded", "failed")
            .into_bytes();
        assert!(verify_with_standardwebhooks(&secret, &[forged])[0].starts_with("error"));
        let other = self::secret();
        assert!(verify_with_standardwebhooks(&other, &got[..1])[0].starts_with("error"));

        // The headers and the body.
        let last = &got[2];
        assert!(
            last.header("user-agent").starts_with("waitd/"),
            "{:?}",
            last.headers
        );
        assert_eq!(last.header("content-type"), "application/json");
        let body = last.json();
        assert_eq!(body["type"], "wait.succeeded");
        assert_eq!(body["data"]["id"], id.as_str());
        assert_eq!(body["data"]["status"], "succeeded");
        assert_eq!(body["event"]["seq"], 3);
        assert_eq!(body["event"]["kind"], "succeeded");
        assert_eq!(body["data"]["spec"]["notify"][0]["secret"], "<redacted>");
        let text = String::from_utf8_lossy(&last.body);
        assert!(!text.contains(&secret[6..]), "the secret is never sent");

        // GET /waits/{id}/deliveries says the same, with the same webhook ids.
        let d = deliveries_when(&run.app, &id, |d| {
            d.len() == 3 && d.iter().all(|x| x["status"] == "delivered")
        })
        .await;
        let ids: Vec<&str> = d
            .iter()
            .map(|x| x["webhook_id"].as_str().unwrap())
            .collect();
        let sent: Vec<String> = got.iter().map(|r| r.header("webhook-id")).collect();
        assert_eq!(ids, sent, "{kind:?}");
        assert_eq!(d[0]["kind"], "created");
        assert_eq!(d[2]["attempts"][0]["status_code"], 200);
        assert_eq!(d[2]["attempts_total"], 1);
        // Reads never show the secret.
        for path in [
            format!("/waits/{id}"),
            "/waits".into(),
            format!("/waits/{id}/events"),
            format!("/waits/{id}/deliveries"),
        ] {
            let r = run.app.client.get(run.app.url(&path)).send().await.unwrap();
            let t = r.text().await.unwrap();
            assert!(!t.contains(&secret[6..]), "{path} shows the secret");
        }
        run.stop().await;
    }
}

#[tokio::test]
async fn a_receiver_that_answers_500_three_times_gets_it_on_the_fourth_attempt_on_schedule() {
    for kind in BOTH {
        let run = Running::start(kind, &[]).await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let hook = rx.script(
            "/flaky",
            vec![
                Answer::code(500),
                Answer::code(500),
                Answer::code(500),
                Answer::code(200),
            ],
        );
        let (_, w) = run
            .app
            .create(notifying(&up, "/s/2", &hook, &secret(), json!(["ended"])))
            .await;
        let id = w["id"].as_str().unwrap().to_string();
        let d = deliveries_when(&run.app, &id, |d| {
            d.len() == 1 && d[0]["status"] == "delivered"
        })
        .await;
        let got = rx.got("/flaky");
        assert_eq!(got.len(), 4, "{kind:?}: delivered on the fourth attempt");
        assert!(
            got.iter()
                .all(|r| r.header("webhook-id") == got[0].header("webhook-id"))
        );
        // The schedule at a base of 20 ms: 20, 120, 480 ms (±10%), and the worker
        // wakes for its own retries, so each comes within a little of it: half a
        // second on a busy host, which the idle look (each second) would often miss.
        for (i, planned) in [20.0, 120.0, 480.0].into_iter().enumerate() {
            let gap = (got[i + 1].at - got[i].at).as_secs_f64() * 1e3;
            assert!(
                gap >= planned * 0.9 - 2.0 && gap <= planned * 1.1 + 500.0,
                "{kind:?}: retry {} came {gap:.0} ms after the attempt before; planned {planned} ms ±10%",
                i + 1
            );
        }
        let codes: Vec<u64> = d[0]["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["status_code"].as_u64().unwrap())
            .collect();
        assert_eq!(codes, [500, 500, 500, 200]);
        assert_eq!(d[0]["attempts_total"], 4);
        let metrics = run
            .app
            .client
            .get(run.app.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            metrics.contains("waitd_webhook_attempts_total{outcome=\"retry\"} 3"),
            "{metrics}"
        );
        assert!(
            metrics.contains("waitd_webhook_attempts_total{outcome=\"delivered\"} 1"),
            "{metrics}"
        );
        run.stop().await;
    }
}

#[tokio::test]
async fn a_receiver_that_is_down_for_a_while_gets_the_delivery_once_it_is_back() {
    for kind in BOTH {
        let run = Running::start(kind, &[]).await;
        let up = Upstream::start().await;
        let down = Receiver::down();
        let (_, w) = run
            .app
            .create(notifying(
                &up,
                "/s/3",
                &down.url("/back"),
                &secret(),
                json!(["ended"]),
            ))
            .await;
        let id = w["id"].as_str().unwrap().to_string();
        // Refused connections: a few attempts fail (20 ms, then 120 ms, then 480 ms
        // apart), while the delivery stays pending.
        let d = deliveries_when(&run.app, &id, |d| {
            d.len() == 1 && d[0]["attempts_total"].as_i64() >= Some(2)
        })
        .await;
        assert_eq!(d[0]["status"], "pending");
        assert!(d[0]["attempts"][0]["error"].as_str().is_some(), "{d:?}");
        assert!(d[0]["next_attempt_at"].is_string());
        let rx = Receiver::start_on(down.port, None).await;
        let d = deliveries_when(&run.app, &id, |d| d[0]["status"] == "delivered").await;
        assert_eq!(rx.got("/back").len(), 1, "{kind:?}");
        let last = d[0]["attempts"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["status_code"], 200);
        run.stop().await;
    }
}

#[tokio::test]
async fn retry_after_sets_the_next_attempt_and_410_stops_the_webhook() {
    for kind in BOTH {
        let run = Running::start(kind, &[]).await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        // 503 with Retry-After: 120 → the next attempt is planned two minutes on,
        // not 20 ms on as the schedule says.
        let hook = rx.script(
            "/busy",
            vec![Answer::Status(
                503,
                vec![("retry-after".into(), "120".into())],
            )],
        );
        let (_, w) = run
            .app
            .create(notifying(&up, "/s/4", &hook, &secret(), json!(["ended"])))
            .await;
        let id = w["id"].as_str().unwrap().to_string();
        let d = deliveries_when(&run.app, &id, |d| {
            d.len() == 1 && d[0]["attempts_total"] == 1
        })
        .await;
        let at = chrono::DateTime::parse_from_rfc3339(d[0]["attempts"][0]["at"].as_str().unwrap())
            .unwrap();
        let next = chrono::DateTime::parse_from_rfc3339(d[0]["next_attempt_at"].as_str().unwrap())
            .unwrap();
        let after = (next - at).num_milliseconds();
        assert!(
            (119_000..=121_500).contains(&after),
            "{kind:?}: next attempt {after} ms after; {d:?}"
        );

        // 410 on the first event: that delivery and every later one to it stop.
        let gone = rx.script("/gone", vec![Answer::code(410)]);
        let mut s = spec(&up.script(
            "/s/5",
            vec![
                Reply::status("deploying"),
                Reply::status("deploying"),
                Reply::status("on"),
            ],
        ));
        s["notify"] =
            json!([{"url": gone, "secret": secret(), "events": ["created", "state", "ended"]}]);
        let (_, w) = run.app.create(s).await;
        let id = w["id"].as_str().unwrap().to_string();
        run.app.wait_end(&id).await;
        let d = deliveries_when(&run.app, &id, |d| {
            !d.is_empty() && d.iter().all(|x| x["status"] == "stopped")
        })
        .await;
        assert_eq!(d[0]["attempts"][0]["status_code"], 410);
        assert_eq!(
            rx.got("/gone").len(),
            1,
            "{kind:?}: nothing more after the 410: {d:?}"
        );
        run.stop().await;
    }
}

#[tokio::test]
async fn a_delivery_can_be_sent_again_with_the_same_webhook_id_but_not_while_pending() {
    for kind in BOTH {
        let run = Running::start(
            kind,
            &[
                "--tokens",
                "alice:alice-token-0123456789,bob:bob-token-0123456789",
                "--webhook-redelivery-interval",
                "100ms",
            ],
        )
        .await;
        let app = &run.app;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let hook = rx.url("/again");
        let post = |path: String, token: &'static str| {
            let c = app.client.post(app.url(&path)).bearer_auth(token);
            async move {
                let r = c.send().await.unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        let mut heard = app.heard();
        let r = app
            .client
            .post(app.url("/waits"))
            .bearer_auth("alice-token-0123456789")
            .json(&notifying(&up, "/s/6", &hook, &secret(), json!(["ended"])))
            .send()
            .await
            .unwrap();
        let w: Value = r.json().await.unwrap();
        let id = w["id"].as_str().unwrap().to_string();
        assert_eq!(heard.attempt(&id).await, signals::DeliveryStatus::Delivered);
        let listed: Value = app
            .client
            .get(app.url(&format!("/waits/{id}/deliveries")))
            .bearer_auth("alice-token-0123456789")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(listed["items"][0]["status"], "delivered", "{listed}");
        let did = listed["items"][0]["id"].as_i64().unwrap();
        let (status, d) = post(
            format!("/waits/{id}/deliveries/{did}/retry"),
            "alice-token-0123456789",
        )
        .await;
        assert_eq!(status, 202, "{d}");
        // The server noted when it queued the redelivery before it answered, so
        // the interval counted from the answer has passed on its clock too.
        let queued = tokio::time::Instant::now();
        assert!(rx.until_got("/again", 2, Duration::from_secs(10)).await);
        let got = rx.got("/again");
        assert_eq!(got[0].header("webhook-id"), got[1].header("webhook-id"));
        // While pending (a receiver now answering 500 keeps it so), a retry is a 409.
        rx.script("/again", vec![Answer::code(500)]);
        // The redelivery is delivered once its outcome is written, and may be
        // queued again once the redelivery interval (100 ms, a rule of the clock)
        // has passed since it was queued.
        heard
            .attempted(&id, signals::DeliveryStatus::Delivered)
            .await;
        tokio::time::sleep_until(queued + Duration::from_millis(100)).await;
        let (status, p) = post(
            format!("/waits/{id}/deliveries/{did}/retry"),
            "alice-token-0123456789",
        )
        .await;
        assert_eq!(status, 202, "{p}");
        let (status, p) = post(
            format!("/waits/{id}/deliveries/{did}/retry"),
            "alice-token-0123456789",
        )
        .await;
        assert_eq!(status, 409, "{p}");
        assert!(
            p["detail"].as_str().unwrap().contains("still pending"),
            "{p}"
        );
        // Another tenant sees no such wait; no such delivery is a 404 too.
        let (status, _) = post(
            format!("/waits/{id}/deliveries/{did}/retry"),
            "bob-token-0123456789",
        )
        .await;
        assert_eq!(status, 404);
        let r = app
            .client
            .get(app.url(&format!("/waits/{id}/deliveries")))
            .bearer_auth("bob-token-0123456789")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        for bad in ["999999", "x", "-1", "99999999999999999999"] {
            let (status, p) = post(
                format!("/waits/{id}/deliveries/{bad}/retry"),
                "alice-token-0123456789",
            )
            .await;
            assert_eq!(status, 404, "{bad}: {p}");
        }
        run.stop().await;
    }
}

#[tokio::test]
async fn a_create_refuses_a_webhook_without_a_usable_secret_or_with_unknown_events_and_never_echoes_the_secret()
 {
    let app = in_process::InProcess::start().await;
    let url = "https://ci.example.com/hook";
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!([{"url": url}]), "notify[0].secret", "is required"),
        (
            json!([{"url": url, "secret": "hunter2-is-my-password"}]),
            "notify[0].secret",
            "is not a Standard Webhooks secret",
        ),
        (
            json!([{"url": url, "secret": "whsec_c2hvcnQ="}]),
            "notify[0].secret",
            "holds a key of 5 bytes",
        ),
        (
            json!([{"url": url, "secret": secret(), "events": ["endd"]}]),
            "notify[0].events[0]",
            "did you mean \"ended\"",
        ),
        (
            json!([{"url": url, "secret": secret(), "events": []}]),
            "notify[0].events",
            "non-empty",
        ),
        (
            json!([{"url": url, "secret": secret(), "evnts": ["ended"]}]),
            "notify[0].evnts",
            "did you mean \"events\"",
        ),
        (
            json!([{"secret": secret()}]),
            "notify[0].url",
            "is required",
        ),
        (
            json!([{"url": "ftp://x/", "secret": secret()}]),
            "notify[0].url",
            "scheme",
        ),
        (
            json!([{"url": "https://user:pw@x/", "secret": secret()}]),
            "notify[0].url",
            "credentials",
        ),
        (
            json!(vec![json!({"url": url, "secret": secret()}); 5]),
            "notify",
            "the limit is 4",
        ),
        (json!({"url": url}), "notify", "must be an array"),
    ];
    for (notify, field, says) in cases {
        let mut s = spec("https://api.example.com/x");
        s["notify"] = notify.clone();
        let (status, p) = app.create(s).await;
        assert_eq!(status, 400, "{notify}: {p}");
        let text = p.to_string();
        assert!(
            p["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["field"] == field && e["message"].as_str().unwrap().contains(says)),
            "{notify}: {p}"
        );
        assert!(
            !text.contains("hunter2"),
            "a wrong secret is never echoed: {p}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn a_webhook_at_loopback_or_the_metadata_address_is_refused_at_creation_and_at_connect_time()
{
    // Targets are allowed by name here, so that the webhook's address is the only
    // thing the guard judges.
    for kind in BOTH {
        let rx = Receiver::start().await;
        let up = Upstream::start().await;
        let resolve = "target.test=127.0.0.1,evil.test=127.0.0.1";
        let dir = TempDir::new("waitd-webhooks");
        let db = match kind {
            Kind::Postgres => Some(TestDb::new().await),
            Kind::Sqlite => None,
        };
        let url = db
            .as_ref()
            .map_or_else(|| dir.sqlite_url(), |d| d.url.clone());
        let args = set_flag(
            set_flag(test_args(&url), "--allow-targets", "target.test"),
            "--resolve",
            resolve,
        );
        let app = App::start_args(args).await;
        let target = up.script("/s/7", vec![Reply::status("on")]);
        let target = target.replace("127.0.0.1", "target.test");
        for hook in [
            rx.url("/hook"),
            "http://169.254.169.254/latest/meta-data/".to_string(),
            "http://localhost:9/hook".to_string(),
            "http://[::1]:9/hook".to_string(),
            "http://2130706433/hook".to_string(),
        ] {
            let mut s = spec(&target);
            s["notify"] = json!([{"url": hook, "secret": secret()}]);
            let (status, p) = app.create(s).await;
            assert_eq!(status, 422, "{kind:?} {hook}: {p}");
            assert!(
                p["detail"].as_str().unwrap().starts_with("notify[0].url"),
                "{p}"
            );
        }
        // A name that resolves to loopback passes creation and is refused when the
        // deliverer connects: the delivery fails, saying why, and nothing arrives.
        let mut s = spec(&target);
        s["notify"] =
            json!([{"url": format!("http://evil.test:{}/hook", rx.port), "secret": secret()}]);
        let (status, w) = app.create(s).await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        let d = deliveries_when(&app, &id, |d| d.len() == 1 && d[0]["status"] == "failed").await;
        let error = d[0]["attempts"][0]["error"].as_str().unwrap();
        assert!(
            error.contains("evil.test") && error.contains("loopback"),
            "{error}"
        );
        assert_eq!(d[0]["attempts_total"], 1, "a refusal is not retried");
        assert!(rx.all().is_empty());
        app.stop().await.0.unwrap();
        if let Some(db) = db {
            db.drop_db().await;
        }
    }
}

#[tokio::test]
async fn an_attempt_is_bounded_by_the_timeout_and_reads_no_more_than_a_few_kib_of_the_answer() {
    for kind in BOTH {
        let run = Running::start(kind, &["--webhook-timeout", "300ms"]).await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let held = rx.script("/held", vec![Answer::Hold, Answer::code(204)]);
        let endless = rx.script("/endless", vec![Answer::Endless]);
        let (_, a) = run
            .app
            .create(notifying(&up, "/s/8", &held, &secret(), json!(["ended"])))
            .await;
        let (_, b) = run
            .app
            .create(notifying(
                &up,
                "/s/9",
                &endless,
                &secret(),
                json!(["ended"]),
            ))
            .await;
        let a = a["id"].as_str().unwrap().to_string();
        let b = b["id"].as_str().unwrap().to_string();
        let d = deliveries_when(&run.app, &a, |d| {
            d.len() == 1 && d[0]["status"] == "delivered"
        })
        .await;
        let first = &d[0]["attempts"][0];
        assert!(
            first["error"]
                .as_str()
                .unwrap()
                .contains("did not answer within 300ms"),
            "{first}"
        );
        let took = first["duration_ms"].as_u64().unwrap();
        assert!(
            (300..1500).contains(&took),
            "{kind:?}: the held attempt took {took} ms"
        );
        // An answer that never ends: 200 is read, then the connection dropped.
        let d = deliveries_when(&run.app, &b, |d| {
            d.len() == 1 && d[0]["status"] == "delivered"
        })
        .await;
        let took = d[0]["attempts"][0]["duration_ms"].as_u64().unwrap();
        assert!(
            took < 300,
            "{kind:?}: the endless answer was read for {took} ms"
        );
        run.stop().await;
    }
}

#[test]
fn the_retry_schedule_spans_about_22_hours_in_eleven_attempts_and_jitters_by_ten_percent() {
    use waitd::notify::retry_delay;
    let base = Duration::from_secs(5);
    let total: Duration = (1..=10).map(|t| retry_delay(t, base, 0.5).unwrap()).sum();
    assert_eq!(total, Duration::from_secs(78_155));
    assert!(total < Duration::from_secs(24 * 3600));
    assert_eq!(retry_delay(11, base, 0.5), None, "eleven attempts in all");
    assert_eq!(retry_delay(0, base, 0.5), None);
    assert_eq!(retry_delay(1, base, 0.0), Some(Duration::from_millis(4500)));
    assert_eq!(retry_delay(1, base, 1.0), Some(Duration::from_millis(5500)));
    assert_eq!(retry_delay(3, base, 0.5), Some(Duration::from_secs(120)));
}

#[tokio::test]
async fn the_documented_receiver_verifies_and_prints_what_waitd_sends_and_refuses_a_forgery() {
    // The receiver built on a Standard Webhooks library (docs/webhooks.md); the
    // README's standard-library one runs in tests/readme.rs.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/webhooks.md")).unwrap();
    let section = &readme[readme.find("# Webhooks").expect("a Webhooks page")..];
    let start = section.find("```python\n").expect("a Python receiver") + "```python\n".len();
    let code = &section[start..start + section[start..].find("```").unwrap()];
    assert!(
        code.lines().count() <= 12,
        "the receiver is about ten lines:\n{code}"
    );
    let port = support::replica::free_port();
    let code = code.replace("9001", &port.to_string());
    let dir = TempDir::new("waitd-readme-receiver");
    let secret = secret();
    std::fs::write(dir.path.join("hook.secret"), format!("{secret}\n")).unwrap();
    let mut child = std::process::Command::new(support::receiver::python_with_standardwebhooks())
        .args(["-c", &code])
        .current_dir(&dir.path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let listening = until(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    assert!(listening.is_some(), "the README receiver did not start");
    let run = Running::start(Kind::Sqlite, &[]).await;
    let up = Upstream::start().await;
    let hook = format!("http://127.0.0.1:{port}/hook");
    let (_, w) = run
        .app
        .create(notifying(&up, "/s/10", &hook, &secret, json!(["ended"])))
        .await;
    let id = w["id"].as_str().unwrap().to_string();
    let d = deliveries_when(&run.app, &id, |d| {
        d.len() == 1 && d[0]["status"] == "delivered"
    })
    .await;
    assert_eq!(d[0]["attempts"][0]["status_code"], 204);
    // A forgery (signed with another secret) gets a 401.
    let forged = reqwest::Client::new()
        .post(&hook)
        .header("webhook-id", "msg_forged")
        .header(
            "webhook-timestamp",
            chrono::Utc::now().timestamp().to_string(),
        )
        .header("webhook-signature", "v1,bm90IGEgc2lnbmF0dXJl")
        .body("{\"type\":\"wait.succeeded\",\"data\":{}}")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status(), 401);
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        printed.starts_with(&format!("wait.succeeded {id} the target reached")),
        "{printed}"
    );
    run.stop().await;
}

#[tokio::test]
async fn a_receiver_that_never_answers_cannot_hold_up_deliveries_to_the_others() {
    for kind in BOTH {
        // 20 attempts at once in all, so a tenant's share is 20 (not 32), and each of
        // its receivers gets half of that. An attempt is bounded by the webhook
        // timeout and by half the lease TTL: both are longer than the test, so no
        // held attempt ends, and frees its place, before the count is looked at.
        let run = Running::start(
            kind,
            &[
                "--webhook-concurrency",
                "20",
                "--webhook-timeout",
                "20s",
                "--lease-ttl",
                "60s",
            ],
        )
        .await;
        let up = Upstream::start().await;
        let stuck = Receiver::start().await;
        let fine = Receiver::start().await;
        let held = stuck.script("/held", vec![Answer::Hold]);
        for i in 0..40 {
            let (status, _) = run
                .app
                .create(notifying(
                    &up,
                    &format!("/s/stuck{i}"),
                    &held,
                    &secret(),
                    json!(["ended"]),
                ))
                .await;
            assert_eq!(status, 201);
        }
        assert!(stuck.until_got("/held", 10, Duration::from_secs(10)).await);
        let t0 = std::time::Instant::now();
        for i in 0..5 {
            run.app
                .create(notifying(
                    &up,
                    &format!("/s/fine{i}"),
                    &fine.url("/ok"),
                    &secret(),
                    json!(["ended"]),
                ))
                .await;
        }
        assert!(fine.until_got("/ok", 5, Duration::from_secs(10)).await);
        // Held behind the stuck receiver, they would wait for an attempt to end:
        // the webhook timeout, 20 s.
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(5),
            "{kind:?}: the other receiver waited {took:?} behind the one that never answers"
        );
        // No 11th while those 10 are held: looked at once the other receiver's
        // deliveries are in, within the timeout (20 s) of the 10.
        assert_eq!(
            stuck.got("/held").len(),
            10,
            "{kind:?}: attempts at once to one receiver"
        );
        run.stop().await;
    }
}

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-0123456789";
const TENANTS: &str = "alice:alice-token-0123456789,bob:bob-token-0123456789";

/// `POST /waits` as the tenant of `token`: the wait's id.
async fn create_as(app: &App, token: &str, spec: Value) -> String {
    let r = app
        .client
        .post(app.url("/waits"))
        .bearer_auth(token)
        .json(&spec)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let w: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{w}");
    w["id"].as_str().unwrap().to_string()
}

/// Every delivery of a wait, page after page, as the tenant of `token` (none:
/// anonymously).
async fn all_deliveries_as(app: &App, token: Option<&str>, id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = String::new();
    loop {
        let mut req = app
            .client
            .get(app.url(&format!("/waits/{id}/deliveries{after}")));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await.unwrap();
        let page: Value = r.json().await.unwrap();
        out.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => after = format!("?after={c}"),
            None => return out,
        }
    }
}

/// The issue's H2: a hundred waits of one tenant, each with four webhooks to a path
/// that accepts the connection and never answers, and another tenant's webhook at
/// the same host and port. The hung path holds half of its own tenant's share of
/// attempts (16), and the other tenant's delivery goes at once.
#[tokio::test]
async fn one_tenants_hung_receiver_does_not_delay_another_tenants_delivery_to_the_same_host() {
    for kind in BOTH {
        // Attempts that hang for the whole test: a 30 s timeout (at most half the lease).
        let run = Running::start(
            kind,
            &[
                "--tokens",
                TENANTS,
                "--lease-ttl",
                "60s",
                "--webhook-timeout",
                "30s",
            ],
        )
        .await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let held = rx.script("/held", vec![Answer::Hold]);
        let hooks: Vec<Value> = (0..4)
            .map(|_| json!({"url": held, "secret": secret(), "events": ["created", "ended"]}))
            .collect();
        for i in 0..100 {
            let mut s = spec(&up.script(&format!("/a/{i}"), vec![Reply::status("on")]));
            s["notify"] = json!(hooks);
            create_as(&run.app, ALICE, s).await;
        }
        assert!(rx.until_got("/held", 16, Duration::from_secs(10)).await);
        let hung_before = rx.got("/held").len();

        let mut heard = run.app.heard();
        let t0 = std::time::Instant::now();
        let bob = create_as(
            &run.app,
            BOB,
            notifying(&up, "/b/1", &rx.url("/ok"), &secret(), json!(["created"])),
        )
        .await;
        assert!(
            rx.until_got("/ok", 1, Duration::from_secs(30)).await,
            "{kind:?}: bob's delivery never arrived"
        );
        let latency = t0.elapsed();
        println!(
            "{kind:?}: bob's delivery arrived {latency:?} after its create, with alice's receiver hung"
        );
        assert!(
            latency < Duration::from_secs(5),
            "{kind:?}: bob's delivery took {latency:?} while alice's receiver hung"
        );
        // Its outcome is written once the writer's batch commits.
        assert_eq!(
            heard.attempt(&bob).await,
            signals::DeliveryStatus::Delivered,
            "{kind:?}: bob's delivery was never recorded delivered"
        );
        let d = all_deliveries_as(&run.app, Some(BOB), &bob).await;
        assert_eq!(d[0]["attempts_total"], 1, "{kind:?}: {d:?}");
        // Alice's hung receiver never had more than its half of her share (16 of 32).
        let hung = rx.got("/held").len();
        assert_eq!(
            (hung_before, hung),
            (16, 16),
            "{kind:?}: attempts at once to alice's hung receiver"
        );
        run.stop().await;
    }
}

/// A connection of the test's own to the store waitd runs on.
enum Peek {
    Pg(sqlx::PgConnection),
    Lite(sqlx::SqliteConnection),
}

impl Peek {
    async fn open(run: &Running) -> Peek {
        use sqlx::Connection;
        match &run.db {
            Some(db) => Peek::Pg(sqlx::PgConnection::connect(&db.url).await.unwrap()),
            None => Peek::Lite(
                sqlx::SqliteConnection::connect(&run.dir.sqlite_url())
                    .await
                    .unwrap(),
            ),
        }
    }

    /// The most pending deliveries of one webhook of a wait, and of one wait, read in
    /// one statement (the API's pages are not one snapshot).
    async fn pending_most(&mut self) -> (i64, i64) {
        const SQL_WEBHOOK: &str = "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n \
             FROM deliveries WHERE status = 'pending' GROUP BY wait_id, endpoint) c";
        const SQL_WAIT: &str = "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n \
             FROM deliveries WHERE status = 'pending' GROUP BY wait_id) c";
        let (webhook, wait): ((i64,), (i64,)) = match self {
            Peek::Pg(c) => (
                sqlx::query_as(SQL_WEBHOOK)
                    .fetch_one(&mut *c)
                    .await
                    .unwrap(),
                sqlx::query_as(SQL_WAIT).fetch_one(&mut *c).await.unwrap(),
            ),
            Peek::Lite(c) => (
                sqlx::query_as(SQL_WEBHOOK)
                    .fetch_one(&mut *c)
                    .await
                    .unwrap(),
                sqlx::query_as(SQL_WAIT).fetch_one(&mut *c).await.unwrap(),
            ),
        };
        (webhook.0, wait.0)
    }
}

async fn metrics(app: &App) -> String {
    app.client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The issue's M1: a wait whose state changes on every poll, with four webhooks on
/// `state` to a receiver that fails. Its webhooks never hold more pending
/// deliveries than their bound (3), nor the wait more than its own (10, less than
/// four times three); the ones dropped say which bound dropped them, the first in
/// line of each webhook keeps its place, the newest are kept, and the metric counts
/// them.
#[tokio::test]
async fn a_wait_that_changes_on_every_poll_never_holds_more_pending_deliveries_than_its_bounds() {
    for kind in BOTH {
        let run = Running::start(
            kind,
            &[
                "--max-pending-deliveries-per-webhook",
                "3",
                "--max-pending-deliveries-per-wait",
                "10",
            ],
        )
        .await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let failing = rx.script("/fail", vec![Answer::code(500)]);
        let flips: Vec<Reply> = (0..5000)
            .map(|i| Reply::status(if i % 2 == 0 { "a" } else { "b" }))
            .collect();
        let mut s = spec(&up.script("/flip", flips));
        s["notify"] = json!(
            (0..4)
                .map(|_| json!({"url": failing, "secret": secret(), "events": ["state"]}))
                .collect::<Vec<_>>()
        );
        let (status, w) = run.app.create(s).await;
        assert_eq!(status, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        let mut peek = Peek::open(&run).await;
        let mut samples = 0;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            let (webhook, wait) = peek.pending_most().await;
            assert!(webhook <= 3, "{kind:?}: {webhook} pending for one webhook");
            assert!(wait <= 10, "{kind:?}: {wait} pending for one wait");
            samples += 1;
            // Looked at again after the next poll, whose change adds deliveries.
            let polled = up.hits("/flip");
            assert!(
                up.hit("/flip", polled + 1, Duration::from_secs(5)).await,
                "{kind:?}: the wait stopped polling"
            );
        }
        let (status, _) = run.app.post(&format!("/waits/{id}/cancel")).await;
        assert_eq!(status, 200);
        let d = all_deliveries_as(&run.app, None, &id).await;
        let count = |f: &dyn Fn(&Value) -> bool| d.iter().filter(|x| f(x)).count();
        let pending = count(&|x| x["status"] == "pending");
        let by_webhook = count(&|x| x["drop_reason"] == "webhook_cap");
        let by_wait = count(&|x| x["drop_reason"] == "wait_cap");
        println!(
            "{kind:?}: {} deliveries in 3 s, {pending} pending, dropped {by_webhook} by the webhook bound and {by_wait} by the wait's; {samples} samples",
            d.len()
        );
        assert!(d.len() > 100, "{kind:?}: only {} deliveries", d.len());
        assert!(pending <= 10, "{kind:?}: {pending} pending");
        assert!(
            by_webhook > 0 && by_wait > 0,
            "{kind:?}: {by_webhook} / {by_wait}"
        );
        assert!(
            d.iter()
                .filter(|x| x["status"] == "dropped")
                .all(|x| x["next_attempt_at"].is_null()
                    && x["finished_at"].is_string()
                    && x["attempts_total"] == 0),
            "{kind:?}: a dropped delivery is finished, unsent"
        );
        // Each webhook's first delivery is still in line (its retry schedule goes on),
        // and the wait's newest event is pending for some webhook.
        for endpoint in 0..4 {
            let first = d.iter().find(|x| x["endpoint"] == endpoint).unwrap();
            assert_eq!(first["status"], "pending", "{kind:?}: {first}");
            assert!(first["attempts_total"].as_i64().unwrap() >= 1, "{first}");
        }
        let newest = d.iter().map(|x| x["seq"].as_i64().unwrap()).max().unwrap();
        assert!(
            d.iter()
                .any(|x| x["seq"] == newest && x["status"] == "pending"),
            "{kind:?}: the newest event is not pending"
        );
        // The store's counts, which every replica reports (read about once a second).
        let counted = |m: &str, reason: &str| {
            let line = format!("waitd_webhook_deliveries_dropped_total{{reason=\"{reason}\"}} ");
            m.lines()
                .find_map(|l| l.strip_prefix(&line))
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
        };
        let ok = poll_for(Duration::from_secs(5), || async {
            let m = metrics(&run.app).await;
            (counted(&m, "webhook_cap") >= by_webhook && counted(&m, "wait_cap") >= by_wait)
                .then_some(())
        })
        .await;
        let m = metrics(&run.app).await;
        assert!(ok.is_some(), "{kind:?}: {m}");
        run.stop().await;
    }
}

/// The issue's M4: `POST .../retry` in a loop. A delivery is queued again at most
/// once per interval; the rest are 429s that say when, so the receiver gets a
/// bounded number of requests.
#[tokio::test]
async fn redelivering_in_a_loop_is_refused_with_429_and_reaches_the_receiver_once_per_interval() {
    for kind in BOTH {
        let run = Running::start(kind, &["--webhook-redelivery-interval", "1s"]).await;
        let up = Upstream::start().await;
        let rx = Receiver::start().await;
        let hook = rx.url("/again");
        let (_, w) = run
            .app
            .create(notifying(&up, "/s/m4", &hook, &secret(), json!(["ended"])))
            .await;
        let id = w["id"].as_str().unwrap().to_string();
        let d = deliveries_when(&run.app, &id, |d| {
            d.len() == 1 && d[0]["status"] == "delivered"
        })
        .await;
        let did = d[0]["id"].as_i64().unwrap();
        let mut heard = run.app.heard();
        let url = run.app.url(&format!("/waits/{id}/deliveries/{did}/retry"));
        let mut codes = std::collections::BTreeMap::<u16, usize>::new();
        let mut refusal = None;
        // How long after the last 202 each 409 (the redelivery still pending or in
        // flight) came: the attempt follows the queueing at once, so only the
        // first few milliseconds after a 202 can answer 409.
        let mut queued_at = None;
        let mut late_409 = Duration::ZERO;
        let t0 = std::time::Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            let r = run.app.client.post(&url).send().await.unwrap();
            let code = r.status().as_u16();
            *codes.entry(code).or_default() += 1;
            match code {
                202 => queued_at = Some(std::time::Instant::now()),
                409 => {
                    let since = queued_at.map_or(t0.elapsed(), |t| t.elapsed());
                    late_409 = late_409.max(since);
                }
                _ => {}
            }
            if code == 429 && refusal.is_none() {
                let after = r.headers()["retry-after"].to_str().unwrap().to_string();
                refusal = Some((after, r.json::<Value>().await.unwrap()));
            }
        }
        // Whatever is still on its way arrives: each redelivery queued is
        // attempted (the receiver has had it once its outcome is written).
        let queued = codes.get(&202).copied().unwrap_or(0);
        for _ in 0..queued {
            heard
                .attempted(&id, signals::DeliveryStatus::Delivered)
                .await;
        }
        let posts = rx.got("/again").len();
        println!(
            "{kind:?}: retries in 3 s: {codes:?}; last 409 {late_409:?} after its 202; POSTs at the receiver: {posts}"
        );
        assert!(
            (2..=4).contains(&queued),
            "{kind:?}: {queued} redeliveries queued in 3 s at one a second: {codes:?}"
        );
        assert!(codes.get(&429).copied().unwrap_or(0) > 10, "{codes:?}");
        // A redelivery pending half a second after it was queued waited for the
        // deliverer's idle look instead of being woken.
        assert!(
            late_409 < Duration::from_millis(500),
            "{kind:?}: a redelivery still pending {late_409:?} after it was queued: {codes:?}"
        );
        assert!(
            posts <= 1 + queued,
            "{kind:?}: {posts} POSTs for {queued} redeliveries"
        );
        let (after, p) = refusal.unwrap();
        assert_eq!(after, "1", "{p}");
        assert_eq!(p["status"], 429);
        let detail = p["detail"].as_str().unwrap();
        assert!(
            detail.contains("at most once per 1s") && detail.contains("try again in 1 s"),
            "{detail}"
        );
        run.stop().await;
    }
}
