//! Credentials the operator holds (`--credentials-file`): a wait names one by
//! `target.auth.credential`, only a tenant the operator lists may, and the
//! secrets stay in the operator's files, read again as they rotate.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::issuer::{CLIENT_ID, Issuer};
use crate::support::*;

const TOKEN_A: &str = "tenant-a-token-0123456789";
const TOKEN_B: &str = "tenant-b-token-0123456789";

async fn create_as(app: &App, token: &str, spec: &Value) -> (u16, Value) {
    let res = client()
        .post(app.url("/waits"))
        .bearer_auth(token)
        .json(spec)
        .send()
        .await
        .unwrap();
    let code = res.status().as_u16();
    (code, res.json().await.unwrap())
}

async fn ended_as(app: &App, token: &str, id: &str) -> Value {
    client()
        .get(app.url(&format!("/waits/{id}?wait=20s")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// An app on SQLite with tenants `a` and `b` and the credentials in `file`.
async fn app_with(dir: &TempDir, file: &Path) -> App {
    let mut args = test_args(&dir.sqlite_url());
    args.extend([
        "--tokens".to_string(),
        format!("a:{TOKEN_A},b:{TOKEN_B}"),
        "--credentials-file".to_string(),
        file.display().to_string(),
    ]);
    App::start_args(args).await
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

fn named(url: &str, credential: &str) -> Value {
    let mut s = spec(url);
    s["target"]["auth"] = json!({ "credential": credential });
    s["poll"] = json!({"initial": "50ms", "factor": 1, "max": "50ms", "jitter": 0});
    s
}

/// The token of a `bearer_file` credential is read again when the file changes:
/// the next poll carries the new one, as a rotated service-account token.
#[tokio::test]
async fn a_rewritten_token_file_is_sent_at_the_next_poll() {
    let dir = TempDir::new("waitd-cred");
    let token_file = dir.path.join("token");
    write(&token_file, "first-token\n");
    let creds = dir.path.join("credentials.json");
    write(
        &creds,
        &json!({"credentials": {"in-cluster": {
            "kind": "bearer_file", "tenants": ["a"], "hosts": ["127.0.0.1"], "path": token_file
        }}})
        .to_string(),
    );
    let app = app_with(&dir, &creds).await;
    let up = Upstream::start().await;
    let url = up.script("/k8s", vec![Reply::status("deploying")]);
    let (code, w) = create_as(&app, TOKEN_A, &named(&url, "in-cluster")).await;
    assert_eq!(code, 201, "{w}");
    assert_eq!(
        w["spec"]["target"]["auth"]["credential"], "in-cluster",
        "{w}"
    );
    let id = w["id"].as_str().unwrap().to_string();
    let sent = |up: &Upstream| -> Vec<String> {
        up.headers_seen("/k8s")
            .iter()
            .filter_map(|h| h.get("authorization")?.to_str().ok().map(str::to_string))
            .collect()
    };
    assert!(up.hit("/k8s", 1, Duration::from_secs(10)).await);
    assert_eq!(sent(&up)[0], "Bearer first-token");

    write(&token_file, "second-token-rotated\n");
    let rotated = up
        .requested(Duration::from_secs(10), |up| {
            sent(up).contains(&"Bearer second-token-rotated".to_string())
        })
        .await;
    assert!(rotated, "the new token was never sent: {:?}", sent(&up));
    let after: Vec<String> = sent(&up)
        .into_iter()
        .skip_while(|t| t != "Bearer second-token-rotated")
        .collect();
    assert!(
        after.iter().all(|t| t == "Bearer second-token-rotated"),
        "the old token after the new one: {after:?}"
    );
    up.script("/k8s", vec![Reply::status("on")]);
    let w = ended_as(&app, TOKEN_A, &id).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    app.stop().await.0.unwrap();
}

/// A tenant the operator does not list for a credential, or a name the operator
/// does not hold: the same 403, naming the credential, for a wait and for a
/// group's member alike.
#[tokio::test]
async fn a_tenant_not_listed_for_a_credential_gets_a_403_naming_it() {
    let dir = TempDir::new("waitd-cred");
    let token_file = dir.path.join("token");
    write(&token_file, "t");
    let creds = dir.path.join("credentials.json");
    write(
        &creds,
        &json!({"credentials": {"team-a-only": {
            "kind": "bearer_file", "tenants": ["a"], "hosts": ["127.0.0.1"], "path": token_file
        }}})
        .to_string(),
    );
    let app = app_with(&dir, &creds).await;
    let url = "http://127.0.0.1:9/never";
    for name in ["team-a-only", "no-such-credential"] {
        let (code, problem) = create_as(&app, TOKEN_B, &named(url, name)).await;
        assert_eq!(code, 403, "{problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(name), "{detail}");
        assert!(detail.contains("target.auth.credential"), "{detail}");
        assert!(
            !detail.contains(&token_file.display().to_string()),
            "{detail}"
        );
    }
    let group = json!({"all": [named(url, "team-a-only")], "timeout": "5s"});
    let (code, problem) = create_as(&app, TOKEN_B, &group).await;
    assert_eq!(code, 403, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .starts_with("all[0].target.auth.credential"),
        "{problem}"
    );
    let (code, w) = create_as(&app, TOKEN_A, &named(url, "team-a-only")).await;
    assert_eq!(code, 201, "tenant a may: {w}");
    let (code, problem) = create_as(&app, TOKEN_A, &named(url, "bad name!")).await;
    assert_eq!(code, 400, "{problem}");
    app.stop().await.0.unwrap();
}

/// An `oauth2` credential proves the client with the secret in its file, or
/// with the assertion in its file (workload identity), each read at every mint.
#[tokio::test]
async fn an_oauth2_credential_reads_its_secret_or_assertion_from_the_operators_file() {
    let dir = TempDir::new("waitd-cred");
    let issuer = Issuer::start("secret-in-a-file").await;
    issuer.on_after(1);
    let secret_file = dir.path.join("client-secret");
    write(&secret_file, "secret-in-a-file\n");
    let assertion_file = dir.path.join("federated-token");
    write(&assertion_file, "secret-in-a-file");
    let creds = dir.path.join("credentials.json");
    write(
        &creds,
        &json!({"credentials": {
            "by-secret": {"kind": "oauth2", "tenants": ["*"], "hosts": ["127.0.0.1"], "token_url": issuer.token_url,
                          "client_id": CLIENT_ID, "client_secret_file": secret_file,
                          "scope": "api://target/.default"},
            "by-assertion": {"kind": "oauth2", "tenants": ["b"], "hosts": ["127.0.0.1"], "token_url": issuer.token_url,
                             "client_id": CLIENT_ID, "client_assertion_file": assertion_file}
        }})
        .to_string(),
    );
    let app = app_with(&dir, &creds).await;
    for (token, name) in [(TOKEN_A, "by-secret"), (TOKEN_B, "by-assertion")] {
        let (code, w) = create_as(&app, token, &named(&issuer.target_url, name)).await;
        assert_eq!(code, 201, "{w}");
        let w = ended_as(&app, token, w["id"].as_str().unwrap()).await;
        assert_eq!(w["status"], "succeeded", "{name}: {w}");
    }
    assert_eq!(issuer.client_auth_seen(), vec!["body", "assertion"]);
    assert_eq!(issuer.unauthorized(), 0);
    app.stop().await.0.unwrap();
}

/// The command-line client names a credential with `--auth-credential`.
#[tokio::test]
async fn the_client_names_a_credential_with_a_flag() {
    let dir = TempDir::new("waitd-cred");
    let token_file = dir.path.join("token");
    write(&token_file, "cli-token");
    let creds = dir.path.join("credentials.json");
    write(
        &creds,
        &json!({"credentials": {"ci": {
            "kind": "bearer_file", "tenants": ["a"], "hosts": ["127.0.0.1"], "path": token_file
        }}})
        .to_string(),
    );
    let app = app_with(&dir, &creds).await;
    let up = Upstream::start().await;
    let url = up.script("/cli", vec![Reply::status("on")]);
    let args = [
        "create",
        "--url",
        url.as_str(),
        "--state",
        "/data/attributes/status",
        "--want",
        "on",
        "--auth-credential",
        "ci",
        "--wait",
    ];
    let run = crate::client::waitd_env(&app.base, &args, &[("WAITD_TOKEN", TOKEN_A)]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let seen = up.headers_seen("/cli");
    assert_eq!(seen[0]["authorization"], "Bearer cli-token");
    let run = crate::client::waitd_env(&app.base, &args, &[("WAITD_TOKEN", TOKEN_B)]).await;
    assert_eq!(run.code, 5, "{run:?}");
    assert!(run.stderr.contains("\"ci\""), "{run:?}");
    app.stop().await.0.unwrap();
}

/// A credential's `ca_file` is the trust of the waits that name it, as the
/// cluster's `ca.crt` is for an in-cluster client; a wait naming it cannot bring
/// a `target.tls` of its own.
#[tokio::test]
async fn a_credentials_ca_file_is_trusted_for_the_waits_that_name_it() {
    use crate::tls_targets::pki;
    let dir = TempDir::new("waitd-cred");
    let ca = pki::authority("cluster CA");
    let (cert, key) = pki::server_cert(&ca);
    let target = pki::TlsTarget::start(&cert, &key, None).await;
    target.set("on");
    let token_file = dir.path.join("token");
    write(&token_file, "sa-token");
    let ca_file = dir.path.join("ca.crt");
    write(&ca_file, &ca.pem());
    let creds = dir.path.join("credentials.json");
    write(
        &creds,
        &json!({"credentials": {
            "in-cluster": {"kind": "bearer_file", "tenants": ["a"], "hosts": ["127.0.0.1"], "path": token_file,
                           "ca_file": ca_file},
            "no-ca": {"kind": "bearer_file", "tenants": ["a"], "hosts": ["127.0.0.1"], "path": token_file}
        }})
        .to_string(),
    );
    let app = app_with(&dir, &creds).await;
    let (code, w) = create_as(&app, TOKEN_A, &named(&target.url(), "in-cluster")).await;
    assert_eq!(code, 201, "{w}");
    let w = ended_as(&app, TOKEN_A, w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");

    let (code, w) = create_as(&app, TOKEN_A, &named(&target.url(), "no-ca")).await;
    assert_eq!(code, 201, "{w}");
    let w = ended_as(&app, TOKEN_A, w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "error", "{w}");
    assert!(
        w["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("invalid peer certificate"),
        "{w}"
    );

    let mut both = named(&target.url(), "in-cluster");
    both["target"]["tls"] = json!({"ca": ca.pem()});
    let (code, problem) = create_as(&app, TOKEN_A, &both).await;
    assert_eq!(code, 400, "{problem}");
    assert!(problem.to_string().contains("target.tls"), "{problem}");
    app.stop().await.0.unwrap();
}

/// A server of the tenant's own that answers every GET with the request's
/// `Authorization` header as `{"auth": …}`: where a credential sent to it would
/// come back in the wait's `state`.
async fn echo_server() -> String {
    let app = axum::Router::new().fallback(|headers: axum::http::HeaderMap| async move {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_string();
        axum::Json(json!({ "auth": auth }))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    base
}

/// The operator's credentials of both kinds, for tenant `a`, each for its own
/// API only (`api` for the bearer token, the issuer's target for the oauth2
/// one), with `"*"` for the oauth2 one's tenants.
fn for_their_hosts(dir: &TempDir, api: &str, issuer: &Issuer) -> std::path::PathBuf {
    let token_file = dir.path.join("token");
    write(&token_file, "the-operators-service-account-token");
    let secret_file = dir.path.join("client-secret");
    write(&secret_file, "secret-in-a-file");
    let creds = dir.path.join("credentials.json");
    write(
        &creds,
        &json!({"credentials": {
            "in-cluster": {"kind": "bearer_file", "tenants": ["a"], "hosts": [api],
                           "path": token_file},
            "arm": {"kind": "oauth2", "tenants": ["*"], "hosts": [issuer.target_url],
                    "token_url": issuer.token_url, "client_id": CLIENT_ID,
                    "client_secret_file": secret_file}
        }})
        .to_string(),
    );
    creds
}

/// A credential goes only where its operator said: a wait that names it for a
/// server of the tenant's own (one that would echo it back in `state`) is a 403
/// that names neither the credential's token nor its hosts, for a wait and for a
/// group's member, on either store; the same credential on its own host works.
async fn a_credential_goes_only_to_the_hosts_it_lists(args: Vec<String>, dir: &TempDir) {
    let up = Upstream::start().await;
    let api = up.script("/k8s/pods", vec![Reply::status("on")]);
    let issuer = Issuer::start("secret-in-a-file").await;
    issuer.on_after(1);
    let creds = for_their_hosts(dir, &format!("{}/k8s/", up.base), &issuer);
    let mut args = args;
    args.extend([
        "--tokens".to_string(),
        format!("a:{TOKEN_A},b:{TOKEN_B}"),
        "--credentials-file".to_string(),
        creds.display().to_string(),
    ]);
    let app = App::start_args(args).await;
    let echo = echo_server().await;
    for (name, url) in [
        ("in-cluster", format!("{echo}/k8s/pods")),
        ("in-cluster", format!("{}/k8s-evil/pods", up.base)),
        ("in-cluster", format!("{}/other", up.base)),
        ("arm", format!("{echo}/target")),
    ] {
        let mut s = named(&url, name);
        s["state"] = json!("/auth");
        s["want"] = json!(["never"]);
        let (code, problem) = create_as(&app, TOKEN_A, &s).await;
        assert_eq!(code, 403, "{name} at {url}: {problem}");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(&format!("\"{name}\"")), "{detail}");
        assert!(
            detail.contains("may not be sent to this target"),
            "{detail}"
        );
        for secret in [
            "the-operators-service-account-token",
            "secret-in-a-file",
            &up.base,
            &issuer.target_url,
        ] {
            assert!(!problem.to_string().contains(secret), "{problem}");
        }
        let group = json!({"all": [s], "timeout": "5s"});
        let (code, problem) = create_as(&app, TOKEN_A, &group).await;
        assert_eq!(code, 403, "{problem}");
    }
    // Where the operator said, it is sent.
    let (code, w) = create_as(&app, TOKEN_A, &named(&api, "in-cluster")).await;
    assert_eq!(code, 201, "{w}");
    let w = ended_as(&app, TOKEN_A, w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    assert_eq!(
        up.headers_seen("/k8s/pods")[0]["authorization"],
        "Bearer the-operators-service-account-token"
    );
    let (code, w) = create_as(&app, TOKEN_A, &named(&issuer.target_url, "arm")).await;
    assert_eq!(code, 201, "{w}");
    let w = ended_as(&app, TOKEN_A, w["id"].as_str().unwrap()).await;
    assert_eq!(w["status"], "succeeded", "{w}");
    app.stop().await.0.unwrap();
}

#[tokio::test]
async fn a_credential_goes_only_to_the_hosts_it_lists_on_sqlite() {
    let dir = TempDir::new("waitd-cred");
    a_credential_goes_only_to_the_hosts_it_lists(test_args(&dir.sqlite_url()), &dir).await;
}

#[tokio::test]
async fn a_credential_goes_only_to_the_hosts_it_lists_on_postgres() {
    let dir = TempDir::new("waitd-cred");
    let db = TestDb::new().await;
    a_credential_goes_only_to_the_hosts_it_lists(test_args(&db.url), &dir).await;
    db.drop_db().await;
}

/// `"tenants": ["*"]` is every tenant with a token: a server without tokens
/// serves anonymous callers, and they may name no credential.
#[tokio::test]
async fn every_tenant_never_includes_anonymous_callers() {
    let dir = TempDir::new("waitd-cred");
    let issuer = Issuer::start("secret-in-a-file").await;
    let creds = for_their_hosts(&dir, "127.0.0.1", &issuer);
    let mut args = test_args(&dir.sqlite_url());
    args.extend([
        "--credentials-file".to_string(),
        creds.display().to_string(),
    ]);
    let app = App::start_args(args).await;
    let (code, problem) = app.create(named(&issuer.target_url, "arm")).await;
    assert_eq!(code, 403, "{problem}");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("is not one this tenant may use"),
        "{problem}"
    );
    assert_eq!(issuer.token_requests(), 0);
    app.stop().await.0.unwrap();
}
