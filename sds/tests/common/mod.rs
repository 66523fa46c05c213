//! Shared fixtures: certificates (rcgen), tokens, snapshots, a running server on a temp
//! unix socket and a TLS port, and a raw protocol-level client.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;
use envoy_types::pb::google::protobuf::Struct;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use meshca_auth::{Claims, ProxyType, RevocationList, SigningKey};
use meshca_control::{
    LeafKey, MeshServiceTrust, MeshView, ProxyEntry, ProxyIdentity, ProxyKey, SecretPem, Snapshot,
    StreamEvent, TrustBundle,
};
use meshca_sds::{decode_secrets, SdsServer, SECRET_TYPE_URL};
use meshca_serve::{bind, connect_channel, BoundAddr, ClientTls, Hub, HubOptions, Listener};
use prost::Message;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair, SanType,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

/// How long a test waits for anything before failing.
pub const WAIT: Duration = Duration::from_secs(10);

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the test clock is after 1970")
        .as_secs()
}

/// A self-signed CA certificate with the SPIFFE trust domain URI, as PEM.
pub fn ca_pem(trust_domain: &str) -> String {
    let key = KeyPair::generate().expect("P-256 key generation");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.subject_alt_names = vec![SanType::URI(
        format!("spiffe://{trust_domain}")
            .try_into()
            .expect("valid URI"),
    )];
    params.self_signed(&key).expect("self-signed CA").pem()
}

/// A leaf certificate and key for `spiffe_id`, signed by a throwaway CA.
pub fn identity(spiffe_id: &str, identity_name: Option<&str>) -> Arc<ProxyIdentity> {
    let ca_key = KeyPair::generate().expect("P-256 key generation");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("P-256 key generation");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
    params.subject_alt_names = vec![SanType::URI(spiffe_id.try_into().expect("valid URI"))];
    let cert = params.signed_by(&key, &issuer).expect("leaf signing");
    Arc::new(ProxyIdentity {
        spiffe_id: spiffe_id.to_owned(),
        identity_name: identity_name.map(str::to_owned),
        chain_pem: cert.pem(),
        key: LeafKey::Held(SecretPem::new(key.serialize_pem())),
    })
}

pub fn bundle(domains: &[(&str, &[&String])]) -> Arc<TrustBundle> {
    Arc::new(TrustBundle::new(
        domains
            .iter()
            .map(|(td, pems)| {
                (
                    (*td).to_owned(),
                    pems.iter().map(|p| (*p).clone()).collect(),
                )
            })
            .collect(),
    ))
}

/// A mesh world for tests: meshes `default` (trust domain `default.zone`) and `other`
/// (`other.zone`), proxies `default.web-1` (Ready), `default.web-2` (Ready),
/// `other.api-1` (Ready), a MeshService `web` in `default`, and an egress bundle.
pub struct World {
    pub default_ca: String,
    pub other_ca: String,
    pub egress_ca: String,
    pub web1: Arc<ProxyIdentity>,
    pub web2: Arc<ProxyIdentity>,
    pub api1: Arc<ProxyIdentity>,
    pub default_trust: Arc<TrustBundle>,
    pub other_trust: Arc<TrustBundle>,
    pub all: Arc<TrustBundle>,
    pub egress: Arc<MeshServiceTrust>,
    pub web_service: Arc<MeshServiceTrust>,
}

impl World {
    pub fn new() -> Self {
        let default_ca = ca_pem("default.zone");
        let other_ca = ca_pem("other.zone");
        let egress_ca = ca_pem("egress.zone");
        let default_trust = bundle(&[("default.zone", &[&default_ca])]);
        let other_trust = bundle(&[("other.zone", &[&other_ca])]);
        let all = bundle(&[
            ("default.zone", &[&default_ca]),
            ("other.zone", &[&other_ca]),
        ]);
        let egress = Arc::new(MeshServiceTrust::new(
            bundle(&[("egress.zone", &[&egress_ca])]),
            BTreeSet::from(["spiffe://egress.zone/egress".to_owned()]),
        ));
        let web_service = Arc::new(MeshServiceTrust::new(
            default_trust.clone(),
            BTreeSet::from([
                "spiffe://default.zone/workload/web-1".to_owned(),
                "spiffe://default/web".to_owned(),
            ]),
        ));
        Self {
            web1: identity("spiffe://default.zone/workload/web-1", Some("mi-web")),
            web2: identity("spiffe://default.zone/workload/web-2", Some("mi-web-2")),
            api1: identity("spiffe://other.zone/workload/api-1", None),
            default_ca,
            other_ca,
            egress_ca,
            default_trust,
            other_trust,
            all,
            egress,
            web_service,
        }
    }

    pub fn snapshot(&self, generation: u64) -> Snapshot {
        let mut proxies = HashMap::new();
        proxies.insert(web1(), ProxyEntry::Ready(self.web1.clone()));
        proxies.insert(
            ProxyKey::new("default", "web-2"),
            ProxyEntry::Ready(self.web2.clone()),
        );
        proxies.insert(
            ProxyKey::new("other", "api-1"),
            ProxyEntry::Ready(self.api1.clone()),
        );
        proxies.insert(
            ProxyKey::new("default", "egress"),
            ProxyEntry::Ready(self.web2.clone()),
        );
        let mut meshes = HashMap::new();
        meshes.insert(
            "default".to_owned(),
            MeshView {
                trust: self.default_trust.clone(),
                mesh_services: HashMap::from([
                    ("web".to_owned(), self.web_service.clone()),
                    (
                        "idle".to_owned(),
                        Arc::new(MeshServiceTrust::new(
                            self.default_trust.clone(),
                            BTreeSet::new(),
                        )),
                    ),
                ]),
                federated: std::sync::Arc::from(Vec::new()),
            },
        );
        meshes.insert(
            "other".to_owned(),
            MeshView {
                trust: self.other_trust.clone(),
                mesh_services: HashMap::new(),
                federated: std::sync::Arc::from(Vec::new()),
            },
        );
        Snapshot {
            generation,
            proxies: proxies.into_iter().collect(),
            meshes: std::sync::Arc::new(meshes),
            all: self.all.clone(),
            egress: Some(self.egress.clone()),
            claim_rules: Default::default(),
            registrations: Default::default(),
            changed: Default::default(),
        }
    }
}

pub fn web1() -> ProxyKey {
    ProxyKey::new("default", "web-1")
}

/// A running server with its control handles.
pub struct Harness {
    pub snapshots: watch::Sender<Arc<Snapshot>>,
    pub revocations: watch::Sender<Arc<RevocationList>>,
    pub events: mpsc::Receiver<StreamEvent>,
    pub signing: SigningKey,
    pub unix_target: String,
    pub tls_addr: SocketAddr,
    pub server_ca_pem: String,
    pub server: SdsServer,
    pub shutdown: CancellationToken,
    pub serve_task: tokio::task::JoinHandle<Result<(), meshca_serve::ServeError>>,
    pub dir: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A rustls server config for `localhost`, and the PEM of the CA that signed it.
pub fn server_tls() -> (Arc<rustls::ServerConfig>, String) {
    let ca_key = KeyPair::generate().expect("P-256 key generation");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("empty SAN list");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name = DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "meshca-sds test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-signed CA");
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().expect("P-256 key generation");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("DNS SAN");
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &issuer).expect("server cert");
    let key_der =
        rustls_pki_types::PrivateKeyDer::try_from(key.serialize_der()).expect("PKCS#8 key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("ring supports the default versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key_der)
    .expect("valid server cert");
    (Arc::new(config), ca_cert.pem())
}

impl Harness {
    pub async fn start() -> Self {
        Self::start_with(HubOptions::default(), World::new().snapshot(1)).await
    }

    pub async fn start_with(options: HubOptions, snapshot: Snapshot) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("sds.sock");
        let (snapshots, snapshot_rx) = watch::channel(Arc::new(snapshot));
        let (revocations, revocation_rx) = watch::channel(Arc::new(RevocationList::new()));
        let (event_tx, events) = mpsc::channel(meshca_serve::EVENT_BUFFER);
        let (signing, _pkcs8) = SigningKey::generate().expect("token key");
        let server = SdsServer::on(Hub::new(
            snapshot_rx,
            signing.verifier(),
            revocation_rx,
            event_tx,
            options,
        ));
        let (tls, server_ca_pem) = server_tls();
        let bound = bind(vec![
            Listener::Unix(socket.clone()),
            Listener::Tls {
                addr: "127.0.0.1:0".parse().expect("addr"),
                config: tls,
            },
        ])
        .await
        .expect("bind");
        let addrs = bound.local_addrs();
        let BoundAddr::Tls(tls_addr) = addrs[1] else {
            panic!("second listener is TLS: {addrs:?}")
        };
        assert_ne!(tls_addr.port(), 0);
        let shutdown = CancellationToken::new();
        let serve_task = tokio::spawn(server.clone().serve(bound, shutdown.clone()));
        Self {
            snapshots,
            revocations,
            events,
            signing,
            unix_target: format!("unix://{}", socket.display()),
            tls_addr,
            server_ca_pem,
            server,
            shutdown,
            serve_task,
            dir,
        }
    }

    pub fn token_for(&self, mesh: &str, name: &str) -> (String, Claims) {
        self.token_with(
            mesh,
            name,
            ProxyType::Dataplane,
            now_unix(),
            Duration::from_secs(3600),
        )
    }

    pub fn token_with(
        &self,
        mesh: &str,
        name: &str,
        proxy_type: ProxyType,
        now: u64,
        valid_for: Duration,
    ) -> (String, Claims) {
        let claims = Claims::new(
            proxy_type,
            mesh,
            name,
            BTreeMap::new(),
            BTreeMap::new(),
            valid_for,
            now,
        )
        .expect("valid claims");
        (self.signing.mint(&claims).expect("mint"), claims)
    }

    pub async fn unix_channel(&self) -> Channel {
        connect_channel(&self.unix_target, None)
            .await
            .expect("unix connect")
    }

    pub async fn tls_channel(&self) -> Channel {
        connect_channel(
            &format!("localhost:{}", self.tls_addr.port()),
            Some(ClientTls {
                ca_pem: self.server_ca_pem.clone().into_bytes(),
                server_name: "localhost".into(),
            }),
        )
        .await
        .expect("TLS connect")
    }

    pub fn publish(&self, snapshot: Snapshot) {
        self.snapshots.send_replace(Arc::new(snapshot));
    }

    /// Waits for the first event matching `pick`, discarding others.
    pub async fn event<T>(&mut self, mut pick: impl FnMut(StreamEvent) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .expect("timed out waiting for a stream event")
                .expect("event channel open");
            if let Some(found) = pick(event) {
                return found;
            }
        }
    }
}

pub fn node(id: &str) -> Option<Node> {
    Some(Node {
        id: id.to_owned(),
        ..Default::default()
    })
}

pub fn node_with_metadata(id: &str, metadata: Struct) -> Option<Node> {
    Some(Node {
        id: id.to_owned(),
        metadata: Some(metadata),
        ..Default::default()
    })
}

pub fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|name| (*name).to_owned()).collect()
}

pub fn authorized<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII token"),
    );
    request
}

/// A state-of-the-world stream driven request by request.
pub struct Sotw {
    pub tx: mpsc::Sender<DiscoveryRequest>,
    pub rx: Streaming<DiscoveryResponse>,
}

impl Sotw {
    /// Opens a stream with `first` as its first request. Errors from the call itself
    /// (authentication) are returned.
    pub async fn open(
        channel: Channel,
        token: Option<&str>,
        first: DiscoveryRequest,
    ) -> Result<Self, Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.expect("queue open");
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII token"),
            );
        }
        let rx = SecretDiscoveryServiceClient::new(channel)
            .stream_secrets(request)
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    pub async fn send(&self, request: DiscoveryRequest) {
        self.tx.send(request).await.expect("stream open");
    }

    /// The next response, or the status that ended the stream.
    pub async fn recv(&mut self) -> Result<DiscoveryResponse, Status> {
        match tokio::time::timeout(WAIT, self.rx.message()).await {
            Err(_) => panic!("timed out waiting for a response"),
            Ok(Ok(Some(response))) => Ok(response),
            Ok(Ok(None)) => Err(Status::new(Code::Ok, "stream ended")),
            Ok(Err(status)) => Err(status),
        }
    }

    pub async fn expect_response(&mut self) -> DiscoveryResponse {
        self.recv().await.expect("a response")
    }

    pub async fn ack(&self, response: &DiscoveryResponse, resource_names: &[String]) {
        self.send(DiscoveryRequest {
            version_info: response.version_info.clone(),
            resource_names: resource_names.to_vec(),
            type_url: SECRET_TYPE_URL.into(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        })
        .await;
    }

    pub async fn nack(
        &self,
        response: &DiscoveryResponse,
        resource_names: &[String],
        message: &str,
    ) {
        self.send(DiscoveryRequest {
            version_info: String::new(),
            resource_names: resource_names.to_vec(),
            type_url: SECRET_TYPE_URL.into(),
            response_nonce: response.nonce.clone(),
            error_detail: Some(RpcStatus {
                code: Code::InvalidArgument as i32,
                message: message.into(),
                details: Vec::new(),
            }),
            ..Default::default()
        })
        .await;
    }
}

pub fn first_request(node_id: &str, resource_names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        node: node(node_id),
        resource_names: names(resource_names),
        type_url: SECRET_TYPE_URL.into(),
        ..Default::default()
    }
}

/// A delta stream driven request by request.
pub struct Delta {
    pub tx: mpsc::Sender<DeltaDiscoveryRequest>,
    pub rx: Streaming<DeltaDiscoveryResponse>,
}

impl Delta {
    pub async fn open(
        channel: Channel,
        token: &str,
        first: DeltaDiscoveryRequest,
    ) -> Result<Self, Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.expect("queue open");
        let rx = SecretDiscoveryServiceClient::new(channel)
            .delta_secrets(authorized(ReceiverStream::new(rx), token))
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    pub async fn send(&self, request: DeltaDiscoveryRequest) {
        self.tx.send(request).await.expect("stream open");
    }

    pub async fn recv(&mut self) -> Result<DeltaDiscoveryResponse, Status> {
        match tokio::time::timeout(WAIT, self.rx.message()).await {
            Err(_) => panic!("timed out waiting for a delta response"),
            Ok(Ok(Some(response))) => Ok(response),
            Ok(Ok(None)) => Err(Status::new(Code::Ok, "stream ended")),
            Ok(Err(status)) => Err(status),
        }
    }
}

/// Decodes the secrets of a response, by name.
pub fn secrets(response: &DiscoveryResponse) -> BTreeMap<String, Secret> {
    decode_secrets(response)
        .expect("decodable secrets")
        .into_iter()
        .map(|secret| (secret.name.clone(), secret))
        .collect()
}

pub fn decode_any(any: &envoy_types::pb::google::protobuf::Any) -> Secret {
    assert_eq!(any.type_url, SECRET_TYPE_URL);
    Secret::decode(any.value.as_slice()).expect("decodable secret")
}
