//! Fetching a peer's bundle from its bundle endpoint (SPIFFE Federation): one HTTPS `GET`, the server
//! authenticated by the endpoint profile, the answer bounded in time and size and read as the peer's
//! trust domain's bundle.
//!
//! - `https_spiffe`: the server presents an X.509-SVID with the configured SPIFFE ID, chained to an X.509
//!   authority of the bundle already held for its trust domain (the initial one, then each fetched).
//! - `https_web`: the server presents a Web PKI certificate for the URL's host, chained to the
//!   configured roots.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use meshca_identity::{SpiffeId, TrustDomain};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use meshca_files::shown;

use crate::bundle::{BundleError, BundleLimits, SpiffeBundle};

/// How the bundle endpoint is authenticated.
#[derive(Clone, Debug)]
pub enum EndpointAuth {
    /// `https_spiffe`: the endpoint's SPIFFE ID, and the bundle its SVID must chain to.
    Spiffe {
        /// The SPIFFE ID the server's X.509-SVID must carry.
        id: SpiffeId,
        /// The bundle held for the endpoint's trust domain.
        bundle: SpiffeBundle,
    },
    /// `https_web`: the roots the server's Web PKI certificate must chain to.
    Web {
        /// The roots, DER.
        roots: Vec<CertificateDer<'static>>,
    },
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The URL cannot be fetched from.
    #[error("{url}: {reason}")]
    Url {
        /// The URL, as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The authentication cannot be set up (no usable root or authority).
    #[error("the endpoint cannot be authenticated: {0}")]
    Auth(String),
    /// Connecting, the TLS handshake or the HTTP exchange failed.
    #[error("{0}")]
    Transport(String),
    /// The server answered another status than 200.
    #[error("the endpoint answered HTTP {0}")]
    Status(u16),
    /// No answer within the time allowed.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer is not a bundle of the trust domain.
    #[error("the endpoint's bundle is refused: {0}")]
    Bundle(#[from] BundleError),
}

/// The system's roots, for an `https_web` endpoint given no roots of its own.
pub fn system_roots() -> Result<Vec<CertificateDer<'static>>, FetchError> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(FetchError::Auth(format!(
            "no system root certificate found ({})",
            errors.join("; ")
        )));
    }
    Ok(found.certs)
}

/// Fetches the bundle of `trust_domain` from `url`, authenticated by `auth`, within `timeout` and
/// `limits`.
pub async fn fetch(
    url: &str,
    trust_domain: &TrustDomain,
    auth: &EndpointAuth,
    timeout: Duration,
    limits: BundleLimits,
) -> Result<SpiffeBundle, FetchError> {
    let target = Target::parse(url)?;
    let config = client_config(auth)?;
    let body = tokio::time::timeout(timeout, get(&target, config, limits.max_bytes))
        .await
        .map_err(|_| FetchError::Timeout(timeout))??;
    Ok(SpiffeBundle::parse(trust_domain, &body, limits)?)
}

/// Whether `url` is one a bundle can be fetched from (an `https` URL with a host).
pub fn check_url(url: &str) -> Result<(), FetchError> {
    Target::parse(url).map(|_| ())
}

/// Where to connect, from an `https` URL.
struct Target {
    uri: hyper::Uri,
    host: String,
    port: u16,
}

impl Target {
    fn parse(url: &str) -> Result<Target, FetchError> {
        let invalid = |reason: &str| FetchError::Url {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let uri: hyper::Uri = url.parse().map_err(|_| invalid("not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(invalid("a bundle endpoint is an https URL"));
        }
        let host = uri.host().ok_or_else(|| invalid("no host"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        Ok(Target { uri, host, port })
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(auth: &EndpointAuth) -> Result<rustls::ClientConfig, FetchError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| FetchError::Auth(e.to_string()))?;
    let config = match auth {
        EndpointAuth::Web { roots } => {
            let mut store = RootCertStore::empty();
            let (added, _ignored) = store.add_parsable_certificates(roots.iter().cloned());
            if added == 0 {
                return Err(FetchError::Auth("no usable root certificate".into()));
            }
            builder.with_root_certificates(store).with_no_client_auth()
        }
        EndpointAuth::Spiffe { id, bundle } => {
            let mut store = RootCertStore::empty();
            let authorities = bundle
                .x509_authorities()
                .iter()
                .map(|a| CertificateDer::from(a.der().to_vec()));
            let (added, _ignored) = store.add_parsable_certificates(authorities);
            if added == 0 {
                return Err(FetchError::Auth(format!(
                    "the bundle held for {} has no X.509 authority to check the endpoint's SVID by",
                    bundle.trust_domain().as_str()
                )));
            }
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SpiffeIdVerifier {
                    id: id.to_string(),
                    roots: Arc::new(store),
                    provider: provider(),
                }))
                .with_no_client_auth()
        }
    };
    Ok(config)
}

async fn get(
    target: &Target,
    config: rustls::ClientConfig,
    max_bytes: usize,
) -> Result<Vec<u8>, FetchError> {
    let transport = |e: &dyn std::fmt::Display| FetchError::Transport(e.to_string());
    let tcp = tokio::net::TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| {
            FetchError::Transport(format!(
                "cannot connect to {}:{}: {e}",
                target.host, target.port
            ))
        })?;
    let name = ServerName::try_from(target.host.clone()).map_err(|e| transport(&e))?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| FetchError::Transport(format!("TLS: {e}")))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| transport(&e))?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let path = target
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, target.host.as_str())
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|e| transport(&e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| transport(&e))?;
    let status = response.status();
    if status != hyper::StatusCode::OK {
        driver.abort();
        return Err(FetchError::Status(status.as_u16()));
    }
    let body = Limited::new(response.into_body(), max_bytes)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                FetchError::Bundle(BundleError::TooLarge {
                    bytes: max_bytes + 1,
                    max: max_bytes,
                })
            } else {
                FetchError::Transport(format!("reading the answer: {e}"))
            }
        })?
        .to_bytes();
    driver.abort();
    Ok(body.to_vec())
}

/// Checks an endpoint's X.509-SVID: chained to the held bundle's authorities for server
/// authentication, and carrying exactly the configured SPIFFE ID. The TLS server name is not used: a
/// SPIFFE endpoint is named by its SPIFFE ID.
#[derive(Debug)]
struct SpiffeIdVerifier {
    id: String,
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SpiffeIdVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let ids = uri_sans(end_entity);
        match ids.as_slice() {
            [only] if *only == self.id => Ok(ServerCertVerified::assertion()),
            _ => {
                // The peer's text, escaped and cut: the first few of its URIs, and how many there were.
                let shown_ids: Vec<String> = ids.iter().take(3).map(|id| shown(id)).collect();
                Err(rustls::Error::General(format!(
                    "the endpoint presented {} URI SAN(s) [{}], not the SPIFFE ID {}",
                    ids.len(),
                    shown_ids.join(", "),
                    self.id
                )))
            }
        }
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
            &self.provider.signature_verification_algorithms,
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
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The URI SANs of a certificate (none when it does not parse).
fn uri_sans(der: &[u8]) -> Vec<String> {
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};
    let Ok((_, certificate)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let Ok(Some(names)) = certificate.subject_alternative_name() else {
        return Vec::new();
    };
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some((*uri).to_owned()),
            _ => None,
        })
        .collect()
}
