//! Credentials the operator holds (`--credentials-file`): each named, each for
//! the tenants it lists. A wait names one (`"auth": {"credential": "NAME"}`) and
//! never a file: only the operator can.
//!
//! ```json
//! { "credentials": {
//!     "in-cluster": { "kind": "bearer_file", "tenants": ["platform"],
//!                     "path": "/var/run/secrets/kubernetes.io/serviceaccount/token" },
//!     "arm": { "kind": "oauth2", "tenants": ["*"],
//!              "token_url": "https://login.microsoftonline.com/<tenant>/oauth2/v2.0/token",
//!              "client_id": "<app-id>",
//!              "client_assertion_file": "/var/run/secrets/azure/tokens/azure-identity-token",
//!              "scope": "https://management.azure.com/.default" } } }
//! ```
//!
//! - `bearer_file`: the token in `path`, read again whenever the file changes
//!   (its modification time or length), as the kubelet rotates a service
//!   account's token.
//! - `oauth2`: tokens minted as for `target.auth.oauth2` ([`super::token`]),
//!   proving the client with `client_secret_file` or with a signed assertion from
//!   `client_assertion_file` (`client_assertion_type` defaults to the JWT bearer
//!   type, as Azure workload identity needs), each read at every mint. One
//!   credential, one token, whichever tenant's wait asks.
//! - Either kind may add `ca_file` (the authorities its waits' targets are
//!   trusted by, instead of the platform's) and `client_cert_file` with
//!   `client_key_file` (a client certificate), read at start-up.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use http::HeaderValue;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::TlsSettings;
use super::token::{Credential, MAX_TOKEN, Secret, TokenError, read_small};
use crate::config::SettingError;
use crate::engine::spec::tls::Tls;
use crate::engine::spec::{ClientAuth, OAuth2, is_credential_name};

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
    /// `None`: every tenant.
    tenants: Option<Vec<String>>,
    bearer: Bearer,
    tls: Option<Arc<TlsSettings>>,
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

/// A token read from a file, and read again when the file changes.
pub struct FileBearer {
    path: PathBuf,
    key: [u8; 32],
    /// The file's modification time and length when it was read, and its token.
    read: Mutex<Option<(Option<SystemTime>, u64, HeaderValue)>>,
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
    /// modification time or length changed since it was read.
    pub fn value(&self) -> Result<HeaderValue, TokenError> {
        let meta = std::fs::metadata(&self.path).map_err(|e| {
            TokenError::Transient(format!(
                "the credential's token file could not be read ({e})"
            ))
        })?;
        let stamp = (meta.modified().ok(), meta.len());
        let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, len, value)) = &*read
            && (*at, *len) == stamp
        {
            return Ok(value.clone());
        }
        let token = read_small(&self.path, "credential's token file")?;
        if token.len() > MAX_TOKEN || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Refused(format!(
                "the credential's token file does not hold one token of at most {} printable characters",
                MAX_TOKEN
            )));
        }
        let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            TokenError::Refused("the credential's token cannot be a header value".into())
        })?;
        value.set_sensitive(true);
        *read = Some((stamp.0, stamp.1, value.clone()));
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

/// The largest credentials file read.
const MAX_DOCUMENT: u64 = 1024 * 1024;

impl Credentials {
    /// Reads `--credentials-file`; none: no credentials. Every mistake is a
    /// sentence naming the credential and the field.
    pub fn load(path: Option<&Path>) -> Result<Credentials, SettingError> {
        let Some(path) = path else {
            return Ok(Credentials::default());
        };
        let fail =
            |why: String| SettingError(format!("--credentials-file {}: {why}", path.display()));
        let text = {
            use std::io::Read;
            let mut buf = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(MAX_DOCUMENT + 1).read_to_string(&mut buf))
                .map_err(|e| fail(format!("cannot be read ({e})")))?;
            if buf.len() as u64 > MAX_DOCUMENT {
                return Err(fail("is larger than 1 MiB".into()));
            }
            buf
        };
        let doc: Document = serde_json::from_str(&text)
            .map_err(|e| fail(format!("is not a credentials document ({e}); write {{\"credentials\": {{\"NAME\": {{\"kind\": \"bearer_file\" or \"oauth2\", \"tenants\": [...], ...}}}}}}")))?;
        let mut by_name = HashMap::new();
        for (name, entry) in doc.credentials {
            let held = Held::of(&name, entry)
                .map_err(|why| fail(format!("credential \"{name}\": {why}")))?;
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

    /// The credential `name`, if `tenant` may use it; otherwise a sentence that
    /// names it (the same whether it is absent or another's, so a tenant learns
    /// nothing of others' credentials).
    pub fn for_tenant(&self, tenant: &str, name: &str) -> Result<Granted, String> {
        self.by_name
            .get(name)
            .filter(|h| {
                h.tenants
                    .as_ref()
                    .is_none_or(|t| t.iter().any(|t| t == tenant))
            })
            .map(|h| Granted {
                bearer: h.bearer.clone(),
                tls: h.tls.clone(),
            })
            .ok_or_else(|| {
                format!(
                    "the credential \"{name}\" is not one this tenant may use: the operator names each credential and its tenants in --credentials-file"
                )
            })
    }
}

impl Held {
    fn of(name: &str, e: Entry) -> Result<Held, String> {
        if !is_credential_name(name) {
            return Err("a name is 1 to 64 of letters, digits, '_', '.' and '-'".into());
        }
        if e.tenants.is_empty() {
            return Err(
                "\"tenants\" lists no tenant; name them, or [\"*\"] for every tenant".into(),
            );
        }
        let tenants = (!e.tenants.iter().any(|t| t == "*")).then_some(e.tenants);
        let tls = tls_of(e.ca_file, e.client_cert_file, e.client_key_file)?;
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
                    return Err("a bearer_file credential has only \"path\" and \"tenants\"".into());
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
                ));
            }
        };
        Ok(Held {
            tenants,
            bearer,
            tls,
        })
    }
}

/// The TLS settings of a credential's files, read and checked at start-up as a
/// wait's `target.tls` is at creation.
fn tls_of(
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
    let read = |p: &Option<PathBuf>, field: &str| -> Result<Option<String>, String> {
        p.as_ref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map_err(|e| format!("\"{field}\" {} cannot be read ({e})", p.display()))
            })
            .transpose()
    };
    let tls = Tls {
        ca: read(&ca, "ca_file")?,
        client_cert: read(&cert, "client_cert_file")?,
        client_key: read(&key, "client_key_file")?,
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

    fn load(doc: serde_json::Value) -> Result<Credentials, String> {
        let dir =
            std::env::temp_dir().join(format!("waitd-creds-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.json");
        std::fs::write(&path, doc.to_string()).unwrap();
        let out = Credentials::load(Some(&path)).map_err(|e| e.0);
        let _ = std::fs::remove_dir_all(&dir);
        out
    }

    #[test]
    fn each_mistake_in_the_file_is_a_sentence_naming_the_credential() {
        let url = "https://login.example.com/token";
        for (doc, says) in [
            (
                serde_json::json!({"credentials": {"x": {"kind": "magic", "tenants": ["a"]}}}),
                "\"magic\"",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "bearer_file", "tenants": []}}}),
                "lists no tenant",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"]}}}),
                "\"path\" is required",
            ),
            (
                serde_json::json!({"credentials": {"bad name": {"kind": "bearer_file", "tenants": ["a"], "path": "/t"}}}),
                "a name is",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "oauth2", "tenants": ["a"], "token_url": url, "client_id": "c"}}}),
                "exactly one of",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "oauth2", "tenants": ["a"], "token_url": url, "client_id": "c",
                "client_secret_file": "/s", "client_assertion_file": "/a"}}}),
                "exactly one of",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "oauth2", "tenants": ["a"], "token_url": "ftp://x/", "client_id": "c",
                "client_secret_file": "/s"}}}),
                "http or https",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "path": "/t", "pth": 1}}}),
                "unknown field",
            ),
            (
                serde_json::json!({"creds": {}}),
                "not a credentials document",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "path": "/t",
                    "client_cert_file": "/c"}}}),
                "go together",
            ),
            (
                serde_json::json!({"credentials": {"x": {"kind": "bearer_file", "tenants": ["a"], "path": "/t",
                    "ca_file": "/nonexistent/ca.crt"}}}),
                "\"ca_file\" /nonexistent/ca.crt cannot be read",
            ),
        ] {
            let err = load(doc.clone())
                .err()
                .unwrap_or_else(|| panic!("{doc} was taken"));
            assert!(err.contains(says), "{doc}: {err}");
            assert!(err.starts_with("--credentials-file"), "{err}");
        }
    }

    #[test]
    fn a_credential_is_only_for_the_tenants_it_lists() {
        let c = load(serde_json::json!({"credentials": {
            "mine": {"kind": "bearer_file", "tenants": ["a"], "path": "/t"},
            "all": {"kind": "bearer_file", "tenants": ["*"], "path": "/t"}
        }}))
        .unwrap();
        assert_eq!(c.len(), 2);
        assert!(c.for_tenant("a", "mine").is_ok());
        let other = c.for_tenant("b", "mine").unwrap_err();
        let absent = c.for_tenant("b", "nope").unwrap_err();
        assert_eq!(
            other.replace("mine", "nope"),
            absent,
            "the same answer either way"
        );
        assert!(c.for_tenant("b", "all").is_ok());
        assert!(c.for_tenant("", "all").is_ok());
    }
}
