//! What one tenant is told stays its own: a target that asks one tenant's
//! requests for quiet (a 429 or 503 with `Retry-After`, a rate limit with none
//! remaining) pauses the requests of that tenant with those credentials, and
//! nobody else's; a poll held back by a pause is no poll, so it costs a wait no
//! retry; and `--host-rate` hands its turns round the tenants rather than to
//! whoever asked first.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::*;

const TOKEN_A: &str = "tenant-a-token-0123456789";
const TOKEN_B: &str = "tenant-b-token-0123456789";

fn with_tenants(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    args.extend(["--tokens".to_string(), format!("a:{TOKEN_A},b:{TOKEN_B}")]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A spec polling `url` every `ms` milliseconds, retrying as often, until its
/// deadline a minute away.
fn every(url: &str, ms: u64) -> Value {
    let mut s = spec(url);
    let d = format!("{ms}ms");
    s["poll"] = json!({"initial": d, "factor": 1, "max": d, "jitter": 0});
    s["retry"] = json!({"delay": d, "max_delay": d, "max_retries": null});
    s["timeout"] = json!("1m");
    s
}

/// Creates a wait as the tenant of `token`: its id.
async fn create_as(app: &App, token: &str, spec: &Value) -> String {
    let (code, body) = app.create_as(token, spec).await;
    assert_eq!(code, 201, "{body}");
    body["id"].as_str().unwrap().to_string()
}

async fn read_as(app: &App, token: &str, path: &str) -> Value {
    app.get_as(token, path).await.1
}

async fn cancel_as(app: &App, token: &str, id: &str) {
    let (code, w) = app.post_as(token, &format!("/waits/{id}/cancel")).await;
    assert_eq!(code, 200, "{w}");
}

/// Every way a target asks for quiet, each far longer than a test: a `Retry-After`
/// of 31 years, a date in year 9999, milliseconds, a `200` with GitHub's rate
/// limit spent until a reset in year 5138, a `200` with the IETF `RateLimit`
/// spent, and a `503` with `Retry-After`.
fn ways_to_ask_for_quiet() -> Vec<(&'static str, Reply)> {
    let deploying = json!({"data": {"attributes": {"status": "deploying"}}});
    vec![
        (
            "429 Retry-After: 999999999",
            Reply::json(429, json!({})).header("retry-after", "999999999"),
        ),
        (
            "429 Retry-After in year 9999",
            Reply::json(429, json!({})).header("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
        ),
        (
            "429 retry-after-ms",
            Reply::json(429, json!({})).header("retry-after-ms", "99999999999"),
        ),
        (
            "200 X-RateLimit-Remaining: 0",
            Reply::json(200, deploying.clone())
                .header("x-ratelimit-remaining", "0")
                .header("x-ratelimit-reset", "99999999999"),
        ),
        (
            "200 RateLimit r=0",
            Reply::json(200, deploying).header("ratelimit", "\"default\";r=0;t=999999"),
        ),
        (
            "503 Retry-After",
            Reply::json(503, json!({})).header("retry-after", "999999"),
        ),
    ]
}

/// Tenant A's wait is told, in each way there is, to be quiet for an hour.
/// Tenant B's wait on the same host keeps its schedule, and so does A's wait
/// with other credentials; only A's waits with the same credentials are held
/// back, sending nothing and counting no poll, and each shows its pause, until
/// when and why.
async fn a_pause_holds_back_only_the_requests_it_was_asked_of(args: Vec<String>) {
    let app = App::start_args(with_tenants(args, &[])).await;
    for (how, reply) in ways_to_ask_for_quiet() {
        let up = Upstream::start().await;
        let told = up.script("/told", vec![reply]);
        let same = up.script("/same", vec![Reply::status("deploying")]);
        let other_tenant = up.script("/other-tenant", vec![Reply::status("deploying")]);
        let other_credential = up.script("/other-credential", vec![Reply::status("deploying")]);
        let mut heard = app.heard();
        let told_id = create_as(&app, TOKEN_A, &every(&told, 50)).await;
        heard.recorded(&told_id).await;
        assert_eq!(up.hits("/told"), 1, "{how}");

        let started = Instant::now();
        let same_id = create_as(&app, TOKEN_A, &every(&same, 50)).await;
        let b_id = create_as(&app, TOKEN_B, &every(&other_tenant, 50)).await;
        let mut credentialed = every(&other_credential, 50);
        credentialed["target"]["headers"] = json!({"Authorization": "Bearer another-token"});
        let c_id = create_as(&app, TOKEN_A, &credentialed).await;
        // The wait held back writes its pause: every replica's read shows it.
        heard.recorded(&same_id).await;
        let w = read_as(&app, TOKEN_A, &format!("/waits/{same_id}")).await;
        assert_eq!(w["status"], "running", "{how}: {w}");
        assert_eq!(w["polls"], 0, "{how}: a held poll is no poll: {w}");
        assert_eq!(w["retries"], 0, "{how}: {w}");
        assert!(w["last_error"].is_null(), "{how}: {w}");
        let until = w["paused"]["until"].as_str().unwrap_or_default();
        let until = chrono::DateTime::parse_from_rfc3339(until)
            .unwrap_or_else(|e| panic!("{how}: {e}: {w}"));
        let hour = chrono::Duration::minutes(59);
        assert!(
            until > chrono::Utc::now() + hour,
            "{how}: paused for an hour: {w}"
        );
        let reason = w["paused"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains("this tenant"), "{how}: {w}");
        // The others keep their 50 ms schedule meanwhile.
        assert!(
            up.hit("/other-tenant", 10, Duration::from_secs(10)).await,
            "{how}: tenant B's wait on the host is polled"
        );
        assert!(
            up.hit("/other-credential", 10, Duration::from_secs(10))
                .await,
            "{how}: A's wait with other credentials is polled"
        );
        assert_eq!(up.hits("/same"), 0, "{how}: A's held wait sent nothing");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{how}: {:?}",
            started.elapsed()
        );
        let b = read_as(&app, TOKEN_B, &format!("/waits/{b_id}")).await;
        assert!(b.get("paused").is_none(), "{how}: {b}");
        for (token, id) in [
            (TOKEN_A, &told_id),
            (TOKEN_A, &same_id),
            (TOKEN_B, &b_id),
            (TOKEN_A, &c_id),
        ] {
            cancel_as(&app, token, id).await;
        }
    }
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_pause_holds_back_only_the_requests_it_was_asked_of_on_sqlite() {
    let dir = TempDir::new("waitd-pause");
    a_pause_holds_back_only_the_requests_it_was_asked_of(test_args(&dir.sqlite_url())).await;
}

#[tokio::test]
async fn a_pause_holds_back_only_the_requests_it_was_asked_of_on_postgres() {
    let db = TestDb::new().await;
    a_pause_holds_back_only_the_requests_it_was_asked_of(test_args(&db.url)).await;
    db.drop_db().await;
}

/// An AKS-shaped wait (`Creating`, 500, 500, `Creating`, 500, 500,
/// `Succeeded`, `max_retries: 2`) beside a wait of the same tenant on the same
/// host that is told again and again to back off: the polls held back by those
/// pauses are charged to nothing, so it succeeds, having polled seven times.
async fn polls_held_back_by_a_pause_cost_no_retry(args: Vec<String>) {
    let app = App::start_args(with_tenants(args, &[])).await;
    let up = Upstream::start().await;
    let state = |s: &str| Reply::json(200, json!({"properties": {"provisioningState": s}}));
    let failing = || Reply::json(500, json!({}));
    let aks = up.script(
        "/aks",
        vec![
            state("Creating"),
            failing(),
            failing(),
            state("Creating"),
            failing(),
            failing(),
            state("Succeeded"),
        ],
    );
    let backs_off = up.script(
        "/backs-off",
        vec![Reply::json(503, json!({})).header("retry-after", "1")],
    );
    let mut told = every(&backs_off, 100);
    told["timeout"] = json!("30s");
    let told_id = create_as(&app, TOKEN_A, &told).await;
    assert!(up.hit("/backs-off", 1, Duration::from_secs(10)).await);
    let mut s = every(&aks, 100);
    s["state"] = json!("/properties/provisioningState");
    s["want"] = json!(["Succeeded"]);
    s["pending"] = json!(["Creating"]);
    s["retry"]["max_retries"] = json!(2);
    s["timeout"] = json!("30s");
    let id = create_as(&app, TOKEN_A, &s).await;
    let w = read_as(&app, TOKEN_A, &format!("/waits/{id}?wait=30s")).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["polls"], 7, "{w}");
    assert_eq!(w["retries"], 4, "{w}");
    assert_eq!(up.hits("/aks"), 7);
    // The other wait was told to back off more than once meanwhile.
    assert!(up.hits("/backs-off") >= 2, "{}", up.hits("/backs-off"));
    cancel_as(&app, TOKEN_A, &told_id).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn polls_held_back_by_a_pause_cost_no_retry_on_sqlite() {
    let dir = TempDir::new("waitd-pause");
    polls_held_back_by_a_pause_cost_no_retry(test_args(&dir.sqlite_url())).await;
}

#[tokio::test]
async fn polls_held_back_by_a_pause_cost_no_retry_on_postgres() {
    let db = TestDb::new().await;
    polls_held_back_by_a_pause_cost_no_retry(test_args(&db.url)).await;
    db.drop_db().await;
}

/// A pause is capped by the wait's deadline: a wait held back past it ends
/// `timed_out` at its deadline, its reason saying it was held back and why.
#[tokio::test]
async fn a_wait_held_back_past_its_deadline_ends_timed_out_on_time_saying_why() {
    let dir = TempDir::new("waitd-pause");
    let app = App::start_args(with_tenants(test_args(&dir.sqlite_url()), &[])).await;
    let up = Upstream::start().await;
    let told = up.script(
        "/told",
        vec![Reply::json(429, json!({})).header("retry-after", "3600")],
    );
    let mut heard = app.heard();
    let told_id = create_as(&app, TOKEN_A, &every(&told, 50)).await;
    heard.recorded(&told_id).await;
    let held = up.script("/held", vec![Reply::status("deploying")]);
    let mut s = every(&held, 50);
    s["timeout"] = json!("2s");
    let created = Instant::now();
    let id = create_as(&app, TOKEN_A, &s).await;
    let w = read_as(&app, TOKEN_A, &format!("/waits/{id}?wait=20s")).await;
    let took = created.elapsed();
    assert_eq!(w["status"], "timed_out", "{w}");
    assert!(took < Duration::from_millis(3500), "{took:?}: {w}");
    assert_eq!(w["polls"], 0, "{w}");
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("the deadline passed after 0 polls"), "{w}");
    assert!(reason.contains("held back"), "{w}");
    assert!(reason.contains("429 Too Many Requests"), "{w}");
    assert!(
        w.get("paused").is_none(),
        "an ended wait shows no pause: {w}"
    );
    assert_eq!(up.hits("/held"), 0);
    app.stop().await.0.unwrap();
}

/// Under `--host-rate`, tenant A's forty waits on a host do not keep tenant
/// B's one wait from its turn, nor A's one wait with other credentials from
/// theirs: the turns go round the tenants, then round a tenant's credentials.
async fn a_host_rate_is_shared_fairly(args: Vec<String>) {
    let app = App::start_args(with_tenants(args, &["--host-rate", "4"])).await;
    let up = Upstream::start().await;
    for i in 0..40 {
        let url = up.script(&format!("/a/{i}"), vec![Reply::status("deploying")]);
        create_as(&app, TOKEN_A, &every(&url, 50)).await;
    }
    let many = |up: &Upstream| (0..40).map(|i| up.hits(&format!("/a/{i}"))).sum::<usize>();
    // A's waits are queued for the host's turns, far more than it gives.
    assert!(
        up.requested(Duration::from_secs(10), |up| many(up) >= 8)
            .await
    );
    let b = up.script("/b", vec![Reply::status("on")]);
    let mut s = every(&b, 50);
    s["timeout"] = json!("10s");
    let created = Instant::now();
    let b_id = create_as(&app, TOKEN_B, &s).await;
    let c = up.script("/a-other", vec![Reply::status("on")]);
    let mut s = every(&c, 50);
    s["timeout"] = json!("10s");
    s["target"]["headers"] = json!({"Authorization": "Bearer another-token"});
    let c_id = create_as(&app, TOKEN_A, &s).await;
    for (token, id) in [(TOKEN_B, &b_id), (TOKEN_A, &c_id)] {
        let w = read_as(&app, token, &format!("/waits/{id}?wait=20s")).await;
        assert_eq!(w["status"], "succeeded", "{w}");
    }
    // Four turns a second: each had one of the next few, not the 41st.
    let took = created.elapsed();
    assert!(took < Duration::from_secs(3), "{took:?}");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_host_rate_is_shared_fairly_on_sqlite() {
    let dir = TempDir::new("waitd-rate");
    a_host_rate_is_shared_fairly(test_args(&dir.sqlite_url())).await;
}

#[tokio::test]
async fn a_host_rate_is_shared_fairly_on_postgres() {
    let db = TestDb::new().await;
    a_host_rate_is_shared_fairly(test_args(&db.url)).await;
    db.drop_db().await;
}

/// Two replicas on one Postgres: a pause one replica was asked for reaches the
/// other (by NOTIFY), which holds back that tenant's waits with those
/// credentials and no one else's.
#[tokio::test]
async fn a_pause_reaches_the_other_replica_for_its_own_requests_only() {
    let db = TestDb::new().await;
    // `one` holds at most ten waits, so `two` holds the rest.
    let one = App::start_args(with_tenants(test_args(&db.url), &["--capacity", "10"])).await;
    let two = App::start_args(with_tenants(test_args(&db.url), &[])).await;
    let up = Upstream::start().await;
    let (mut a_paths, mut b_paths, mut a_ids) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..12 {
        for (token, tenant) in [(TOKEN_A, "a"), (TOKEN_B, "b")] {
            let path = format!("/{tenant}/{i}");
            let url = up.script(&path, vec![Reply::status("deploying")]);
            let id = create_as(&one, token, &every(&url, 100)).await;
            if tenant == "a" {
                a_paths.push(path);
                a_ids.push(id);
            } else {
                b_paths.push(path);
            }
        }
    }
    let hits = |up: &Upstream, paths: &[String]| paths.iter().map(|p| up.hits(p)).sum::<usize>();
    assert!(
        up.requested(Duration::from_secs(15), |up| {
            a_paths.iter().all(|p| up.hits(p) > 0) && b_paths.iter().all(|p| up.hits(p) > 0)
        })
        .await,
        "every wait is polled"
    );
    let owners = db_count(
        &db,
        "SELECT count(DISTINCT s.holder) FROM waits w JOIN slots s ON s.id = w.owner
         WHERE w.status = 'running' AND w.tenant = 'a'",
    )
    .await;
    assert_eq!(owners, 2, "both replicas hold waits of tenant a");

    let told = up.script(
        "/told",
        vec![Reply::json(429, json!({})).header("retry-after", "60")],
    );
    create_as(&two, TOKEN_A, &every(&told, 100)).await;
    assert!(up.hit("/told", 1, Duration::from_secs(10)).await);
    // Every wait of tenant a is held back, on both replicas, and shows it.
    for id in &a_ids {
        let paused = poll_for(Duration::from_secs(5), || async {
            let w = read_as(&one, TOKEN_A, &format!("/waits/{id}")).await;
            w.get("paused").map(|_| ())
        })
        .await;
        assert!(paused.is_some(), "tenant a's wait {id} is not held back");
    }
    let (a_from, b_from) = (hits(&up, &a_paths), hits(&up, &b_paths));
    // Tenant b's twelve waits poll on at 100 ms meanwhile.
    assert!(
        up.requested(Duration::from_secs(10), |up| hits(up, &b_paths)
            >= b_from + 120)
            .await,
        "tenant b's waits are polled"
    );
    let sent = hits(&up, &a_paths) - a_from;
    assert_eq!(sent, 0, "{sent} requests of tenant a while it was paused");
    two.stop().await.0.unwrap();
    one.stop().await.0.unwrap();
    db.drop_db().await;
}

mod generated {
    //! Every shape a target may give a request for quiet, generated: huge,
    //! negative, fractional, garbled, dates of any year. However it is said, a
    //! pause is never longer than `--max-host-pause`, never comes from an answer
    //! that does not ask for one, and holds only its own key's requests.

    use std::time::{Duration, SystemTime};

    use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use proptest::prelude::*;
    use waitd::probe::pause_asked;

    fn number() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u64..100_000).prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            "[0-9]{20,40}",
            (-100_000i64..0).prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| f.to_string()),
            Just(String::new()),
            "[ -~]{0,30}",
        ]
    }

    fn date() -> impl Strategy<Value = String> {
        (0u64..253_402_300_000)
            .prop_map(|s| httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(s)))
    }

    fn header() -> impl Strategy<Value = (&'static str, String)> {
        prop_oneof![
            (Just("retry-after"), prop_oneof![number(), date()]),
            (Just("retry-after-ms"), number()),
            (Just("x-ms-retry-after-ms"), number()),
            (
                Just("x-ratelimit-remaining"),
                prop_oneof![Just("0".to_string()), number()]
            ),
            (Just("x-ratelimit-reset"), prop_oneof![number(), date()]),
            (
                Just("ratelimit"),
                (number(), number(), "[a-z\"]{0,8}")
                    .prop_map(|(r, t, p)| format!("\"{p}\";r={r};t={t}")),
            ),
            (Just("ratelimit"), "[ -~]{0,60}".prop_map(String::from)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn a_pause_is_never_longer_than_the_cap_nor_asked_by_an_answer_that_does_not_ask(
            status in prop_oneof![Just(200u16), Just(429), Just(503), Just(500), 100u16..600],
            headers in prop::collection::vec(header(), 0..6),
            now_s in 0u64..200_000_000_000,
            max_s in 1u64..=3600,
        ) {
            let mut map = HeaderMap::new();
            for (name, value) in &headers {
                if let Ok(v) = HeaderValue::from_str(value) {
                    map.append(HeaderName::from_static(name), v);
                }
            }
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now_s);
            let max = Duration::from_secs(max_s);
            let status = StatusCode::from_u16(status).unwrap();
            let asked = pause_asked(status, &map, now, max);
            if let Some((d, _)) = asked {
                prop_assert!(!d.is_zero() && d <= max, "{d:?} over {max:?}");
                let asks = matches!(status.as_u16(), 429 | 503)
                    && map.keys().any(|k| k.as_str().contains("retry-after"))
                    || map.contains_key("x-ratelimit-remaining")
                    || map.contains_key("ratelimit");
                prop_assert!(asks, "{status} {map:?} paused for {d:?}");
            }
            // Where a `RateLimit` alone says how long, however large, that is the
            // pause, up to the cap.
            let t = match headers.as_slice() {
                [("ratelimit", v)] => v
                    .split(';')
                    .find_map(|p| p.strip_prefix("t="))
                    .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
                    .filter(|_| v.contains(";r=0;")),
                _ => None,
            };
            if let Some(t) = t
                && !matches!(status.as_u16(), 429 | 503)
            {
                let secs = t.parse::<u64>().unwrap_or(u64::MAX);
                let want = Duration::from_secs(secs).min(max);
                prop_assert_eq!(asked.map(|(d, _)| d), (!want.is_zero()).then_some(want), "{:?}", headers);
            }
        }
    }
}

/// Generated answers that ask for quiet, each given to one wait of tenant A on
/// a host of its own, beside a wait of tenant B and one of A with other
/// credentials on that host: whatever the answer says, those two keep their
/// 20 ms schedule, and a wait of A held back shows a pause no longer than
/// `--max-host-pause` and ending by its deadline.
#[test]
fn generated_requests_for_quiet_never_hold_back_another_tenant_or_credential() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = TempDir::new("waitd-pause-gen");
    let app = rt.block_on(App::start_args(with_tenants(
        test_args(&dir.sqlite_url()),
        &["--max-host-pause", "10m"],
    )));
    let answer = (
        prop_oneof![Just(429u16), Just(503), Just(200)],
        prop_oneof![
            (Just("retry-after"), "[0-9]{1,25}"),
            (
                Just("retry-after"),
                Just("Fri, 31 Dec 9999 23:59:59 GMT".to_string())
            ),
            (Just("retry-after-ms"), "[0-9]{1,25}(\\.[0-9]{1,3})?"),
            (
                Just("ratelimit"),
                "[0-9]{1,25}".prop_map(|t| format!("\"p\";r=0;t={t}"))
            ),
            (Just("x-ratelimit-reset"), "[0-9]{1,25}"),
        ],
    );
    let mut runner = TestRunner::new(Config {
        cases: 12,
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&answer, |(status, (name, value)): (u16, (&str, String))| {
        rt.block_on(async {
            let up = Upstream::start().await;
            let body = json!({"data": {"attributes": {"status": "deploying"}}});
            let mut reply = Reply::json(status, body).header(name, &value);
            if name == "x-ratelimit-reset" {
                reply = reply.header("x-ratelimit-remaining", "0");
            }
            let told = up.script("/told", vec![reply]);
            let mut heard = app.heard();
            let told_id = create_as(&app, TOKEN_A, &every(&told, 20)).await;
            heard.recorded(&told_id).await;
            let same = up.script("/same", vec![Reply::status("deploying")]);
            let same_id = create_as(&app, TOKEN_A, &every(&same, 20)).await;
            let b = up.script("/b", vec![Reply::status("deploying")]);
            let b_id = create_as(&app, TOKEN_B, &every(&b, 20)).await;
            let c = up.script("/c", vec![Reply::status("deploying")]);
            let mut other = every(&c, 20);
            other["target"]["headers"] = json!({"X-Api-Key": "another-key"});
            let c_id = create_as(&app, TOKEN_A, &other).await;
            let on_schedule = up
                .requested(Duration::from_secs(5), |up| {
                    up.hits("/b") >= 10 && up.hits("/c") >= 10
                })
                .await;
            let w = read_as(&app, TOKEN_A, &format!("/waits/{same_id}")).await;
            for (token, id) in [
                (TOKEN_A, &told_id),
                (TOKEN_A, &same_id),
                (TOKEN_B, &b_id),
                (TOKEN_A, &c_id),
            ] {
                cancel_as(&app, token, id).await;
            }
            if !on_schedule {
                return Err(TestCaseError::fail(format!(
                    "{status} {name}: {value}: B's wait polled {} times, A's with other credentials {}",
                    up.hits("/b"),
                    up.hits("/c")
                )));
            }
            if let Some(until) = w.get("paused").and_then(|p| p["until"].as_str()) {
                let until = chrono::DateTime::parse_from_rfc3339(until).unwrap();
                let latest = chrono::Utc::now() + chrono::Duration::minutes(10);
                let deadline = chrono::DateTime::parse_from_rfc3339(w["deadline"].as_str().unwrap()).unwrap();
                if until > latest || until > deadline + chrono::Duration::minutes(10) {
                    return Err(TestCaseError::fail(format!("{status} {name}: {value}: {w}")));
                }
            }
            Ok(())
        })
    });
    rt.block_on(async { app.stop().await.0.unwrap() });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}
