//! Where a request's `Authorization: Bearer` comes from: a token minted at a
//! token endpoint ([`crate::outbound::token`]), or one read from a file and read
//! again when the file changes, as the kubelet rotates a service account's token.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::HeaderValue;

use crate::files::Stamp;
use crate::outbound::token::{Credential, MAX_TOKEN, TokenError, read_small};

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
    pub(super) path: PathBuf,
    pub(super) key: [u8; 32],
    /// The token, the file's stamp when it was read, and when the file was
    /// last looked at.
    pub(super) read: Mutex<Option<(HeaderValue, Stamp, tokio::time::Instant)>>,
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
