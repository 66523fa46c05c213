//! Serving meshca's own trust domains to peers: the SPIFFE bundle an endpoint serves, numbered so that
//! its `spiffe_sequence` never goes backwards (the last number and the content it numbered are kept in
//! the keystore, which replicas on a database share), and the endpoint itself: HTTPS, `GET /` only,
//! every connection bounded in number and time.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use meshca_identity::TrustDomain;
use meshca_keystore::Keystore;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_util::sync::CancellationToken;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

use crate::bundle::{SpiffeBundle, X509Authority};

/// What an endpoint serves now: the bundle, the document it is sent as, and since when each X.509
/// authority has been served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedBundle {
    /// The bundle, numbered.
    pub bundle: SpiffeBundle,
    /// Its canonical JSON.
    pub json: Bytes,
    /// Each X.509 authority (by the lowercase hex SHA-256 of its DER) and when it was first served;
    /// the Unix epoch for the authorities of the first bundle ever served, which no peer could have
    /// fetched before (so nothing waits for them).
    pub served_since: BTreeMap<String, SystemTime>,
    /// The authorities (by id) served only because certificates they signed are still valid, and until
    /// when: their CAs were removed.
    pub retired: BTreeMap<String, SystemTime>,
}

/// The lowercase hex SHA-256 of `der`: how a served authority is named (as meshca names CAs).
pub fn authority_id(der: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The keystore entry that numbers `trust_domain`'s served bundle.
pub fn sequence_path(trust_domain: &TrustDomain) -> String {
    format!("federation/served/{trust_domain}.json")
}

/// The keystore's record: the last sequence, a digest of the content it numbered, and since when each
/// of its X.509 authorities has been served (Unix seconds).
#[derive(serde::Serialize, serde::Deserialize)]
struct SequenceRecord {
    sequence: u64,
    /// Lowercase hex SHA-256 of the content's canonical JSON without sequence or refresh hint.
    digest: String,
    #[serde(default)]
    served_since: BTreeMap<String, u64>,
    /// The authorities served only until the last certificate each signed expires, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    retired: BTreeMap<String, RetiredRecord>,
}

/// A retired authority in the record: its DER (base64) and until when it is served (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct RetiredRecord {
    der: String,
    until: u64,
}

fn digest(content: &SpiffeBundle) -> String {
    let mut bare = content.clone();
    bare.sequence = None;
    bare.refresh_hint = None;
    authority_id(&bare.to_json())
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An X.509 authority that left what the trust domain's proxies trust (its CA was removed), served on
/// until the last certificate it signed expires, so that peers accept that certificate for its life.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retiring {
    /// The authority.
    pub authority: X509Authority,
    /// When the last certificate it signed expires.
    pub until: SystemTime,
}

/// Numbers `content` (a trust domain's authorities) for serving with `refresh_hint` at `now`, with
/// `retiring` and the authorities retired before (kept in the record) added while their certificates
/// live: the recorded sequence when the record numbered this very content (a restart, another
/// replica), else the next one, recorded first with when each authority was first served. A record
/// that does not read is replaced by a number above any a reader of it could have served (the time in
/// seconds), so the sequence still never goes backwards.
pub fn number(
    keystore: &dyn Keystore,
    content: &SpiffeBundle,
    retiring: &[Retiring],
    refresh_hint: Duration,
    now: SystemTime,
) -> Result<ServedBundle, String> {
    let td = content.trust_domain();
    let path = sequence_path(td);
    let recorded = keystore
        .get_public(&path)
        .map_err(|e| format!("keystore entry {path}: {e}"))?
        .map(|bytes| serde_json::from_slice::<SequenceRecord>(&bytes));
    let before = match &recorded {
        Some(Ok(record)) => record.retired.clone(),
        _ => BTreeMap::new(),
    };
    let retired = still_retired(td, content, before, retiring, now);
    let full = SpiffeBundle::new(
        td.clone(),
        content
            .x509_authorities()
            .iter()
            .chain(retired.values().map(|(authority, _)| authority))
            .cloned()
            .collect(),
        content.jwt_authorities().to_vec(),
    );
    let digest = digest(&full);
    let ids: Vec<String> = full
        .x509_authorities()
        .iter()
        .map(|a| authority_id(a.der()))
        .collect();
    let retired_record: BTreeMap<String, RetiredRecord> = retired
        .iter()
        .map(|(id, (authority, until))| {
            let der = STANDARD.encode(authority.der());
            (id.clone(), RetiredRecord { der, until: *until })
        })
        .collect();
    let record = match recorded {
        Some(Ok(record)) if record.digest == digest && record.retired == retired_record => record,
        // The same content, retired until another time (another replica knew of a later certificate).
        Some(Ok(record)) if record.digest == digest => write_record(
            keystore,
            &path,
            SequenceRecord {
                retired: retired_record,
                ..record
            },
        )?,
        Some(Ok(record)) => {
            // Authorities served before keep their time; new ones are served from now.
            let served_since = ids
                .iter()
                .map(|id| {
                    let since = record
                        .served_since
                        .get(id)
                        .copied()
                        .unwrap_or(unix_secs(now));
                    (id.clone(), since)
                })
                .collect();
            write_record(
                keystore,
                &path,
                SequenceRecord {
                    sequence: record.sequence.saturating_add(1),
                    digest,
                    served_since,
                    retired: retired_record,
                },
            )?
        }
        // The first bundle ever served: no peer could have fetched anything before it.
        None => write_record(
            keystore,
            &path,
            SequenceRecord {
                sequence: 1,
                digest,
                served_since: ids.iter().map(|id| (id.clone(), 0)).collect(),
                retired: retired_record,
            },
        )?,
        Some(Err(e)) => {
            tracing::warn!(entry = %path, error = %e, "the served bundle's sequence record does not read; numbering from the clock");
            write_record(
                keystore,
                &path,
                SequenceRecord {
                    sequence: unix_secs(now).max(1),
                    digest,
                    served_since: ids.iter().map(|id| (id.clone(), unix_secs(now))).collect(),
                    retired: retired_record,
                },
            )?
        }
    };
    let mut bundle = full;
    bundle.sequence = Some(record.sequence);
    bundle.refresh_hint = Some(refresh_hint);
    let json = Bytes::from(bundle.to_json());
    let served_since = record
        .served_since
        .into_iter()
        .map(|(id, secs)| (id, from_unix_secs(secs)))
        .collect();
    Ok(ServedBundle {
        bundle,
        json,
        served_since,
        retired: retired
            .into_iter()
            .map(|(id, (_, until))| (id, from_unix_secs(until)))
            .collect(),
    })
}

fn from_unix_secs(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

/// The retired authorities to serve at `now`: those recorded `before` and those `retiring` (the later
/// time when both name one), while the last certificate each signed is valid and it is not in
/// `content` again anyway. By id; the times in Unix seconds.
fn still_retired(
    td: &TrustDomain,
    content: &SpiffeBundle,
    before: BTreeMap<String, RetiredRecord>,
    retiring: &[Retiring],
    now: SystemTime,
) -> BTreeMap<String, (X509Authority, u64)> {
    let mut retired = BTreeMap::new();
    for (id, record) in before {
        let authority = STANDARD
            .decode(&record.der)
            .map_err(|e| e.to_string())
            .and_then(|der| X509Authority::from_der(der, td));
        match authority {
            Ok(authority) => {
                retired.insert(id, (authority, record.until));
            }
            Err(e) => {
                tracing::warn!(trust_domain = %td, authority = %id, error = %e, "a retired authority in the served bundle's record does not read; no longer served");
            }
        }
    }
    for r in retiring {
        let until = unix_secs(r.until);
        retired
            .entry(authority_id(r.authority.der()))
            .and_modify(|(_, recorded)| *recorded = until.max(*recorded))
            .or_insert_with(|| (r.authority.clone(), until));
    }
    let served: std::collections::HashSet<&[u8]> =
        content.x509_authorities().iter().map(|a| a.der()).collect();
    let now = unix_secs(now);
    retired.retain(|_, (authority, until)| *until > now && !served.contains(authority.der()));
    retired
}

fn write_record(
    keystore: &dyn Keystore,
    path: &str,
    record: SequenceRecord,
) -> Result<SequenceRecord, String> {
    let bytes = serde_json::to_vec(&record).map_err(|e| e.to_string())?;
    keystore
        .put_public(path, &bytes)
        .map_err(|e| format!("keystore entry {path}: {e}"))?;
    Ok(record)
}

/// The most peer addresses a [`FetchLog`] remembers; past it, the one seen least recently is forgotten.
pub const FETCH_LOG_PEERS: usize = 1024;

/// What one peer address fetched from an endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerFetches {
    /// Bundles answered to it.
    pub count: u64,
    /// When it last got one.
    pub last: SystemTime,
    /// The sequence of the last one.
    pub sequence: Option<u64>,
}

/// Who fetched an endpoint's bundle, by peer address: the fetches seen, shown while a new CA waits for
/// the trust domain's peers. At most [`FETCH_LOG_PEERS`] addresses.
#[derive(Clone, Debug, Default)]
pub struct FetchLog(Arc<Mutex<BTreeMap<std::net::IpAddr, PeerFetches>>>);

impl FetchLog {
    fn record(&self, peer: std::net::IpAddr, sequence: Option<u64>, now: SystemTime) {
        let mut log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !log.contains_key(&peer) && log.len() >= FETCH_LOG_PEERS {
            let oldest = log.iter().min_by_key(|(_, f)| f.last).map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                log.remove(&ip);
            }
        }
        let entry = log.entry(peer).or_insert(PeerFetches {
            count: 0,
            last: now,
            sequence,
        });
        entry.count += 1;
        entry.last = now;
        entry.sequence = sequence;
    }

    /// Every peer address seen, with its fetches.
    pub fn peers(&self) -> Vec<(std::net::IpAddr, PeerFetches)> {
        let log = self.0.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().map(|(ip, f)| (*ip, *f)).collect()
    }
}

/// How much an endpoint takes from its clients.
#[derive(Clone, Copy, Debug)]
pub struct EndpointLimits {
    /// Open connections; more are closed at once.
    pub connections: usize,
    /// Time for the TLS handshake and the request's head.
    pub handshake: Duration,
}

/// Serves `served` on `listener` over TLS with `tls` until `shutdown`: `GET /` answers the bundle
/// (`503` while there is none yet), any other path `404`, any other method `405`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    served: watch::Receiver<Option<ServedBundle>>,
    limits: EndpointLimits,
    fetches: FetchLog,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let slots = Arc::new(Semaphore::new(limits.connections));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, peer)) = accepted else {
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "bundle endpoint at its connection limit: closed");
            continue;
        };
        let (acceptor, served, shutdown) = (acceptor.clone(), served.clone(), shutdown.clone());
        let fetches = fetches.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(Ok(tls)) = tokio::time::timeout(limits.handshake, acceptor.accept(tcp)).await
            else {
                return;
            };
            let service = hyper::service::service_fn(move |request| {
                let (response, sequence) = answer(&request, &served);
                if response.status() == StatusCode::OK {
                    fetches.record(peer.ip(), sequence, SystemTime::now());
                }
                async move { Ok::<_, std::convert::Infallible>(response) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.handshake)
                .max_buf_size(16 * 1024)
                .keep_alive(false)
                .serve_connection(TokioIo::new(tls), service);
            tokio::select! {
                _ = connection => {}
                () = shutdown.cancelled() => {}
            }
        });
    }
}

/// The answer to `request`, and the sequence of the bundle it carries.
fn answer(
    request: &Request<Incoming>,
    served: &watch::Receiver<Option<ServedBundle>>,
) -> (Response<Full<Bytes>>, Option<u64>) {
    let plain = |status: StatusCode, text: &'static str| {
        let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *response.status_mut() = status;
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return (plain(StatusCode::METHOD_NOT_ALLOWED, "GET / only\n"), None);
    }
    if request.uri().path() != "/" {
        return (plain(StatusCode::NOT_FOUND, "the bundle is at /\n"), None);
    }
    let Some(bundle) = served.borrow().clone() else {
        return (
            plain(StatusCode::SERVICE_UNAVAILABLE, "no bundle yet\n"),
            None,
        );
    };
    let sequence = bundle.bundle.sequence;
    let mut response = Response::new(Full::new(bundle.json));
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    (response, sequence)
}

/// An `https_web` endpoint's certificate: the operator's files, read again when they change (looked at
/// no more than once a second, on a handshake). A change that does not load keeps the last good
/// certificate, logged.
#[derive(Debug)]
pub struct WebCertificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    state: Mutex<WebState>,
}

#[derive(Debug)]
struct WebState {
    key: Arc<CertifiedKey>,
    /// The files' modification times when `key` was read.
    read_at: (Option<SystemTime>, Option<SystemTime>),
    looked: Instant,
}

fn modified(path: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reads a PEM certificate chain and its private key as rustls's signing key.
pub fn load_certified_key(
    cert_file: &std::path::Path,
    key_file: &std::path::Path,
) -> io::Result<CertifiedKey> {
    let invalid = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    fn named(path: &std::path::Path) -> impl Fn(io::Error) -> io::Error + '_ {
        move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
    }
    let certs_pem = meshca_files::read(
        cert_file,
        meshca_files::PEM_FILE_BYTES,
        meshca_files::PEM_FILE_BOUND,
    )
    .map_err(named(cert_file))?;
    let key_pem = meshca_files::open(key_file)
        .and_then(|f| f.read_secret(meshca_files::PEM_FILE_BYTES, meshca_files::PEM_FILE_BOUND))
        .map_err(named(key_file))?;
    let chain: Vec<rustls::pki_types::CertificateDer<'static>> = ::pem::parse_many(&certs_pem)
        .map_err(|e| invalid(format!("{}: not PEM: {e}", cert_file.display())))?
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| b.into_contents().into())
        .collect();
    if chain.is_empty() {
        return Err(invalid(format!(
            "{}: no CERTIFICATE block",
            cert_file.display()
        )));
    }
    let key = ::pem::parse(&*key_pem)
        .map_err(|e| invalid(format!("{}: not PEM: {e}", key_file.display())))?;
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.contents().to_vec())
        .map_err(|e| invalid(format!("{}: {e}", key_file.display())))?;
    let provider = rustls::crypto::ring::default_provider();
    let signing = provider
        .key_provider
        .load_private_key(der)
        .map_err(|e| invalid(format!("{}: {e}", key_file.display())))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        invalid(format!(
            "{} and {}: {e}",
            cert_file.display(),
            key_file.display()
        ))
    })?;
    Ok(certified)
}

impl WebCertificate {
    /// Reads the files now: an error is the operator's to fix before the endpoint can start.
    pub fn load(cert_file: PathBuf, key_file: PathBuf) -> io::Result<WebCertificate> {
        let key = Arc::new(load_certified_key(&cert_file, &key_file)?);
        let read_at = (modified(&cert_file), modified(&key_file));
        Ok(WebCertificate {
            cert_file,
            key_file,
            state: Mutex::new(WebState {
                key,
                read_at,
                looked: Instant::now(),
            }),
        })
    }
}

impl ResolvesServerCert for WebCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.looked.elapsed() >= Duration::from_secs(1) {
            state.looked = Instant::now();
            let now = (modified(&self.cert_file), modified(&self.key_file));
            if now != state.read_at {
                match load_certified_key(&self.cert_file, &self.key_file) {
                    Ok(key) => {
                        tracing::info!(cert_file = %self.cert_file.display(), "bundle endpoint certificate reloaded");
                        state.key = Arc::new(key);
                        state.read_at = now;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the bundle endpoint's new certificate does not load; the last good one keeps serving");
                        state.read_at = now;
                    }
                }
            }
        }
        Some(state.key.clone())
    }
}

/// An `https_spiffe` endpoint's certificate: the X.509-SVID meshca issues it, as it changes.
#[derive(Debug)]
pub struct SvidCertificate(pub watch::Receiver<Option<Arc<CertifiedKey>>>);

impl ResolvesServerCert for SvidCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.borrow().clone()
    }
}

/// A TLS server configuration presenting what `certificate` resolves.
pub fn server_config(
    certificate: Arc<dyn ResolvesServerCert>,
) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
