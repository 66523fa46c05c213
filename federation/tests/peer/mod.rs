//! A bundle endpoint written against the SPIFFE Federation standard alone (rustls, rcgen, a
//! hand-written HTTP/1.1 answer and a bundle built as JSON), never with meshca's code; shared by the
//! federation tests.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use meshca_federation::{SpiffeBundle, X509Authority};
use meshca_identity::TrustDomain;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const ENDPOINT_ID: &str = "spiffe://peer.example/spire/server";

pub struct Ca(pub CertifiedIssuer<'static, KeyPair>);

impl Ca {
    pub fn new(trust_domain: &str) -> Ca {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.subject_alt_names = vec![SanType::URI(
            format!("spiffe://{trust_domain}")
                .try_into()
                .expect("a URI"),
        )];
        let key = KeyPair::generate().expect("a P-256 key");
        Ca(CertifiedIssuer::self_signed(params, key).expect("a CA"))
    }

    pub fn der(&self) -> Vec<u8> {
        self.0.der().to_vec()
    }

    /// The CA as a SPIFFE bundle's x509-svid JWK, built from the standard.
    pub fn jwk(&self) -> serde_json::Value {
        let point = self.0.key().public_key_raw();
        serde_json::json!({
            "use": "x509-svid",
            "kty": "EC",
            "crv": "P-256",
            "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
            "x5c": [STANDARD.encode(self.der())],
        })
    }

    /// A server SVID for `id`.
    pub fn svid(&self, id: &str) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.subject_alt_names = vec![SanType::URI(id.try_into().expect("a URI"))];
        let key = KeyPair::generate().expect("a P-256 key");
        let cert = params.signed_by(&key, &self.0).expect("a leaf");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (vec![cert.der().clone()], key)
    }
}

pub fn td() -> TrustDomain {
    TrustDomain::parse("peer.example").expect("a trust domain")
}

/// The bundle the fetching side holds for the peer: its CA.
pub fn held(ca: &Ca) -> SpiffeBundle {
    let authority = X509Authority::from_der(ca.der(), &td()).expect("a CA of peer.example");
    SpiffeBundle::new(td(), vec![authority], Vec::new())
}

/// What an endpoint answers: an HTTP status line's code and reason, and a body.
#[derive(Clone)]
pub struct Answer {
    pub status: &'static str,
    pub body: Vec<u8>,
}

/// A bundle endpoint: what it answers can be changed, and it counts the requests it answered.
#[derive(Clone)]
pub struct Endpoint {
    pub addr: std::net::SocketAddr,
    answer: Arc<Mutex<Answer>>,
    served: Arc<AtomicU64>,
}

impl Endpoint {
    /// Starts an endpoint that answers every connection's one request with `status` and `body`, over
    /// TLS with `svid`.
    pub async fn start(
        svid: (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>),
        status: &'static str,
        body: Vec<u8>,
    ) -> Endpoint {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(svid.0, svid.1)
            .expect("a server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port");
        let endpoint = Endpoint {
            addr: listener.local_addr().expect("an address"),
            answer: Arc::new(Mutex::new(Answer { status, body })),
            served: Arc::new(AtomicU64::new(0)),
        };
        let (answer, served) = (endpoint.answer.clone(), endpoint.served.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, answer, served) = (acceptor.clone(), answer.clone(), served.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    assert!(request.starts_with(b"GET / HTTP/1.1\r\n"), "one GET of /");
                    let Answer { status, body } = answer.lock().expect("not poisoned").clone();
                    let head = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(head.as_bytes()).await;
                    let _ = tls.write_all(&body).await;
                    let _ = tls.shutdown().await;
                    served.fetch_add(1, Ordering::AcqRel);
                });
            }
        });
        endpoint
    }

    /// Answers `status` and `body` from now on.
    pub fn answer(&self, status: &'static str, body: Vec<u8>) {
        *self.answer.lock().expect("not poisoned") = Answer { status, body };
    }

    /// Requests answered so far.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Acquire)
    }

    /// The endpoint's URL.
    pub fn url(&self) -> String {
        format!("https://{}/", self.addr)
    }
}

/// A SPIFFE bundle document with `keys`, `spiffe_sequence` and a refresh hint of a minute.
pub fn bundle_json(keys: &[serde_json::Value], sequence: u64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "keys": keys,
        "spiffe_sequence": sequence,
        "spiffe_refresh_hint": 60,
    }))
    .expect("JSON")
}
