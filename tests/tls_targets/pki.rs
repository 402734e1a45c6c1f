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

/// A client certificate `ca` signed for the key `pkcs8` (PEM).
pub fn client_cert_for(ca: &CertifiedIssuer<'static, KeyPair>, pkcs8: &str) -> String {
    let mut params = CertificateParams::new(vec!["waitd-client".to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::from_pem(pkcs8).unwrap();
    params.signed_by(&key, ca).unwrap().pem()
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

/// Keys in the forms rcgen does not write, made for the tests with `openssl`
/// (`ecparam -genkey -noout`, `genrsa -traditional 2048`), and each as PKCS#8
/// (`pkcs8 -topk8 -nocrypt`), which rcgen signs a certificate for.
pub const EC_SEC1: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIE/Oo0A0+4v61GNlzBckgR6tX25PgzvRMW0OBD6WKevPoAoGCCqGSM49
AwEHoUQDQgAEzobthH5IfaYS+o8aC7+rbQL22njaBt/JWu0ERrIp33/0RuUYbbZP
Yr+wOtXox51L+dBO4q/PW85a4NmGUik4tA==
-----END EC PRIVATE KEY-----
";
pub const EC_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgT86jQDT7i/rUY2XM
FySBHq1fbk+DO9ExbQ4EPpYp68+hRANCAATOhu2Efkh9phL6jxoLv6ttAvbaeNoG
38la7QRGsinff/RG5Rhttk9iv7A61ejHnUv50E7ir89bzlrg2YZSKTi0
-----END PRIVATE KEY-----
";
pub const RSA_PKCS1: &str = "-----BEGIN RSA PRIVATE KEY-----
MIIEowIBAAKCAQEA12JVmCVsp+sn162IL42D8uGSaOhNuLwxbY2HoKl/HlkxaXPY
7eJ0hNAuS0mRi6EgI96LSWWBL/MQ8pNSlWlMc71umoiTTUK82WBxfipDwszjRwwV
5UIzkJxmnQ2BwMHUNy/wY4ASplYUDUXZyylJRzyINHutSfW2GrAqG1Qs6UmX7gCd
7xcHpiXlNqE95WE14KGFpEmaQoflU7TFEHA4Eb9God/V8Cl1oDW3rWIXZe3R2jo7
g0PQ03utp15DbGgj0NB75ldhg3oPPhqcPDWEaRP6TzqSykbbb2gkhul8zMwQsImC
Rp0OpVHrur6RKJNM1UKmih62DylAK2b3Z3ReAwIDAQABAoIBAAO3i7ibdLuVIFPl
h8MiUxOe9vLeh3DXtpaoaZ3JLwtsCKFEQYshbFdabGIaO+vH9REJZyf2G3ujWziE
eFlhvtMEguMh1kDwFOg/dNXzjsXO2WFBgSM6uD8Xo+Gz+PhFoA7vwdtFu4ypUaFF
AlQyOzSCg+s78yqilejx/1gHZNsFxPnyGU3Wamma7OQbMqOBg6Yy5HbRqI/kEJQQ
SvD8+VR+LBZg0+7DRKEga4uLKamA0rFSNmoyPT/rau+cH+tPIlSAqBNiku86Hay2
UHxX4DCDGN0/w/O8k+3HQW08TUyIujOTtT68Th6CUr1tWqXvWUxhvPHBubbkqN0l
4wl9FYkCgYEA/+v0/TL3WyPq/+sGLQ6VJhC0rqI8CdfxMkJcdsRVyXrIuEyilpGt
V94AK6yKeqVtCfbkm6T8b67kMPBZ/3KDKxmAozo5OPVD0YQcLdLrE3789AuKtvU0
6DEF98Mu49rM//0BHBBVQZxUNdAMy+04buzEFzT4XfDAKC2Zn1TamOcCgYEA13Mz
3IFWKs5u1+8CVp8Urzn1vmbAERWQ7z9SpWC4WeLnCG+9vjeB6Zvx8Wpi/xARX4JA
okP8z1awpP+pJ1uqM+AOwOV2lpsaMjjAXfchIAUv1m0xSNGOEJaeHFs3pahtW1PO
1XmblStLvpMTiS8iACXTl9JlKZPM9+S735IB4oUCgYEA2X8d0UXMRI/M+zwxHn/D
L/uIotXL8o2sNYuCa4lGYxnPlhnDH/WkfQV13aggdEU82vgRp1lbFEttMU5DHj6i
zTE6Sv6DfS2sOlZtYGBdWk9VCM76T60rDp4DNWKS6iCckn3hwIj8++qxAp7TEUiE
6nib2iExZxzhIgRHB8skkEcCgYA3HGTbtsnP0VZRLfYvKiokWHMf7TCcLiQQzuXZ
H9CITZ5DbjHfAlvc4eMVmd0Q2Y9YGv1lhHaaotY0nqEqTCxRcLLVbNzU0X/18MZk
Qt7aTflapDvDILdyTtTK9Bpb6aVvgxSZTq4ZjiWl7gFFSiUsXICviUYPSJtZnczg
93w78QKBgDZ9bjqFZw8kY0t9LbiClnEmZa2ZovamgIVpSUJZpL3D9Hsvw8FXVFTv
oCdTD5g5y8HxMm7ct6NBrTWV7XIRMsidfyR6QBfRsLwTtaWr9vdXkgIC71cB0S9e
ulJp0biO+g8Ee/BbFCbTgZ4lJNTtk3Irwx5nL9mVfP/PdlgG92tG
-----END RSA PRIVATE KEY-----
";
pub const RSA_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDXYlWYJWyn6yfX
rYgvjYPy4ZJo6E24vDFtjYegqX8eWTFpc9jt4nSE0C5LSZGLoSAj3otJZYEv8xDy
k1KVaUxzvW6aiJNNQrzZYHF+KkPCzONHDBXlQjOQnGadDYHAwdQ3L/BjgBKmVhQN
RdnLKUlHPIg0e61J9bYasCobVCzpSZfuAJ3vFwemJeU2oT3lYTXgoYWkSZpCh+VT
tMUQcDgRv0ah39XwKXWgNbetYhdl7dHaOjuDQ9DTe62nXkNsaCPQ0HvmV2GDeg8+
Gpw8NYRpE/pPOpLKRttvaCSG6XzMzBCwiYJGnQ6lUeu6vpEok0zVQqaKHrYPKUAr
ZvdndF4DAgMBAAECggEAA7eLuJt0u5UgU+WHwyJTE5728t6HcNe2lqhpnckvC2wI
oURBiyFsV1psYho768f1EQlnJ/Ybe6NbOIR4WWG+0wSC4yHWQPAU6D901fOOxc7Z
YUGBIzq4Pxej4bP4+EWgDu/B20W7jKlRoUUCVDI7NIKD6zvzKqKV6PH/WAdk2wXE
+fIZTdZqaZrs5Bsyo4GDpjLkdtGoj+QQlBBK8Pz5VH4sFmDT7sNEoSBri4spqYDS
sVI2ajI9P+tq75wf608iVICoE2KS7zodrLZQfFfgMIMY3T/D87yT7cdBbTxNTIi6
M5O1PrxOHoJSvW1ape9ZTGG88cG5tuSo3SXjCX0ViQKBgQD/6/T9MvdbI+r/6wYt
DpUmELSuojwJ1/EyQlx2xFXJesi4TKKWka1X3gArrIp6pW0J9uSbpPxvruQw8Fn/
coMrGYCjOjk49UPRhBwt0usTfvz0C4q29TToMQX3wy7j2sz//QEcEFVBnFQ10AzL
7Thu7MQXNPhd8MAoLZmfVNqY5wKBgQDXczPcgVYqzm7X7wJWnxSvOfW+ZsARFZDv
P1KlYLhZ4ucIb72+N4Hpm/HxamL/EBFfgkCiQ/zPVrCk/6knW6oz4A7A5XaWmxoy
OMBd9yEgBS/WbTFI0Y4Qlp4cWzelqG1bU87VeZuVK0u+kxOJLyIAJdOX0mUpk8z3
5LvfkgHihQKBgQDZfx3RRcxEj8z7PDEef8Mv+4ii1cvyjaw1i4JriUZjGc+WGcMf
9aR9BXXdqCB0RTza+BGnWVsUS20xTkMePqLNMTpK/oN9Law6Vm1gYF1aT1UIzvpP
rSsOngM1YpLqIJySfeHAiPz76rECntMRSITqeJvaITFnHOEiBEcHyySQRwKBgDcc
ZNu2yc/RVlEt9i8qKiRYcx/tMJwuJBDO5dkf0IhNnkNuMd8CW9zh4xWZ3RDZj1ga
/WWEdpqi1jSeoSpMLFFwstVs3NTRf/XwxmRC3tpN+VqkO8Mgt3JO1Mr0GlvppW+D
FJlOrhmOJaXuAUVKJSxcgK+JRg9Im1mdzOD3fDvxAoGANn1uOoVnDyRjS30tuIKW
cSZlrZmi9qaAhWlJQlmkvcP0ey/DwVdUVO+gJ1MPmDnLwfEybty3o0GtNZXtchEy
yJ1/JHpAF9GwvBO1pav291eSAgLvVwHRL166UmnRuI76DwR78FsUJtOBniUk1O2T
civDHmcv2ZV8/892WAb3a0Y=
-----END PRIVATE KEY-----
";
