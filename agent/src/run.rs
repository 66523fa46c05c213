//! The `meshca agent` process: its local Workload API server, and its conversation with the
//! servers (failover, key requests, acknowledgements).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use meshca_auth::{ProxyType, RevocationList, SigningKey, Verifier};
use meshca_control::{ProxyEntry, ProxyKey, Snapshot, StreamEvent};
use meshca_serve::{AttestedRoutes, ClientTls, Hub, HubOptions, Listener, StreamLimits};
use meshca_workload::jwt::JwksDocument;
use meshca_workload::jwt_keys::KeySet;
use meshca_workload::{JwtMinter, JwtSource, RemoteJwt, WorkloadApi};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::config::{AgentConfig, ServerAddr};
use crate::gate::LocalStreams;
use crate::local::Local;
use crate::proto::{
    agent_message, paths, Ack, AgentMessage, AgentState, Hello, JwtSvidRequest, JwtSvidResponse,
    KeyRequest, KeyRequests, KEY_REQUESTS_PER_MESSAGE, PROTOCOL_VERSION,
};
use crate::status::{self, RegistrationWithStreams, StatusHandle};
use crate::AgentError;

/// The largest state accepted from a server.
const MAX_STATE_BYTES: usize = 256 * 1024 * 1024;

/// What serves SDS on the agent's Workload API socket, for Envoys set up for a SPIRE agent's socket:
/// given the agent's hub, the routes to add (`meshca_sds::SdsServer::attested_routes_on`).
pub type LocalSds = fn(Hub) -> AttestedRoutes;

/// A running agent.
#[derive(Debug)]
pub struct Agent {
    status: StatusHandle,
    admin: Option<SocketAddr>,
    socket: PathBuf,
    name: String,
    tasks: Vec<JoinHandle<()>>,
}

/// Reads the agent token in `path`: the token, and the agent name it carries.
pub fn read_token(path: &Path) -> Result<(String, String), AgentError> {
    let text = std::fs::read_to_string(path).map_err(|source| AgentError::TokenFile {
        path: path.to_owned(),
        source,
    })?;
    let token = text.trim().to_owned();
    let claims = Verifier::read_unverified(&token).map_err(|source| AgentError::Token {
        path: path.to_owned(),
        reason: source.to_string(),
    })?;
    if claims.proxy_type != ProxyType::Agent {
        return Err(AgentError::Token {
            path: path.to_owned(),
            reason: format!(
                "it is a {} token; mint one with `meshca token --type agent --name HOST`",
                claims.subject()
            ),
        });
    }
    Ok((token, claims.name))
}

impl Agent {
    /// Starts the agent: binds its Workload API socket and admin listener (errors here are the
    /// operator's to fix), then serves until `shutdown` fires.
    pub async fn start(
        config: AgentConfig,
        local_sds: LocalSds,
        shutdown: CancellationToken,
    ) -> Result<Agent, AgentError> {
        if config.servers.is_empty() {
            return Err(AgentError::NoServer);
        }
        let (_, name) = read_token(&config.token_file)?;
        if let Some(ca) = &config.sds_ca {
            if rustls_pki_types::pem::PemObject::pem_slice_iter(ca)
                .collect::<Result<Vec<rustls_pki_types::CertificateDer<'_>>, _>>()
                .map_or(true, |certs| certs.is_empty())
            {
                return Err(AgentError::SdsCa);
            }
        }
        let (snapshot_tx, snapshot_rx) = watch::channel(Arc::new(Snapshot::empty()));
        let (events_tx, events_rx) = mpsc::channel(meshca_serve::EVENT_BUFFER);
        let (revocations_tx, revocations_rx) = watch::channel(Arc::new(RevocationList::new()));
        // No token is ever accepted on the agent's socket: the verifier's key is thrown away.
        let verifier = SigningKey::generate()
            .map(|(key, _)| key.verifier())
            .map_err(|e| AgentError::Internal(format!("cannot make a token verifier: {e}")))?;
        let hub = Hub::new(
            snapshot_rx,
            verifier,
            revocations_rx,
            events_tx,
            HubOptions::default().with_identity_wait(config.workload.identity_wait),
        );
        let mut options = config.workload.clone();
        options.agent = Some(name.clone());
        let (jwt_keys_tx, jwt_keys_rx) = watch::channel(Arc::new(KeySet::default()));
        let (server_tx, server_rx) = watch::channel(None);
        let minter = Arc::new(Minter { server: server_rx });
        let api = WorkloadApi::with_jwt_source(
            hub.clone(),
            options,
            Some(JwtSource::Remote(RemoteJwt {
                keys: jwt_keys_rx,
                minter,
            })),
        );

        if let Some(dir) = config.listen.parent() {
            if !dir.as_os_str().is_empty() && !dir.exists() {
                std::fs::create_dir_all(dir).map_err(|source| AgentError::Listen {
                    path: config.listen.clone(),
                    reason: format!("cannot create {}: {source}", dir.display()),
                })?;
            }
        }
        let bound = meshca_serve::bind(vec![Listener::UnixForAnyUser(config.listen.clone())])
            .await
            .map_err(|e| AgentError::Listen {
                path: config.listen.clone(),
                reason: e.to_string(),
            })?;
        let admin = match config.admin {
            Some(addr) => Some(status::bind(addr).await?),
            None => None,
        };
        let admin_addr = admin.as_ref().and_then(|l| l.local_addr().ok());

        let status = StatusHandle::default();
        status.update(|s| s.agent = name.clone());
        let mut tasks = Vec::new();
        let policy = api.conn_policy(StreamLimits::default());
        let routes = api.routes(Some(local_sds(hub.clone())));
        let closer = hub.clone();
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(error) = bound
                .serve_service(routes, policy, move || closer.close_streams(), stop)
                .await
            {
                tracing::error!(%error, "the agent's Workload API server failed");
            }
        }));
        if let Some(listener) = admin {
            tasks.push(tokio::spawn(status::serve(
                listener,
                status.clone(),
                shutdown.clone(),
            )));
        }
        tracing::info!(agent = %name, socket = %config.listen.display(), admin = ?admin_addr, servers = %config.servers.iter().map(ToString::to_string).collect::<Vec<_>>().join(","), "meshca agent started");
        let socket = config.listen.clone();
        let core = Core {
            local: Local::new(name.clone()),
            streams: LocalStreams::default(),
            config: Arc::new(config),
            snapshot_tx,
            events: events_rx,
            status: status.clone(),
            jwt_keys: jwt_keys_tx,
            server: server_tx,
            _hub: hub,
            _revocations: revocations_tx,
        };
        tasks.push(tokio::spawn(core.run(shutdown)));
        Ok(Agent {
            status,
            admin: admin_addr,
            socket,
            name,
            tasks,
        })
    }

    /// The agent's status.
    pub fn status(&self) -> StatusHandle {
        self.status.clone()
    }

    /// Where the admin listener listens (its port when port 0 was asked).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The Workload API socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The agent's name, from its token.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits until the agent stopped (its shutdown fired).
    pub async fn wait(self) {
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Why a stream to a server ended.
struct Ended {
    /// What to log and show.
    reason: String,
    /// The server refused the token: wait the longest before trying again.
    refused: bool,
    /// A state was received on it (the connection worked).
    had_state: bool,
}

impl Ended {
    fn failed(reason: String) -> Ended {
        Ended {
            reason,
            refused: false,
            had_state: false,
        }
    }
}

/// The agent's own task: the state it serves, and the server it takes it from.
struct Core {
    local: Local,
    streams: LocalStreams,
    config: Arc<AgentConfig>,
    snapshot_tx: watch::Sender<Arc<Snapshot>>,
    events: mpsc::Receiver<StreamEvent>,
    status: StatusHandle,
    /// The JWT bundles of the last state.
    jwt_keys: watch::Sender<Arc<KeySet>>,
    /// The server connected now, for `FetchJWTSVID`.
    server: watch::Sender<Option<Connected>>,
    /// Held so that the local server's channels stay open.
    _hub: Hub,
    _revocations: watch::Sender<Arc<RevocationList>>,
}

impl Core {
    async fn run(mut self, shutdown: CancellationToken) {
        let servers = self.config.servers.clone();
        let (shortest, longest) = self.config.backoff;
        let mut index = 0;
        let mut delay = shortest;
        // Since when no server answers, once that was logged.
        let mut outage: Option<u64> = None;
        // Streams that ended without a state since the last that brought one.
        let mut failed_in_a_row = 0usize;
        loop {
            let server = &servers[index % servers.len()];
            let ended = tokio::select! {
                ended = self.session(server, &mut outage) => ended,
                () = shutdown.cancelled() => return,
            };
            self.server.send_replace(None);
            let now = status::unix_now();
            self.status.update(|s| {
                s.server = status::ServerStatus {
                    connected: None,
                    since: Some(now),
                    last_error: Some(format!("{server}: {}", ended.reason)),
                };
            });
            if ended.refused {
                tracing::error!(%server, reason = %ended.reason, "the server refused this agent's token (revoked, expired, or not an agent token); trying again in {longest:?}");
            } else {
                tracing::info!(%server, reason = %ended.reason, "the stream to the server ended; trying the next server");
            }
            failed_in_a_row = if ended.had_state {
                1
            } else {
                failed_in_a_row + 1
            };
            // An outage: every server tried once in a row, none answered.
            if outage.is_none() && failed_in_a_row >= servers.len() {
                outage = Some(now);
                let serving = self.local.published().generation > 0;
                if ended.refused {
                    tracing::warn!(%server, reason = %ended.reason, serving, "no meshca server accepts this agent's token; the Workload API keeps serving what it holds");
                } else {
                    tracing::warn!(%server, reason = %ended.reason, serving, "no meshca server answers; the Workload API keeps serving what it holds");
                }
            }
            delay = if ended.refused {
                longest
            } else if ended.had_state {
                shortest
            } else {
                delay
            };
            let wait = jittered(delay);
            delay = (delay * 2).min(longest);
            index += 1;
            let sleep = tokio::time::sleep(wait);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    () = &mut sleep => break,
                    event = self.events.recv() => match event {
                        Some(event) => self.streams.event(event),
                        None => return,
                    },
                    () = shutdown.cancelled() => return,
                }
            }
        }
    }

    /// One stream to `server`, until it ends.
    async fn session(&mut self, server: &ServerAddr, outage: &mut Option<u64>) -> Ended {
        let token = match read_token(&self.config.token_file) {
            Ok((token, _)) => token,
            Err(error) => return Ended::failed(error.to_string()),
        };
        let channel = match connect(server, self.config.sds_ca.as_deref()).await {
            Ok(channel) => channel,
            Err(reason) => return Ended::failed(reason),
        };
        // Unbounded on purpose: with a bound, a server busy writing states stops reading messages, the
        // agent then waits to send and stops reading states, and neither moves again (one agent with
        // 1,000 registrations did exactly that). What it holds is bounded by the states received
        // meanwhile: one Ack each, and one key request per registration per certificate.
        let (tx, rx) = mpsc::unbounded_channel::<AgentMessage>();
        let hello = AgentMessage {
            message: Some(agent_message::Message::Hello(Hello {
                protocol: PROTOCOL_VERSION,
                agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            })),
        };
        // The receiver is held below: these sends cannot fail.
        let _ = tx.send(hello);
        for message in key_messages(self.local.new_stream()) {
            let _ = tx.send(message);
        }
        self.streams.new_stream();
        let mut request = tonic::Request::new(UnboundedReceiverStream::new(rx));
        match format!("Bearer {token}").parse() {
            Ok(value) => {
                request.metadata_mut().insert("authorization", value);
            }
            Err(_) => return Ended::failed("the token is not a valid header value".into()),
        }
        let connected = Connected {
            channel: channel.clone(),
            authorization: format!("Bearer {token}"),
        };
        let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_STATE_BYTES);
        if let Err(error) = grpc.ready().await {
            return Ended::failed(format!("the connection is not ready: {error}"));
        }
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(paths::SYNC);
        let response = grpc
            .streaming(
                request,
                path,
                meshca_serve::StreamCodec::<AgentMessage, AgentState>::default(),
            )
            .await;
        let mut inbound = match response {
            Ok(response) => response.into_inner(),
            Err(status) => return ended_by(&status, false),
        };
        let mut first_deadline = Some(Instant::now() + self.config.first_state_timeout);
        let mut had_state = false;
        loop {
            tokio::select! {
                message = inbound.message() => match message {
                    Ok(Some(state)) => {
                        if !had_state {
                            had_state = true;
                            first_deadline = None;
                            self.server.send_replace(Some(connected.clone()));
                            let now = status::unix_now();
                            self.status.update(|s| s.server = status::ServerStatus { connected: Some(server.to_string()), since: Some(now), last_error: None });
                            match outage.take() {
                                Some(since) => tracing::info!(%server, outage_seconds = now.saturating_sub(since), "connected to a meshca server again"),
                                None => tracing::info!(%server, "connected to a meshca server"),
                            }
                        }
                        if let Err(reason) = self.on_state(state, &tx).await {
                            return Ended { reason, refused: false, had_state };
                        }
                    }
                    Ok(None) => return Ended { reason: "the server ended the stream".into(), refused: false, had_state },
                    Err(status) => return ended_by(&status, had_state),
                },
                event = self.events.recv() => {
                    let Some(event) = event else {
                        return Ended { reason: "the agent is stopping".into(), refused: false, had_state };
                    };
                    self.streams.event(event);
                    if let Err(reason) = self.ack_due(&tx).await {
                        return Ended { reason, refused: false, had_state };
                    }
                }
                () = crate::run::sleep_until(first_deadline) => {
                    return Ended::failed(format!("no state within {:?} of connecting", self.config.first_state_timeout));
                }
            }
        }
    }

    /// Takes a state: keys, the snapshot served, requests and acknowledgements.
    async fn on_state(
        &mut self,
        state: AgentState,
        tx: &mpsc::UnboundedSender<AgentMessage>,
    ) -> Result<(), String> {
        let version = state.version;
        // Keys are made here (an RSA key takes a while): on a runtime with worker threads, the
        // others go on meanwhile.
        let requests = match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.local.apply(&state))
            }
            _ => self.local.apply(&state),
        };
        let jwt_keys = jwt_key_set(&state);
        if *jwt_keys != **self.jwt_keys.borrow() {
            self.jwt_keys.send_replace(jwt_keys);
        }
        let snapshot = self.local.build(&state);
        let generation = self.local.published().generation;
        self.streams.served(version, generation);
        let registrations = self.local.status();
        let counts = self.streams.counts(self.local.registrations());
        // The status says what is served before a local stream can see it, so that whoever reads
        // it after their workload got an SVID finds that SVID there.
        self.status.update(|s| {
            s.last_version_received = Some(version);
            s.serving = generation > 0;
            s.registrations = registrations
                .into_iter()
                .zip(counts)
                .map(|(registration, open)| RegistrationWithStreams {
                    registration,
                    open_streams: open.streams,
                })
                .collect();
        });
        if let Some(snapshot) = snapshot {
            self.snapshot_tx.send_replace(snapshot);
        }
        for message in key_messages(requests) {
            tx.send(message)
                .map_err(|_| "the stream closed while sending key requests".to_owned())?;
        }
        self.ack_due(tx).await
    }

    /// Acknowledges the newest version every open local stream has applied, if one waits.
    async fn ack_due(&mut self, tx: &mpsc::UnboundedSender<AgentMessage>) -> Result<(), String> {
        let open = self.streams.open();
        let published = self.local.published().clone();
        let serving =
            |proxy: &ProxyKey| matches!(published.proxies.get(proxy), Some(ProxyEntry::Ready(_)));
        let Some(version) = self.streams.due(serving) else {
            self.status.update(|s| s.open_streams = open);
            return Ok(());
        };
        let streams = self.streams.counts(self.local.registrations());
        self.status.update(|s| {
            s.last_version_acknowledged = Some(version);
            s.open_streams = open;
            for (registration, count) in s.registrations.iter_mut().zip(&streams) {
                registration.open_streams = count.streams;
            }
        });
        tracing::debug!(
            version,
            open,
            "acknowledging a state every local stream was sent"
        );
        tx.send(AgentMessage {
            message: Some(agent_message::Message::Ack(Ack { version, streams })),
        })
        .map_err(|_| "the stream closed while acknowledging".to_owned())
    }
}

/// The state's JWT bundles as the Workload API publishes them; a bundle that does not parse is left
/// out, with a warning.
fn jwt_key_set(state: &AgentState) -> Arc<KeySet> {
    let mut documents = BTreeMap::new();
    for (trust_domain, document) in &state.jwt_bundles {
        let trust_domain = trust_domain
            .strip_prefix("spiffe://")
            .unwrap_or(trust_domain);
        match JwksDocument::parse(document) {
            Ok(document) => {
                documents.insert(trust_domain.to_owned(), document);
            }
            Err(error) => {
                tracing::warn!(%trust_domain, %error, "the server's JWT bundle does not parse; it is not served");
            }
        }
    }
    Arc::new(KeySet::from_documents(documents))
}

/// The server the agent is connected to: where `FetchJWTSVID` is sent.
#[derive(Clone)]
struct Connected {
    channel: tonic::transport::Channel,
    authorization: String,
}

/// Mints JWT-SVIDs on the connected server.
struct Minter {
    server: watch::Receiver<Option<Connected>>,
}

impl JwtMinter for Minter {
    fn mint(
        &self,
        registration: &meshca_control::Registration,
        audience: &[String],
    ) -> BoxFuture<'static, Result<String, tonic::Status>> {
        let connected = self.server.borrow().clone();
        let request = JwtSvidRequest {
            mesh: registration.proxy.mesh.to_string(),
            registration: registration.name.clone(),
            audience: audience.to_vec(),
        };
        Box::pin(async move {
            let Some(connected) = connected else {
                return Err(tonic::Status::unavailable(
                    "no meshca server answers this agent; JWT-SVIDs are signed by the server",
                ));
            };
            let mut request = tonic::Request::new(request);
            let value = connected
                .authorization
                .parse()
                .map_err(|_| tonic::Status::internal("the token is not a valid header value"))?;
            request.metadata_mut().insert("authorization", value);
            let mut grpc = tonic::client::Grpc::new(connected.channel);
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("the server is not ready: {e}")))?;
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(paths::MINT_JWT_SVID);
            let response = grpc
                .unary(
                    request,
                    path,
                    meshca_serve::StreamCodec::<JwtSvidRequest, JwtSvidResponse>::default(),
                )
                .await?;
            Ok(response.into_inner().token)
        })
    }
}

/// Key requests, at most [`KEY_REQUESTS_PER_MESSAGE`] a message.
fn key_messages(requests: Vec<KeyRequest>) -> Vec<AgentMessage> {
    requests
        .chunks(KEY_REQUESTS_PER_MESSAGE)
        .map(|chunk| AgentMessage {
            message: Some(agent_message::Message::Keys(KeyRequests {
                requests: chunk.to_vec(),
            })),
        })
        .collect()
}

/// Why a stream ended with `status`.
fn ended_by(status: &tonic::Status, had_state: bool) -> Ended {
    let refused = matches!(
        status.code(),
        Code::Unauthenticated | Code::PermissionDenied
    );
    Ended {
        reason: format!("{:?}: {}", status.code(), status.message()),
        refused,
        had_state,
    }
}

/// Opens a channel to `server`.
async fn connect(
    server: &ServerAddr,
    sds_ca: Option<&[u8]>,
) -> Result<tonic::transport::Channel, String> {
    let (target, tls) = match server {
        ServerAddr::Unix(path) => (format!("unix://{}", path.display()), None),
        ServerAddr::Tcp { addr, host, https } => match sds_ca {
            Some(ca) => (
                addr.clone(),
                Some(ClientTls {
                    ca_pem: ca.to_vec(),
                    server_name: host.clone(),
                }),
            ),
            None if *https => {
                return Err("https:// needs the SDS CA (--sds-ca) to verify the server".into())
            }
            None => (addr.clone(), None),
        },
    };
    meshca_serve::connect_channel(&target, tls)
        .await
        .map_err(|e| e.to_string())
}

/// `delay`, give or take a quarter, so that agents cut off together do not return together.
fn jittered(delay: Duration) -> Duration {
    let mut byte = [0u8; 1];
    let random = match ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut byte) {
        Ok(()) => f64::from(byte[0]) / 255.0,
        Err(_) => 0.5,
    };
    delay.mul_f64(0.75 + random / 2.0)
}

/// Sleeps until `deadline`, or forever without one.
pub(crate) async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_requests_are_sent_64_a_message() {
        let requests: Vec<KeyRequest> = (0..130)
            .map(|i| KeyRequest {
                mesh: "m".into(),
                registration: format!("r{i}"),
                csr: vec![1],
                replace_now: true,
            })
            .collect();
        let sizes: Vec<usize> = key_messages(requests)
            .into_iter()
            .map(|m| match m.message {
                Some(agent_message::Message::Keys(keys)) => keys.requests.len(),
                other => panic!("not key requests: {other:?}"),
            })
            .collect();
        assert_eq!(sizes, [64, 64, 2]);
    }

    #[test]
    fn backoff_is_jittered_within_a_quarter() {
        for _ in 0..100 {
            let wait = jittered(Duration::from_secs(4));
            assert!(
                wait >= Duration::from_secs(3) && wait <= Duration::from_secs(5),
                "{wait:?}"
            );
        }
    }
}
