//! A Workload API client that takes one answer and leaves: what `meshca workload fetch` uses to ask
//! a socket what the calling process would get.
//!
//! Each fetch sends the security header, reads the first message of the stream (every message holds
//! the whole current state) and closes the stream. Responses are parsed into checked types: SPIFFE
//! IDs and trust domains valid, chains and bundles split into certificates, the key kept as a
//! secret.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use futures::FutureExt;
use meshca_identity::{SpiffeId, TrustDomain};
use tonic::client::Grpc;
use tonic::transport::Channel;
use tonic::{Code, Request, Status, Streaming};
use tonic_prost::ProstCodec;
use zeroize::Zeroizing;

use crate::proto::{
    paths, JwtSvidRequest, JwtSvidResponse, X509BundlesRequest, X509BundlesResponse,
    X509SvidRequest, X509SvidResponse,
};
use crate::SECURITY_HEADER;

/// The variable SPIFFE clients read the Workload API's address from.
pub const ENDPOINT_SOCKET_VAR: &str = "SPIFFE_ENDPOINT_SOCKET";

/// Why a Workload API address was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// Not a `unix:` address.
    #[error("{value:?} is not a unix socket address; write unix:///absolute/path")]
    NotUnix {
        /// The address as given.
        value: String,
    },
    /// A `unix:` address whose path is not absolute (or that names a host).
    #[error("{value:?} does not name an absolute socket path; write unix:///absolute/path")]
    NotAbsolute {
        /// The address as given.
        value: String,
    },
    /// The address is not UTF-8.
    #[error("the address is not UTF-8 text; write unix:///absolute/path")]
    NotText,
}

/// The socket path of a Workload API address, as the SPIFFE Workload Endpoint standard writes it:
/// `unix:///absolute/path` (or `unix:/absolute/path`). A relative path, a host part, a query or a
/// fragment, and any other scheme (meshca serves no TCP endpoint) are refused.
pub fn parse_endpoint(value: &OsStr) -> Result<PathBuf, EndpointError> {
    let text = value.to_str().ok_or(EndpointError::NotText)?;
    let Some(rest) = text.strip_prefix("unix:") else {
        return Err(EndpointError::NotUnix {
            value: text.to_owned(),
        });
    };
    let not_absolute = || EndpointError::NotAbsolute {
        value: text.to_owned(),
    };
    // `unix:///p` has an empty authority; `unix://host/p` or `unix://p` names a host.
    let path = match rest.strip_prefix("//") {
        Some(after) if after.starts_with('/') => after,
        Some(_) => return Err(not_absolute()),
        None => rest,
    };
    if !path.starts_with('/') || path.len() < 2 || path.contains(['?', '#']) {
        return Err(not_absolute());
    }
    Ok(PathBuf::from(path))
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The socket could not be reached (absent, refused, not a socket).
    #[error("cannot connect to the Workload API socket {}: {reason}", socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// Why.
        reason: String,
    },
    /// `PERMISSION_DENIED`: the server issues nothing to this process.
    #[error(
        "no identity for this process: no WorkloadRegistration matches it (uid {uid}, gid {gid}); the Workload API at {} answered PERMISSION_DENIED: {message}",
        socket.display()
    )]
    NoIdentity {
        /// The socket.
        socket: PathBuf,
        /// This process's effective uid.
        uid: u32,
        /// This process's effective gid.
        gid: u32,
        /// The server's message, escaped and quoted.
        message: String,
    },
    /// Any other gRPC status.
    #[error("{method} on the Workload API at {} failed: {code}: {message}", socket.display())]
    Status {
        /// The socket.
        socket: PathBuf,
        /// The method's name.
        method: &'static str,
        /// The status code, as gRPC names it (`UNIMPLEMENTED`).
        code: &'static str,
        /// The server's message, escaped and quoted.
        message: String,
    },
    /// The stream ended before its first message.
    #[error("{method} on the Workload API at {}: the stream ended without a message", socket.display())]
    Ended {
        /// The socket.
        socket: PathBuf,
        /// The method's name.
        method: &'static str,
    },
    /// The response breaks the Workload API's rules.
    #[error("{method} on the Workload API at {}: the response is malformed: {reason}", socket.display())]
    Malformed {
        /// The socket.
        socket: PathBuf,
        /// The method's name.
        method: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl FetchError {
    /// The gRPC status code the server answered, when the failure is one.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            FetchError::NoIdentity { .. } => Some(code_name(Code::PermissionDenied)),
            FetchError::Status { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A private key, PKCS#8 DER: zeroized on drop, never printed.
pub struct PrivateKey(Zeroizing<Vec<u8>>);

impl PrivateKey {
    /// The DER bytes.
    pub fn der(&self) -> &[u8] {
        &self.0
    }

    /// PEM (`PRIVATE KEY`), zeroized on drop.
    pub fn to_pem(&self) -> Zeroizing<String> {
        Zeroizing::new(::pem::encode(&::pem::Pem::new(
            "PRIVATE KEY",
            self.0.to_vec(),
        )))
    }
}

impl std::fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrivateKey([redacted])")
    }
}

/// DER certificates, in the order the server sent them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Certificates(pub Vec<Vec<u8>>);

impl Certificates {
    /// PEM text, one `CERTIFICATE` block each, in order.
    pub fn to_pem(&self) -> String {
        self.0
            .iter()
            .map(|der| ::pem::encode(&::pem::Pem::new("CERTIFICATE", der.clone())))
            .collect()
    }
}

/// One X.509-SVID as received.
#[derive(Debug)]
pub struct FetchedSvid {
    /// Its SPIFFE ID.
    pub spiffe_id: SpiffeId,
    /// The operator's hint; empty when none.
    pub hint: String,
    /// The chain, leaf first.
    pub chain: Certificates,
    /// The leaf's key.
    pub key: PrivateKey,
    /// The CAs of the SVID's trust domain.
    pub bundle: Certificates,
}

/// The first message of `FetchX509SVID`.
#[derive(Debug)]
pub struct X509Context {
    /// The SVIDs; the first is the default one. Never empty.
    pub svids: Vec<FetchedSvid>,
    /// The other trust domains' CAs.
    pub federated: BTreeMap<TrustDomain, Certificates>,
}

/// One JWT-SVID as received.
#[derive(Debug)]
pub struct FetchedJwt {
    /// Its subject.
    pub spiffe_id: SpiffeId,
    /// The operator's hint; empty when none.
    pub hint: String,
    /// The token (JWS compact serialization).
    pub token: Zeroizing<String>,
}

/// An open `FetchX509SVID` stream (see [`WorkloadClient::watch_x509`]).
#[derive(Debug)]
pub struct X509Watch {
    client: WorkloadClient,
    stream: Streaming<X509SvidResponse>,
}

impl X509Watch {
    /// The next message: the whole state as of now. Ends with an error when the stream does.
    pub async fn next(&mut self) -> Result<X509Context, FetchError> {
        let response = self.client.next_of(X509_METHOD, &mut self.stream).await?;
        self.client.x509_context(response)
    }

    /// The newest of the messages that have already arrived, without waiting; `None` when none has.
    /// Each message holds the whole state, so the older ones need not be looked at.
    pub fn newest_ready(&mut self) -> Option<Result<X509Context, FetchError>> {
        let mut newest = None;
        while let Some(next) = self.next().now_or_never() {
            let failed = next.is_err();
            newest = Some(next);
            if failed {
                break;
            }
        }
        newest
    }
}

/// The method name of `FetchX509SVID`, for errors.
const X509_METHOD: &str = "FetchX509SVID";

/// A connection to a Workload API socket.
#[derive(Debug)]
pub struct WorkloadClient {
    grpc: Grpc<Channel>,
    socket: PathBuf,
}

impl WorkloadClient {
    /// Connects to the socket at `socket` (an absolute path, see [`parse_endpoint`]).
    pub async fn connect(socket: &Path) -> Result<WorkloadClient, FetchError> {
        let channel = meshca_serve::connect_channel(&format!("unix://{}", socket.display()), None)
            .await
            .map_err(|e| FetchError::Connect {
                socket: socket.to_owned(),
                reason: match e {
                    meshca_serve::ConnectError::Connect { reason, .. } => without_repeats(&reason),
                    other => other.to_string(),
                },
            })?;
        Ok(WorkloadClient {
            grpc: Grpc::new(channel),
            socket: socket.to_owned(),
        })
    }

    /// The first `FetchX509SVID` message: this process's SVIDs and the federated bundles.
    pub async fn fetch_x509(&mut self) -> Result<X509Context, FetchError> {
        let response: X509SvidResponse = self
            .first(X509_METHOD, paths::FETCH_X509_SVID, X509SvidRequest {})
            .await?;
        self.x509_context(response)
    }

    /// A `FetchX509SVID` stream kept open: every message it brings, each the whole current state.
    pub async fn watch_x509(mut self) -> Result<X509Watch, FetchError> {
        let stream = self
            .open(X509_METHOD, paths::FETCH_X509_SVID, X509SvidRequest {})
            .await?;
        Ok(X509Watch {
            client: self,
            stream,
        })
    }

    /// A `FetchX509SVID` message, checked and split into certificates.
    fn x509_context(&self, response: X509SvidResponse) -> Result<X509Context, FetchError> {
        let malformed = |reason: String| self.malformed(X509_METHOD, reason);
        if response.svids.is_empty() {
            return Err(malformed("it holds no SVID".into()));
        }
        let mut svids = Vec::with_capacity(response.svids.len());
        for (i, svid) in response.svids.into_iter().enumerate() {
            let at = |what: &str, reason: String| malformed(format!("svids[{i}].{what}: {reason}"));
            let spiffe_id = SpiffeId::parse(&svid.spiffe_id)
                .map_err(|e| at("spiffe_id", format!("{:?}: {e}", svid.spiffe_id)))?;
            let chain = split_der(&svid.x509_svid).map_err(|e| at("x509_svid", e))?;
            let bundle = split_der(&svid.bundle).map_err(|e| at("bundle", e))?;
            if svid.x509_svid_key.is_empty() {
                return Err(at("x509_svid_key", "empty".into()));
            }
            svids.push(FetchedSvid {
                spiffe_id,
                hint: svid.hint,
                chain,
                key: PrivateKey(Zeroizing::new(svid.x509_svid_key)),
                bundle,
            });
        }
        let federated =
            self.by_trust_domain(X509_METHOD, "federated_bundles", response.federated_bundles)?;
        Ok(X509Context { svids, federated })
    }

    /// The first `FetchX509Bundles` message: every trust domain's CAs.
    pub async fn fetch_bundles(
        &mut self,
    ) -> Result<BTreeMap<TrustDomain, Certificates>, FetchError> {
        const METHOD: &str = "FetchX509Bundles";
        let response: X509BundlesResponse = self
            .first(METHOD, paths::FETCH_X509_BUNDLES, X509BundlesRequest {})
            .await?;
        self.by_trust_domain(METHOD, "bundles", response.bundles)
    }

    /// `FetchJWTSVID` for `audience` (at least one), for the SVID of `spiffe_id` only when given.
    pub async fn fetch_jwt(
        &mut self,
        audience: Vec<String>,
        spiffe_id: Option<&SpiffeId>,
    ) -> Result<Vec<FetchedJwt>, FetchError> {
        const METHOD: &str = "FetchJWTSVID";
        let request = JwtSvidRequest {
            audience,
            spiffe_id: spiffe_id
                .map(|id| id.as_str().to_owned())
                .unwrap_or_default(),
        };
        self.ready(METHOD).await?;
        let response: JwtSvidResponse = self
            .grpc
            .unary(
                with_header(request),
                path(paths::FETCH_JWT_SVID),
                ProstCodec::default(),
            )
            .await
            .map_err(|status| self.status(METHOD, status))?
            .into_inner();
        let mut tokens = Vec::with_capacity(response.svids.len());
        for (i, svid) in response.svids.into_iter().enumerate() {
            let spiffe_id = SpiffeId::parse(&svid.spiffe_id).map_err(|e| {
                self.malformed(
                    METHOD,
                    format!("svids[{i}].spiffe_id {:?}: {e}", svid.spiffe_id),
                )
            })?;
            tokens.push(FetchedJwt {
                spiffe_id,
                hint: svid.hint,
                token: Zeroizing::new(svid.svid),
            });
        }
        if tokens.is_empty() {
            return Err(self.malformed(METHOD, "it holds no token".into()));
        }
        Ok(tokens)
    }

    /// Opens a server stream, takes its first message and drops the stream (which resets it).
    async fn first<Q, R>(
        &mut self,
        method: &'static str,
        path_text: &'static str,
        request: Q,
    ) -> Result<R, FetchError>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        let mut stream = self.open(method, path_text, request).await?;
        self.next_of(method, &mut stream).await
    }

    /// Opens a server stream.
    async fn open<Q, R>(
        &mut self,
        method: &'static str,
        path_text: &'static str,
        request: Q,
    ) -> Result<Streaming<R>, FetchError>
    where
        Q: prost::Message + Send + Sync + 'static,
        R: prost::Message + Default + Send + Sync + 'static,
    {
        self.ready(method).await?;
        Ok(self
            .grpc
            .server_streaming(
                with_header(request),
                path(path_text),
                ProstCodec::<Q, R>::default(),
            )
            .await
            .map_err(|status| self.status(method, status))?
            .into_inner())
    }

    /// The next message of a stream.
    async fn next_of<R>(
        &self,
        method: &'static str,
        stream: &mut Streaming<R>,
    ) -> Result<R, FetchError> {
        match stream.message().await {
            Ok(Some(message)) => Ok(message),
            Ok(None) => Err(FetchError::Ended {
                socket: self.socket.clone(),
                method,
            }),
            Err(status) => Err(self.status(method, status)),
        }
    }

    async fn ready(&mut self, method: &'static str) -> Result<(), FetchError> {
        self.grpc.ready().await.map_err(|e| FetchError::Connect {
            socket: self.socket.clone(),
            reason: format!("{method}: {e}"),
        })
    }

    fn by_trust_domain(
        &self,
        method: &'static str,
        field: &str,
        bundles: std::collections::HashMap<String, Vec<u8>>,
    ) -> Result<BTreeMap<TrustDomain, Certificates>, FetchError> {
        let mut out = BTreeMap::new();
        for (key, der) in bundles {
            let at = |reason: String| self.malformed(method, format!("{field}[{key:?}]: {reason}"));
            out.insert(
                trust_domain_key(&key).map_err(at)?,
                split_der(&der).map_err(at)?,
            );
        }
        Ok(out)
    }

    fn malformed(&self, method: &'static str, reason: String) -> FetchError {
        FetchError::Malformed {
            socket: self.socket.clone(),
            method,
            reason,
        }
    }

    fn status(&self, method: &'static str, status: Status) -> FetchError {
        let message = meshca_serve::shown(status.message());
        if status.code() == Code::PermissionDenied {
            return FetchError::NoIdentity {
                socket: self.socket.clone(),
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
                message,
            };
        }
        FetchError::Status {
            socket: self.socket.clone(),
            method,
            code: code_name(status.code()),
            message,
        }
    }
}

/// The trust domain a bundle map's key names: `spiffe://<trust domain>` as the standard writes it,
/// or the bare name, which other servers send and SPIFFE's own clients accept.
fn trust_domain_key(key: &str) -> Result<TrustDomain, String> {
    if !key.starts_with("spiffe://") {
        return TrustDomain::parse(key).map_err(|e| e.to_string());
    }
    let id = SpiffeId::parse(key).map_err(|e| e.to_string())?;
    if !id.is_root() {
        return Err("the key must be spiffe://<trust domain>, without a path".into());
    }
    Ok(id.trust_domain().clone())
}

/// An error chain without a cause that repeats the one before it (`a: b: b` → `a: b`).
fn without_repeats(chain: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in chain.split(": ") {
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    parts.join(": ")
}

fn with_header<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        SECURITY_HEADER,
        tonic::metadata::MetadataValue::from_static("true"),
    );
    request
}

fn path(text: &'static str) -> tonic::codegen::http::uri::PathAndQuery {
    tonic::codegen::http::uri::PathAndQuery::from_static(text)
}

/// A status code as gRPC writes it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Splits concatenated DER certificates (each an ASN.1 SEQUENCE) without parsing them further.
fn split_der(mut bytes: &[u8]) -> Result<Certificates, String> {
    let mut certs = Vec::new();
    while !bytes.is_empty() {
        let n = certs.len() + 1;
        let bad = |what: &str| format!("certificate {n}: {what}");
        if bytes.first() != Some(&0x30) {
            return Err(bad("not a DER SEQUENCE"));
        }
        let first = *bytes.get(1).ok_or_else(|| bad("truncated length"))?;
        let (header, len) = if first < 0x80 {
            (2, usize::from(first))
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 {
                return Err(bad("unsupported length encoding"));
            }
            let digits = bytes
                .get(2..2 + count)
                .ok_or_else(|| bad("truncated length"))?;
            let len = digits
                .iter()
                .fold(0usize, |acc, d| (acc << 8) | usize::from(*d));
            (2 + count, len)
        };
        let end = header
            .checked_add(len)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| bad("truncated"))?;
        certs.push(bytes[..end].to_vec());
        bytes = &bytes[end..];
    }
    if certs.is_empty() {
        return Err("no certificate".into());
    }
    Ok(Certificates(certs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_absolute_unix_paths() {
        let ok = |s: &str| parse_endpoint(OsStr::new(s));
        assert_eq!(ok("unix:///run/w.sock"), Ok(PathBuf::from("/run/w.sock")));
        assert_eq!(ok("unix:/run/w.sock"), Ok(PathBuf::from("/run/w.sock")));
        for bad in [
            "unix://run/w.sock",
            "unix:run/w.sock",
            "unix://",
            "unix:///",
            "unix:///a?b",
        ] {
            assert!(
                matches!(ok(bad), Err(EndpointError::NotAbsolute { .. })),
                "{bad}"
            );
        }
        for bad in ["/run/w.sock", "tcp://127.0.0.1:1", "", "UNIX:///a"] {
            assert!(
                matches!(ok(bad), Err(EndpointError::NotUnix { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn bundle_keys_name_a_trust_domain_with_or_without_the_scheme() {
        let td = |k: &str| trust_domain_key(k).map(|t| t.as_str().to_owned());
        assert_eq!(td("spiffe://example.org"), Ok("example.org".into()));
        assert_eq!(td("example.org"), Ok("example.org".into()));
        assert!(td("spiffe://example.org/path").is_err());
        assert!(td("Example/../x").is_err());
        assert!(td("").is_err());
    }

    #[test]
    fn concatenated_der_splits_at_each_sequence() {
        let short = [0x30, 2, 1, 2];
        let mut long = vec![0x30, 0x81, 200];
        long.extend(std::iter::repeat_n(7, 200));
        let joined = [&short[..], &long[..], &short[..]].concat();
        let certs = split_der(&joined).expect("splits");
        assert_eq!(certs.0, [short.to_vec(), long.clone(), short.to_vec()]);
        assert!(split_der(&[]).is_err());
        assert!(split_der(&[0x30, 5, 1]).is_err(), "truncated");
        assert!(split_der(&[0x31, 0]).is_err(), "not a sequence");
        assert!(split_der(&long[..100]).is_err(), "truncated long form");
    }
}
