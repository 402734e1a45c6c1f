//! The credentials file read: its document, and each entry checked and made a
//! credential (its tenants, its hosts, its token and its TLS files), with every
//! mistake a sentence naming the field.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Bearer, FileBearer, Held, JWT_BEARER, Place};
use crate::engine::spec::tls::Tls;
use crate::engine::spec::{ClientAuth, OAuth2, is_credential_name};
use crate::outbound::TlsSettings;
use crate::outbound::token::{Credential, Secret};

sentence_error! {
    /// Why one credential of the file is refused; the sentence follows its name.
    pub(super) struct EntryError;
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Document {
    pub credentials: BTreeMap<String, Entry>,
    /// The operator's event sources (docs/design.md §2.18).
    #[serde(default)]
    /// Each read by itself, so that a mistake in one names it.
    pub sources: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
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
pub(super) const MAX_DOCUMENT: usize = 1024 * 1024;

/// The most entries of a credential's `hosts`.
const MAX_HOSTS: usize = 64;

impl Held {
    pub(super) async fn of(name: &str, e: Entry) -> Result<Held, EntryError> {
        if !is_credential_name(name) {
            return Err("a name is 1 to 64 of letters, digits, '_', '.' and '-'".into());
        }
        let tenants = tenants_of(e.tenants)?;
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

/// An entry's `tenants`: `None` for `["*"]`, every tenant with a token.
pub(super) fn tenants_of(tenants: Vec<String>) -> Result<Option<Vec<String>>, EntryError> {
    if tenants.is_empty() {
        return Err("\"tenants\" lists no tenant; name them, or [\"*\"] for every tenant".into());
    }
    if let Some(i) = tenants
        .iter()
        .position(|t| t != "*" && !crate::tokens::is_tenant_name(t))
    {
        return Err(format!(
            "tenants[{i}] is not a tenant name (1 to {} of letters, digits, '.', '_' and '-') nor \"*\"",
            crate::tokens::MAX_TENANT
        )
        .into());
    }
    Ok((!tenants.iter().any(|t| t == "*")).then_some(tenants))
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
