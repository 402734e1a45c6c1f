//! The clients of the requests with TLS settings of their own: one
//! [`Client::with_tls`] per distinct setting, shared by everyone who holds it and
//! gone when no one does.
//!
//! A setting's client is built once (parsing its authorities, loading its key,
//! building the verifier is CPU work), then every holder of the same setting
//! sends through it, and so through one connection pool. A connection made under
//! one setting is never used under another: each setting has its own pool.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

use super::client::{Client, TlsError};

/// TLS settings of one's own, as [`Client::with_tls`] takes them.
pub struct TlsSettings {
    /// The authorities trusted instead of the platform's roots; none: the
    /// platform's verifier.
    pub roots: Vec<CertificateDer<'static>>,
    /// The client certificate chain and its key, presented when a server asks.
    pub identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl std::fmt::Debug for TlsSettings {
    // Never print the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("roots", &self.roots.len())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// A digest of [`TlsSettings`]: equal settings have equal digests, and different
/// ones (in practice) never do.
pub type TlsDigest = [u8; 32];

impl TlsSettings {
    /// The SHA-256 of every certificate and the key, each length-prefixed under
    /// its role, so that no two different settings share one.
    pub fn digest(&self) -> TlsDigest {
        let mut h = Sha256::new();
        let mut put = |tag: u8, bytes: &[u8]| {
            h.update([tag]);
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        for root in &self.roots {
            put(b'r', root);
        }
        if let Some((chain, key)) = &self.identity {
            for cert in chain {
                put(b'c', cert);
            }
            put(b'k', key.secret_der());
        }
        h.finalize().into()
    }
}

/// The client of one setting, held by every holder of it; when the last lets go
/// it leaves the registry.
pub struct TlsClient {
    client: Client,
    digest: TlsDigest,
    registry: Weak<Mutex<HashMap<TlsDigest, Weak<TlsClient>>>>,
}

impl TlsClient {
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The digest of its settings.
    pub fn digest(&self) -> &TlsDigest {
        &self.digest
    }
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").finish_non_exhaustive()
    }
}

impl Drop for TlsClient {
    fn drop(&mut self) {
        if let Some(registry) = self.registry.upgrade() {
            let mut clients = registry.lock().unwrap_or_else(|p| p.into_inner());
            if clients
                .get(&self.digest)
                .is_some_and(|w| w.strong_count() == 0)
            {
                clients.remove(&self.digest);
            }
        }
    }
}

/// The clients of the settings held now, by digest; each made from the same base
/// client (its guard, resolver and settings).
pub struct TlsClients {
    base: Client,
    clients: Arc<Mutex<HashMap<TlsDigest, Weak<TlsClient>>>>,
}

impl TlsClients {
    pub fn new(base: Client) -> TlsClients {
        TlsClients {
            base,
            clients: Arc::default(),
        }
    }

    /// The client of `settings`: the one held already, or a new one. The error
    /// says why rustls cannot take the settings.
    pub fn client(&self, settings: &TlsSettings) -> Result<Arc<TlsClient>, TlsError> {
        let digest = settings.digest();
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(found) = clients.get(&digest).and_then(Weak::upgrade) {
            return Ok(found);
        }
        // Built under the lock, so that a setting is built once however many
        // waits of it are taken up together.
        let client = Arc::new(TlsClient {
            client: self.base.with_tls(settings)?,
            digest,
            registry: Arc::downgrade(&self.clients),
        });
        clients.insert(digest, Arc::downgrade(&client));
        Ok(client)
    }

    /// How many settings have a client now.
    pub fn held(&self) -> usize {
        self.clients.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}
