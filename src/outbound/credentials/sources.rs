//! The operator's event sources in the credentials file (docs/design.md §2.18):
//! each entry read and checked as a tenant's create is (the same kinds, secrets,
//! keys and lookbacks), its secret read from a file, with every mistake a
//! sentence naming the field.
//!
//! ```json
//! { "credentials": {},
//!   "sources": {
//!     "github": { "kind": "github", "secret_file": "/run/secrets/github-webhook",
//!                 "key": "/workflow_run/head_sha", "lookback": "10m",
//!                 "tenants": ["*"], "hook_id": "k3J9-q0VwZtq7YbM2xR1sA8e" } } }
//! ```

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::document::{EntryError, MAX_DOCUMENT, tenants_of};
use crate::engine::spec::{SOURCE_NAME_RULE, is_source_name};
use crate::sources::{
    DEFAULT_LOOKBACK, KeyFrom, Kind, MAX_HOOK_ID, MIN_HOOK_ID, check_secret, is_hook_id,
};

/// One entry of the file's `sources`, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceEntry {
    kind: Option<String>,
    secret_file: Option<PathBuf>,
    key: Option<String>,
    lookback: Option<String>,
    tenants: Option<Vec<String>>,
    hook_id: Option<String>,
}

/// An event source the operator declares: the tenants it lists may name it in
/// `on_event.source`; its events arrive at `/hooks/{hook_id}`.
pub struct OperatorSource {
    /// `None`: every tenant with a token.
    pub tenants: Option<Vec<String>>,
    pub hook_id: String,
    pub kind: Kind,
    pub key_from: String,
    pub lookback: Duration,
    pub secret: String,
}

impl std::fmt::Debug for OperatorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorSource")
            .field("tenants", &self.tenants)
            .field("kind", &self.kind)
            .field("key_from", &self.key_from)
            .field("lookback", &self.lookback)
            .finish_non_exhaustive()
    }
}

impl OperatorSource {
    /// Whether `tenant` may name it; the anonymous tenant (`""`) never may.
    pub fn is_for(&self, tenant: &str) -> bool {
        !tenant.is_empty()
            && self
                .tenants
                .as_ref()
                .is_none_or(|t| t.iter().any(|t| t == tenant))
    }

    /// Reads and checks one entry, its secret read from its `secret_file`.
    pub(super) async fn of(name: &str, e: serde_json::Value) -> Result<OperatorSource, EntryError> {
        let e: SourceEntry = serde_json::from_value(e).map_err(|err| err.to_string())?;
        if !is_source_name(name) {
            return Err(format!("a source's name is {SOURCE_NAME_RULE}").into());
        }
        let kinds = Kind::ALL.map(Kind::as_str).join("\", \"");
        let kind = match e.kind.as_deref() {
            Some(k) => Kind::parse(k).ok_or_else(|| {
                format!(
                    "\"kind\" is \"{}\"; it is one of \"{kinds}\"",
                    k.escape_debug()
                )
            })?,
            None => {
                return Err(format!(
                    "\"kind\" is required: one of \"{kinds}\", how its events are signed"
                )
                .into());
            }
        };
        let key_from = e.key.ok_or(
            "\"key\" is required: a JSON Pointer such as \"/workflow_run/id\" or a CEL expression such as \"body.workflow_run.head_sha\"",
        )?;
        KeyFrom::parse(&key_from).map_err(|why| format!("\"key\" {why}"))?;
        let lookback = match e.lookback.as_deref() {
            None => DEFAULT_LOOKBACK,
            Some(t) => crate::sources::lookback(t).map_err(|why| format!("\"lookback\" {why}"))?,
        };
        let tenants = tenants_of(e.tenants.ok_or(
            "\"tenants\" is required: the tenants whose waits may name it, or [\"*\"] for every tenant",
        )?)?;
        let hook_id = e.hook_id.ok_or_else(|| {
            format!("\"hook_id\" is required: {MIN_HOOK_ID} to {MAX_HOOK_ID} random characters of A-Z a-z 0-9 _ -, the path of /hooks/{{hook_id}} configured at the sender")
        })?;
        if !is_hook_id(&hook_id) {
            return Err(format!(
                "\"hook_id\" must be {MIN_HOOK_ID} to {MAX_HOOK_ID} characters of A-Z a-z 0-9 _ -, chosen at random (e.g. `openssl rand -base64 24 | tr '+/' '-_'`): it is all that stands between a stranger and the hook URL but the signature"
            )
            .into());
        }
        let path = e.secret_file.ok_or(
            "\"secret_file\" is required: the file that holds the secret its events are signed with",
        )?;
        let secret = crate::files::read_text(&path, MAX_DOCUMENT)
            .await
            .map_err(|err| format!("\"secret_file\" {} {err}", path.display()))?
            .trim()
            .to_string();
        check_secret(kind, &secret)
            .map_err(|why| format!("the secret in \"secret_file\" {}", why))?;
        Ok(OperatorSource {
            tenants,
            hook_id,
            kind,
            key_from,
            lookback,
            secret,
        })
    }
}
