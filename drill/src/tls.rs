//! rustls mTLS configs for a simulated proxy, built once per applied state.
//!
//! The server side requires a client certificate that chains to the proxy's bundle (rustls' stock
//! client verifier does that well) and checks the client's SPIFFE ID after the handshake. The client
//! side needs its own verifier, since SVIDs carry only a URI SAN and rustls' stock server verifier
//! wants a DNS name. Like Envoy's SPIFFE validator, it picks the anchors of the trust domain of the ID
//! the server presents, checks the chain for serverAuth and then the URI SAN: against one pinned ID,
//! or against the IDs of a `meshservice:` context the client applied.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, Resumption};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// ring, the one crypto provider of meshca.
static PROVIDER: LazyLock<Arc<CryptoProvider>> =
    LazyLock::new(|| Arc::new(rustls::crypto::ring::default_provider()));

/// Bundle key of CAs that vouch for any trust domain (a plain `trusted_ca` validation context).
pub const ANY_TRUST_DOMAIN: &str = "*";

/// Why an applied state cannot be turned into TLS configs (a proxy would NACK it).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    /// The validation context holds no CA at all.
    #[error("the trust bundle holds no CA certificate")]
    EmptyBundle,
    /// A bundle certificate is not a usable trust anchor.
    #[error("trust domain {domain:?}: a bundle certificate is not a usable CA: {reason}")]
    BadAnchor {
        /// The trust domain whose bundle holds it.
        domain: String,
        /// What rustls/webpki said.
        reason: String,
    },
    /// A client was asked to check a server with a validation context it has not applied.
    #[error("no {name} context applied")]
    NoContext {
        /// The context's resource name.
        name: String,
    },
    /// The certificate chain and key do not make a usable identity.
    #[error("the identity secret is unusable: {reason}")]
    BadIdentity {
        /// What is wrong.
        reason: String,
    },
}

/// Why a certificate carries no SPIFFE ID the drill can read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpiffeIdError {
    #[error("the certificate does not decode: {0}")]
    Decode(x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error("the subjectAltName extension does not decode: {0}")]
    SubjectAltName(x509_parser::error::X509Error),
    #[error("the certificate has no subjectAltName extension")]
    NoSubjectAltName,
    #[error("the URI SAN {0:?} is not a SPIFFE ID")]
    NotSpiffe(String),
    #[error("the certificate has no URI SAN")]
    NoUri,
    #[error("the certificate has {0} URI SANs, a SVID has exactly one")]
    SeveralUris(usize),
}

/// The peer's certificate does not carry the SPIFFE ID expected of it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerIdError {
    #[error("the peer presents {presented}, expected {expected}")]
    Unexpected { presented: String, expected: String },
    #[error("{reason} (expected {expected})")]
    Unreadable {
        reason: SpiffeIdError,
        expected: String,
    },
}

/// The SPIFFE ID of a certificate: its one URI SAN, which must be a `spiffe://` URI.
pub fn spiffe_id(der: &[u8]) -> Result<String, SpiffeIdError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(SpiffeIdError::Decode)?;
    let san = cert
        .subject_alternative_name()
        .map_err(SpiffeIdError::SubjectAltName)?
        .ok_or(SpiffeIdError::NoSubjectAltName)?;
    let uris: Vec<&str> = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect();
    match uris.as_slice() {
        [uri] if uri.starts_with("spiffe://") => Ok((*uri).to_owned()),
        [uri] => Err(SpiffeIdError::NotSpiffe((*uri).to_owned())),
        [] => Err(SpiffeIdError::NoUri),
        many => Err(SpiffeIdError::SeveralUris(many.len())),
    }
}

/// Whether `ca` issued `cert`: the certificate's issuer name is the CA's subject name (meshca gives
/// every CA a subject of its own). Undecodable input is never issued by anything.
pub fn issued_by(cert: &[u8], ca: &[u8]) -> bool {
    match (
        X509Certificate::from_der(cert),
        X509Certificate::from_der(ca),
    ) {
        (Ok((_, cert)), Ok((_, ca))) => cert.issuer().as_raw() == ca.subject().as_raw(),
        _ => false,
    }
}

/// The trust domain of a SPIFFE ID (`spiffe://<td>/...`).
pub fn trust_domain(id: &str) -> Option<&str> {
    id.strip_prefix("spiffe://")?.split('/').next()
}

/// Trust domain → CA certificates, as a validation context carries them (the SPIFFE validator's form;
/// a plain `trusted_ca` context is filed under [`ANY_TRUST_DOMAIN`]).
pub type Bundle = BTreeMap<String, Vec<CertificateDer<'static>>>;

/// A validation context with SAN matchers as a proxy applied it (`meshservice:<name>`,
/// `system_trust_bundle_egress`): the SPIFFE IDs a server may present, and the CAs that vouch for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceContext {
    /// The SAN matchers: exactly these IDs are accepted.
    pub ids: BTreeSet<String>,
    /// The CAs, per trust domain.
    pub bundle: Bundle,
}

/// How a client checks the server it connects to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PeerCheck {
    /// Chains to the proxy's mesh bundle and carries exactly this SPIFFE ID (a pinned outbound).
    Exact(String),
    /// Passes the validation context the client applied under this resource name (`meshservice:<name>`,
    /// `system_trust_bundle_egress`): chains to its CAs and carries one of its IDs (how clients validate
    /// servers while their identities change).
    Context(String),
}

impl fmt::Display for PeerCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerCheck::Exact(id) => f.write_str(id),
            PeerCheck::Context(name) => f.write_str(name),
        }
    }
}

/// What a client accepts from a server: IDs, and the anchors per trust domain.
#[derive(Clone, Debug)]
struct Acceptance {
    ids: BTreeSet<String>,
    anchors: BTreeMap<String, Arc<RootCertStore>>,
}

/// The rustls side of one applied state: a server config, and client configs per peer check.
#[derive(Debug)]
pub struct Endpoint {
    server: Arc<ServerConfig>,
    identity: Arc<FixedIdentity>,
    anchors: BTreeMap<String, Arc<RootCertStore>>,
    services: BTreeMap<String, Acceptance>,
    /// One client config per peer check, made on first use (a drill has a handful of services). Only
    /// held while looking up or inserting, never across an await.
    clients: Mutex<HashMap<PeerCheck, Arc<ClientConfig>>>,
}

/// One root store per trust domain of `bundle`, and one of every CA.
fn stores(
    bundle: &Bundle,
) -> Result<(BTreeMap<String, Arc<RootCertStore>>, RootCertStore), TlsSetupError> {
    let mut all = RootCertStore::empty();
    let mut anchors = BTreeMap::new();
    for (domain, certs) in bundle {
        let mut store = RootCertStore::empty();
        for cert in certs {
            let bad_anchor = |e: rustls::Error| TlsSetupError::BadAnchor {
                domain: domain.clone(),
                reason: e.to_string(),
            };
            store.add(cert.clone()).map_err(bad_anchor)?;
            all.add(cert.clone()).map_err(bad_anchor)?;
        }
        anchors.insert(domain.clone(), Arc::new(store));
    }
    Ok((anchors, all))
}

impl Endpoint {
    /// Builds the configs from a chain (leaf first), its key, the bundle and the contexts with SAN
    /// matchers applied (by resource name).
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        bundle: &Bundle,
        services: &BTreeMap<String, ServiceContext>,
    ) -> Result<Endpoint, TlsSetupError> {
        let bad_identity = |reason: String| TlsSetupError::BadIdentity { reason };
        if chain.is_empty() {
            return Err(bad_identity("the certificate chain is empty".into()));
        }
        let certified = CertifiedKey::from_der(chain, key, &PROVIDER)
            .map_err(|e| bad_identity(e.to_string()))?;
        let identity = Arc::new(FixedIdentity(Arc::new(certified)));

        let (anchors, all) = stores(bundle)?;
        if all.is_empty() {
            return Err(TlsSetupError::EmptyBundle);
        }
        let services = services
            .iter()
            .map(|(name, context)| {
                let (anchors, _) = stores(&context.bundle)?;
                let ids = context.ids.clone();
                Ok((name.clone(), Acceptance { ids, anchors }))
            })
            .collect::<Result<_, TlsSetupError>>()?;
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(all), PROVIDER.clone())
            .build()
            .map_err(|e| TlsSetupError::BadAnchor {
                domain: "*".into(),
                reason: e.to_string(),
            })?;
        let mut server = ServerConfig::builder_with_provider(PROVIDER.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| bad_identity(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(identity.clone());
        // Every handshake must verify certificates: resumption would skip exactly what is drilled.
        server.session_storage = Arc::new(NoServerSessionStorage {});
        server.send_tls13_tickets = 0;
        Ok(Endpoint {
            server: Arc::new(server),
            identity,
            anchors,
            services,
            clients: Mutex::new(HashMap::new()),
        })
    }

    /// The server config (client certificate required).
    pub fn server(&self) -> Arc<ServerConfig> {
        self.server.clone()
    }

    /// A client config that accepts only a server that passes `check`.
    pub fn client_for(&self, check: &PeerCheck) -> Result<Arc<ClientConfig>, TlsSetupError> {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(config) = clients.get(check) {
            return Ok(config.clone());
        }
        let acceptance = match check {
            PeerCheck::Exact(id) => Acceptance {
                ids: BTreeSet::from([id.clone()]),
                anchors: self.anchors.clone(),
            },
            PeerCheck::Context(name) => self
                .services
                .get(name)
                .cloned()
                .ok_or_else(|| TlsSetupError::NoContext { name: name.clone() })?,
        };
        let verifier = Arc::new(SpiffeServerVerifier {
            check: check.clone(),
            acceptance,
        });
        let mut config = ClientConfig::builder_with_provider(PROVIDER.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError::BadIdentity {
                reason: e.to_string(),
            })?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(self.identity.clone());
        config.resumption = Resumption::disabled();
        let config = Arc::new(config);
        clients.insert(check.clone(), config.clone());
        Ok(config)
    }
}

/// Presents the same certificate and key on both sides of every connection.
#[derive(Debug)]
struct FixedIdentity(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for FixedIdentity {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for FixedIdentity {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Checks that a peer's leaf certificate carries one of the SPIFFE IDs `accepted`; `what` names them
/// in the error (an ID, or the context they come from).
pub fn check_peer_id(
    leaf: &[u8],
    accepted: &BTreeSet<String>,
    what: &dyn fmt::Display,
) -> Result<(), PeerIdError> {
    match spiffe_id(leaf) {
        Ok(presented) if accepted.contains(&presented) => Ok(()),
        Ok(presented) => Err(PeerIdError::Unexpected {
            presented,
            expected: what.to_string(),
        }),
        Err(reason) => Err(PeerIdError::Unreadable {
            reason,
            expected: what.to_string(),
        }),
    }
}

/// Checks a server's SVID as Envoy's SPIFFE validator does: the anchors of the trust domain of the
/// presented SPIFFE ID, the chain for serverAuth, then the URI SAN among the accepted IDs. The TLS server
/// name is not used.
#[derive(Debug)]
struct SpiffeServerVerifier {
    check: PeerCheck,
    acceptance: Acceptance,
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let anchors = &self.acceptance.anchors;
        let presented = spiffe_id(end_entity).ok();
        let roots = presented
            .as_deref()
            .and_then(trust_domain)
            .and_then(|domain| anchors.get(domain))
            .or_else(|| anchors.get(ANY_TRUST_DOMAIN))
            .cloned()
            .unwrap_or_else(|| Arc::new(RootCertStore::empty()));
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &roots,
            intermediates,
            now,
            PROVIDER.signature_verification_algorithms.all,
        )?;
        check_peer_id(end_entity, &self.acceptance.ids, &self.check)
            .map_err(|reason| rustls::Error::Other(rustls::OtherError(Arc::new(reason))))?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &PROVIDER.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &PROVIDER.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        PROVIDER
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Which end of a connection refused it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The client (it rejected the server's certificate, or could not start).
    Client,
    /// The server (it rejected the client's certificate or its SPIFFE ID).
    Server,
}

/// A handshake that did not complete: who refused and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandshakeFailure {
    /// The side that detected the problem.
    pub side: Side,
    /// What it said, e.g. `invalid peer certificate: UnknownIssuer`.
    pub reason: String,
}

/// Size of the in-memory pipe: a whole handshake flight fits, so neither side blocks on the other.
const PIPE_BYTES: usize = 64 * 1024;

/// What a server accepts from a client: a certificate its mesh bundle vouches for, carrying one of
/// these SPIFFE IDs (what the client may legitimately present, before and after a migration).
#[derive(Clone, Debug)]
pub struct ClientIds(pub BTreeSet<String>);

impl fmt::Display for ClientIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.0.iter().map(String::as_str).collect();
        match ids.as_slice() {
            [one] => f.write_str(one),
            many => write!(f, "one of {}", many.join(", ")),
        }
    }
}

/// One real mutual-TLS handshake over an in-memory pipe: `client` checks the server with
/// `server_check`, `server` accepts `client_ids` from the client. Both ends run to completion; the
/// failure reported is the one detected locally (not the alert the other end merely received).
pub async fn handshake(
    client: &Endpoint,
    server: &Endpoint,
    server_check: &PeerCheck,
    client_ids: &ClientIds,
) -> Result<(), HandshakeFailure> {
    let client_config = client
        .client_for(server_check)
        .map_err(|e| HandshakeFailure {
            side: Side::Client,
            reason: e.to_string(),
        })?;
    let connector = tokio_rustls::TlsConnector::from(client_config);
    let acceptor = tokio_rustls::TlsAcceptor::from(server.server());
    let (client_io, server_io) = tokio::io::duplex(PIPE_BYTES);
    // The name is not checked (the verifier matches SPIFFE IDs); any valid DNS name will do.
    let name = ServerName::try_from("peer.drill.invalid")
        .expect("a constant, syntactically valid DNS name");
    let (client_end, server_end) = tokio::join!(connector.connect(name, client_io), async {
        let tls = acceptor.accept(server_io).await?;
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .ok_or_else(|| std::io::Error::other("the client presented no certificate"))?;
        check_peer_id(leaf, &client_ids.0, client_ids).map_err(std::io::Error::other)?;
        Ok::<_, std::io::Error>(tls)
    });
    let failure = |side, error: &std::io::Error| HandshakeFailure {
        side,
        reason: error.to_string(),
    };
    match (client_end, server_end) {
        (Ok(_), Ok(_)) => Ok(()),
        (Err(c), Ok(_)) => Err(failure(Side::Client, &c)),
        (Ok(_), Err(s)) => Err(failure(Side::Server, &s)),
        (Err(c), Err(s)) if received_alert(&c) => Err(failure(Side::Server, &s)),
        (Err(c), Err(_)) => Err(failure(Side::Client, &c)),
    }
}

fn received_alert(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .is_some_and(|e| matches!(e, rustls::Error::AlertReceived(_)))
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
