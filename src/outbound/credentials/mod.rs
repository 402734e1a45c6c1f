//! Credentials the operator holds (`--credentials-file`): each named, each for
//! the tenants it lists and sent only to the hosts it lists. A wait names one
//! (`"auth": {"credential": "NAME"}`) and never a file: only the operator can.
//!
//! ```json
//! { "credentials": {
//!     "in-cluster": { "kind": "bearer_file", "tenants": ["platform"],
//!                     "hosts": ["kubernetes.default.svc"],
//!                     "path": "/var/run/secrets/kubernetes.io/serviceaccount/token" },
//!     "arm": { "kind": "oauth2", "tenants": ["*"],
//!              "hosts": ["https://management.azure.com/subscriptions/"],
//!              "token_url": "https://login.microsoftonline.com/<tenant>/oauth2/v2.0/token",
//!              "client_id": "<app-id>",
//!              "client_assertion_file": "/var/run/secrets/azure/tokens/azure-identity-token",
//!              "scope": "https://management.azure.com/.default" } } }
//! ```
//!
//! - `tenants`: the tenants that may name it; `"*"` is every tenant with a
//!   token, never the anonymous callers of a server without tokens.
//! - `hosts`: where its token may go, each a host (`api.example.com`, any port)
//!   or a host and port (`api.example.com:8443`), or a URL prefix
//!   (`https://api.example.com/v1/`: that scheme, host and port, and a path
//!   under it). A wait that names it for a target elsewhere is refused, so a
//!   tenant cannot point the operator's token at a server of its own.
//! - `bearer_file`: the token in `path`, read again when the file changes (its
//!   modification time or length, looked at at most once a second), as the
//!   kubelet rotates a service account's token.
//! - `oauth2`: tokens minted as for `target.auth.oauth2` ([`super::token`]),
//!   proving the client with `client_secret_file` or with a signed assertion from
//!   `client_assertion_file` (`client_assertion_type` defaults to the JWT bearer
//!   type, as Azure workload identity needs), each read at every mint. One
//!   credential, one token, whichever tenant's wait asks.
//! - Either kind may add `ca_file` (the authorities its waits' targets are
//!   trusted by, instead of the platform's) and `client_cert_file` with
//!   `client_key_file` (a client certificate), read at start-up.
//!
//! Every file is read off the runtime's threads and within a time
//! ([`crate::files`]): a file that blocks fails the polls that need it, and
//! nothing else.
//!
//! This file is the credentials held and which tenant may send which where.
//! Reading the file is [`document`]'s, an entry of `hosts` is [`place`]'s, and
//! the token a credential sends is [`bearer`]'s. The file's optional `sources`
//! are the operator's event sources, read by [`sources`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use super::TlsSettings;
use crate::config::SettingError;

mod bearer;
mod document;
mod place;
mod sources;

pub use bearer::{Bearer, FileBearer, LOOK_EVERY};
use document::{Document, MAX_DOCUMENT};
use place::Place;
pub use sources::OperatorSource;

/// The `client_assertion_type` of a JWT bearer assertion (RFC 7523 §2.2).
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// The operator's credentials, by name.
#[derive(Default)]
pub struct Credentials {
    by_name: HashMap<String, Held>,
    /// The operator's event sources, by name ([`sources`]).
    sources: BTreeMap<String, OperatorSource>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.by_name.keys()).finish()
    }
}

struct Held {
    /// `None`: every tenant (with a token).
    tenants: Option<Vec<String>>,
    /// Where its token may go.
    hosts: Vec<Place>,
    bearer: Bearer,
    tls: Option<Arc<TlsSettings>>,
}

/// Why a tenant may not send a credential where a wait asks.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The operator does not give it to this tenant, or holds none of that name:
    /// the same either way, so a tenant learns nothing of another's credentials.
    NotTheTenants(String),
    /// It is the tenant's, but not for the target's host.
    NotForTheTarget(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotTheTenants(why) | Refused::NotForTheTarget(why) => f.write_str(why),
        }
    }
}

/// What a credential gives the waits that name it: the token, and the TLS
/// settings of its `ca_file`, `client_cert_file` and `client_key_file`.
#[derive(Clone, Debug)]
pub struct Granted {
    pub bearer: Bearer,
    pub tls: Option<Arc<TlsSettings>>,
}

impl Credentials {
    /// Reads `--credentials-file` (off the runtime's threads, within
    /// [`crate::files::READ_WITHIN`]); none: no credentials. Every mistake is a
    /// sentence naming the credential and the field.
    pub async fn load(path: Option<&Path>) -> Result<Credentials, SettingError> {
        let Some(path) = path else {
            return Ok(Credentials::default());
        };
        let fail =
            |why: String| SettingError(format!("--credentials-file {}: {why}", path.display()));
        let text = crate::files::read_text(path, MAX_DOCUMENT)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let doc: Document = serde_json::from_str(&text)
            .map_err(|e| fail(format!("is not a credentials document ({e}); write {{\"credentials\": {{\"NAME\": {{\"kind\": \"bearer_file\" or \"oauth2\", \"tenants\": [...], ...}}}}}}")))?;
        let mut by_name = HashMap::new();
        for (name, entry) in doc.credentials {
            let held = Held::of(&name, entry)
                .await
                .map_err(|why| fail(format!("credential \"{}\": {why}", name.escape_debug())))?;
            by_name.insert(name, held);
        }
        let mut sources = BTreeMap::new();
        for (name, entry) in doc.sources {
            let source = OperatorSource::of(&name, entry)
                .await
                .map_err(|why| fail(format!("source \"{}\": {why}", name.escape_debug())))?;
            if let Some((other, _)) = sources
                .iter()
                .find(|(_, s): &(&String, &OperatorSource)| s.hook_id == source.hook_id)
            {
                return Err(fail(format!(
                    "source \"{}\": \"hook_id\" is the hook_id of source \"{other}\" too; give each its own",
                    name.escape_debug()
                )));
            }
            sources.insert(name, source);
        }
        Ok(Credentials { by_name, sources })
    }

    /// The operator's event sources, by name.
    pub fn sources(&self) -> &BTreeMap<String, OperatorSource> {
        &self.sources
    }

    /// The operator's event source `name`, if `tenant` may name it.
    pub fn source_for(&self, tenant: &str, name: &str) -> Option<&OperatorSource> {
        self.sources.get(name).filter(|s| s.is_for(tenant))
    }

    /// How many credentials the operator holds.
    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    /// The credential `name`, if `tenant` may send it to `target`; otherwise a
    /// sentence that names it, and neither its value nor its hosts. It is the
    /// same whether the credential is absent or another tenant's, so a tenant
    /// learns nothing of others' credentials; the anonymous tenant (`""`) is
    /// given none.
    pub fn for_target(
        &self,
        tenant: &str,
        name: &str,
        target: &url::Url,
    ) -> Result<Granted, Refused> {
        let held = self
            .by_name
            .get(name)
            .filter(|_| !tenant.is_empty())
            .filter(|h| {
                h.tenants
                    .as_ref()
                    .is_none_or(|t| t.iter().any(|t| t == tenant))
            })
            .ok_or_else(|| {
                Refused::NotTheTenants(format!(
                    "the credential \"{name}\" is not one this tenant may use: the operator names each credential and its tenants in --credentials-file"
                ))
            })?;
        if !held.hosts.iter().any(|p| p.admits(target)) {
            return Err(Refused::NotForTheTarget(format!(
                "the credential \"{name}\" may not be sent to this target: the operator names the hosts each credential goes to in --credentials-file"
            )));
        }
        Ok(Granted {
            bearer: held.bearer.clone(),
            tls: held.tls.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    async fn load(doc: serde_json::Value) -> Result<Credentials, SettingError> {
        let dir =
            std::env::temp_dir().join(format!("waitd-creds-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        std::fs::write(&path, doc.to_string()).unwrap();
        let out = Credentials::load(Some(&path)).await;
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    fn bearer(tenants: &[&str], hosts: &[&str]) -> serde_json::Value {
        json!({"kind": "bearer_file", "tenants": tenants, "hosts": hosts, "path": "/t"})
    }

    #[tokio::test]
    async fn each_mistake_in_the_file_is_a_sentence_naming_the_credential() {
        let url = "https://login.example.com/token";
        let h = ["api.example.com"];
        for (doc, says) in [
            (
                json!({"credentials": {"x": {"kind": "magic", "tenants": ["a"], "hosts": h}}}),
                "\"magic\"",
            ),
            (
                json!({"credentials": {"x": {"kind": "bearer_file", "tenants": [], "hosts": h}}}),
                "lists no tenant",
            ),
            (
                json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "hosts": h}}}),
                "\"path\" is required",
            ),
            (
                json!({"credentials": {"bad name": bearer(&["a"], &h)}}),
                "a name is",
            ),
            (
                json!({"credentials": {"x": {"kind": "oauth2", "tenants": ["a"], "hosts": h, "token_url": url, "client_id": "c"}}}),
                "exactly one of",
            ),
            (
                json!({"credentials": {"x": {"kind": "oauth2", "tenants": ["a"], "hosts": h, "token_url": url, "client_id": "c",
                "client_secret_file": "/s", "client_assertion_file": "/a"}}}),
                "exactly one of",
            ),
            (
                json!({"credentials": {"x": {"kind": "oauth2", "tenants": ["a"], "hosts": h, "token_url": "ftp://x/", "client_id": "c",
                "client_secret_file": "/s"}}}),
                "http or https",
            ),
            (
                json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "hosts": h, "path": "/t", "pth": 1}}}),
                "unknown field",
            ),
            (json!({"creds": {}}), "not a credentials document"),
            (
                json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "hosts": h, "path": "/t",
                    "client_cert_file": "/c"}}}),
                "go together",
            ),
            (
                json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "hosts": h, "path": "/t",
                    "ca_file": "/nonexistent/ca.crt"}}}),
                "\"ca_file\" /nonexistent/ca.crt could not be read",
            ),
            (
                json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "path": "/t"}}}),
                "missing field `hosts`",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &[])}}),
                "\"hosts\" names",
            ),
            (
                json!({"credentials": {"x": bearer(&["a b"], &h)}}),
                "tenants[0] is not a tenant name",
            ),
            (
                json!({"credentials": {"x": bearer(&["*", ""], &h)}}),
                "tenants[1]",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["h", " api.example.com"])}}),
                "hosts[1]",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["api.example.com/v1"])}}),
                "hosts[0] is a host",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["ftp://api.example.com/"])}}),
                "hosts[0]",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["https://u:p@api.example.com/"])}}),
                "no credentials",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["https://api.example.com/?q"])}}),
                "query",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["api.example.com:99999"])}}),
                "hosts[0]",
            ),
            (
                json!({"credentials": {"x": bearer(&["a"], &["api.example.com:"])}}),
                "hosts[0]",
            ),
        ] {
            let err = load(doc.clone())
                .await
                .err()
                .unwrap_or_else(|| panic!("{doc} was taken"));
            assert!(err.contains(says), "{doc}: {err}");
            assert!(err.starts_with("--credentials-file"), "{err}");
        }
    }

    #[tokio::test]
    async fn an_operator_source_is_for_the_tenants_it_lists_and_its_hook_id_is_its_own() {
        let dir =
            std::env::temp_dir().join(format!("waitd-opsrc-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("s");
        std::fs::write(&secret, "a-github-secret-0123456789\n").unwrap();
        let entry = |tenants: &[&str], hook_id: &str| {
            json!({"kind": "github", "secret_file": secret, "key": "/id",
                   "tenants": tenants, "hook_id": hook_id})
        };
        let c = load(json!({"credentials": {}, "sources": {
            "mine": entry(&["a"], "hook-of-mine-0123456789ab"),
            "all": entry(&["*"], "hook-of-all-0123456789abc"),
        }}))
        .await
        .unwrap();
        assert!(c.source_for("a", "mine").is_some());
        assert!(c.source_for("b", "mine").is_none());
        assert!(c.source_for("b", "all").is_some());
        assert!(c.source_for("", "all").is_none(), "never the anonymous");
        assert_eq!(c.sources()["all"].secret, "a-github-secret-0123456789");
        assert!(!format!("{:?}", c.sources()["all"]).contains("a-github-secret"));
        let twice = load(json!({"credentials": {}, "sources": {
            "one": entry(&["a"], "the-same-hook-0123456789ab"),
            "two": entry(&["a"], "the-same-hook-0123456789ab"),
        }}))
        .await
        .unwrap_err();
        assert!(twice.contains("source \"two\": \"hook_id\""), "{twice}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_credential_is_only_for_the_tenants_it_lists_and_never_anonymous() {
        let c = load(json!({"credentials": {
            "mine": bearer(&["a"], &["api.example.com"]),
            "all": bearer(&["*"], &["api.example.com"]),
        }}))
        .await
        .unwrap();
        let url = url::Url::parse("https://api.example.com/x").unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.for_target("a", "mine", &url).is_ok());
        let other = c.for_target("b", "mine", &url).unwrap_err().to_string();
        let absent = c.for_target("b", "nope", &url).unwrap_err().to_string();
        assert_eq!(
            other.replace("mine", "nope"),
            absent,
            "the same answer either way"
        );
        assert!(c.for_target("b", "all", &url).is_ok());
        assert!(matches!(
            c.for_target("", "all", &url),
            Err(Refused::NotTheTenants(_))
        ));
    }

    #[tokio::test]
    async fn a_credential_goes_only_to_the_hosts_and_prefixes_it_lists() {
        let c = load(json!({"credentials": {
            "host": bearer(&["a"], &["api.example.com"]),
            "port": bearer(&["a"], &["api.example.com:8443", "[::1]:9000"]),
            "tls-port": bearer(&["a"], &["api.example.com:443"]),
            "prefix": bearer(&["a"], &["https://api.example.com/v1/"]),
            "exact": bearer(&["a"], &["https://api.example.com/v2"]),
        }}))
        .await
        .unwrap();
        let may = |name: &str, url: &str| {
            c.for_target("a", name, &url::Url::parse(url).unwrap())
                .map(|_| ())
                .map_err(|e| {
                    assert!(matches!(e, Refused::NotForTheTarget(_)), "{e:?}");
                    let text = e.to_string();
                    assert!(!text.contains("example"), "names its hosts: {text}");
                    assert!(!text.contains("/t"), "names its file: {text}");
                })
                .is_ok()
        };
        assert!(may("host", "https://api.example.com/anything?q=1"));
        assert!(may("host", "http://API.example.com:8080/"));
        assert!(!may("host", "https://api.example.com.evil.test/"));
        assert!(!may("host", "https://evil.test/api.example.com"));
        assert!(!may("host", "https://sub.api.example.com/"));
        assert!(may("port", "https://api.example.com:8443/"));
        assert!(may("port", "http://[::1]:9000/"));
        assert!(!may("port", "https://api.example.com/"));
        assert!(may("tls-port", "https://api.example.com/"));
        assert!(!may("tls-port", "http://api.example.com/"));
        assert!(may("prefix", "https://api.example.com/v1/servers/1"));
        assert!(!may("prefix", "https://api.example.com/v1"));
        assert!(!may("prefix", "https://api.example.com/v10/"));
        assert!(!may("prefix", "http://api.example.com/v1/servers"));
        assert!(!may("prefix", "https://api.example.com:444/v1/servers"));
        assert!(!may("prefix", "https://api.example.com/v1/../admin"));
        assert!(!may("prefix", "https://api.example.com/v1/%2e%2e/admin"));
        assert!(may("exact", "https://api.example.com/v2"));
        assert!(may("exact", "https://api.example.com/v2/x"));
        assert!(!may("exact", "https://api.example.com/v2x"));
    }
}
