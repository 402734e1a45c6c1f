//! The other side of `tls_targets`: authorities and certificates made for a test
//! (rcgen, on ring), and rustls servers on 127.0.0.1 that present them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::json;
use tokio::sync::watch;

/// An authority made for the test.
pub fn authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A certificate `ca` signed for `names`, for a server or a client; its PEM and
/// its key's (PKCS#8) PEM.
pub fn issue(
    ca: &CertifiedIssuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

pub fn server_cert(ca: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    issue(
        ca,
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    )
}

pub fn client_cert(ca: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    issue(ca, &["waitd-client"], ExtendedKeyUsagePurpose::ClientAuth)
}

/// A TLS target on 127.0.0.1 answering every request with the Latitude-shaped
/// status it is set to; it counts the requests it served and the handshakes
/// that failed.
pub struct TlsTarget {
    addr: SocketAddr,
    status: Arc<Mutex<String>>,
    served: watch::Receiver<usize>,
    refused: watch::Receiver<usize>,
}

impl TlsTarget {
    /// With the server certificate `cert`/`key`; with `clients`, it requires a
    /// client certificate that chains to that authority (PEM).
    pub async fn start(cert: &str, key: &str, clients: Option<&str>) -> TlsTarget {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let chain = vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
        let builder = rustls::ServerConfig::builder();
        let builder = match clients {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots
                    .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
                    .unwrap();
                let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(chain, key).unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let status = Arc::new(Mutex::new("deploying".to_string()));
        let (served_tx, served) = watch::channel(0usize);
        let (refused_tx, refused) = watch::channel(0usize);
        let (served_tx, refused_tx) = (Arc::new(served_tx), Arc::new(refused_tx));
        let answer = status.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, answer) = (acceptor.clone(), answer.clone());
                let (served_tx, refused_tx) = (served_tx.clone(), refused_tx.clone());
                tokio::spawn(async move {
                    let tls = match acceptor.accept(tcp).await {
                        Ok(tls) => tls,
                        Err(_) => {
                            refused_tx.send_modify(|n| *n += 1);
                            return;
                        }
                    };
                    let service = hyper::service::service_fn(move |_request| {
                        let body =
                            json!({"data": {"attributes": {"status": *answer.lock().unwrap()}}});
                        served_tx.send_modify(|n| *n += 1);
                        async move {
                            Ok::<_, Infallible>(
                                http::Response::builder()
                                    .header("content-type", "application/json")
                                    .body(http_body_util::Full::new(bytes::Bytes::from(
                                        body.to_string(),
                                    )))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        TlsTarget {
            addr,
            status,
            served,
            refused,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}/", self.addr.port())
    }

    pub fn set(&self, status: &str) {
        *self.status.lock().unwrap() = status.to_string();
    }

    pub fn served(&self) -> usize {
        *self.served.borrow()
    }

    /// Whether it has served at least `n` requests within `within`.
    pub async fn served_at_least(&self, n: usize, within: Duration) -> bool {
        let mut rx = self.served.clone();
        tokio::time::timeout(within, rx.wait_for(|s| *s >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Whether at least `n` handshakes have failed within `within`.
    pub async fn refused_at_least(&self, n: usize, within: Duration) -> bool {
        let mut rx = self.refused.clone();
        tokio::time::timeout(within, rx.wait_for(|s| *s >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}
