//! `target.auth.oauth2`: waits that poll with tokens waitd mints by the
//! client-credentials grant, shared by the tenant's waits that name the same
//! credential, minted again before they expire and when the target refuses one.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::issuer::{CLIENT_ID, Issuer, Mode};
use crate::support::receiver::Receiver;
use crate::support::*;

const SECRET: &str = "oauth-client-s3cret-0123456789";

/// A wait polling the issuer's target every 200 ms with tokens from its endpoint.
fn oauth_spec(issuer: &Issuer) -> Value {
    let mut s = spec(&issuer.target_url);
    s["target"]["auth"] = json!({"oauth2": {
        "token_url": issuer.token_url,
        "client_id": CLIENT_ID,
        "client_secret": SECRET,
        "scope": "https://management.azure.com/.default",
    }});
    s["poll"] = json!({"initial": "200ms", "factor": 1, "max": "200ms", "jitter": 0});
    s["timeout"] = json!("60s");
    s
}

async fn sqlite_app(dir: &TempDir) -> App {
    App::start_args(test_args(&dir.sqlite_url())).await
}

/// Tokens living 2 s and a target that takes no expired one: 50 waits over about
/// ten seconds all succeed, no poll is refused, and the credential they share is
/// minted about once per token life, not once per wait.
async fn tokens_are_shared_and_minted_again_before_they_expire(app: &App) {
    let issuer = Issuer::start(SECRET).await;
    issuer.set_lifetime(Duration::from_secs(2));
    // The target says "on" once the sixth token is issued: about 9 s in.
    issuer.on_after(6);
    let mut ids = Vec::new();
    for _ in 0..50 {
        let (code, w) = app.create(oauth_spec(&issuer)).await;
        assert_eq!(code, 201, "{w}");
        assert_eq!(
            w["spec"]["target"]["auth"]["oauth2"]["client_secret"], "<redacted>",
            "{w}"
        );
        ids.push(w["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let (_, w) = app.get(&format!("/waits/{id}?wait=40s")).await;
        assert_eq!(w["status"], "succeeded", "{w}");
        assert_eq!(w["retries"], 0, "no poll needed a retry: {w}");
    }
    let minted = issuer.token_requests();
    println!(
        "50 waits, tokens of 2 s: {minted} token requests, {} polls answered, {} refused",
        issuer.target_ok(),
        issuer.unauthorized()
    );
    assert_eq!(issuer.unauthorized(), 0, "a poll carried an expired token");
    assert!(
        (6..=9).contains(&minted),
        "{minted} token requests for one credential over about 6 token lives"
    );
    let form = &issuer.forms()[0];
    assert_eq!(form["grant_type"], "client_credentials");
    assert_eq!(form["scope"], "https://management.azure.com/.default");
    assert_eq!(issuer.client_auth_seen()[0], "body");
}

#[tokio::test]
async fn tokens_are_shared_and_minted_again_before_they_expire_on_sqlite() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    tokens_are_shared_and_minted_again_before_they_expire(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn tokens_are_shared_and_minted_again_before_they_expire_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    tokens_are_shared_and_minted_again_before_they_expire(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A token the target stops taking before its life ends: one new mint, the poll
/// asked again with it, and no retry counted.
async fn a_refused_token_is_minted_again_and_the_poll_asked_again(app: &App) {
    let issuer = Issuer::start(SECRET).await;
    let (code, w) = app.create(oauth_spec(&issuer)).await;
    assert_eq!(code, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    assert!(
        issuer
            .until(Duration::from_secs(10), |i| i.target_ok() >= 1)
            .await,
        "the target is polled with a token"
    );
    issuer.on_after(2);
    issuer.revoke_current();
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(w["retries"], 0, "the refused token cost no retry: {w}");
    assert_eq!(issuer.unauthorized(), 1, "one poll with the revoked token");
    assert_eq!(issuer.token_requests(), 2, "one mint more");
    let (_, events) = app.get(&format!("/waits/{id}/events")).await;
    assert!(
        !events.to_string().contains("\"retry\""),
        "no retry event: {events}"
    );
    let metrics = app.metrics().await;
    for line in [
        "waitd_oauth_token_requests_total{outcome=\"minted\"} 2",
        "waitd_oauth_token_requests_total{outcome=\"failed\"} 0",
        "waitd_oauth_tokens_refused_total 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_refused_token_is_minted_again_and_the_poll_asked_again_on_sqlite() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    a_refused_token_is_minted_again_and_the_poll_asked_again(&app).await;
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_refused_token_is_minted_again_and_the_poll_asked_again_on_postgres() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    a_refused_token_is_minted_again_and_the_poll_asked_again(&app).await;
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// `invalid_client` ends the wait `error` with the endpoint's code and a fixed
/// sentence of what it means, none of the endpoint's words, and the secret it
/// repeats is in no read, event or webhook.
#[tokio::test]
async fn an_invalid_client_ends_the_wait_with_its_code_and_none_of_the_endpoints_words() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    let issuer = Issuer::start(SECRET).await;
    issuer.set_mode(Mode::InvalidClient);
    let rx = Receiver::start().await;
    let mut s = oauth_spec(&issuer);
    s["notify"] =
        json!([{"url": rx.url("/hook"), "secret": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]);
    let (code, w) = app.create(s).await;
    assert_eq!(code, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "error", "{w}");
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("invalid_client (the client was not authenticated"),
        "{reason}"
    );
    assert!(!reason.contains("is not valid for this tenant"), "{reason}");
    assert!(
        rx.until_got("/hook", 1, Duration::from_secs(10)).await,
        "the end is delivered"
    );
    let mut seen = vec![w.to_string()];
    for path in [
        format!("/waits/{id}"),
        format!("/waits/{id}/events"),
        "/waits".to_string(),
        "/events".to_string(),
    ] {
        seen.push(app.get(&path).await.1.to_string());
    }
    seen.extend(rx.all().into_iter().map(|r| r.json().to_string()));
    for text in &seen {
        assert!(!text.contains(SECRET), "the secret came back: {text}");
    }
    assert_eq!(issuer.token_requests(), 1, "a refusal is not asked again");
    app.stop().await.0.unwrap();
}

/// A token endpoint that writes the secret back in any encoding (as given,
/// form-encoded, in the Basic credentials, percent-escaped, reversed, spaced
/// out, halved, in Base64 or hexadecimal, even as its error code) gets none of
/// it into the reason, the events or the trace spans, sent either way.
#[tokio::test]
async fn a_secret_echoed_in_any_encoding_reaches_no_reason_event_or_span() {
    use base64::Engine as _;
    const ODD: &str = "p/q+r&s t=u%v~Zq7Xw9Kp";
    let dir = TempDir::new("waitd-oauth-echo");
    let collector = crate::support::collector::Collector::start().await;
    let app = App::start_args(set_flag(
        test_args(&dir.sqlite_url()),
        "--otlp-endpoint",
        &collector.base,
    ))
    .await;
    let issuer = Issuer::start(ODD).await;
    let enc: String = url::form_urlencoded::byte_serialize(ODD.as_bytes()).collect();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{enc}",
        url::form_urlencoded::byte_serialize(CLIENT_ID.as_bytes()).collect::<String>()
    ));
    let mut forms = vec![
        ODD.to_string(),
        enc.clone(),
        enc.to_ascii_lowercase(),
        basic,
        crate::support::issuer::uri_encoded(ODD),
    ];
    forms.extend(crate::support::issuer::echoes(ODD));
    let mut ids = Vec::new();
    for (mode, how) in [
        (Mode::InvalidClient, "body"),
        (Mode::InvalidClient, "basic"),
        (Mode::OwnCode, "body"),
    ] {
        issuer.set_mode(mode.clone());
        let mut s = oauth_spec(&issuer);
        s["target"]["auth"]["oauth2"]["client_secret"] = json!(ODD);
        s["target"]["auth"]["oauth2"]["client_auth"] = json!(how);
        let (code, w) = app.create(s).await;
        assert_eq!(code, 201, "{w}");
        let id = w["id"].as_str().unwrap().to_string();
        let w = app.wait_end(&id).await;
        assert_eq!(w["status"], "error", "{w}");
        let reason = w["reason"].as_str().unwrap_or_default();
        match mode {
            Mode::OwnCode => assert!(reason.contains("do not define"), "{reason}"),
            _ => assert!(reason.contains("invalid_client"), "{reason}"),
        }
        ids.push(id);
    }
    let mut seen = Vec::new();
    for id in &ids {
        for path in [format!("/waits/{id}"), format!("/waits/{id}/events")] {
            seen.push(app.get(&path).await.1.to_string());
        }
    }
    // Every poll's span is exported once the waits have ended.
    let spans = poll_for(Duration::from_secs(10), || async {
        let spans = collector.spans();
        let polls = spans.iter().filter(|s| s.name.starts_with("poll")).count();
        (polls >= ids.len()).then_some(spans)
    })
    .await
    .expect("the polls' spans are exported");
    seen.extend(spans.iter().map(|s| format!("{s:?}")));
    for text in &seen {
        for form in &forms {
            assert!(!text.contains(form.as_str()), "{form} came back: {text}");
        }
    }
    app.stop().await.0.unwrap();
}

/// A token endpoint that answers `503` for a while: the wait rides it out as
/// transient errors and succeeds once a token comes.
#[tokio::test]
async fn a_token_endpoint_that_is_down_for_a_while_is_ridden_out() {
    let db = TestDb::new().await;
    let app = App::start(&db).await;
    let issuer = Issuer::start(SECRET).await;
    issuer.set_mode(Mode::DownFor(5));
    issuer.on_after(1);
    let mut s = oauth_spec(&issuer);
    s["retry"] = json!({"delay": "100ms", "max_delay": "500ms", "max_retries": 100});
    let (code, w) = app.create(s).await;
    assert_eq!(code, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert!(
        w["retries"].as_u64().unwrap_or(0) >= 5,
        "each poll without a token was a retry: {w}"
    );
    // A failed mint answers every poll within a second of it: the endpoint was
    // asked about once a second, not once a poll.
    assert_eq!(issuer.token_requests(), 6, "five 503s, then a token");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// A token endpoint that takes the request and never answers: the wait ends
/// `timed_out` at its deadline, and what it says names the token endpoint, not
/// the target, which was never asked.
#[tokio::test]
async fn a_token_endpoint_that_never_answers_is_named_at_the_deadline() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    let issuer = Issuer::start(SECRET).await;
    issuer.set_mode(Mode::Hang);
    let mut s = oauth_spec(&issuer);
    s["timeout"] = json!("2s");
    let (code, w) = app.create(s).await;
    assert_eq!(code, 201, "{w}");
    let started = std::time::Instant::now();
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "timed_out", "{w}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "ended by its deadline"
    );
    let text = w.to_string();
    assert!(
        text.contains("the token endpoint of the target's credential had not answered"),
        "{text}"
    );
    assert!(!text.contains("the target had not answered"), "{text}");
    assert_eq!(
        issuer.target_ok() + issuer.unauthorized(),
        0,
        "the target was never asked"
    );
    app.stop().await.0.unwrap();
}

/// HTTP Basic client authentication, and extra form fields.
#[tokio::test]
async fn basic_client_authentication_and_extra_fields_reach_the_endpoint() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    let issuer = Issuer::start("s3cret:with/odd+chars").await;
    issuer.on_after(1);
    let mut s = oauth_spec(&issuer);
    s["target"]["auth"]["oauth2"]["client_secret"] = json!("s3cret:with/odd+chars");
    s["target"]["auth"]["oauth2"]["client_auth"] = json!("basic");
    s["target"]["auth"]["oauth2"]["audience"] = json!("https://api.example.com");
    s["target"]["auth"]["oauth2"]["params"] = json!({"resource": "https://vault.example.com"});
    let (code, w) = app.create(s).await;
    assert_eq!(code, 201, "{w}");
    let w = app.wait_end(w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(issuer.client_auth_seen(), vec!["basic"]);
    let form = &issuer.forms()[0];
    assert!(!form.contains_key("client_secret"), "{form:?}");
    assert_eq!(form["audience"], "https://api.example.com");
    assert_eq!(form["resource"], "https://vault.example.com");
    app.stop().await.0.unwrap();
}

/// With a secret key, the client secret is sealed at rest like header values, and
/// a wait taken up again from the store still mints with it.
#[tokio::test]
async fn the_client_secret_is_sealed_at_rest_and_opens_after_a_restart() {
    let db = TestDb::new().await;
    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    let app = App::start_with(&db, &["--secret-key", KEY]).await;
    let issuer = Issuer::start(SECRET).await;
    let (code, w) = app.create(oauth_spec(&issuer)).await;
    assert_eq!(code, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    assert!(
        issuer
            .until(Duration::from_secs(10), |i| i.target_ok() >= 1)
            .await,
        "polled"
    );
    app.stop().await.0.unwrap();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    let rows: Vec<(String,)> = sqlx::query_as("SELECT t::text FROM wait_specs t")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert!(
        !rows[0].0.contains(SECRET),
        "stored in plain text: {}",
        rows[0].0
    );
    assert!(rows[0].0.contains("<redacted>"), "{}", rows[0].0);

    // Another process takes the wait up and mints its own token.
    issuer.on_after(2);
    let app = App::start_with(&db, &["--secret-key", KEY]).await;
    let w = app.wait_end(&id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(issuer.token_requests(), 2, "the new owner minted its own");
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

/// Bad credentials specs: a 400 naming the field and never the secret; a token
/// endpoint on an internal address: a 422.
#[tokio::test]
async fn bad_auth_is_refused_with_the_field_and_without_the_secret() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    let issuer = Issuer::start(SECRET).await;
    let base = oauth_spec(&issuer);
    let with = |path: &str, v: Value| {
        let mut s = base.clone();
        let (parent, last) = path.rsplit_once('/').unwrap();
        s.pointer_mut(parent).unwrap()[last] = v;
        s
    };
    let without = |field: &str| {
        let mut s = base.clone();
        s["target"]["auth"]["oauth2"]
            .as_object_mut()
            .unwrap()
            .remove(field);
        s
    };
    for (what, body, field) in [
        (
            "no secret",
            without("client_secret"),
            "target.auth.oauth2.client_secret",
        ),
        (
            "no token_url",
            without("token_url"),
            "target.auth.oauth2.token_url",
        ),
        (
            "no client_id",
            without("client_id"),
            "target.auth.oauth2.client_id",
        ),
        (
            "an unknown kind",
            with("/target/auth", json!({"oauth1": {}})),
            "target.auth.oauth1",
        ),
        (
            "a typo",
            with("/target/auth/oauth2/scopes", json!("x")),
            "target.auth.oauth2.scopes",
        ),
        (
            "a secret with a newline",
            with(
                "/target/auth/oauth2/client_secret",
                json!(format!("{SECRET}\r\n")),
            ),
            "target.auth.oauth2.client_secret",
        ),
        (
            "an over-long secret",
            with(
                "/target/auth/oauth2/client_secret",
                json!(format!("{SECRET}{}", "x".repeat(2000))),
            ),
            "target.auth.oauth2.client_secret",
        ),
        (
            "a grant_type in params",
            with(
                "/target/auth/oauth2/params",
                json!({"grant_type": "password"}),
            ),
            "target.auth.oauth2.params.grant_type",
        ),
        (
            "an Authorization header beside",
            with("/target/headers", json!({"Authorization": SECRET})),
            "target.headers.Authorization",
        ),
        (
            "a token_url with credentials",
            with(
                "/target/auth/oauth2/token_url",
                json!(format!("https://u:{SECRET}@login.example.com/token")),
            ),
            "target.auth.oauth2.token_url",
        ),
        (
            "client_auth unknown",
            with("/target/auth/oauth2/client_auth", json!("jwt")),
            "target.auth.oauth2.client_auth",
        ),
    ] {
        let (code, problem) = app.create(body).await;
        assert_eq!(code, 400, "{what}: {problem}");
        let text = problem.to_string();
        assert!(text.contains(field), "{what}: {text}");
        assert!(!text.contains(SECRET), "{what} echoed the secret: {text}");
    }
    app.stop().await.0.unwrap();

    // The guard as shipped: no internal address allowed.
    let guarded =
        App::start_args(unset_flag(test_args(&dir.sqlite_url()), "--allow-targets")).await;
    for internal in ["http://169.254.169.254/token", "http://10.0.0.1/token"] {
        let mut s = base.clone();
        s["target"]["url"] = json!("https://api.example.com/servers/1");
        s["target"]["auth"]["oauth2"]["token_url"] = json!(internal);
        let (code, problem) = guarded.create(s).await;
        assert_eq!(code, 422, "{internal}: {problem}");
        let text = problem.to_string();
        assert!(text.contains("token_url"), "{text}");
        assert!(text.contains("token endpoint"), "{text}");
    }
    guarded.stop().await.0.unwrap();
}

/// A preset's request takes `target.auth` from the create request, as it takes
/// headers: the Azure machine preset with the client-credentials form.
#[tokio::test]
async fn a_preset_takes_the_credentials_of_the_request() {
    let dir = TempDir::new("waitd-oauth");
    let app = sqlite_app(&dir).await;
    let issuer = Issuer::start(SECRET).await;
    let body = json!({
        "preset": "azure.aks_machine",
        "params": {"base_url": issuer.target_url.trim_end_matches("/target"),
                   "subscription_id": "26fe00f8-9173-4872-9134-bb1d2e00343a",
                   "resource_group": "rg1", "cluster": "c1", "agent_pool": "pool1",
                   "machine": "m1"},
        "target": {"auth": {"oauth2": {
            "token_url": issuer.token_url, "client_id": CLIENT_ID,
            "client_secret": SECRET, "scope": "https://management.azure.com/.default"}}},
        "timeout": "5s"
    });
    let (code, w) = app.create(body).await;
    assert_eq!(code, 201, "{w}");
    let target = &w["spec"]["target"];
    assert!(
        target["url"]
            .as_str()
            .unwrap()
            .contains("/machines/m1?api-version="),
        "{w}"
    );
    assert_eq!(
        target["auth"]["oauth2"]["client_secret"], "<redacted>",
        "{w}"
    );
    assert!(
        issuer
            .until(Duration::from_secs(10), |i| i.tokens_issued() >= 1)
            .await,
        "the preset's wait minted a token"
    );
    app.stop().await.0.unwrap();
}

mod generated {
    use proptest::prelude::*;
    use serde_json::{Value, json};
    use waitd::engine::{Limits, Spec};

    const SECRET_MARK: &str = "S3CRET";

    /// Text past the fields' limits, with control characters and the mark.
    fn text() -> impl Strategy<Value = Value> {
        prop_oneof![
            "[a-z0-9:/._-]{1,40}".prop_map(Value::String),
            (0usize..3000).prop_map(|n| Value::String("x".repeat(n))),
            "\\PC{0,20}[\\x00-\\x1f\\x7f\\u{85}]\\PC{0,5}".prop_map(Value::String),
            Just(Value::Null),
            any::<i64>().prop_map(Value::from),
            Just(json!(["a"])),
            Just(json!({"a": {"b": [1]}})),
        ]
    }

    fn secret() -> impl Strategy<Value = Value> {
        prop_oneof![
            "[ -~]{0,30}".prop_map(|s| Value::String(format!("{SECRET_MARK}{s}"))),
            (0usize..2000).prop_map(|n| Value::String(format!("{SECRET_MARK}{}", "y".repeat(n)))),
            "[\\x00-\\x1f]{1,3}".prop_map(|s| Value::String(format!("{SECRET_MARK}{s}"))),
            text(),
        ]
    }

    fn params() -> impl Strategy<Value = Value> {
        prop::collection::btree_map(
            prop_oneof![
                "[a-z_.-]{1,10}",
                Just("grant_type".to_string()),
                Just("client_secret".to_string()),
                "\\PC{0,70}",
            ],
            text(),
            0..12,
        )
        .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    fn auth() -> impl Strategy<Value = Value> {
        let oauth2 = (
            prop_oneof![
                Just(json!("https://login.example.com/token")),
                text(),
                "(http|https|ftp)://[a-z0-9.@:-]{0,20}/?".prop_map(Value::String),
            ],
            text(),
            secret(),
            prop::option::of(text()),
            prop::option::of(text()),
            prop::option::of(params()),
            prop::option::of(prop_oneof![
                Just(json!("body")),
                Just(json!("basic")),
                text()
            ]),
        )
            .prop_map(|(url, id, secret, scope, audience, params, how)| {
                let mut o = json!({"token_url": url, "client_id": id, "client_secret": secret});
                for (k, v) in [
                    ("scope", scope),
                    ("audience", audience),
                    ("params", params),
                    ("client_auth", how),
                ] {
                    if let Some(v) = v {
                        o[k] = v;
                    }
                }
                json!({"oauth2": o})
            });
        prop_oneof![
            4 => oauth2,
            1 => text().prop_map(|c| json!({"credential": c})),
            1 => text(),
            1 => (text(), secret()).prop_map(|(c, s)| json!({"credential": c, "oauth2": {"client_secret": s}})),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Any `target.auth` is judged to an end: refused with field errors that
        /// never hold the secret, or accepted within the limits and shown back
        /// with the secret redacted.
        #[test]
        fn any_auth_is_judged_and_its_secret_never_echoed(auth in auth()) {
            let request = json!({
                "target": {"url": "https://api.example.com/x", "auth": auth},
                "state": "/s", "want": ["on"]
            });
            match Spec::from_request(&request, &Limits::default()) {
                Ok(spec) => {
                    let shown = serde_json::to_string(&spec.redacted()).unwrap();
                    prop_assert!(!shown.contains(SECRET_MARK), "{}", shown);
                    if let Some(waitd::engine::spec::Auth::Oauth2(o)) = &spec.target.as_ref().unwrap().auth {
                        prop_assert!(o.client_secret.len() <= 1024);
                        prop_assert!(o.client_id.len() <= 256);
                        prop_assert!(o.params.len() <= 8);
                        prop_assert!(!o.client_secret.chars().any(char::is_control));
                    }
                }
                Err(errors) => {
                    prop_assert!(!errors.is_empty());
                    let said = format!("{errors:?}");
                    prop_assert!(!said.contains(SECRET_MARK), "{}", said);
                }
            }
        }
    }
}
