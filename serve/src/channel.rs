//! Opening a gRPC channel to a meshca listener: a unix socket, or TCP with or without TLS (ring, HTTP/2
//! by ALPN). SDS's client, the agent and `meshca workload fetch` connect through here.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::net::{TcpStream, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::{ConnectError, ErrorChain};

/// TLS settings of a client connecting over TCP.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// PEM certificates of the CAs that may sign the server's certificate.
    pub ca_pem: Vec<u8>,
    /// The DNS name or IP address the server's certificate must carry.
    pub server_name: String,
}

/// Where to connect.
enum Target {
    Unix(PathBuf),
    Tcp(String),
}

fn parse_target(target: &str) -> Result<Target, ConnectError> {
    let invalid = |reason: &str| ConnectError::InvalidTarget {
        target: target.to_owned(),
        reason: reason.to_owned(),
    };
    if let Some(rest) = target.strip_prefix("unix:") {
        let path = rest.strip_prefix("//").unwrap_or(rest);
        if path.is_empty() {
            return Err(invalid(
                "a unix target needs a socket path: unix:///path/to/sds.sock",
            ));
        }
        return Ok(Target::Unix(PathBuf::from(path)));
    }
    if target.contains("://") {
        return Err(invalid(
            "expected unix:///path or host:port (TLS is chosen by the TLS settings, not a scheme)",
        ));
    }
    match target.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            Ok(Target::Tcp(target.to_owned()))
        }
        _ => Err(invalid("expected unix:///path or host:port")),
    }
}

fn tls_config(
    tls: &ClientTls,
) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), ConnectError> {
    let tls_error = |reason: String| ConnectError::Tls { reason };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&tls.ca_pem) {
        let cert = cert.map_err(|error| tls_error(format!("CA PEM: {error}")))?;
        roots
            .add(cert)
            .map_err(|error| tls_error(format!("CA certificate: {error}")))?;
    }
    if roots.is_empty() {
        return Err(tls_error("the CA PEM holds no certificate".into()));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|error| tls_error(error.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let server_name = ServerName::try_from(tls.server_name.clone())
        .map_err(|error| tls_error(format!("server name {:?}: {error}", tls.server_name)))?;
    Ok((Arc::new(config), server_name))
}

/// Opens an HTTP/2 channel to an SDS server: `unix:///path` (plaintext over the socket),
/// or `host:port` over TLS when `tls` is given, plaintext otherwise (loopback only on the
/// server side).
pub async fn connect_channel(
    target: &str,
    tls: Option<ClientTls>,
) -> Result<Channel, ConnectError> {
    let connect_error = |error: tonic::transport::Error| ConnectError::Connect {
        target: target.to_owned(),
        reason: ErrorChain(&error).to_string(),
    };
    match parse_target(target)? {
        Target::Unix(path) => {
            let connector = tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            });
            Endpoint::from_static("http://localhost")
                .connect_with_connector(connector)
                .await
                .map_err(connect_error)
        }
        Target::Tcp(addr) => {
            let endpoint =
                Endpoint::from_shared(format!("http://{addr}")).map_err(connect_error)?;
            match tls {
                None => {
                    let connector = tower::service_fn(move |_: Uri| {
                        let addr = addr.clone();
                        async move { TcpStream::connect(addr).await.map(TokioIo::new) }
                    });
                    endpoint
                        .connect_with_connector(connector)
                        .await
                        .map_err(connect_error)
                }
                Some(tls) => {
                    let (config, server_name) = tls_config(&tls)?;
                    let connector = tower::service_fn(move |_: Uri| {
                        let (addr, config, server_name) =
                            (addr.clone(), config.clone(), server_name.clone());
                        async move {
                            let tcp = TcpStream::connect(addr).await?;
                            let tls = tokio_rustls::TlsConnector::from(config)
                                .connect(server_name, tcp)
                                .await?;
                            if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
                                return Err(io::Error::other(
                                    "the server did not agree to HTTP/2 (ALPN h2)",
                                ));
                            }
                            Ok::<_, io::Error>(TokioIo::new(tls))
                        }
                    });
                    endpoint
                        .connect_with_connector(connector)
                        .await
                        .map_err(connect_error)
                }
            }
        }
    }
}
