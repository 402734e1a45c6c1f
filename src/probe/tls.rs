//! A `tls://host:port` target: one connection and TLS handshake a poll, through
//! the same guarded connect as `tcp://`, to read the chain the target serves and
//! whether it verifies (against the wait's `tls.ca`, or the platform's roots).
//! Its state is `verified` or `unverified`; conditions see it as the map `tls`.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::connection::{Conn, Probed};
use super::refusal;
use super::tcp::{Outcome, host_port, state};
use crate::engine::Observation;
use crate::engine::condition::Field;
use crate::engine::spec::tls::Tls;

/// At most this many names of the certificate are shown to conditions.
const MAX_NAMES: usize = 64;
/// At most this many bytes of one name, subject or issuer.
const MAX_NAME_LEN: usize = 512;

/// What the served certificate says, as conditions read it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Served {
    pub not_after: Option<DateTime<Utc>>,
    pub subject: String,
    pub issuer: String,
    /// The DNS names and addresses of its subject alternative names.
    pub sans: Vec<String>,
}

/// The fields of a DER certificate that a wait reads; `None` when it does not
/// parse. Names past [`MAX_NAMES`] and text past [`MAX_NAME_LEN`] are cut.
pub fn served(der: &[u8]) -> Option<Served> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let cut = |s: String| s.chars().take(MAX_NAME_LEN).collect::<String>();
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in ext.value.general_names.iter().take(MAX_NAMES) {
            match name {
                GeneralName::DNSName(d) => sans.push(cut(d.to_string())),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => sans
                        .push(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).ok()?).to_string()),
                    16 => sans
                        .push(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).ok()?).to_string()),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Some(Served {
        not_after: DateTime::from_timestamp(cert.validity().not_after.timestamp(), 0),
        subject: cut(cert.subject().to_string()),
        issuer: cut(cert.issuer().to_string()),
        sans,
    })
}

/// A verifier that lets every handshake finish, and keeps what the real one
/// said of the chain: the chain is what a wait reads, verified or not.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn ServerCertVerifier>,
    verdict: Mutex<Option<Result<(), rustls::Error>>>,
}

impl ServerCertVerifier for Recording {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self
            .inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            .map(|_| ());
        *self.verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(verdict);
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The verifier of a wait: exactly its authorities, or the platform's.
fn verifier(own: Option<&Tls>) -> Result<Arc<dyn ServerCertVerifier>, String> {
    let provider = crate::engine::spec::tls::crypto_provider();
    let roots = match own {
        Some(own) => own.roots()?,
        None => Vec::new(),
    };
    if roots.is_empty() {
        return rustls_platform_verifier::Verifier::new(provider)
            .map(|v| Arc::new(v) as Arc<dyn ServerCertVerifier>)
            .map_err(|e| e.to_string());
    }
    let mut store = rustls::RootCertStore::empty();
    for cert in roots {
        store.add(cert).map_err(|e| e.to_string())?;
    }
    rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .map(|v| v as Arc<dyn ServerCertVerifier>)
        .map_err(|e| e.to_string())
}

/// What one handshake came to.
struct Shaken {
    verdict: Result<(), rustls::Error>,
    chain: Vec<CertificateDer<'static>>,
}

impl super::Prober {
    /// One handshake with a `tls://` target, not yet judged by a wait's
    /// conditions.
    pub(super) async fn tls_probed(&self, wait: uuid::Uuid, c: &Conn<'_>) -> Probed {
        let (host, port) = host_port(c.uri);
        let _slot = self.inner.hosts.acquire(c.host.clone()).await;
        self.inner
            .shares
            .counts
            .sent
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let started = tokio::time::Instant::now();
        let deadline = started + self.inner.timeout;
        let connected = self.connect(&host, port).await;
        let transient = |error: String| {
            Probed::bare(Observation::Transient {
                error,
                retry_after: None,
            })
        };
        let stream = match connected.outcome {
            Outcome::Connected(stream) => stream,
            Outcome::Forbidden(error) => return Probed::bare(refusal(wait, &host, error)),
            Outcome::Refused => return transient(format!("{host}:{port} refused the connection")),
            Outcome::Failed(error) => return transient(error),
        };
        let shaken =
            match tokio::time::timeout_at(deadline, self.handshake(c.tls, &host, stream)).await {
                Ok(Ok(shaken)) => shaken,
                Ok(Err(error)) => return transient(error.0),
                Err(_) => {
                    return transient(format!(
                        "the TLS handshake with {host}:{port} did not finish within {}s",
                        self.inner.timeout.as_secs_f64()
                    ));
                }
            };
        let elapsed = started.elapsed();
        let leaf = shaken.chain.first().and_then(|c| served(c));
        let base = match (&shaken.verdict, &leaf) {
            (Ok(()), Some(_)) => state("verified"),
            _ => state("unverified"),
        };
        let leaf = leaf.unwrap_or_default();
        let now = Utc::now();
        let fields = vec![
            ("verified", Field::Bool(shaken.verdict.is_ok())),
            (
                "error",
                match &shaken.verdict {
                    Ok(()) => Field::Null,
                    Err(e) => Field::Text(e.to_string()),
                },
            ),
            (
                "not_after",
                leaf.not_after.map_or(Field::Null, Field::Timestamp),
            ),
            (
                "days_left",
                leaf.not_after
                    .map_or(Field::Null, |t| Field::Int((t - now).num_days())),
            ),
            ("subject", Field::Text(leaf.subject)),
            ("issuer", Field::Text(leaf.issuer)),
            ("sans", Field::List(leaf.sans)),
            ("chain", Field::Int(shaken.chain.len() as i64)),
            ("elapsed", Field::Duration(elapsed)),
        ];
        Probed {
            base,
            kind: "tls",
            fields: Some(fields),
            elapsed,
        }
    }

    /// The handshake over a connection made: the chain served, and whether it
    /// verifies for `host` (or the wait's `tls.server_name`, which is also the
    /// name asked for).
    async fn handshake(
        &self,
        own: Option<&Tls>,
        host: &str,
        stream: tokio::net::TcpStream,
    ) -> Result<Shaken, super::TargetError> {
        let unusable = |why: String| format!("the target's TLS settings cannot be used: {why}");
        let recording = Arc::new(Recording {
            inner: verifier(own).map_err(unusable)?,
            verdict: Mutex::new(None),
        });
        let config = rustls::ClientConfig::builder_with_provider(
            crate::engine::spec::tls::crypto_provider(),
        )
        .with_safe_default_protocol_versions()
        .map_err(|e| unusable(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(recording.clone())
        .with_no_client_auth();
        let asked = own
            .and_then(|t| t.server_name.clone())
            .unwrap_or_else(|| host.to_string());
        let name = ServerName::try_from(asked)
            .map_err(|_| format!("{host} is not a name a TLS server can be asked for"))?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, stream)
            .await
            .map_err(|e| format!("the TLS handshake with {host} failed: {e}"))?;
        let chain: Vec<CertificateDer<'static>> = tls
            .get_ref()
            .1
            .peer_certificates()
            .unwrap_or_default()
            .iter()
            .map(|c| c.clone().into_owned())
            .collect();
        let verdict = recording
            .verdict
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or(Err(rustls::Error::NoCertificatesPresented));
        Ok(Shaken { verdict, chain })
    }
}
