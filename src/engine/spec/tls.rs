//! A target's own TLS settings (`target.tls`): the certificate authorities its
//! certificate must chain to, and the client certificate presented when it asks
//! for one. How a request's `target.tls` is read and checked, and its certificates
//! and key as the outbound client takes them ([`Tls::roots`], [`Tls::identity`]).
//!
//! PEM is read by rustls-pki-types (through rustls's re-export); certificates and keys are checked by rustls
//! with the process's crypto provider, as the client that uses them will.

use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject, SectionKind};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ParsedCertificate;
use rustls::sign::CertifiedKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::schema;
use super::{Errors, NUL_REFUSED, REDACTED, opt, type_name};

/// The longest `ca`, `client_cert` or `client_key`, in bytes (a request's body
/// is at most 64 KiB in all).
pub const MAX_PEM_LEN: usize = 32 * 1024;

/// The most certificates in `ca`, and in `client_cert`.
pub const MAX_CERTS: usize = 16;

/// The fields of `target.tls`.
const FIELDS: &[&str] = &["ca", "client_cert", "client_key", "server_name"];

/// The target's own TLS settings. `ca` replaces the platform's roots for this
/// wait; `client_cert` and `client_key` come together.
#[derive(Clone, PartialEq, Eq, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// One or more PEM certificates (at most 16, 32 KiB in all): the target's
    /// certificate must chain to one of them. With `ca` the wait trusts exactly
    /// these authorities, not the platform's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::PemCertificates>)]
    pub ca: Option<String>,
    /// The client certificate presented when the target asks for one: PEM, the
    /// client's own certificate first, then any intermediates (at most 16, 32 KiB
    /// in all). Requires `client_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::PemCertificates>)]
    pub client_cert: Option<String>,
    /// The private key of `client_cert`: one PEM block, PKCS#8, PKCS#1 (RSA) or
    /// SEC1 (EC), not encrypted (at most 32 KiB). Write-only: every read shows
    /// `<redacted>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<schema::PemPrivateKey>)]
    pub client_key: Option<String>,
    /// The name a `tls://` target is asked for (SNI) and its chain verified
    /// for, instead of the URL's host: a DNS name of at most 253 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
}

impl std::fmt::Debug for Tls {
    // Never print the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca)
            .field("client_cert", &self.client_cert)
            .field("client_key", &self.client_key.as_ref().map(|_| REDACTED))
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// A client certificate chain and its key.
pub type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

impl Tls {
    /// The certificates of `ca` (none without it).
    pub fn roots(&self) -> Result<Vec<CertificateDer<'static>>, String> {
        match &self.ca {
            None => Ok(Vec::new()),
            Some(ca) => certificates(ca).map_err(|why| format!("target.tls.ca {why}")),
        }
    }

    /// The client certificate chain and its key, when both are given.
    pub fn identity(&self) -> Result<Option<Identity>, String> {
        let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) else {
            return Ok(None);
        };
        let chain = certificates(cert).map_err(|why| format!("target.tls.client_cert {why}"))?;
        let key = private_key(key).map_err(|why| format!("target.tls.client_key {why}"))?;
        Ok(Some((chain, key)))
    }
}

/// Reads `target.tls` of a target whose (valid) URL is `url`: `None` when it is
/// absent, null or empty (the platform's verifier, no client certificate).
pub(super) fn parse_tls(v: Option<&Value>, url: Option<&str>, errs: &mut Errors) -> Option<Tls> {
    let obj = match v {
        None | Some(Value::Null) => return None,
        Some(Value::Object(o)) => o,
        Some(other) => {
            errs.push(
                "target.tls",
                format!(
                    "must be an object with ca, client_cert and client_key (PEM text), not {}",
                    type_name(other)
                ),
            );
            return None;
        }
    };
    errs.unknown(obj, "target.tls", FIELDS);
    let mut text = |name: &str| -> Option<String> {
        let field = format!("target.tls.{name}");
        match opt(obj, name)? {
            Value::String(s) if s.len() > MAX_PEM_LEN => {
                errs.push(
                    &field,
                    format!(
                        "is {} bytes long; the limit is {}",
                        s.len(),
                        crate::engine::bound::format_size(MAX_PEM_LEN)
                    ),
                );
                None
            }
            Value::String(s) if s.contains('\0') => {
                errs.push(&field, NUL_REFUSED);
                None
            }
            Value::String(s) => Some(s.clone()),
            other => {
                errs.push(
                    &field,
                    format!("must be a string of PEM text, not {}", type_name(other)),
                );
                None
            }
        }
    };
    let given = |name: &str| opt(obj, name).is_some();
    let tls = Tls {
        ca: text("ca"),
        client_cert: text("client_cert"),
        client_key: text("client_key"),
        server_name: text("server_name"),
    };
    if let Some(name) = &tls.server_name {
        let dns = rustls::pki_types::DnsName::try_from(name.as_str()).is_ok();
        if name.len() > 253 || !dns {
            errs.push(
                "target.tls.server_name",
                "must be a DNS name such as \"api.example.com\" (at most 253 bytes), the name the server is asked for",
            );
        }
        if !url.is_some_and(|u| u.starts_with("tls:")) {
            errs.push(
                "target.tls.server_name",
                "applies to tls:// targets only; an https target is asked for its URL's host",
            );
        }
    }
    if let Some(ca) = &tls.ca {
        check_ca(ca, errs);
    }
    match (given("client_cert"), given("client_key")) {
        (true, false) => errs.push(
            "target.tls.client_key",
            "is required with target.tls.client_cert: the certificate's private key, in PEM",
        ),
        (false, true) => errs.push(
            "target.tls.client_cert",
            "is required with target.tls.client_key: the certificate (PEM) the key belongs to",
        ),
        _ => {}
    }
    if let (Some(cert), Some(key)) = (&tls.client_cert, &tls.client_key) {
        check_identity(cert, key, errs);
    }
    let tls = (tls != Tls::default()).then_some(tls)?;
    if url.is_some_and(|u| u.starts_with("tls:"))
        && (tls.client_cert.is_some() || tls.client_key.is_some())
    {
        errs.push(
            "target.tls.client_cert",
            "is not presented by a tls:// target, which only reads the served chain; remove it",
        );
    }
    if url.is_some_and(|u| u.starts_with("http:") || u.starts_with("tcp:")) {
        errs.push(
            "target.tls",
            "applies to https targets only, and target.url is http://, which would send the request without TLS; write https://",
        );
    }
    Some(tls)
}

/// Every certificate of `ca` must be one rustls can take as an authority.
fn check_ca(ca: &str, errs: &mut Errors) {
    const FIELD: &str = "target.tls.ca";
    let certs = match certificates(ca) {
        Ok(certs) => certs,
        Err(why) => return errs.push(FIELD, why),
    };
    let n = certs.len();
    for (i, cert) in certs.into_iter().enumerate() {
        if rustls::RootCertStore::empty().add(cert).is_err() {
            errs.push(
                FIELD,
                format!(
                    "has a certificate (number {} of {n}) that is not a valid X.509 certificate",
                    i + 1
                ),
            );
        }
    }
}

/// The chain must parse, the key must be one the provider signs with, and the
/// key must be the first certificate's.
fn check_identity(cert: &str, key: &str, errs: &mut Errors) {
    const CERT: &str = "target.tls.client_cert";
    const KEY: &str = "target.tls.client_key";
    let chain = match certificates(cert) {
        Ok(chain) => {
            let n = chain.len();
            let bad = chain
                .iter()
                .position(|c| ParsedCertificate::try_from(c).is_err());
            match bad {
                Some(i) => {
                    errs.push(
                        CERT,
                        format!(
                            "has a certificate (number {} of {n}) that is not a valid X.509 certificate",
                            i + 1
                        ),
                    );
                    None
                }
                None => Some(chain),
            }
        }
        Err(why) => {
            errs.push(CERT, why);
            None
        }
    };
    // Never echo the key, nor a line of it.
    let key = match private_key(key) {
        Ok(key) => key,
        Err(why) => return errs.push(KEY, why),
    };
    let signer = match crypto_provider().key_provider.load_private_key(key) {
        Ok(signer) => signer,
        Err(_) => {
            return errs.push(
                KEY,
                "is not a private key waitd can sign with: write an RSA (2048 to 8192 bits), ECDSA P-256 or P-384, or Ed25519 key",
            );
        }
    };
    let Some(chain) = chain else {
        return;
    };
    if let Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) =
        CertifiedKey::new(chain, signer).keys_match()
    {
        errs.push(
            KEY,
            "does not belong to target.tls.client_cert: its public key is not that of the first certificate (the client's own, which comes before any intermediates)",
        );
    }
}

/// The certificates of a PEM text: one or more, at most [`MAX_CERTS`], and
/// nothing else. The error is a sentence for after the field's name.
fn certificates(text: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    if text.contains("PRIVATE KEY") {
        // An unknown block is skipped by the reader, and this field is shown on
        // every read: a key must not be kept here.
        return Err("holds a private key, and this field is shown on every read; a client certificate's key goes in target.tls.client_key, which is never shown back".into());
    }
    let mut certs = Vec::new();
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        match section.map_err(pem_error)? {
            (SectionKind::Certificate, der) => {
                if certs.len() == MAX_CERTS {
                    return Err(format!(
                        "holds more than {MAX_CERTS} certificates; the limit is {MAX_CERTS}"
                    ));
                }
                certs.push(CertificateDer::from(der));
            }
            (kind, _) => {
                return Err(format!(
                    "holds {}; only certificates (-----BEGIN CERTIFICATE-----) belong here",
                    section_name(kind)
                ));
            }
        }
    }
    if certs.is_empty() {
        return Err("holds no PEM certificate; write one or more blocks from -----BEGIN CERTIFICATE----- to -----END CERTIFICATE-----".into());
    }
    Ok(certs)
}

/// The one private key of a PEM text. The error is a sentence for after the
/// field's name, and never holds a part of the text.
fn private_key(text: &str) -> Result<PrivateKeyDer<'static>, String> {
    let mut found = None;
    for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(text.as_bytes()) {
        let key = match section.map_err(pem_error)? {
            (SectionKind::PrivateKey, der) => PrivateKeyDer::Pkcs8(der.into()),
            (SectionKind::RsaPrivateKey, der) => PrivateKeyDer::Pkcs1(der.into()),
            (SectionKind::EcPrivateKey, der) => PrivateKeyDer::Sec1(der.into()),
            (kind, _) => {
                return Err(format!(
                    "holds {}; only the private key belongs here (its certificate goes in target.tls.client_cert)",
                    section_name(kind)
                ));
            }
        };
        if found.replace(key).is_some() {
            return Err(
                "holds more than one private key; give only the key of target.tls.client_cert"
                    .into(),
            );
        }
    }
    match found {
        Some(key) => Ok(key),
        None if text.contains("ENCRYPTED PRIVATE KEY") => Err("holds an encrypted private key, which waitd cannot read; write it decrypted (for example with `openssl pkey -in key.pem`); it is stored sealed and never shown back".into()),
        None => Err("holds no PEM private key; write one block from -----BEGIN PRIVATE KEY----- (PKCS#8), -----BEGIN RSA PRIVATE KEY----- (PKCS#1) or -----BEGIN EC PRIVATE KEY----- (SEC1) to its END line".into()),
    }
}

/// What is wrong with the PEM, in words that quote none of it.
fn pem_error(e: pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => {
            "has a PEM block that does not end: its -----END …----- line is missing".into()
        }
        pem::Error::IllegalSectionStart { .. } => {
            "has a -----BEGIN line that is not well formed (it must end in five dashes)".into()
        }
        pem::Error::Base64Decode(_) => "has a PEM block whose body is not valid base64".into(),
        _ => "is not valid PEM text".into(),
    }
}

/// A PEM block kind, as a sentence names it.
fn section_name(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "a certificate",
        SectionKind::PublicKey => "a public key",
        SectionKind::RsaPrivateKey | SectionKind::PrivateKey | SectionKind::EcPrivateKey => {
            "a private key"
        }
        SectionKind::Crl => "a certificate revocation list",
        SectionKind::Csr => "a certificate request",
        _ => "a PEM block that is not a certificate",
    }
}

/// The process's crypto provider: ring's, installed as the process default if
/// none is. Certificates and keys are checked with it where they are given
/// (`target.tls`), as the client that uses them will.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Another part of the process may have installed a provider first; either way
    // one is installed afterwards.
    let _ = rustls::crypto::ring::default_provider().install_default();
    rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}
