//! What event sources refuse, and what they never show: bad sources and
//! listeners get sentences naming the field, bad events are refused before
//! anything is kept, the tenant's caps hold, the secret appears in no answer,
//! and generated inputs hold the header parsers and key extraction to their
//! bounds.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::support::*;

#[tokio::test]
async fn sources_refuse_bad_input_with_sentences_and_never_show_their_secret() {
    for (app, db) in each_store("1ms").await {
        let mut answers = Vec::new();
        let hook = source(&app, "gh", "github", "/workflow_run/id", "5m").await;
        for (body, field) in [
            (
                json!({"name": "Bad Name", "kind": "github", "secret": GITHUB_SECRET, "key": "/a"}),
                "name",
            ),
            (
                json!({"name": "x", "kind": "gitlab", "secret": GITHUB_SECRET, "key": "/a"}),
                "kind",
            ),
            (
                json!({"name": "x", "kind": "github", "secret": "short", "key": "/a"}),
                "secret",
            ),
            (
                json!({"name": "x", "kind": "standard-webhooks", "secret": GITHUB_SECRET, "key": "/a"}),
                "secret",
            ),
            (
                json!({"name": "x", "kind": "github", "secret": GITHUB_SECRET, "key": "body.(("}),
                "key",
            ),
            (
                json!({"name": "x", "kind": "github", "secret": GITHUB_SECRET, "key": "/a", "lookback": "2h"}),
                "lookback",
            ),
        ] {
            let (status, p, text) = answered(client().post(app.url("/sources")).json(&body)).await;
            assert_eq!(status, 400, "{p}");
            assert_eq!(p["errors"][0]["field"], field, "{p}");
            answers.push(text);
        }
        let (status, p, text) = answered(client().post(app.url("/sources")).json(&json!({
            "name": "gh", "kind": "github", "secret": GITHUB_SECRET, "key": "/a"})))
        .await;
        assert_eq!(status, 409, "{p}");
        answers.push(text);
        // Waits that name no source, or name it badly.
        for (on_event, field) in [
            (json!({"source": "nope", "key": "1"}), "on_event.source"),
            (json!({"source": "gh"}), "on_event.key"),
            (
                json!({"source": "gh", "key": "1", "then": "stop"}),
                "on_event.then",
            ),
            (
                json!({"source": "gh", "key": "1", "match": "body.(("}),
                "on_event.match",
            ),
        ] {
            let (status, p) = app.create(json!({"target": {"url": "http://127.0.0.1:9/x"}, "state": "/s", "want": ["on"], "on_event": on_event})).await;
            assert_eq!(status, 400, "{p}");
            assert_eq!(p["errors"][0]["field"], field, "{p}");
        }
        // An event is judged alone: what counts across polls cannot be met by one.
        let (status, p) = app
            .create(
                json!({"target": {"url": "http://127.0.0.1:9/x"}, "state": "/s", "want": ["on"],
            "consecutive": 2, "on_event": {"source": "gh", "key": "1", "then": "end"}}),
            )
            .await;
        assert_eq!(status, 400, "{p}");
        assert_eq!(p["errors"][0]["field"], "on_event.then", "{p}");
        assert!(
            p["detail"].as_str().unwrap().contains("consecutive (2)"),
            "{p}"
        );
        let (status, p) = app
            .create(json!({"callback": {}, "on_event": {"source": "gh", "key": "1"}}))
            .await;
        assert_eq!(status, 400, "{p}");
        assert_eq!(p["errors"][0]["field"], "on_event.then", "{p}");
        // Events: too large, not JSON (signed), over the caps is elsewhere.
        let big = vec![b'1'; 1024 * 1024 + 1];
        let (status, p, text) = answered(
            client()
                .post(&hook)
                .header("x-hub-signature-256", github_signature(GITHUB_SECRET, &big))
                .body(big),
        )
        .await;
        assert_eq!(status, 413, "{p}");
        answers.push(text);
        let junk = b"{not json".to_vec();
        let (status, p, text) = answered(
            client()
                .post(&hook)
                .header(
                    "x-hub-signature-256",
                    github_signature(GITHUB_SECRET, &junk),
                )
                .body(junk),
        )
        .await;
        assert_eq!(status, 400, "{p}");
        answers.push(text);
        let (status, p, text) = answered(
            client()
                .post(app.url("/hooks/0123456789abcdef0123456789abcdef"))
                .json(&json!({})),
        )
        .await;
        assert_eq!(status, 404, "{p}");
        answers.push(text);
        let (status, a, text) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "ok",
            &run_event(1, "x"),
        ))
        .await;
        assert_eq!(status, 202, "{a}");
        answers.push(text);
        for path in ["/sources", "/sources/gh", "/events", "/waits"] {
            let (status, _, text) = answered(client().get(app.url(path))).await;
            assert_eq!(status, 200, "{path}");
            answers.push(text);
        }
        answers.push(app.metrics().await);
        for text in &answers {
            assert!(!text.contains(GITHUB_SECRET), "the secret is shown: {text}");
        }
        let (status, _, _) = answered(client().delete(app.url("/sources/gh"))).await;
        assert_eq!(status, 204);
        let (status, _, _) = answered(signed(
            &hook,
            "github",
            GITHUB_SECRET,
            "gone",
            &run_event(1, "x"),
        ))
        .await;
        assert_eq!(status, 404);
        finish(app, db).await;
    }
}

#[tokio::test]
async fn an_event_over_the_tenants_caps_is_refused_and_not_kept() {
    let dir = TempDir::new("waitd-sources-caps");
    let args = set_flag(test_args(&dir.sqlite_url()), "--source-events", "3");
    let app = App::start_args(args).await;
    let hook = source(&app, "b", "bearer", "/workflow_run/id", "5m").await;
    for n in 0..3 {
        let (status, a, _) = answered(signed(
            &hook,
            "bearer",
            BEARER_SECRET,
            &format!("c{n}"),
            &run_event(n, "x"),
        ))
        .await;
        assert_eq!(status, 202, "{a}");
    }
    let (status, p, _) = answered(signed(
        &hook,
        "bearer",
        BEARER_SECRET,
        "c3",
        &run_event(3, "x"),
    ))
    .await;
    assert_eq!(status, 429, "{p}");
    assert!(
        p["detail"].as_str().unwrap().contains("nothing was kept"),
        "{p}"
    );
    // A replay of a kept delivery is still a replay, not a refusal.
    let (status, a, _) = answered(signed(
        &hook,
        "bearer",
        BEARER_SECRET,
        "c0",
        &run_event(0, "x"),
    ))
    .await;
    assert_eq!((status, a["replayed"].as_bool()), (200, Some(true)), "{a}");
    let _ = app.stop().await;
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn signature_headers_of_any_text_are_parsed_in_bounds(text in ".{0,300}", long in 0usize..20_000) {
        let _ = waitd::sources::parse_github_signature(&text);
        let sigs = waitd::sources::parse_webhook_signatures(&text);
        prop_assert!(sigs.len() <= waitd::sources::MAX_SIGNATURES);
        let many = format!("v1,{} ", "A".repeat(43) + "=").repeat(long / 45 + 1);
        prop_assert!(waitd::sources::parse_webhook_signatures(&many).len() <= waitd::sources::MAX_SIGNATURES);
        let padded = format!("sha256={}", "a".repeat(long));
        prop_assert_eq!(waitd::sources::parse_github_signature(&padded).is_some(), long == 64);
    }

    #[test]
    fn a_key_past_its_limit_is_no_key(len in 0usize..2000, number in any::<i64>()) {
        let from = waitd::sources::KeyFrom::parse("/k").unwrap();
        let headers = Default::default();
        let key = from.extract(&json!({"k": "x".repeat(len)}), &headers);
        prop_assert_eq!(key.is_some(), (1..=waitd::engine::spec::MAX_KEY).contains(&len));
        prop_assert_eq!(from.extract(&json!({"k": number}), &headers), Some(number.to_string()));
        prop_assert_eq!(from.extract(&json!({"k": {"deep": [1]}}), &headers), None);
    }
}

#[test]
fn a_cel_key_reads_body_and_headers_within_its_budget() {
    let headers = [("x-run".to_string(), "r-1".to_string())]
        .into_iter()
        .collect();
    let from = waitd::sources::KeyFrom::parse("headers['x-run'] + ':' + string(body.n)").unwrap();
    assert_eq!(
        from.extract(&json!({"n": 4}), &headers),
        Some("r-1:4".into())
    );
    let burn = waitd::sources::KeyFrom::parse(
        "string(body.l.map(a, body.l.map(b, body.l.map(c, 1))).size())",
    )
    .unwrap();
    assert_eq!(
        burn.extract(&json!({"l": (0..300).collect::<Vec<_>>()}), &headers),
        None
    );
}
