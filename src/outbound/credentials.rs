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

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::TlsSettings;
use super::token::{Credential, MAX_TOKEN, Secret, TokenError, read_small};
use crate::config::SettingError;
use crate::engine::spec::tls::Tls;
use crate::engine::spec::{ClientAuth, OAuth2, is_credential_name};
use crate::files::Stamp;

/// The `client_assertion_type` of a JWT bearer assertion (RFC 7523 §2.2).
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// The operator's credentials, by name.
#[derive(Default)]
pub struct Credentials {
    by_name: HashMap<String, Held>,
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

/// One entry of a credential's `hosts`.
#[derive(Debug)]
enum Place {
    /// A host, on the port given or any.
    Host { host: String, port: Option<u16> },
    /// A URL prefix: that scheme, host and port, and a path under its path.
    Prefix {
        scheme: String,
        host: String,
        port: Option<u16>,
        path: String,
    },
}

sentence_error! {
    /// Why one credential of the file is refused; the sentence follows its name.
    struct EntryError;
}

impl Place {
    /// Reads one entry of `hosts`.
    fn parse(entry: &str) -> Result<Place, EntryError> {
        let shape = "is a host (api.example.com), a host and port (api.example.com:8443) or a URL prefix (https://api.example.com/v1/)";
        if entry.is_empty() || entry.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!("{shape}, with no whitespace").into());
        }
        if entry.contains("://") {
            let url = url::Url::parse(entry).map_err(|e| format!("{shape} ({e})"))?;
            if !matches!(url.scheme(), "http" | "https")
                || url.host_str().is_none_or(str::is_empty)
                || !url.username().is_empty()
                || url.password().is_some()
                || url.query().is_some()
                || url.fragment().is_some()
            {
                return Err(format!(
                    "{shape}: an http or https URL with a host, and no credentials, query or fragment"
                ).into());
            }
            return Ok(Place::Prefix {
                scheme: url.scheme().to_string(),
                host: url.host_str().unwrap_or_default().to_string(),
                port: url.port_or_known_default(),
                path: url.path().to_string(),
            });
        }
        if entry.contains(['/', '@', '?', '#', '\\']) {
            return Err(shape.into());
        }
        // The port as given (a URL forgets its scheme's own).
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) if !entry.ends_with(']') => (
                host,
                Some(port.parse::<u16>().map_err(|_| shape.to_string())?),
            ),
            _ => (entry, None),
        };
        let url =
            url::Url::parse(&format!("https://{host}/")).map_err(|e| format!("{shape} ({e})"))?;
        let host = url.host_str().unwrap_or_default();
        if host.is_empty() || url.port().is_some() {
            return Err(shape.into());
        }
        Ok(Place::Host {
            host: host.to_string(),
            port,
        })
    }

    /// Whether a request to `url` may carry the credential.
    fn admits(&self, url: &url::Url) -> bool {
        let host = url.host_str().unwrap_or_default();
        match self {
            Place::Host { host: h, port } => {
                h.eq_ignore_ascii_case(host)
                    && port.is_none_or(|p| Some(p) == url.port_or_known_default())
            }
            Place::Prefix {
                scheme,
                host: h,
                port,
                path,
            } => {
                scheme == url.scheme()
                    && h.eq_ignore_ascii_case(host)
                    && *port == url.port_or_known_default()
                    && match url.path().strip_prefix(path.as_str()) {
                        Some(rest) => {
                            path.ends_with('/') || rest.is_empty() || rest.starts_with('/')
                        }
                        None => false,
                    }
            }
        }
    }
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

/// Where a request's `Authorization: Bearer` comes from.
#[derive(Clone, Debug)]
pub enum Bearer {
    /// Minted at a token endpoint.
    Minted(Arc<Credential>),
    /// Read from a file.
    File(Arc<FileBearer>),
}

impl Bearer {
    /// Names the credential without revealing it: requests with the same one
    /// send the same token.
    pub fn key(&self) -> [u8; 32] {
        match self {
            Bearer::Minted(c) => *c.key(),
            Bearer::File(f) => f.key,
        }
    }
}

/// How long a token read from a file is sent before the file is looked at again.
pub const LOOK_EVERY: Duration = Duration::from_secs(1);

/// A token read from a file, and read again when the file changes.
pub struct FileBearer {
    path: PathBuf,
    key: [u8; 32],
    /// The token, the file's stamp when it was read, and when the file was
    /// last looked at.
    read: Mutex<Option<(HeaderValue, Stamp, tokio::time::Instant)>>,
}

impl std::fmt::Debug for FileBearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBearer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl FileBearer {
    /// The `Authorization` value: the file's token, read again when the file's
    /// modification time or length changed since it was read. The file is
    /// looked at at most once every [`LOOK_EVERY`], off the runtime's threads.
    pub async fn value(&self) -> Result<HeaderValue, TokenError> {
        let now = tokio::time::Instant::now();
        let known = {
            let read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            match &*read {
                Some((value, _, looked)) if now.duration_since(*looked) < LOOK_EVERY => {
                    return Ok(value.clone());
                }
                Some((_, stamp, _)) => Some(*stamp),
                None => None,
            }
        };
        let what = "the credential's token file";
        let stamp = crate::files::stamp(&self.path)
            .await
            .map_err(|e| TokenError::Transient(format!("{what} {e}")))?;
        if known == Some(stamp) {
            let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((value, s, looked)) = &mut *read
                && *s == stamp
            {
                *looked = now;
                return Ok(value.clone());
            }
        }
        let token = read_small(&self.path, "credential's token file").await?;
        if token.len() > MAX_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Refused(format!(
                "{what} does not hold one token of at most {} printable characters",
                MAX_TOKEN
            )));
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            TokenError::Refused("the credential's token cannot be a header value".into())
        })?;
        value.set_sensitive(true);
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = Some((value.clone(), stamp, now));
        Ok(value)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    credentials: BTreeMap<String, Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    kind: String,
    tenants: Vec<String>,
    hosts: Vec<String>,
    path: Option<PathBuf>,
    token_url: Option<String>,
    client_id: Option<String>,
    client_secret_file: Option<PathBuf>,
    client_assertion_file: Option<PathBuf>,
    client_assertion_type: Option<String>,
    scope: Option<String>,
    audience: Option<String>,
    #[serde(default)]
    params: BTreeMap<String, String>,
    #[serde(default)]
    client_auth: ClientAuth,
    ca_file: Option<PathBuf>,
    client_cert_file: Option<PathBuf>,
    client_key_file: Option<PathBuf>,
}

/// The largest credentials file read, and the largest file it names for TLS.
const MAX_DOCUMENT: usize = 1024 * 1024;

/// The most entries of a credential's `hosts`.
const MAX_HOSTS: usize = 64;

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
        Ok(Credentials { by_name })
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

impl Held {
    async fn of(name: &str, e: Entry) -> Result<Held, EntryError> {
        if !is_credential_name(name) {
            return Err("a name is 1 to 64 of letters, digits, '_', '.' and '-'".into());
        }
        if e.tenants.is_empty() {
            return Err(
                "\"tenants\" lists no tenant; name them, or [\"*\"] for every tenant".into(),
            );
        }
        if let Some(i) = e
            .tenants
            .iter()
            .position(|t| t != "*" && !crate::tokens::is_tenant_name(t))
        {
            return Err(format!(
                "tenants[{i}] is not a tenant name (1 to {} of letters, digits, '.', '_' and '-') nor \"*\"",
                crate::tokens::MAX_TENANT
            ).into());
        }
        let tenants = (!e.tenants.iter().any(|t| t == "*")).then_some(e.tenants);
        if e.hosts.is_empty() || e.hosts.len() > MAX_HOSTS {
            return Err(format!(
                "\"hosts\" names the hosts (or URL prefixes) its token may be sent to: 1 to {MAX_HOSTS} of them"
            ).into());
        }
        let hosts = e
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| Place::parse(h).map_err(|why| format!("hosts[{i}] {why}")))
            .collect::<Result<Vec<_>, _>>()?;
        let tls = tls_of(e.ca_file, e.client_cert_file, e.client_key_file).await?;
        let key: [u8; 32] = Sha256::digest(format!("\0operator\0{name}")).into();
        let oauth_fields = e.token_url.is_some()
            || e.client_id.is_some()
            || e.client_secret_file.is_some()
            || e.client_assertion_file.is_some()
            || e.client_assertion_type.is_some()
            || e.scope.is_some()
            || e.audience.is_some()
            || !e.params.is_empty();
        let bearer = match e.kind.as_str() {
            "bearer_file" => {
                let path = e
                    .path
                    .ok_or("\"path\" is required: the file that holds the token")?;
                if oauth_fields {
                    return Err(
                        "a bearer_file credential has only \"path\", \"tenants\", \"hosts\" and the TLS files"
                            .into(),
                    );
                }
                Bearer::File(Arc::new(FileBearer {
                    path,
                    key,
                    read: Mutex::new(None),
                }))
            }
            "oauth2" => {
                if e.path.is_some() {
                    return Err("\"path\" belongs to a bearer_file credential; an oauth2 one reads client_secret_file or client_assertion_file".into());
                }
                let token_url = e.token_url.ok_or("\"token_url\" is required")?;
                let url = url::Url::parse(&token_url)
                    .map_err(|err| format!("\"token_url\" is not a valid URL ({err})"))?;
                if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
                    return Err("\"token_url\" must be an http or https URL with a host".into());
                }
                let client_id = e.client_id.ok_or("\"client_id\" is required")?;
                let secret = match (e.client_secret_file, e.client_assertion_file) {
                    (Some(path), None) => {
                        if e.client_assertion_type.is_some() {
                            return Err(
                                "\"client_assertion_type\" goes with client_assertion_file".into(),
                            );
                        }
                        Secret::File(path)
                    }
                    (None, Some(path)) => Secret::Assertion {
                        path,
                        kind: e.client_assertion_type.unwrap_or_else(|| JWT_BEARER.into()),
                    },
                    _ => {
                        return Err(
                            "give exactly one of \"client_secret_file\" and \"client_assertion_file\""
                                .into(),
                        );
                    }
                };
                let spec = OAuth2 {
                    token_url,
                    client_id,
                    client_secret: String::new(),
                    scope: e.scope,
                    audience: e.audience,
                    params: e.params,
                    client_auth: e.client_auth,
                };
                Bearer::Minted(Arc::new(
                    Credential::new(key, &spec, secret).map_err(|err| err.to_string())?,
                ))
            }
            other => {
                return Err(format!(
                    "\"kind\" is \"{}\"; it is \"bearer_file\" or \"oauth2\"",
                    other.escape_debug()
                )
                .into());
            }
        };
        Ok(Held {
            tenants,
            hosts,
            bearer,
            tls,
        })
    }
}

/// The TLS settings of a credential's files, read and checked at start-up as a
/// wait's `target.tls` is at creation.
async fn tls_of(
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<Arc<TlsSettings>>, String> {
    if ca.is_none() && cert.is_none() && key.is_none() {
        return Ok(None);
    }
    if cert.is_some() != key.is_some() {
        return Err("\"client_cert_file\" and \"client_key_file\" go together".into());
    }
    async fn read(p: &Option<PathBuf>, field: &str) -> Result<Option<String>, String> {
        match p {
            None => Ok(None),
            Some(p) => crate::files::read_text(p, MAX_DOCUMENT)
                .await
                .map(Some)
                .map_err(|e| format!("\"{field}\" {} {e}", p.display())),
        }
    }
    let tls = Tls {
        ca: read(&ca, "ca_file").await?,
        client_cert: read(&cert, "client_cert_file").await?,
        client_key: read(&key, "client_key_file").await?,
        server_name: None,
    };
    // The sentences name the spec's fields; here they are the files.
    let named = |why: String| {
        why.replace("target.tls.ca", "ca_file")
            .replace("target.tls.client_cert", "client_cert_file")
            .replace("target.tls.client_key", "client_key_file")
    };
    Ok(Some(Arc::new(TlsSettings {
        roots: tls.roots().map_err(named)?,
        identity: tls.identity().map_err(named)?,
    })))
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
