//! The agent protocol's server side, over a unix socket beside SDS, against an SDS server built by hand:
//! snapshots published here, stream events read here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_agent_server::proto::{
    agent_message, paths, Ack, AgentMessage, AgentState, Hello, JwtSvidRequest, JwtSvidResponse,
    KeyRequest, KeyRequests, OpenStreams,
};
use meshca_agent_server::{AgentOptions, AgentServer};
use meshca_auth::{Claims, ProxyType, RevocationList, SigningKey, CLOCK_SKEW_LEEWAY_SECS};
use meshca_control::{
    Changed, LeafKey, MeshView, ProxyEntry, ProxyIdentity, ProxyKey, Registration, Registrations,
    SecretPem, Snapshot, StreamEvent, StreamId, TrustBundle,
};
use meshca_identity::KeyAlgorithm;
use meshca_sds::SdsServer;
use meshca_serve::{bind, connect_channel, ConnPolicy, Hub, HubOptions, Listener};
use meshca_workload::jwt_keys::JwtKeys;
use meshca_workload::WorkloadOptions;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};
use tonic_prost::ProstCodec;

/// How long a test waits for anything before failing.
const WAIT: Duration = Duration::from_secs(10);

const AGENT: &str = "host-a";

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the test clock is after 1970")
        .as_secs()
}

/// A CA for trust domain `default.zone`: its PEM and an issuer.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Ca {
        let key = KeyPair::generate().expect("a CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.subject_alt_names = vec![SanType::URI(
            "spiffe://default.zone".try_into().expect("a URI"),
        )];
        let pem = params.self_signed(&key).expect("self-signed").pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `spiffe_id` over `key`, as PEM.
    fn leaf(&self, spiffe_id: &str, key: &KeyPair) -> String {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![SanType::URI(spiffe_id.try_into().expect("a URI"))];
        params.signed_by(key, &self.issuer).expect("a leaf").pem()
    }
}

/// A certificate signing request for `key`, naming `uris` as URI SANs.
fn csr(key: &KeyPair, uris: &[&str]) -> Vec<u8> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.subject_alt_names = uris
        .iter()
        .map(|u| SanType::URI((*u).try_into().expect("a URI")))
        .collect();
    params
        .serialize_request(key)
        .expect("a request")
        .der()
        .to_vec()
}

fn der_of(pem_text: &str) -> Vec<Vec<u8>> {
    pem::parse_many(pem_text)
        .expect("PEM")
        .into_iter()
        .map(pem::Pem::into_contents)
        .collect()
}

fn registration(name: &str, dataplane: &str, agent: Option<&str>) -> Registration {
    Registration {
        name: name.into(),
        proxy: ProxyKey::new("default", dataplane),
        selectors: vec!["unix:uid:1001".parse().expect("a selector")],
        agent: agent.map(str::to_owned),
        hint: None,
        jwt_svid_expiry: Duration::from_secs(300),
        labels: Default::default(),
    }
}

/// The mesh: `web` (Dataplane web-1, an identity over the agent's key), `web2` (web-2, an identity
/// whose key meshca holds), `db` (db-1, no identity), all of agent host-a; `other` (other-1) of agent
/// host-b; `local` (web-1) of the server's own socket.
struct World {
    ca: Ca,
    agent_key: KeyPair,
    web1: Arc<ProxyIdentity>,
    trust: Arc<TrustBundle>,
}

impl World {
    fn new() -> World {
        let ca = Ca::new();
        let agent_key = KeyPair::generate().expect("the agent's key");
        let public = meshca_ca::csr_public_key(&csr(&agent_key, &[])).expect("a key");
        let web1 = Arc::new(ProxyIdentity {
            spiffe_id: "spiffe://default.zone/web-1".into(),
            identity_name: None,
            chain_pem: ca.leaf("spiffe://default.zone/web-1", &agent_key),
            key: LeafKey::Agent(Arc::new(public)),
        });
        let trust = Arc::new(TrustBundle::new(BTreeMap::from([(
            "default.zone".to_owned(),
            vec![ca.pem.clone()],
        )])));
        World {
            ca,
            agent_key,
            web1,
            trust,
        }
    }

    fn registrations() -> Vec<Registration> {
        vec![
            registration("web", "web-1", Some(AGENT)),
            registration("web2", "web-2", Some(AGENT)),
            registration("db", "db-1", Some(AGENT)),
            registration("other", "other-1", Some("host-b")),
            registration("local", "web-1", None),
        ]
    }

    fn snapshot(&self, generation: u64, registrations: Vec<Registration>) -> Snapshot {
        let held_key = KeyPair::generate().expect("a key");
        let web2 = Arc::new(ProxyIdentity {
            spiffe_id: "spiffe://default.zone/web-2".into(),
            identity_name: None,
            chain_pem: self.ca.leaf("spiffe://default.zone/web-2", &held_key),
            key: LeafKey::Held(SecretPem::new(held_key.serialize_pem())),
        });
        let mut snapshot = Snapshot::empty();
        snapshot.generation = generation;
        snapshot.proxies = [
            (
                ProxyKey::new("default", "web-1"),
                ProxyEntry::Ready(self.web1.clone()),
            ),
            (ProxyKey::new("default", "web-2"), ProxyEntry::Ready(web2)),
            (
                ProxyKey::new("default", "db-1"),
                ProxyEntry::NoIdentity {
                    reason: "no MeshIdentity selects it".into(),
                },
            ),
            (
                ProxyKey::new("default", "other-1"),
                ProxyEntry::Ready(self.web1.clone()),
            ),
        ]
        .into_iter()
        .collect();
        std::sync::Arc::make_mut(&mut snapshot.meshes).insert(
            "default".into(),
            MeshView {
                trust: self.trust.clone(),
                mesh_services: Default::default(),
                federated: std::sync::Arc::from(Vec::new()),
            },
        );
        snapshot.all = self.trust.clone();
        snapshot.registrations = Arc::new(Registrations::new(registrations));
        snapshot
    }
}

/// The snapshot after `previous` that changes only `proxy`'s entry, and nothing of the agent's.
fn unrelated_change(previous: &Snapshot) -> Snapshot {
    let mut next = previous.clone();
    next.generation = previous.generation + 1;
    let other = ProxyKey::new("default", "unrelated");
    next.proxies.insert(other.clone(), ProxyEntry::Pending);
    next.changed = Changed::after(previous, Some(Arc::from(vec![other])));
    next
}

struct Harness {
    world: World,
    snapshots: watch::Sender<Arc<Snapshot>>,
    revocations: watch::Sender<Arc<RevocationList>>,
    events: mpsc::Receiver<StreamEvent>,
    signing: SigningKey,
    agent: AgentServer,
    jwt_keys: JwtKeys,
    channel: Channel,
    shutdown: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Harness {
    async fn start() -> Harness {
        Harness::start_with(AgentOptions::new(KeyAlgorithm::EcdsaP256)).await
    }

    async fn start_with(options: AgentOptions) -> Harness {
        let world = World::new();
        let dir = tempfile::tempdir().expect("a temp dir");
        let socket = dir.path().join("sds.sock");
        let (snapshots, snapshot_rx) =
            watch::channel(Arc::new(world.snapshot(1, World::registrations())));
        let (revocations, revocation_rx) = watch::channel(Arc::new(RevocationList::new()));
        let (event_tx, events) = mpsc::channel(meshca_serve::EVENT_BUFFER);
        let (signing, _pkcs8) = SigningKey::generate().expect("a token key");
        let sds = SdsServer::on(Hub::new(
            snapshot_rx,
            signing.verifier(),
            revocation_rx,
            event_tx,
            HubOptions::default().with_identity_wait(Duration::from_secs(5)),
        ));
        let jwt_keys = JwtKeys::load(
            Arc::new(meshca_keystore::MemoryKeystore::new()),
            &WorkloadOptions {
                ack_after: Duration::ZERO,
                ..WorkloadOptions::default()
            },
        )
        .await
        .expect("JWT keys");
        let agent = AgentServer::new(sds.hub().clone(), jwt_keys.clone(), options);
        let bound = bind(vec![Listener::Unix(socket.clone())])
            .await
            .expect("bind");
        let shutdown = CancellationToken::new();
        let routes = tonic::service::Routes::new(sds.clone().into_service())
            .add_service(agent.clone().into_service());
        let policy = ConnPolicy::new("SDS", "limits.sdsConnections", sds.limits().clone());
        let closer = sds.clone();
        tokio::spawn(bound.serve_service(
            routes,
            policy,
            move || closer.close_streams(),
            shutdown.clone(),
        ));
        let channel = connect_channel(&format!("unix://{}", socket.display()), None)
            .await
            .expect("connect");
        Harness {
            world,
            snapshots,
            revocations,
            events,
            signing,
            agent,
            jwt_keys,
            channel,
            shutdown,
            _dir: dir,
        }
    }

    fn token(&self, claims: &Claims) -> String {
        self.signing.mint(claims).expect("a token")
    }

    fn agent_token(&self, name: &str) -> (String, Claims) {
        let claims =
            Claims::new_agent(name, Duration::from_secs(3600), now_unix()).expect("claims");
        (self.token(&claims), claims)
    }

    fn publish(&self, snapshot: Snapshot) {
        self.snapshots.send_replace(Arc::new(snapshot));
    }

    fn current(&self) -> Arc<Snapshot> {
        self.snapshots.borrow().clone()
    }

    /// Opens `Sync` with `token`; the agent's first message is Hello unless `first` is given.
    async fn sync(
        &self,
        token: Option<&str>,
        first: Option<AgentMessage>,
    ) -> Result<Agent, Status> {
        let (tx, rx) = mpsc::channel(16);
        let first = first.unwrap_or(AgentMessage {
            message: Some(agent_message::Message::Hello(Hello {
                protocol: 1,
                agent_version: "test".into(),
            })),
        });
        tx.send(first).await.expect("queue open");
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII"),
            );
        }
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.expect("channel ready");
        let response = grpc
            .streaming(
                request,
                PathAndQuery::from_static(paths::SYNC),
                ProstCodec::<AgentMessage, AgentState>::default(),
            )
            .await?;
        Ok(Agent {
            tx,
            rx: response.into_inner(),
        })
    }

    async fn mint(&self, token: &str, registration: &str) -> Result<String, Status> {
        let mut request = tonic::Request::new(JwtSvidRequest {
            mesh: "default".into(),
            registration: registration.into(),
            audience: vec!["db".into()],
        });
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ASCII"),
        );
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.expect("channel ready");
        let response = grpc
            .unary(
                request,
                PathAndQuery::from_static(paths::MINT_JWT_SVID),
                ProstCodec::<JwtSvidRequest, JwtSvidResponse>::default(),
            )
            .await?;
        Ok(response.into_inner().token)
    }

    /// Waits for the first event `pick` takes, discarding others.
    async fn event<T>(&mut self, mut pick: impl FnMut(StreamEvent) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .expect("timed out waiting for a stream event")
                .expect("the event channel is open");
            if let Some(found) = pick(event) {
                return found;
            }
        }
    }

    /// The streams connected for Dataplanes, by Dataplane name, once `count` have connected.
    async fn connected(&mut self, count: usize) -> BTreeMap<String, StreamId> {
        let mut streams = BTreeMap::new();
        while streams.len() < count {
            let (name, id) = self
                .event(|e| match e {
                    StreamEvent::Connected { stream, claims } => {
                        Some((claims.name.clone(), stream))
                    }
                    _ => None,
                })
                .await;
            streams.insert(name, id);
        }
        streams
    }

    /// Waits until each of `streams` was reported ACKed at `generation`.
    async fn acked_at(&mut self, streams: impl IntoIterator<Item = StreamId>, generation: u64) {
        let mut waiting: std::collections::BTreeSet<StreamId> = streams.into_iter().collect();
        while !waiting.is_empty() {
            let (stream, acked) = self
                .event(|e| match e {
                    StreamEvent::Acked {
                        stream, generation, ..
                    } => Some((stream, generation)),
                    _ => None,
                })
                .await;
            assert!(acked <= generation, "ACKed {acked}, past {generation}");
            if acked == generation {
                waiting.remove(&stream);
            }
        }
    }

    /// Every event received so far.
    fn drain(&mut self) -> Vec<StreamEvent> {
        let mut out = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            out.push(event);
        }
        out
    }
}

/// The agent's end of a `Sync` stream.
struct Agent {
    tx: mpsc::Sender<AgentMessage>,
    rx: Streaming<AgentState>,
}

impl Agent {
    async fn recv(&mut self) -> Result<AgentState, Status> {
        match tokio::time::timeout(WAIT, self.rx.message()).await {
            Ok(Ok(Some(state))) => Ok(state),
            Ok(Ok(None)) => panic!("the stream ended without a status"),
            Ok(Err(status)) => Err(status),
            Err(_) => panic!("no state within {WAIT:?}"),
        }
    }

    async fn state(&mut self) -> AgentState {
        self.recv().await.expect("a state")
    }

    async fn refused(&mut self) -> Status {
        self.recv().await.expect_err("the stream ends")
    }

    async fn send(&self, message: agent_message::Message) {
        self.tx
            .send(AgentMessage {
                message: Some(message),
            })
            .await
            .expect("the stream is open");
    }

    async fn ack(&self, version: u64) {
        self.send(agent_message::Message::Ack(Ack {
            version,
            streams: vec![OpenStreams {
                mesh: "default".into(),
                registration: "web".into(),
                streams: 3,
            }],
        }))
        .await;
    }

    async fn keys(&self, requests: Vec<KeyRequest>) {
        self.send(agent_message::Message::Keys(KeyRequests { requests }))
            .await;
    }
}

fn key_request(registration: &str, csr: Vec<u8>) -> KeyRequest {
    KeyRequest {
        mesh: "default".into(),
        registration: registration.into(),
        csr,
        replace_now: true,
    }
}

fn names(state: &AgentState) -> Vec<&str> {
    state
        .registrations
        .iter()
        .map(|r| r.name.as_str())
        .collect()
}

#[tokio::test]
async fn a_call_without_an_agent_token_is_refused() {
    let h = Harness::start().await;
    let status = h.sync(None, None).await.err().expect("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");

    let dataplane = Claims::new(
        ProxyType::Dataplane,
        "default",
        "web-1",
        BTreeMap::new(),
        BTreeMap::new(),
        Duration::from_secs(3600),
        now_unix(),
    )
    .expect("claims");
    let token = h.token(&dataplane);
    let status = h.sync(Some(&token), None).await.err().expect("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("not an agent token"),
        "{status:?}"
    );
    let status = h.mint(&token, "web").await.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");

    // A token another server signed.
    let (other, _) = SigningKey::generate().expect("a key");
    let foreign = other
        .mint(&Claims::new_agent(AGENT, Duration::from_secs(60), now_unix()).expect("claims"))
        .expect("a token");
    let status = h.sync(Some(&foreign), None).await.err().expect("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

#[tokio::test]
async fn the_first_message_must_be_a_hello_of_protocol_1() {
    let h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let ack = AgentMessage {
        message: Some(agent_message::Message::Ack(Ack {
            version: 1,
            streams: vec![],
        })),
    };
    let mut agent = h.sync(Some(&token), Some(ack)).await.expect("opened");
    assert_eq!(agent.refused().await.code(), Code::InvalidArgument);

    let hello2 = AgentMessage {
        message: Some(agent_message::Message::Hello(Hello {
            protocol: 2,
            agent_version: String::new(),
        })),
    };
    let mut agent = h.sync(Some(&token), Some(hello2)).await.expect("opened");
    let status = agent.refused().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("protocol 2"), "{status:?}");
}

#[tokio::test]
async fn the_first_state_holds_the_agents_registrations_only() {
    let mut h = Harness::start().await;
    let (token, claims) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    let state = agent.state().await;
    assert_eq!(state.version, 1, "the snapshot's generation");
    // By name: another agent's registration and the server's own socket's are not there.
    assert_eq!(names(&state), ["db", "web", "web2"]);

    let web = &state.registrations[1];
    assert_eq!(web.dataplane, "web-1");
    assert_eq!(web.selectors, ["unix:uid:1001"]);
    assert_eq!(web.key_algorithm, "ecdsa-p256");
    assert_eq!(web.jwt_svid_seconds, 300);
    assert!(web.wants_key, "no key was offered on this stream");
    let identity = web
        .identity
        .as_ref()
        .expect("an identity over the agent's key");
    assert_eq!(identity.spiffe_id, "spiffe://default.zone/web-1");
    assert_eq!(identity.certificate_chain, der_of(&h.world.web1.chain_pem));
    assert_eq!(
        identity.key_id,
        meshca_agent_server::proto::key_id(rcgen::PublicKeyData::der_bytes(&h.world.agent_key))
    );

    let web2 = &state.registrations[2];
    assert!(
        web2.identity.is_none(),
        "its key is meshca's, not the agent's"
    );
    assert!(web2.no_identity.is_empty(), "one is coming");
    let db = &state.registrations[0];
    assert!(db.identity.is_none());
    assert_eq!(db.no_identity, "no MeshIdentity selects it");

    assert_eq!(
        state.all["default.zone"].authorities,
        der_of(&h.world.ca.pem)
    );
    assert_eq!(
        state.meshes["default"].by_trust_domain["default.zone"].authorities,
        der_of(&h.world.ca.pem)
    );

    // The owner hears of one stream per registration, each subscribed.
    let streams = h.connected(3).await;
    assert_eq!(
        streams.keys().collect::<Vec<_>>(),
        ["db-1", "web-1", "web-2"]
    );
    let status = h.agent.agents().list();
    assert_eq!(status.len(), 1);
    assert_eq!(status[0].name, AGENT);
    assert_eq!(status[0].token_id, claims.id);
    assert_eq!(status[0].protocol, 1);
    assert_eq!(status[0].last_sent, Some(1));
    assert_eq!(status[0].registrations.len(), 3);
}

#[tokio::test]
async fn acks_are_reported_for_every_registration_stream() {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    let state = agent.state().await;
    let streams = h.connected(3).await;

    agent.ack(state.version).await;
    h.acked_at(streams.values().copied(), 1).await;

    // A snapshot that changes nothing of the agent's: the acknowledged state stands for it too.
    h.publish(unrelated_change(&h.current()));
    h.acked_at(streams.values().copied(), 2).await;

    // The status counts the workload streams the acknowledgement named.
    let status = h.agent.agents().list();
    assert_eq!(status[0].last_acked, Some(1));
    let web = status[0]
        .registrations
        .iter()
        .find(|r| r.name == "web")
        .expect("web");
    assert_eq!(web.workload_streams, 3);

    // A version this stream never sent ends it.
    agent.ack(99).await;
    assert_eq!(agent.refused().await.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_snapshot_touching_the_agent_without_changing_its_content_sends_nothing() {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    let state = agent.state().await;
    let streams = h.connected(3).await;
    agent.ack(state.version).await;
    h.acked_at(streams.values().copied(), 1).await;

    // web-1 is named as changed, but every entry and bundle is the one the state was built from:
    // the acknowledged state stands for generation 2, and no state is sent for it.
    let web1 = ProxyKey::new("default", "web-1");
    let first = h.current();
    let mut second = (*first).clone();
    second.generation = 2;
    second.changed = Changed::after(&first, Some(Arc::from(vec![web1.clone()])));
    h.publish(second.clone());
    h.acked_at(streams.values().copied(), 2).await;

    // web-1 renewed over the same key: the next state carries the new chain, and web's part only
    // changed.
    let renewed_pem = h
        .world
        .ca
        .leaf("spiffe://default.zone/web-1", &h.world.agent_key);
    let renewed = Arc::new(ProxyIdentity {
        chain_pem: renewed_pem.clone(),
        ..(*h.world.web1).clone()
    });
    let mut third = second.clone();
    third.generation = 3;
    third
        .proxies
        .insert(web1.clone(), ProxyEntry::Ready(renewed));
    third.changed = Changed::after(&second, Some(Arc::from(vec![web1])));
    h.publish(third);
    let next = agent.state().await;
    assert_eq!(next.version, 3, "no state was sent for generation 2");
    let part = |state: &AgentState, name: &str| {
        state
            .registrations
            .iter()
            .find(|r| r.name == name)
            .cloned()
            .expect("the registration")
    };
    let web = part(&next, "web");
    assert_eq!(
        web.identity.expect("an identity").certificate_chain,
        der_of(&renewed_pem)
    );
    assert_ne!(part(&state, "web"), part(&next, "web"));
    assert_eq!(part(&state, "web2"), part(&next, "web2"));
    assert_eq!(part(&state, "db"), part(&next, "db"));
    assert_eq!(state.all, next.all);
    assert_eq!(state.meshes, next.meshes);
}

#[tokio::test]
async fn an_unchanged_state_not_yet_acknowledged_is_acked_for_the_newer_generation() {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    let state = agent.state().await;
    let streams = h.connected(3).await;
    let second = unrelated_change(&h.current());
    h.publish(second.clone());
    // The change reached the stream once a later one that concerns it is sent: then the state for
    // generation 2 went unsent, as it should.
    let mut third = h.world.snapshot(3, World::registrations()[..2].to_vec());
    third.changed = Changed::after(&second, None);
    agent.ack(state.version).await;
    h.acked_at(streams.values().copied(), 2).await;

    // A registration removed: its stream is disconnected, and the next state leaves it out.
    h.publish(third);
    let next = agent.state().await;
    assert_eq!(next.version, 3);
    assert_eq!(names(&next), ["web", "web2"]);
    let gone = h
        .event(|e| match e {
            StreamEvent::Disconnected { stream } => Some(stream),
            _ => None,
        })
        .await;
    assert_eq!(gone, streams["db-1"]);

    // The stream's end disconnects the others.
    drop(agent);
    let mut left = vec![
        h.event(|e| match e {
            StreamEvent::Disconnected { stream } => Some(stream),
            _ => None,
        })
        .await,
        h.event(|e| match e {
            StreamEvent::Disconnected { stream } => Some(stream),
            _ => None,
        })
        .await,
    ];
    left.sort();
    let mut expected = vec![streams["web-1"], streams["web-2"]];
    expected.sort();
    assert_eq!(left, expected);
}

#[tokio::test]
async fn a_good_key_request_is_offered_to_the_owner_for_its_registrations_stream() {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    agent.state().await;
    let streams = h.connected(3).await;

    let next_key = KeyPair::generate().expect("a key");
    // Naming the registration's own SPIFFE ID is allowed; naming none too.
    agent
        .keys(vec![
            key_request("web", csr(&next_key, &["spiffe://default.zone/web-1"])),
            key_request("web2", csr(&next_key, &[])),
        ])
        .await;
    let offered = h
        .event(|e| match e {
            StreamEvent::KeyOffered {
                stream,
                key,
                replace_now,
            } => Some((stream, key, replace_now)),
            _ => None,
        })
        .await;
    assert_eq!(offered.0, streams["web-1"]);
    assert_eq!(offered.1.raw(), rcgen::PublicKeyData::der_bytes(&next_key));
    assert!(offered.2, "replace_now is passed on");
    let second = h
        .event(|e| match e {
            StreamEvent::KeyOffered { stream, .. } => Some(stream),
            _ => None,
        })
        .await;
    assert_eq!(second, streams["web-2"]);

    // The state says the server holds a key for the next certificates now.
    let state = agent.state().await;
    assert!(state.version > 1, "versions grow: {}", state.version);
    let wants: Vec<bool> = state.registrations.iter().map(|r| r.wants_key).collect();
    assert_eq!(wants, [true, false, false], "db, web, web2");

    // Once the owner certified the offered key, the registration wants the next one.
    let mut certified = (*h.current()).clone();
    certified.generation = 2;
    certified.changed = Changed::after(&h.current(), None);
    let web1 = ProxyIdentity {
        spiffe_id: "spiffe://default.zone/web-1".into(),
        identity_name: None,
        chain_pem: h.world.ca.leaf("spiffe://default.zone/web-1", &next_key),
        key: LeafKey::Agent(offered.1.clone()),
    };
    certified.proxies.insert(
        ProxyKey::new("default", "web-1"),
        ProxyEntry::Ready(Arc::new(web1)),
    );
    h.publish(certified);
    let state = agent.state().await;
    let wants: Vec<bool> = state.registrations.iter().map(|r| r.wants_key).collect();
    assert_eq!(wants, [true, true, false], "db, web, web2");
    let web = &state.registrations[1];
    assert_eq!(
        web.identity.as_ref().map(|i| i.key_id.clone()),
        Some(meshca_agent_server::proto::key_id(
            rcgen::PublicKeyData::der_bytes(&next_key)
        ))
    );

    // A request for another agent's registration is ignored (the registration may have moved), and the
    // stream goes on. A key offered already (an agent sends its request again when a state that
    // crossed it still asks for a key) is not offered again and sends no state: the next event and
    // state are the new key's.
    let last = state.version;
    let after_next = KeyPair::generate().expect("a key");
    agent
        .keys(vec![key_request("other", csr(&next_key, &[]))])
        .await;
    agent
        .keys(vec![key_request("web2", csr(&next_key, &[]))])
        .await;
    agent
        .keys(vec![key_request("web", csr(&after_next, &[]))])
        .await;
    let third = h
        .event(|e| match e {
            StreamEvent::KeyOffered { stream, key, .. } => Some((stream, key)),
            _ => None,
        })
        .await;
    assert_eq!(third.0, streams["web-1"], "web2's key was offered already");
    assert_eq!(third.1.raw(), rcgen::PublicKeyData::der_bytes(&after_next));
    let state = agent.state().await;
    assert_eq!(
        state.version,
        last + 1,
        "no state for the key offered again"
    );
    assert_eq!(h.agent.ignored_key_requests(), 1);
}

/// Sends `request` on a new stream of agent host-a; the stream must end with INVALID_ARGUMENT naming
/// `reason`, and no key is offered.
async fn refused_request(request: KeyRequest, reason: &str) {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    agent.state().await;
    let registration = request.registration.clone();
    agent.keys(vec![request]).await;
    let status = agent.refused().await;
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains(&registration) && status.message().contains(reason),
        "{status:?}"
    );
    assert!(
        !h.drain()
            .iter()
            .any(|e| matches!(e, StreamEvent::KeyOffered { .. })),
        "nothing was offered"
    );
}

#[tokio::test]
async fn a_request_with_a_bad_signature_is_refused() {
    let key = KeyPair::generate().expect("a key");
    let mut forged = csr(&key, &[]);
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    refused_request(key_request("web", forged), "signature").await;
}

#[tokio::test]
async fn a_request_for_a_key_of_another_algorithm_is_refused() {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("a key");
    refused_request(key_request("web", csr(&key, &[])), "ecdsa-p384").await;
}

#[tokio::test]
async fn a_request_naming_another_spiffe_id_is_refused() {
    let key = KeyPair::generate().expect("a key");
    refused_request(
        key_request("web", csr(&key, &["spiffe://default.zone/db-1"])),
        "spiffe://default.zone/db-1",
    )
    .await;
}

#[tokio::test]
async fn a_request_naming_a_spiffe_id_before_the_registration_has_one_is_refused() {
    let key = KeyPair::generate().expect("a key");
    refused_request(
        key_request("db", csr(&key, &["spiffe://default.zone/db-1"])),
        "no identity yet",
    )
    .await;
}

#[tokio::test]
async fn a_revoked_token_ends_the_stream() {
    let h = Harness::start().await;
    let (token, claims) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    agent.state().await;
    let list = RevocationList::parse(&format!("{}\n", claims.id)).expect("a list");
    h.revocations.send_replace(Arc::new(list));
    let status = agent.refused().await;
    assert_eq!(
        status.code(),
        Code::Unauthenticated,
        "as SDS ends a revoked proxy's stream: {status:?}"
    );
    assert!(status.message().contains("revoked"), "{status:?}");
    // And it cannot come back.
    let status = h.sync(Some(&token), None).await.err().expect("refused");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
}

#[tokio::test]
async fn an_expired_token_ends_the_stream() {
    let h = Harness::start().await;
    // Accepted now (within the verifier's leeway), expired two seconds from now at the latest.
    let issued = now_unix() - 3600 - CLOCK_SKEW_LEEWAY_SECS + 2;
    let claims = Claims::new_agent(AGENT, Duration::from_secs(3600), issued).expect("claims");
    let token = h.token(&claims);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    agent.state().await;
    let status = agent.refused().await;
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("expired"), "{status:?}");
}

#[tokio::test]
async fn an_agent_holds_at_most_its_limit_of_streams() {
    let h =
        Harness::start_with(AgentOptions::new(KeyAlgorithm::EcdsaP256).with_streams_per_agent(1))
            .await;
    let (token, _) = h.agent_token(AGENT);
    let mut first = h.sync(Some(&token), None).await.expect("opened");
    first.state().await;
    let status = h.sync(Some(&token), None).await.err().expect("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("limits.agentStreamsPerAgent"),
        "{status:?}"
    );
    // Another agent has its own.
    let (other, _) = h.agent_token("host-b");
    let mut second = h.sync(Some(&other), None).await.expect("opened");
    assert_eq!(names(&second.state().await), ["other"]);
}

#[tokio::test]
async fn jwt_svids_are_minted_for_the_agents_registrations_only() {
    let h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let jwt = h.mint(&token, "web").await.expect("minted");
    let keys = h.agent_keys_current();
    let validated = meshca_workload::jwt::validate(
        &jwt,
        "db",
        &|td: &str, kid: &str| keys.get(td, kid),
        now_unix(),
    )
    .expect("a valid JWT-SVID");
    assert_eq!(validated.spiffe_id.as_str(), "spiffe://default.zone/web-1");

    let status = h.mint(&token, "other").await.expect_err("refused");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let status = h.mint(&token, "db").await.expect_err("no identity");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
}

impl Harness {
    fn agent_keys_current(&self) -> Arc<meshca_workload::jwt_keys::KeySet> {
        self.jwt_keys.current()
    }
}

#[tokio::test]
async fn an_ack_of_a_superseded_state_is_taken_quietly() {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    assert_eq!(agent.state().await.version, 1);
    let streams = h.connected(3).await;
    let mut second = (*h.current()).clone();
    second.generation = 2;
    second.changed = Changed::after(&h.current(), None);
    second
        .proxies
        .insert(ProxyKey::new("default", "db-1"), ProxyEntry::Pending);
    h.publish(second);
    let state = agent.state().await;
    assert_eq!(state.version, 2);
    assert!(
        state.registrations[0].no_identity.is_empty(),
        "db is pending"
    );
    agent.ack(2).await;
    h.acked_at(streams.values().copied(), 2).await;
    // Version 1 was sent, and version 2 superseded it.
    agent.ack(1).await;
    agent.ack(99).await;
    let status = agent.refused().await;
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("99"), "{status:?}");
    assert!(
        !h.drain()
            .iter()
            .any(|e| matches!(e, StreamEvent::Acked { generation: 1, .. })),
        "nothing is acknowledged backwards"
    );
}

#[tokio::test]
async fn a_registration_linked_anew_is_sent_a_state_even_if_it_looks_the_same() {
    let mut h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    let first = agent.state().await;
    let streams = h.connected(3).await;
    // The Dataplane's labels changed: what the agent is sent does not show them, but the owner must
    // hear of the stream anew (its claims select the MeshIdentity).
    let mut registrations = World::registrations();
    registrations[0].labels = Arc::new(meshca_auth::LabelMap::from([(
        "team".to_owned(),
        "a".to_owned(),
    )]));
    let mut second = (*h.current()).clone();
    second.generation = 2;
    second.changed = Changed::after(&h.current(), None);
    second.registrations = Arc::new(Registrations::new(registrations));
    h.publish(second);
    let gone = h
        .event(|e| match e {
            StreamEvent::Disconnected { stream } => Some(stream),
            _ => None,
        })
        .await;
    assert_eq!(gone, streams["web-1"]);
    let anew = h.connected(1).await;
    let state = agent.state().await;
    assert_eq!(state.version, 2);
    assert_eq!(state.registrations, first.registrations);
    agent.ack(2).await;
    h.acked_at([anew["web-1"], streams["web-2"], streams["db-1"]], 2)
        .await;
}

#[tokio::test]
async fn a_new_jwt_signing_key_is_sent_to_the_agent() {
    let h = Harness::start().await;
    let (token, _) = h.agent_token(AGENT);
    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    let first = agent.state().await;
    assert!(first.jwt_bundles.is_empty(), "no JWT key was made yet");
    // Minting makes the trust domain's first key.
    h.mint(&token, "web").await.expect("minted");
    let state = agent.state().await;
    assert_eq!(state.version, 2, "one generation, sent twice");
    let document = meshca_workload::jwt::JwksDocument::parse(&state.jwt_bundles["default.zone"])
        .expect("a JWK Set");
    assert_eq!(
        document.keys().len(),
        h.jwt_keys.current().by_trust_domain()["default.zone"]
            .keys()
            .len()
    );
}

#[tokio::test]
async fn too_many_key_requests_in_one_message_or_too_large_a_message_end_the_stream() {
    let h = Harness::start_with(
        AgentOptions::new(KeyAlgorithm::EcdsaP256).with_message_bytes(64 * 1024),
    )
    .await;
    let (token, _) = h.agent_token(AGENT);
    let key = KeyPair::generate().expect("a key");
    let one = csr(&key, &[]);

    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    agent.state().await;
    agent.keys(vec![key_request("web", one.clone()); 65]).await;
    let status = agent.refused().await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    let mut agent = h.sync(Some(&token), None).await.expect("opened");
    agent.state().await;
    agent
        .keys(vec![key_request("web", vec![0; 64 * 1024])])
        .await;
    let status = agent.refused().await;
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
}
