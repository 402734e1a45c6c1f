//! Target header values at rest (and a target's client key, which
//! [`Target::secrets`](crate::engine::Target::secrets) puts among them): sealed with
//! AES-256-GCM under the operator's key when one is configured, so a copy of the
//! database does not hand out the credentials waitd polls with.
//!
//! A second, read-only key lets an operator rotate: new waits are sealed under the
//! current key, old ones still open under the previous one. Without a key, header
//! values are stored as they are (and still never shown on any read path).

use std::collections::BTreeMap;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng};
use aes_gcm::{Aes256Gcm, Nonce};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The sealing keys. Cloning copies the expanded keys (a few hundred bytes).
#[derive(Clone, Default)]
pub struct Cipher {
    current: Option<Key>,
    previous: Option<Key>,
}

#[derive(Clone)]
struct Key {
    id: String,
    aead: Aes256Gcm,
}

impl std::fmt::Debug for Cipher {
    // Never print key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cipher")
            .field("current", &self.current.as_ref().map(|k| &k.id))
            .field("previous", &self.previous.as_ref().map(|k| &k.id))
            .finish()
    }
}

sentence_error! {
    /// Why values cannot be sealed, or their stored form opened.
    pub struct SecretError;
}

impl Key {
    fn parse(text: &str, name: &str) -> Result<Key, crate::config::SettingError> {
        let bytes = hex_decode(text.trim())
            .filter(|b| b.len() == 32)
            .ok_or_else(|| format!("{name} must be 32 bytes written as 64 hex digits (e.g. from `openssl rand -hex 32`)"))?;
        let aead = Aes256Gcm::new_from_slice(&bytes)
            .map_err(|_| format!("{name} is not a valid AES-256 key"))?;
        // The key's id: a short digest, so a stored value says which key sealed it
        // without revealing anything about the key.
        let id = hex_encode(&Sha256::digest(&bytes)[..4]);
        Ok(Key { id, aead })
    }
}

impl Cipher {
    /// `current` seals and opens; `previous` only opens (for rotation).
    pub fn new(
        current: Option<&str>,
        previous: Option<&str>,
    ) -> Result<Cipher, crate::config::SettingError> {
        let current = current
            .map(|k| Key::parse(k, "WAITD_SECRET_KEY"))
            .transpose()?;
        let previous = previous
            .map(|k| Key::parse(k, "WAITD_SECRET_KEY_PREVIOUS"))
            .transpose()?;
        if current.is_none() && previous.is_some() {
            return Err(crate::config::SettingError("WAITD_SECRET_KEY_PREVIOUS needs WAITD_SECRET_KEY: the previous key only reads old values".into()));
        }
        Ok(Cipher { current, previous })
    }

    pub fn is_enabled(&self) -> bool {
        self.current.is_some()
    }

    /// The stored form of the headers.
    pub fn seal(&self, headers: &BTreeMap<String, String>) -> Result<Value, SecretError> {
        let Some(key) = &self.current else {
            return serde_json::to_value(headers).map_err(|e| e.to_string().into());
        };
        if headers.is_empty() {
            return Ok(json!({}));
        }
        let plain = serde_json::to_vec(headers).map_err(|e| e.to_string())?;
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let sealed = key
            .aead
            .encrypt(&nonce, plain.as_slice())
            .map_err(|_| "sealing the header values failed".to_string())?;
        Ok(
            json!({ "sealed": "aes-256-gcm", "key": key.id, "nonce": hex_encode(&nonce), "data": hex_encode(&sealed) }),
        )
    }

    /// The headers from their stored form.
    pub fn open(&self, stored: &Value) -> Result<BTreeMap<String, String>, SecretError> {
        if stored.get("sealed").is_none() {
            return serde_json::from_value(stored.clone())
                .map_err(|e| format!("stored headers: {e}").into());
        }
        let kid = stored["key"].as_str().unwrap_or_default();
        let key = [&self.current, &self.previous]
            .into_iter()
            .flatten()
            .find(|k| k.id == kid)
            .ok_or_else(|| {
                format!("the target headers are sealed with key {kid}, which is neither WAITD_SECRET_KEY nor WAITD_SECRET_KEY_PREVIOUS")
            })?;
        let nonce = stored["nonce"]
            .as_str()
            .and_then(hex_decode)
            .and_then(|n| <[u8; 12]>::try_from(n).ok())
            .ok_or("the sealed headers have no valid nonce")?;
        let data = stored["data"]
            .as_str()
            .and_then(hex_decode)
            .ok_or("the sealed headers are damaged")?;
        let plain = key
            .aead
            .decrypt(&Nonce::from(nonce), data.as_slice())
            .map_err(|_| {
                "the sealed headers do not open with their key (damaged or tampered with)"
                    .to_string()
            })?;
        serde_json::from_slice(&plain).map_err(|e| format!("sealed headers: {e}").into())
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    hex::decode(s).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn headers() -> BTreeMap<String, String> {
        BTreeMap::from([(
            "Authorization".to_string(),
            "Bearer very-secret".to_string(),
        )])
    }

    #[test]
    fn sealed_headers_do_not_contain_the_secret_and_open_again() {
        let c = Cipher::new(Some(K1), None).unwrap();
        let stored = c.seal(&headers()).unwrap();
        assert!(!stored.to_string().contains("very-secret"));
        assert_eq!(c.open(&stored).unwrap(), headers());
    }

    #[test]
    fn without_a_key_headers_are_stored_as_they_are() {
        let c = Cipher::default();
        let stored = c.seal(&headers()).unwrap();
        assert_eq!(c.open(&stored).unwrap(), headers());
    }

    #[test]
    fn a_rotated_key_still_opens_old_values_through_the_previous_key() {
        let old = Cipher::new(Some(K1), None)
            .unwrap()
            .seal(&headers())
            .unwrap();
        let rotated = Cipher::new(Some(K2), Some(K1)).unwrap();
        assert_eq!(rotated.open(&old).unwrap(), headers());
        let new = rotated.seal(&headers()).unwrap();
        assert_ne!(new["key"], old["key"]);
        let err = Cipher::new(Some(K2), None).unwrap().open(&old).unwrap_err();
        assert!(err.contains("neither"), "{err}");
    }

    #[test]
    fn a_tampered_value_does_not_open() {
        let c = Cipher::new(Some(K1), None).unwrap();
        let mut stored = c.seal(&headers()).unwrap();
        let data = stored["data"].as_str().unwrap().to_string();
        let flipped = format!(
            "{}{}",
            if data.starts_with('0') { "1" } else { "0" },
            &data[1..]
        );
        stored["data"] = json!(flipped);
        assert!(c.open(&stored).is_err());
    }

    #[test]
    fn a_malformed_key_is_refused_with_advice() {
        let err = Cipher::new(Some("short"), None).unwrap_err();
        assert!(err.0.contains("64 hex digits"), "{err}");
        assert!(Cipher::new(None, Some(K1)).is_err());
    }
}
