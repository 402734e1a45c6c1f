//! The files an operator writes (API tokens, credentials, the files they name)
//! are read strictly, and off the runtime's threads: a line read loosely does not
//! move a tenant or widen a token, and a file that blocks fails only what needs
//! it, while the API, the other waits and a shutdown go on.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use waitd::worker::Signal;

use crate::support::replica::{Replica, free_port, replica_args};
use crate::support::*;

const FULL: &str = "token-of-tenant-a-0001";
const OTHER: &str = "token-of-tenant-b-0001";

/// Tokens files that say too little or too much, each with the line the
/// sentence names: a byte-order mark, stray whitespace, a carriage return, a
/// tenant name with a space or a control character, a mistyped `:read`, a
/// token with a colon.
fn loose_files() -> Vec<(&'static str, String, &'static str)> {
    vec![
        ("a BOM", format!("\u{feff}a:{FULL}\n"), "line 1"),
        ("a trailing space", format!("a:{FULL} \n"), "line 1"),
        ("a leading space", format!("# x\n a:{FULL}\n"), "line 2"),
        ("a CRLF", format!("a:{FULL}\r\n"), "carriage return"),
        ("a tab", format!("a:{FULL}\nb:{OTHER}\t\n"), "line 2"),
        (
            "a tenant with a space",
            format!("a:{FULL}\nb c:{OTHER}\n"),
            "line 2: holds whitespace",
        ),
        (
            "a tenant with a slash",
            format!("a:{FULL}\nb/c:{OTHER}\n"),
            "tenant name",
        ),
        (
            "a tenant with a NUL",
            format!("a:{FULL}\nb\0:{OTHER}\n"),
            "line 2",
        ),
        (
            "a mistyped suffix",
            format!("a:{FULL}\nb:{OTHER}:readonly\n"),
            "suffix",
        ),
        (
            "two suffixes",
            format!("a:{FULL}\nb:{OTHER}:read:read\n"),
            "suffix",
        ),
    ]
}

async fn status_with(app: &App, path: &str, token: &str) -> u16 {
    app.get_as(token, path).await.0
}

/// A reload of a tokens file read loosely fails with a sentence naming
/// the line, and the tokens in force stay: tenant `a` keeps its waits, and no
/// token is widened by a mistyped suffix.
async fn a_loose_tokens_file_is_refused_and_the_tokens_in_force_stay(db_url: &str) {
    let dir = TempDir::new("waitd-tokens-strict");
    let file = dir.path.join("tokens");
    std::fs::write(&file, format!("a:{FULL}\n")).unwrap();
    let mut args = test_args(db_url);
    args.extend(["--tokens-file".into(), file.display().to_string()]);
    let app = App::start_args(args).await;
    let (code, w) = app.create_as(FULL, &spec("http://127.0.0.1:9/never")).await;
    assert_eq!(code, 201, "{w}");
    let id = w["id"].as_str().unwrap().to_string();
    let mut heard = app.heard();
    for (i, (what, text, _)) in loose_files().into_iter().enumerate() {
        // Written whole at once (a rename), with a comment of its own length so
        // that each file's stamp differs: one reload a file.
        let next = dir.path.join("tokens.next");
        std::fs::write(&next, format!("{text}#{}\n", "-".repeat(i))).unwrap();
        std::fs::rename(&next, &file).unwrap();
        let reloaded = heard
            .expect(&format!("the reload of {what}"), |s| {
                matches!(s, Signal::TokensReloaded { .. })
            })
            .await;
        assert_eq!(
            reloaded,
            Signal::TokensReloaded { ok: false },
            "{what} was taken"
        );
        assert_eq!(
            status_with(&app, &format!("/waits/{id}"), FULL).await,
            200,
            "{what}: tenant a still sees its wait"
        );
        for widened in [format!("{OTHER}:readonly"), OTHER.to_string()] {
            assert_eq!(status_with(&app, "/waits", &widened).await, 401, "{what}");
        }
    }
    let failed = app.metrics().await;
    assert!(
        failed.contains(&format!(
            "waitd_token_reloads_total{{outcome=\"failed\"}} {}",
            loose_files().len()
        )),
        "{failed}"
    );
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_loose_tokens_file_is_refused_and_the_tokens_in_force_stay_on_sqlite() {
    a_loose_tokens_file_is_refused_and_the_tokens_in_force_stay("sqlite::memory:").await;
}

#[tokio::test]
async fn a_loose_tokens_file_is_refused_and_the_tokens_in_force_stay_on_postgres() {
    let db = TestDb::new().await;
    a_loose_tokens_file_is_refused_and_the_tokens_in_force_stay(&db.url).await;
    db.drop_db().await;
}

/// Why waitd does not start with these flags.
async fn start_error(args: Vec<String>) -> String {
    let config = waitd::Config::from_args(args).expect("flags that parse");
    let addr = "127.0.0.1:0".parse().unwrap();
    match waitd::App::start(config, addr).await {
        Ok(_) => panic!("waitd started"),
        Err(e) => e.to_string(),
    }
}

/// A start-up with a tokens file read loosely does not start, and says which
/// file and line.
#[tokio::test]
async fn a_loose_tokens_file_stops_the_start_with_a_sentence_naming_its_line() {
    let dir = TempDir::new("waitd-tokens-strict");
    let file = dir.path.join("tokens");
    for (what, text, says) in loose_files() {
        std::fs::write(&file, &text).unwrap();
        let mut args = test_args("sqlite::memory:");
        args.extend(["--tokens-file".into(), file.display().to_string()]);
        let e = start_error(args).await;
        assert!(e.contains(&file.display().to_string()), "{what}: {e}");
        assert!(e.contains(says), "{what}: {e}");
        assert!(!e.contains(FULL) && !e.contains(OTHER), "{what}: {e}");
    }
}

fn mkfifo(path: &Path) {
    let made = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(made.success(), "mkfifo {}", path.display());
}

/// A credential whose token file blocks (a FIFO no one writes, standing for
/// a hung network mount), named by sixteen waits. The process's API answers
/// (`/healthz` included), a wait of another tenant without the credential is
/// polled and ends, the waits that need the file end by their deadline saying
/// it blocks, and SIGTERM ends the process.
#[tokio::test]
async fn a_credential_file_that_blocks_fails_only_the_polls_that_need_it() {
    let dir = TempDir::new("waitd-fifo");
    let fifo = dir.path.join("token");
    mkfifo(&fifo);
    let creds = dir.path.join("credentials.json");
    std::fs::write(
        &creds,
        json!({"credentials": {"mounted": {
            "kind": "bearer_file", "tenants": ["a"], "hosts": ["127.0.0.1"], "path": fifo
        }}})
        .to_string(),
    )
    .unwrap();
    let port = free_port();
    let tokens = format!("a:{FULL},b:{OTHER}");
    let creds_arg = creds.display().to_string();
    let args = replica_args(
        &dir.sqlite_url(),
        port,
        "3s",
        &["--tokens", &tokens, "--credentials-file", &creds_arg],
    );
    let mut r = Replica::spawn("fifo", &dir.path, port, args);
    r.ready(Duration::from_secs(15)).await;
    let up = Upstream::start().await;
    let url = up.script("/needs-the-file", vec![Reply::status("deploying")]);
    let mut ids = Vec::new();
    for _ in 0..16 {
        let mut s = spec(&url);
        s["target"]["auth"] = json!({"credential": "mounted"});
        s["timeout"] = json!("7s");
        s["retry"] = json!({"delay": "100ms", "max_delay": "100ms", "max_retries": null});
        let res = client()
            .post(r.url("/waits"))
            .bearer_auth(FULL)
            .json(&s)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        ids.push(
            res.json::<Value>().await.unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    for _ in 0..3 {
        let health = quick.get(r.url("/healthz")).send().await;
        assert!(
            health.is_ok_and(|h| h.status().is_success()),
            "/healthz did not answer within 2 s; log:\n{}",
            r.log_tail(20)
        );
    }
    let healthy = up.script("/healthy", vec![Reply::status("on")]);
    let res = quick
        .post(r.url("/waits?wait=10s"))
        .bearer_auth(OTHER)
        .timeout(Duration::from_secs(12))
        .json(&spec(&healthy))
        .send()
        .await
        .expect("another tenant's wait is answered");
    let w: Value = res.json().await.unwrap();
    assert_eq!(w["status"], "succeeded", "{w}");
    for id in &ids {
        let w: Value = quick
            .get(r.url(&format!("/waits/{id}?wait=15s")))
            .bearer_auth(FULL)
            .timeout(Duration::from_secs(17))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(w["status"], "timed_out", "{w}");
        let error = w["last_error"].as_str().unwrap_or_default();
        assert!(error.contains("credential's token file"), "{w}");
        assert!(error.contains("blocks"), "{w}");
    }
    assert_eq!(up.hits("/needs-the-file"), 0);
    r.signal("TERM");
    let exit = r.wait_exit(Duration::from_secs(15)).await;
    assert!(
        exit.is_some_and(|e| e.success()),
        "SIGTERM: {exit:?}; log:\n{}",
        r.log_tail(20)
    );
}

/// A tokens or credentials file that blocks at start-up stops the start within
/// moments, with a sentence, rather than hang it.
#[tokio::test]
async fn a_file_that_blocks_at_start_up_stops_it_with_a_sentence() {
    let dir = TempDir::new("waitd-fifo");
    let fifo = dir.path.join("blocks");
    mkfifo(&fifo);
    let path = fifo.display().to_string();
    for flag in ["--tokens-file", "--credentials-file"] {
        let port = free_port();
        let args = replica_args(&dir.sqlite_url(), port, "3s", &[flag, &path]);
        let mut r = Replica::spawn(flag.trim_start_matches('-'), &dir.path, port, args);
        let exit = r.wait_exit(Duration::from_secs(15)).await;
        assert!(
            exit.is_some_and(|e| !e.success()),
            "{flag}: {exit:?}; log:\n{}",
            r.log_tail(20)
        );
        let log = r.log_text();
        assert!(log.contains(&path), "{flag}: {log}");
        assert!(
            log.contains("could not be read within 5 s"),
            "{flag}: {log}"
        );
    }
}

mod generated {
    //! Tokens and credentials files as an operator may mistype them: byte-order
    //! marks, whitespace, control characters, long lines, odd suffixes. Whatever
    //! they hold, reading them ends with tokens that are each exactly as written,
    //! or a sentence that names where and holds no token.

    use proptest::prelude::*;
    use serde_json::json;
    use waitd::tokens::{Access, MAX_TENANT, MAX_TOKEN, MIN_TOKEN, is_tenant_name, parse};

    fn odd() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("\u{feff}".to_string()),
            Just(" ".to_string()),
            Just("\t".to_string()),
            Just("\r".to_string()),
            Just("\0".to_string()),
            Just("\u{7}".to_string()),
            Just("\u{a0}".to_string()),
            Just(":".to_string()),
            Just(":read".to_string()),
            Just(":readonly".to_string()),
            Just(":READ".to_string()),
            Just("é".to_string()),
            Just("#".to_string()),
            "[ -~]{1,3}",
            (1usize..10_000).prop_map(|n| "x".repeat(n)),
        ]
    }

    fn line() -> impl Strategy<Value = String> {
        let tenant = "[A-Za-z0-9._-]{1,12}";
        let token = "[!-9;-~]{16,40}";
        let good = (tenant, token, any::<bool>())
            .prop_map(|(t, k, read)| format!("{t}:{k}{}", if read { ":read" } else { "" }));
        prop_oneof![
            3 => good.clone(),
            4 => (good, odd(), any::<prop::sample::Index>()).prop_map(|(g, o, at)| {
                let mut cut = at.index(g.len() + 1);
                while !g.is_char_boundary(cut) {
                    cut -= 1;
                }
                format!("{}{o}{}", &g[..cut], &g[cut..])
            }),
            1 => Just(String::new()),
            1 => "#[ -~]{0,20}",
            1 => "[ -~\u{feff}\t\r]{0,60}",
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        #[test]
        fn a_tokens_file_is_read_exactly_as_written_or_refused_with_a_sentence(
            lines in prop::collection::vec(line(), 0..8),
        ) {
            match parse(&lines, |i| format!("line {}", i + 1)) {
                Ok(set) => {
                    for line in lines.iter().filter(|l| !l.is_empty() && !l.starts_with('#')) {
                        let parts: Vec<&str> = line.split(':').collect();
                        prop_assert!(parts.len() == 2 || (parts.len() == 3 && parts[2] == "read"), "{:?}", line);
                        prop_assert!(is_tenant_name(parts[0]) && parts[0].len() <= MAX_TENANT, "{:?}", line);
                        let token = parts[1];
                        prop_assert!((MIN_TOKEN..=MAX_TOKEN).contains(&token.len()), "{:?}", line);
                        prop_assert!(token.bytes().all(|b| b.is_ascii_graphic() && b != b':'), "{:?}", line);
                        let grant = &set[token];
                        prop_assert_eq!(&grant.tenant, parts[0]);
                        prop_assert_eq!(grant.access == Access::Read, parts.len() == 3);
                    }
                }
                Err(e) => {
                    prop_assert!(e.0.starts_with("line "), "{}", e.0);
                    prop_assert!(e.0.len() < 300, "{}", e.0);
                    for line in &lines {
                        for part in line.split(':').skip(1).filter(|p| p.len() >= MIN_TOKEN) {
                            prop_assert!(!e.0.contains(part), "{} holds {:?}", e.0, part);
                        }
                    }
                }
            }
        }

        #[test]
        fn a_credentials_file_is_read_or_refused_with_a_sentence_naming_it(
            name in prop_oneof!["[a-z]{1,8}", odd()],
            tenant in prop_oneof!["[a-z]{1,8}", Just("*".to_string()), odd()],
            host in prop_oneof![Just("api.example.com".to_string()), Just("https://api.example.com/v1/".to_string()), odd()],
            kind in prop_oneof![Just("bearer_file".to_string()), odd()],
            bom in any::<bool>(),
            pad in prop_oneof![Just(String::new()), odd()],
        ) {
            let mut credentials = serde_json::Map::new();
            credentials.insert(name.clone(), json!({
                "kind": kind, "tenants": [tenant.clone()], "hosts": [host.clone()], "path": "/nonexistent/token"
            }));
            let doc = json!({ "credentials": credentials });
            let text = format!("{}{pad}{doc}", if bom { "\u{feff}" } else { "" });
            let dir = std::env::temp_dir().join(format!("waitd-creds-{}", uuid::Uuid::now_v7().simple()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("c.json");
            std::fs::write(&path, &text).unwrap();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let loaded = rt.block_on(waitd::outbound::credentials::Credentials::load(Some(&path)));
            let _ = std::fs::remove_dir_all(&dir);
            match loaded {
                Ok(c) => {
                    prop_assert!(!bom, "a BOM was taken");
                    prop_assert_eq!(c.len(), 1);
                    prop_assert!(waitd::engine::spec::is_credential_name(&name), "{:?}", name);
                    prop_assert!(tenant == "*" || is_tenant_name(&tenant), "{:?}", tenant);
                    prop_assert!(!host.chars().any(|c| c.is_whitespace() || c.is_control()), "{:?}", host);
                }
                Err(e) => {
                    prop_assert!(e.0.starts_with("--credentials-file"), "{}", e.0);
                }
            }
        }
    }
}
