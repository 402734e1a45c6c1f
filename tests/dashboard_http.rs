//! The dashboard as HTTP serves it: its files with their types and a strict
//! Content-Security-Policy, and CORS for dashboards on other origins (exact origins,
//! and no CORS headers at all unless configured). The page itself is tested in a
//! real browser by `tests/dashboard.rs`.

use crate::support;

use support::{App, TestDb};

#[tokio::test]
async fn the_dashboard_is_served_with_its_types_and_a_strict_policy() {
    let db = TestDb::new().await;
    let app = App::start_with(&db, &["--tokens", "ci:0123456789abcdef-ci"]).await;
    let plain = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    for from in ["/", "/ui"] {
        let r = plain.get(app.url(from)).send().await.unwrap();
        assert_eq!(r.status(), 308, "{from}");
        assert_eq!(r.headers()["location"], "/ui/");
    }
    // No token needed for the page itself: it asks for one.
    for (path, ty) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/sse.js", "text/javascript"),
        ("/ui/style.css", "text/css"),
    ] {
        let r = plain.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(ty),
            "{path}"
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.contains("default-src 'none'"), "{csp}");
        assert!(csp.contains("script-src 'self'"), "{csp}");
        assert!(!csp.contains("unsafe"), "{csp}");
        assert_eq!(h["x-content-type-options"], "nosniff");
    }
    let r = plain.get(app.url("/ui/nope.js")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // The API still needs the token.
    let r = plain.get(app.url("/waits")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    app.stop().await.0.unwrap();
    db.drop_db().await;
}

#[tokio::test]
async fn cors_answers_exactly_the_configured_origins_and_nothing_otherwise() {
    let db = TestDb::new().await;
    let preflight = |app: &App, origin: &'static str| {
        let c = app.client.clone();
        let u = app.url("/events");
        async move {
            c.request(reqwest::Method::OPTIONS, u)
                .header("origin", origin)
                .header("access-control-request-method", "GET")
                .header(
                    "access-control-request-headers",
                    "authorization,last-event-id",
                )
                .send()
                .await
                .unwrap()
        }
    };
    // Unset: no CORS headers anywhere.
    let app = App::start(&db).await;
    let r = preflight(&app, "https://dash.example.com").await;
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = app
        .client
        .get(app.url("/waits"))
        .header("origin", "https://dash.example.com")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    app.stop().await.0.unwrap();

    let app = App::start_with(
        &db,
        &[
            "--cors-origins",
            "https://dash.example.com,http://127.0.0.1:3000",
        ],
    )
    .await;
    let r = preflight(&app, "https://dash.example.com").await;
    assert!(r.status().is_success(), "{}", r.status());
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://dash.example.com");
    let allowed = h["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(
        allowed.contains("authorization") && allowed.contains("last-event-id"),
        "{allowed}"
    );
    // Another origin, even a suffix of a listed one, gets nothing.
    for other in [
        "https://evil.example.com",
        "https://dash.example.com.evil.net",
        "null",
    ] {
        let r = preflight(&app, other).await;
        assert!(
            r.headers().get("access-control-allow-origin").is_none(),
            "{other}"
        );
    }
    let r = app
        .client
        .get(app.url("/waits"))
        .header("origin", "http://127.0.0.1:3000")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://127.0.0.1:3000"
    );
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    assert!(exposed.contains("location"), "{exposed}");
    app.stop().await.0.unwrap();

    // A path or a wildcard is not an origin: start-up refuses it with a sentence.
    for bad in ["https://dash.example.com/app", "*", "dash.example.com"] {
        let config = waitd::Config::from_args(
            support::test_args(&db.url)
                .into_iter()
                .chain(["--cors-origins".to_string(), bad.to_string()]),
        )
        .unwrap();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let e = waitd::serve(l, config, async {})
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("--cors-origins"), "{bad}: {e}");
    }
    db.drop_db().await;
}
