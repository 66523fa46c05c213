//! `meshca agent` against fake servers written here: what it sends, what it serves on its socket,
//! when it acknowledges, and how it fails over.

use std::collections::HashMap;
use std::convert::Infallible;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use futures::stream::{BoxStream, StreamExt};
use meshca_agent::proto::{
    agent_message, paths, AgentMessage, AgentState, Identity, JwtSvidRequest, JwtSvidResponse,
    MeshTrust, Registration, X509Bundle,
};
use meshca_agent::{AgentConfig, AgentStatus, ServerAddr};
use meshca_auth::{Claims, SigningKey};
use meshca_ca::{CaParams, CertificateAuthority, KeyAlgorithm, SvidRequest};
use meshca_identity::{SpiffeId, TrustDomain};
use meshca_workload::client::WorkloadClient;
use meshca_workload::jwt::{JwksDocument, JwtSigningKey};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::{UnboundedReceiverStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::Status;
use tonic_prost::ProstCodec;

/// How long any one step may take before the test fails (a bound, never a wait).
const STEP: Duration = Duration::from_secs(20);

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// One `Sync` stream the fake server accepted.
struct Conn {
    incoming: tonic::Streaming<AgentMessage>,
    outgoing: mpsc::UnboundedSender<Result<AgentState, Status>>,
    authorization: String,
}

impl Conn {
    async fn recv(&mut self) -> agent_message::Message {
        within("a message from the agent", self.incoming.message())
            .await
            .expect("the agent's stream is healthy")
            .expect("the agent sent a message")
            .message
            .expect("a message with content")
    }

    fn send(&self, state: AgentState) {
        self.outgoing.send(Ok(state)).expect("the stream is open");
    }

    fn end(&self, status: Status) {
        self.outgoing.send(Err(status)).expect("the stream is open");
    }
}

/// A fake meshca server: it hands every `Sync` stream to the test, and signs JWT-SVIDs with its key.
#[derive(Clone)]
struct Fake {
    conns: mpsc::UnboundedSender<Conn>,
    jwt_key: Arc<JwtSigningKey>,
}

impl NamedService for Fake {
    const NAME: &'static str = paths::SERVICE;
}

impl Service<http::Request<tonic::body::Body>> for Fake {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let conns = self.conns.clone();
        let jwt_key = self.jwt_key.clone();
        Box::pin(async move {
            match request.uri().path() {
                paths::SYNC => Ok(Grpc::new(ProstCodec::<AgentState, AgentMessage>::default())
                    .streaming(Sync { conns }, request)
                    .await),
                paths::MINT_JWT_SVID => Ok(Grpc::new(
                    ProstCodec::<JwtSvidResponse, JwtSvidRequest>::default(),
                )
                .unary(Mint { key: jwt_key }, request)
                .await),
                _ => Ok(Status::unimplemented("not in the fake").into_http()),
            }
        })
    }
}

/// `MintJwtSvid`: a token for the registration's identity, as the server would sign it.
struct Mint {
    key: Arc<JwtSigningKey>,
}

impl UnaryService<JwtSvidRequest> for Mint {
    type Response = JwtSvidResponse;
    type Future = BoxFuture<tonic::Response<JwtSvidResponse>, Status>;

    fn call(&mut self, request: tonic::Request<JwtSvidRequest>) -> Self::Future {
        let key = self.key.clone();
        Box::pin(async move {
            let request = request.into_inner();
            if (request.mesh.as_str(), request.registration.as_str()) != ("default", "billing") {
                return Err(Status::permission_denied("not this agent's registration"));
            }
            let now = now_secs();
            let token =
                meshca_workload::jwt::mint(&key, SPIFFE_ID, &request.audience, now, now + 300)
                    .map_err(|e| Status::internal(e.to_string()))?;
            Ok(tonic::Response::new(JwtSvidResponse { token }))
        })
    }
}

struct Sync {
    conns: mpsc::UnboundedSender<Conn>,
}

impl StreamingService<AgentMessage> for Sync {
    type Response = AgentState;
    type ResponseStream = BoxStream<'static, Result<AgentState, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<AgentMessage>>) -> Self::Future {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.conns.send(Conn {
            incoming: request.into_inner(),
            outgoing: tx,
            authorization,
        });
        Box::pin(async move {
            Ok(tonic::Response::new(
                UnboundedReceiverStream::new(rx).boxed(),
            ))
        })
    }
}

/// A fake server on a unix socket, until its token is cancelled.
struct FakeServer {
    socket: PathBuf,
    conns: mpsc::UnboundedReceiver<Conn>,
    stop: CancellationToken,
}

impl FakeServer {
    fn start(socket: PathBuf, jwt_key: Arc<JwtSigningKey>) -> FakeServer {
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the fake server");
        let (tx, conns) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let until = stop.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(Fake { conns: tx, jwt_key })
                .serve_with_incoming_shutdown(
                    UnixListenerStream::new(listener),
                    until.cancelled_owned(),
                )
                .await
                .expect("the fake server runs");
        });
        FakeServer {
            socket,
            conns,
            stop,
        }
    }

    fn addr(&self) -> ServerAddr {
        ServerAddr::Unix(self.socket.clone())
    }

    async fn next_conn(&mut self) -> Conn {
        within("the agent to connect", self.conns.recv())
            .await
            .expect("the fake server runs")
    }
}

const TD: &str = "example.org";
const SPIFFE_ID: &str = "spiffe://example.org/workload/billing";

fn ca() -> CertificateAuthority {
    CertificateAuthority::generate(
        &CaParams {
            trust_domain: TrustDomain::parse(TD).expect("trust domain"),
            key_algorithm: KeyAlgorithm::EcdsaP256,
            validity: Duration::from_secs(3600),
            name: "default/test".into(),
        },
        SystemTime::now(),
    )
    .expect("a CA")
}

/// The state of one registration whose callers are this process's uid.
fn state(
    version: u64,
    uid: u32,
    ca: &CertificateAuthority,
    jwt_key: &JwtSigningKey,
    identity: Option<Identity>,
) -> AgentState {
    let bundle = X509Bundle {
        authorities: vec![ca.cert_der().to_vec()],
    };
    AgentState {
        version,
        registrations: vec![Registration {
            mesh: "default".into(),
            name: "billing".into(),
            dataplane: "billing-1".into(),
            selectors: vec![format!("unix:uid:{uid}")],
            hint: String::new(),
            jwt_svid_seconds: 300,
            key_algorithm: "ecdsa-p256".into(),
            identity,
            no_identity: String::new(),
            wants_key: false,
        }],
        all: HashMap::from([(TD.to_owned(), bundle.clone())]),
        meshes: HashMap::from([(
            "default".to_owned(),
            MeshTrust {
                by_trust_domain: HashMap::from([(TD.to_owned(), bundle)]),
                federated: HashMap::new(),
            },
        )]),
        jwt_bundles: HashMap::from([(
            TD.to_owned(),
            JwksDocument::new([jwt_key.public()]).to_bytes(),
        )]),
    }
}

/// The one key request of a `KeyRequests` message, checked: its request proves the key.
fn one_request(
    message: agent_message::Message,
) -> (meshca_agent::proto::KeyRequest, meshca_ca::PublicKey) {
    let agent_message::Message::Keys(keys) = message else {
        panic!("expected key requests, got {message:?}");
    };
    assert_eq!(keys.requests.len(), 1, "{keys:?}");
    let request = keys.requests.into_iter().next().expect("one request");
    assert_eq!(
        (request.mesh.as_str(), request.registration.as_str()),
        ("default", "billing")
    );
    let public = meshca_ca::csr_public_key(&request.csr).expect("the request's signature verifies");
    (request, public)
}

fn ack_version(message: agent_message::Message) -> (u64, u32) {
    let agent_message::Message::Ack(ack) = message else {
        panic!("expected an ack, got {message:?}");
    };
    (ack.version, ack.streams.first().map_or(0, |s| s.streams))
}

fn identity_over(ca: &CertificateAuthority, public: &meshca_ca::PublicKey) -> Identity {
    let leaf = ca
        .issue_for_key(
            &SvidRequest {
                spiffe_id: SpiffeId::parse(SPIFFE_ID).expect("id"),
                key_algorithm: KeyAlgorithm::EcdsaP256,
                lifetime: Duration::from_secs(600),
            },
            public,
            SystemTime::now(),
        )
        .expect("a leaf");
    Identity {
        spiffe_id: SPIFFE_ID.into(),
        certificate_chain: leaf.chain_der,
        key_id: meshca_agent::proto::key_id(public.raw()),
    }
}

fn write_token(dir: &Path, name: &str) -> PathBuf {
    let (key, _) = SigningKey::generate().expect("a signing key");
    let claims = Claims::new_agent(name, Duration::from_secs(3600), now_secs()).expect("claims");
    let token = key.mint(&claims).expect("a token");
    let path = dir.join("agent.token");
    std::fs::write(&path, format!("{token}\n")).expect("write the token");
    path
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A one-shot HTTP/1.0 GET: the status code and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_get_as(addr, &addr.to_string(), path).await
}

/// A GET whose `Host` header is `host`.
async fn http_get_as(addr: std::net::SocketAddr, host: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = within("the admin listener", tokio::net::TcpStream::connect(addr))
        .await
        .expect("connect");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .expect("write");
    let mut raw = Vec::new();
    within("the admin response", stream.read_to_end(&mut raw))
        .await
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    (code, body.to_owned())
}

async fn wait_status(
    status: &mut watch::Receiver<AgentStatus>,
    what: &str,
    f: impl Fn(&AgentStatus) -> bool,
) {
    within(what, status.wait_for(|s| f(s)))
        .await
        .expect("the agent runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_serves_what_its_servers_certify_over_its_own_keys() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let uid = std::fs::metadata(dir.path()).expect("metadata").uid();
    let jwt_key = Arc::new(JwtSigningKey::generate().expect("a JWT key"));
    let mut first = FakeServer::start(dir.path().join("first.sock"), jwt_key.clone());
    let mut second = FakeServer::start(dir.path().join("second.sock"), jwt_key.clone());
    let mut config = AgentConfig::new(
        vec![first.addr(), second.addr()],
        write_token(dir.path(), "host-1"),
    );
    config.listen = dir.path().join("workload.sock");
    config.admin = Some("127.0.0.1:0".parse().expect("an address"));
    config.workload.ack_after = Duration::from_millis(50);
    config.backoff = (Duration::from_millis(20), Duration::from_millis(200));
    let shutdown = CancellationToken::new();
    let agent = meshca_agent::Agent::start(
        config,
        meshca_sds::SdsServer::attested_routes_on,
        shutdown.clone(),
    )
    .await
    .expect("the agent starts");
    assert_eq!(agent.name(), "host-1");
    let mut status = agent.status().subscribe();
    let ca = ca();
    let admin = agent.admin_addr().expect("an admin listener");
    let (code, body) = http_get(admin, "/ready").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("no state received"), "{body}");

    // Hello first, with the agent's token.
    let mut conn = first.next_conn().await;
    assert!(
        conn.authorization.starts_with("Bearer "),
        "{}",
        conn.authorization
    );
    let agent_message::Message::Hello(hello) = conn.recv().await else {
        panic!("the first message is Hello");
    };
    assert_eq!(hello.protocol, meshca_agent::proto::PROTOCOL_VERSION);

    // No identity yet: a key, for now.
    conn.send(state(1, uid, &ca, &jwt_key, None));
    let (request, public) = one_request(conn.recv().await);
    assert!(request.replace_now);
    assert_eq!(
        ack_version(conn.recv().await),
        (1, 0),
        "no stream open: acknowledged at once"
    );

    // A workload opens its stream; it waits for its identity.
    let client = WorkloadClient::connect(agent.socket())
        .await
        .expect("connect");
    let mut watch = client.watch_x509().await.expect("a stream");
    let first_message = tokio::spawn(async move {
        let context = watch.next().await;
        (context, watch)
    });
    wait_status(&mut status, "the workload's stream", |s| {
        s.open_streams == 1
    })
    .await;

    // The certificate over the agent's key: served with that key; acknowledged once sent.
    conn.send(state(
        2,
        uid,
        &ca,
        &jwt_key,
        Some(identity_over(&ca, &public)),
    ));
    let (ahead, ahead_public) = one_request(conn.recv().await);
    assert!(
        !ahead.replace_now,
        "the key ahead waits for the next renewal"
    );
    assert_ne!(ahead_public, public);
    assert_eq!(ack_version(conn.recv().await), (2, 1));
    assert!(
        first_message.is_finished(),
        "acknowledged only after the stream was sent the state"
    );
    assert_eq!(http_get(admin, "/ready").await.0, 200);
    let (code, body) = http_get(admin, "/api/status").await;
    assert_eq!(code, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["lastVersionAcknowledged"], 2, "{json}");
    // A page that rebound its own name to the loopback address reads nothing.
    let port = admin.port();
    let (code, body) = http_get_as(
        admin,
        &format!("rebind.attacker.example:{port}"),
        "/api/status",
    )
    .await;
    assert_eq!(code, 421, "{body}");
    assert!(!body.contains(SPIFFE_ID), "{body}");
    assert_eq!(
        http_get_as(admin, &format!("localhost:{port}"), "/api/status")
            .await
            .0,
        200
    );
    assert_eq!(json["registrations"][0]["spiffeId"], SPIFFE_ID, "{json}");
    assert_eq!(json["registrations"][0]["openStreams"], 1, "{json}");
    assert_eq!(
        json["registrations"][0]["keyRequestOutstanding"], true,
        "{json}"
    );
    let (context, _watch) = first_message.await.expect("the client task");
    let context = context.expect("an SVID");
    let svid = &context.svids[0];
    assert_eq!(svid.spiffe_id.as_str(), SPIFFE_ID);
    let key =
        meshca_ca::PrivateKey::from_pkcs8_der(zeroize::Zeroizing::new(svid.key.der().to_vec()))
            .expect("a PKCS#8 key");
    assert_eq!(
        key.public_key().expect("its public half"),
        public,
        "the leaf's key"
    );

    // JWT-SVIDs come from the connected server, and validate against the bundle it sent.
    let mut client = WorkloadClient::connect(agent.socket())
        .await
        .expect("connect");
    let jwts = within(
        "a JWT-SVID",
        client.fetch_jwt(vec!["billing-api".into()], None),
    )
    .await
    .expect("a JWT-SVID through the agent");
    assert_eq!(jwts[0].spiffe_id.as_str(), SPIFFE_ID);
    let jwt_public = jwt_key.public();
    let validated = meshca_workload::jwt::validate(
        &jwts[0].token,
        "billing-api",
        &|td: &str, kid: &str| (td == TD && kid == jwt_public.kid()).then(|| jwt_public.clone()),
        now_secs(),
    )
    .expect("the token validates");
    assert_eq!(validated.spiffe_id.as_str(), SPIFFE_ID);

    // A certificate over a key the agent does not hold: a new key, now.
    let mut unknown = identity_over(&ca, &public);
    unknown.key_id = vec![0; 32];
    conn.send(state(3, uid, &ca, &jwt_key, Some(unknown)));
    let (replace, _) = one_request(conn.recv().await);
    assert!(replace.replace_now);

    // The first server goes away: the second gets the requests still outstanding.
    conn.end(Status::unavailable("shutting down"));
    let mut conn = second.next_conn().await;
    assert!(matches!(
        conn.recv().await,
        agent_message::Message::Hello(_)
    ));
    let (again, _) = one_request(conn.recv().await);
    assert_eq!(again, replace, "the outstanding request, sent again");
    conn.send(state(
        1,
        uid,
        &ca,
        &jwt_key,
        Some(identity_over(&ca, &public)),
    ));
    wait_status(&mut status, "the second server", |s| {
        s.server.connected.as_deref() == Some(second.addr().to_string().as_str())
    })
    .await;

    // A refused token: said so, and the next server is tried after the longest wait.
    conn.end(Status::unauthenticated("the token is revoked"));
    let mut conn = first.next_conn().await;
    let refused = agent.status().get().server.last_error.unwrap_or_default();
    assert!(refused.contains("Unauthenticated"), "{refused}");
    assert!(matches!(
        conn.recv().await,
        agent_message::Message::Hello(_)
    ));
    let (again, _) = one_request(conn.recv().await);
    assert_eq!(again, replace, "still outstanding");

    // No server at all: the socket keeps serving what the agent holds.
    first.stop.cancel();
    second.stop.cancel();
    conn.end(Status::unavailable("shutting down"));
    wait_status(&mut status, "the outage", |s| s.server.connected.is_none()).await;
    let mut client = WorkloadClient::connect(agent.socket())
        .await
        .expect("connect");
    let context = within("an SVID with no server", client.fetch_x509())
        .await
        .expect("an SVID");
    assert_eq!(context.svids[0].spiffe_id.as_str(), SPIFFE_ID);
    let refused = within(
        "FetchJWTSVID with no server",
        client.fetch_jwt(vec!["a".into()], None),
    )
    .await
    .expect_err("no server signs");
    assert_eq!(refused.code(), Some("UNAVAILABLE"), "{refused}");
    let status_now = agent.status().get();
    assert!(status_now.server.last_error.is_some(), "{status_now:?}");
    assert!(agent.status().ready().is_ok());

    shutdown.cancel();
    within("the agent to stop", agent.wait()).await;
}
