//! One agent's `Sync` stream.
//!
//! The stream speaks to the owner for every registration that names its agent, as an SDS stream of the
//! registration's Dataplane would: connected (so the owner issues its identity), subscribed to what a
//! Workload API caller is sent (`default`, `system_trust_bundle`, `ALL`), and ACKed when the agent
//! acknowledges a state, which it does only once every Workload API stream on its host was sent it. A
//! state whose content a new snapshot leaves unchanged stands for the new generation too, as an SDS
//! response does, so the rollout gate sees the agent's workloads hold the newest generation without a
//! message being sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use futures::stream::{self, BoxStream, StreamExt};
use futures::FutureExt;
use meshca_auth::{Claims, RevocationList};
use meshca_ca::PublicKey;
use meshca_control::{parse_names, rfc3339, ProxyHashSet, Registration, Snapshot};
use meshca_serve::StreamCodec;
use meshca_serve::{shown, HubStream, LogBudget, OpenStream};
use meshca_workload::jwt_keys::KeySet;
use tokio::sync::watch;
use tonic::codegen::{http, BoxFuture};
use tonic::server::{Grpc, StreamingService};
use tonic::{Status, Streaming};

use super::state::{self, Fingerprint, Source};
use super::status::{AgentStatus, Listed, RegistrationStatus};
use super::{keys, Admitted, Shared, KEY_REQUESTS_PER_MESSAGE};
use crate::proto::{
    self, agent_message, Ack, AgentMessage, AgentState, KeyRequests, PROTOCOL_VERSION,
};
use meshca_serve::ledger::{Acked, Ledger, NeverSent};

/// The most messages that arrived already a stream handles before it builds the next state.
const MESSAGES_PER_WAKE: usize = 64;

/// What an agent's stream subscribes to for each registration: what a Workload API caller is sent.
const RESOURCES: [&str; 3] = ["default", "system_trust_bundle", "ALL"];

/// Answers `Sync`: the token is checked on the headers and the stream takes its place in the agent's
/// limit before anything of the body is read.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let admitted = match shared.admit(&request) {
        Ok(admitted) => admitted,
        Err(status) => return status.into_http(),
    };
    let status = AgentStatus {
        name: admitted.claims.name.clone(),
        token_id: admitted.claims.id.clone(),
        peer: admitted.peer.clone(),
        connected_since: rfc3339(SystemTime::now()),
        protocol: 0,
        agent_version: String::new(),
        last_sent: None,
        last_acked: None,
        registrations: Vec::new(),
    };
    let most = shared.options.streams_per_agent;
    let listed = match shared.agents.open(status, most) {
        Ok(listed) => listed,
        Err(held) => {
            return Status::resource_exhausted(format!(
                "agent {} already has {held} open Sync streams, the most one agent may have \
                 (limits.agentStreamsPerAgent)",
                shown(&admitted.claims.name)
            ))
            .into_http()
        }
    };
    let limit = shared.options.message_bytes;
    Grpc::new(StreamCodec::<AgentState, AgentMessage>::default())
        .apply_max_message_size_config(Some(limit), None)
        .streaming(
            Method {
                start: Some((shared, admitted, listed)),
            },
            request,
        )
        .await
}

/// The method, holding what the stream starts with until tonic hands it the request body.
struct Method {
    start: Option<(Arc<Shared>, Admitted, Listed)>,
}

impl StreamingService<AgentMessage> for Method {
    type Response = AgentState;
    type ResponseStream = BoxStream<'static, Result<AgentState, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<Streaming<AgentMessage>>) -> Self::Future {
        let start = self.start.take();
        Box::pin(async move {
            let (shared, admitted, listed) =
                start.ok_or_else(|| Status::internal("the Sync method was called twice"))?;
            let sync = Sync::new(shared, admitted, listed, request.into_inner());
            Ok(tonic::Response::new(sync.into_stream()))
        })
    }
}

/// A registration the stream speaks for, as the owner knows the stream.
struct Link {
    registration: Arc<Registration>,
    /// The stream of the registration's Dataplane, as the owner knows it.
    stream: HubStream,
    /// The last key the agent offered for it, and the owner was told of.
    offered: Option<Arc<PublicKey>>,
    /// Its Workload API streams on the agent's host, as of the last acknowledgement.
    workload_streams: u32,
    /// Its part of the last state built, and what that was built from.
    built: Option<(Source, proto::Registration)>,
}

/// One agent's stream.
struct Sync {
    shared: Arc<Shared>,
    agent: Arc<Claims>,
    inbound: Streaming<AgentMessage>,
    snapshots: watch::Receiver<Arc<Snapshot>>,
    revocations: watch::Receiver<Arc<RevocationList>>,
    jwt: watch::Receiver<Arc<KeySet>>,
    /// The token's expiry, plus the verifier's leeway: the stream ends then.
    expiry: Pin<Box<tokio::time::Sleep>>,
    /// Resolves when the server shuts down.
    closed: Pin<Box<dyn Future<Output = ()> + Send + std::marker::Sync>>,
    /// Whether each watch still has a sender: one whose sender is gone is not waited on.
    watching: Watching,
    greeted: bool,
    links: Vec<Link>,
    /// The Dataplanes of `links`, to tell quickly whether a snapshot concerns the agent.
    proxies: ProxyHashSet,
    /// The snapshot generation the stream's content was last compared with.
    seen: Option<u64>,
    /// Something other than the snapshot changed the content (a key was offered, the JWT keys
    /// changed): build anew.
    force: bool,
    /// What the content last sent was built from.
    fingerprint: Option<Fingerprint>,
    /// The states sent, for the agent's acknowledgements.
    sent: Ledger,
    listed: Listed,
    warnings: LogBudget,
    done: bool,
    _open: Option<OpenStream>,
}

struct Watching {
    snapshots: bool,
    revocations: bool,
    jwt: bool,
}

/// What ended a wait.
enum Woken {
    Message(Option<AgentMessage>),
    Changed,
}

impl Sync {
    fn new(
        shared: Arc<Shared>,
        admitted: Admitted,
        listed: Listed,
        inbound: Streaming<AgentMessage>,
    ) -> Sync {
        let revocations = shared.hub.revocations();
        let expiry = Box::pin(tokio::time::sleep_until(meshca_serve::token_deadline(
            admitted.claims.expires_at,
        )));
        Sync {
            snapshots: shared.hub.snapshots(),
            jwt: shared.jwt_keys.subscribe(),
            closed: Box::pin(shared.hub.closed()),
            warnings: LogBudget::new(shared.options.warnings_per_minute),
            revocations,
            expiry,
            watching: Watching {
                snapshots: true,
                revocations: true,
                jwt: true,
            },
            agent: admitted.claims,
            _open: admitted.open,
            inbound,
            greeted: false,
            links: Vec::new(),
            proxies: ProxyHashSet::default(),
            seen: None,
            force: false,
            fingerprint: None,
            sent: Ledger::default(),
            listed,
            done: false,
            shared,
        }
    }

    fn into_stream(self) -> BoxStream<'static, Result<AgentState, Status>> {
        stream::unfold(self, |mut sync| async move {
            let item = sync.next().await?;
            Some((item, sync))
        })
        .boxed()
    }

    async fn next(&mut self) -> Option<Result<AgentState, Status>> {
        if self.done {
            return None;
        }
        match self.serve().await {
            Ok(Some(state)) => Some(Ok(state)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(status) => {
                self.done = true;
                tracing::info!(agent = %self.agent.name, code = ?status.code(), message = status.message(), "agent stream ended");
                Some(Err(status))
            }
        }
    }

    /// The next state to send; `None` when the agent ended the stream.
    async fn serve(&mut self) -> Result<Option<AgentState>, Status> {
        if !self.greeted {
            if !self.hello().await? {
                return Ok(None);
            }
            self.greeted = true;
        }
        loop {
            self.check_revocation()?;
            if let Some(state) = self.refresh().await {
                return Ok(Some(state));
            }
            match self.wait().await? {
                Woken::Changed => {}
                Woken::Message(None) => return Ok(None),
                Woken::Message(Some(message)) => {
                    self.handle(message).await?;
                    if !self.handle_arrived().await? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Reads the first message, which must be a Hello of this protocol; false when the agent closed
    /// the stream first.
    async fn hello(&mut self) -> Result<bool, Status> {
        let wait = self.shared.first_message_wait();
        let first = tokio::select! {
            received = self.inbound.message() => received?,
            () = tokio::time::sleep(wait) => return Err(Status::deadline_exceeded(format!(
                "no Hello within {wait:?} of opening the stream"
            ))),
            () = self.closed.as_mut() => return Err(Status::unavailable("the server is shutting down")),
        };
        let hello = match first.and_then(|m| m.message) {
            None => return Ok(false),
            Some(agent_message::Message::Hello(hello)) => hello,
            Some(_) => {
                return Err(Status::invalid_argument(
                    "the first message of a Sync stream must be Hello",
                ))
            }
        };
        if hello.protocol != PROTOCOL_VERSION {
            return Err(Status::invalid_argument(format!(
                "the agent speaks protocol {}; this server speaks protocol {PROTOCOL_VERSION}",
                hello.protocol
            )));
        }
        let version = shown(&hello.agent_version);
        tracing::info!(agent = %self.agent.name, token = %self.agent.id, agent_version = %version, "agent connected");
        self.listed.update(|s| {
            s.protocol = hello.protocol;
            s.agent_version = version;
        });
        Ok(true)
    }

    /// Waits for a message of the agent, or for a change that may concern it.
    async fn wait(&mut self) -> Result<Woken, Status> {
        enum Ended {
            Expired,
            Closed,
        }
        let Sync {
            watching,
            snapshots,
            revocations,
            jwt,
            expiry,
            closed,
            inbound,
            force,
            ..
        } = self;
        let ended = tokio::select! {
            biased;
            () = expiry.as_mut() => Ended::Expired,
            () = closed.as_mut() => Ended::Closed,
            changed = watch_changed(revocations, watching.revocations) => {
                watching.revocations = changed;
                return Ok(Woken::Changed);
            }
            received = inbound.message() => return Ok(Woken::Message(received?)),
            changed = watch_changed(snapshots, watching.snapshots) => {
                watching.snapshots = changed;
                return Ok(Woken::Changed);
            }
            changed = watch_changed(jwt, watching.jwt) => {
                watching.jwt = changed;
                // The JWT keys are no part of the snapshot: build anew.
                *force = true;
                return Ok(Woken::Changed);
            }
        };
        Err(match ended {
            Ended::Expired => self.expired(),
            Ended::Closed => Status::unavailable("the server is shutting down"),
        })
    }

    /// The status that ends the stream when its token expires.
    fn expired(&self) -> Status {
        tracing::info!(agent = %self.agent.name, token = %self.agent.id, "agent token expired: its stream ends");
        Status::unauthenticated(format!(
            "token {} of agent {} has expired; the agent needs a new token",
            self.agent.id,
            shown(&self.agent.name)
        ))
    }

    /// Ends the stream when the revocation list names the token (a lookup in a set, made at every
    /// wake-up: a new list wakes the stream, and a wake-up for anything else may come first).
    fn check_revocation(&mut self) -> Result<(), Status> {
        let revoked = self
            .revocations
            .borrow_and_update()
            .contains(&self.agent.id);
        if revoked {
            tracing::info!(agent = %self.agent.name, token = %self.agent.id, "agent token revoked: its stream ends");
            // The status SDS ends a revoked proxy's stream with: the credential is no longer valid.
            return Err(Status::unauthenticated(format!(
                "token {} of agent {} has been revoked",
                self.agent.id,
                shown(&self.agent.name)
            )));
        }
        Ok(())
    }

    /// Handles the messages that arrived already (at most [`MESSAGES_PER_WAKE`]) before the next state
    /// is built: an agent sends its key requests in several messages at once, and a state built
    /// between two of them would be older than the next on arrival. False when the agent ended the
    /// stream.
    async fn handle_arrived(&mut self) -> Result<bool, Status> {
        for _ in 0..MESSAGES_PER_WAKE {
            match self.inbound.message().now_or_never() {
                Some(Ok(Some(message))) => self.handle(message).await?,
                Some(Ok(None)) => return Ok(false),
                Some(Err(status)) => return Err(status),
                None => break,
            }
        }
        Ok(true)
    }

    async fn handle(&mut self, message: AgentMessage) -> Result<(), Status> {
        match message.message {
            Some(agent_message::Message::Ack(ack)) => self.ack(ack).await,
            Some(agent_message::Message::Keys(keys)) => self.keys(keys).await,
            Some(agent_message::Message::Hello(_)) => Err(Status::invalid_argument(
                "Hello is the first message of a Sync stream only",
            )),
            None => Err(Status::invalid_argument(
                "an empty message: expected Hello, KeyRequests or Ack",
            )),
        }
    }

    /// The state to send for the newest snapshot, if its content differs from what was sent.
    async fn refresh(&mut self) -> Option<AgentState> {
        let snapshot = self.snapshots.borrow_and_update().clone();
        if snapshot.generation == 0 {
            // Nothing published yet: there is nothing to tell the agent.
            return None;
        }
        if !self.force {
            if self.seen == Some(snapshot.generation) {
                return None;
            }
            let untouched = self
                .seen
                .and_then(|seen| snapshot.changed.proxies_since(seen))
                .is_some_and(|mut keys| !keys.any(|key| self.proxies.contains(key)));
            if untouched {
                self.seen = Some(snapshot.generation);
                self.stands_for(snapshot.generation).await;
                return None;
            }
        }
        self.force = false;
        self.seen = Some(snapshot.generation);
        let relinked = self.relink(&snapshot).await;
        let jwt = self.jwt.borrow_and_update().clone();
        let sources = self
            .links
            .iter()
            .map(|l| Source::of(&snapshot, &l.registration, l.offered.as_ref()))
            .collect();
        let fingerprint = Fingerprint::new(&snapshot, sources, jwt);
        // A registration linked anew has a stream the last state did not carry: it needs a state of
        // its own to acknowledge, even if the content looks the same.
        if !relinked && self.fingerprint.as_ref() == Some(&fingerprint) {
            self.stands_for(snapshot.generation).await;
            return None;
        }
        let algorithm = self.shared.options.key_algorithm;
        let registrations = self
            .links
            .iter_mut()
            .zip(fingerprint.sources())
            .map(|(link, source)| match &link.built {
                Some((built_from, part)) if built_from == source => part.clone(),
                _ => {
                    let part = state::registration(source, algorithm);
                    link.built = Some((source.clone(), part.clone()));
                    part
                }
            })
            .collect();
        let mut state = fingerprint.state(registrations);
        let version = self.sent.send(
            snapshot.generation,
            self.links.iter().map(|l| l.stream.id()).collect(),
        );
        state.version = version;
        self.fingerprint = Some(fingerprint);
        self.listed.update(|s| s.last_sent = Some(version));
        tracing::debug!(agent = %self.agent.name, version, registrations = self.links.len(), "agent state sent");
        Some(state)
    }

    /// The content last sent equals generation `generation`'s: it stands for it too, and if the agent
    /// acknowledged it, every registration's stream holds `generation`.
    async fn stands_for(&mut self, generation: u64) {
        if let Some(acked) = self.sent.unchanged(generation) {
            self.report_acked(acked).await;
        }
    }

    /// Matches the agent against `snapshot`'s registrations, and tells the owner which it now speaks
    /// for. Whether it linked any anew.
    async fn relink(&mut self, snapshot: &Snapshot) -> bool {
        let name = self.agent.name.as_str();
        let mine: Vec<&Arc<Registration>> = snapshot
            .registrations
            .iter()
            .filter(|r| r.agent.as_deref() == Some(name))
            .collect();
        let same = mine.len() == self.links.len()
            && mine
                .iter()
                .zip(&self.links)
                .all(|(m, l)| Arc::ptr_eq(m, &l.registration) || ***m == *l.registration);
        if same {
            return false;
        }
        let mut kept = Vec::with_capacity(mine.len());
        for link in std::mem::take(&mut self.links) {
            if mine.iter().any(|m| ***m == *link.registration) {
                kept.push(link);
            } else {
                tracing::debug!(agent = %self.agent.name, mesh = %link.registration.proxy.mesh, registration = %link.registration.name, stream = %link.stream.id(), "a registration no longer names the agent");
                link.stream.close().await;
            }
        }
        let mut added = false;
        for registration in mine {
            if let Some(at) = kept.iter().position(|l| *l.registration == **registration) {
                self.links.push(kept.swap_remove(at));
            } else if let Some(link) = self.connect(registration).await {
                self.links.push(link);
                added = true;
            }
        }
        self.proxies = self
            .links
            .iter()
            .map(|l| l.registration.proxy.clone())
            .collect();
        self.list_registrations();
        added
    }

    /// Tells the owner a stream of `registration`'s Dataplane is open and what it subscribes to.
    async fn connect(&self, registration: &Arc<Registration>) -> Option<Link> {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = match registration.dataplane_claims(now) {
            Ok(claims) => claims,
            Err(error) => {
                tracing::warn!(agent = %self.agent.name, mesh = %registration.proxy.mesh, registration = %registration.name, %error, "a WorkloadRegistration's Dataplane cannot be served");
                return None;
            }
        };
        let stream = self.shared.hub.connect(Arc::new(claims)).await;
        stream
            .subscribe(parse_names(
                RESOURCES.iter().map(|s| (*s).to_owned()).collect(),
            ))
            .await;
        let id = stream.id();
        tracing::debug!(agent = %self.agent.name, mesh = %registration.proxy.mesh, registration = %registration.name, stream = %id, "agent serves a registration");
        Some(Link {
            registration: registration.clone(),
            stream,
            offered: None,
            workload_streams: 0,
            built: None,
        })
    }

    /// `Ack`: the agent sent state `version` to every Workload API stream on its host.
    async fn ack(&mut self, ack: Ack) -> Result<(), Status> {
        if !ack.streams.is_empty() {
            let at: std::collections::HashMap<(&str, &str), usize> = self
                .links
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    (
                        (&*l.registration.proxy.mesh, l.registration.name.as_str()),
                        i,
                    )
                })
                .collect();
            let counts: Vec<(usize, u32)> = ack
                .streams
                .iter()
                .filter_map(|open| {
                    at.get(&(open.mesh.as_str(), open.registration.as_str()))
                        .map(|i| (*i, open.streams))
                })
                .collect();
            for (i, streams) in counts {
                self.links[i].workload_streams = streams;
            }
        }
        match self.sent.ack(ack.version) {
            Ok(Some(acked)) => {
                self.listed.update(|s| s.last_acked = Some(ack.version));
                tracing::debug!(agent = %self.agent.name, version = ack.version, generation = acked.generation, "agent state acknowledged");
                self.report_acked(acked).await;
            }
            // Superseded by a newer acknowledgement: it tells nothing new.
            Ok(None) => {}
            Err(NeverSent(version)) => {
                return Err(Status::invalid_argument(format!(
                    "Ack of version {version}, which this stream never sent"
                )))
            }
        }
        self.list_registrations();
        Ok(())
    }

    /// Reports `acked` for those of its streams the stream still speaks for.
    async fn report_acked(&self, acked: Acked) {
        let open: Vec<&HubStream> = self.links.iter().map(|l| &l.stream).collect();
        acked.report(&open).await;
    }

    /// `KeyRequests`: each accepted key is offered to the owner for its registration's next
    /// certificate; a forged or wrong request ends the stream.
    async fn keys(&mut self, keys: KeyRequests) -> Result<(), Status> {
        if keys.requests.len() > KEY_REQUESTS_PER_MESSAGE {
            return Err(Status::resource_exhausted(format!(
                "{} key requests in one message; at most {KEY_REQUESTS_PER_MESSAGE} are taken",
                keys.requests.len()
            )));
        }
        let snapshot = self.snapshots.borrow().clone();
        let algorithm = self.shared.options.key_algorithm;
        for request in keys.requests {
            let Some(link) = self.links.iter_mut().find(|l| {
                *l.registration.proxy.mesh == *request.mesh
                    && l.registration.name == request.registration
            }) else {
                self.shared
                    .ignored_key_requests
                    .fetch_add(1, Ordering::Relaxed);
                if let Some(suppressed) = self.warnings.admit() {
                    tracing::warn!(agent = %shown(&self.agent.name), mesh = %shown(&request.mesh), registration = %shown(&request.registration), suppressed, "a key request for a registration that does not name the agent was ignored");
                }
                continue;
            };
            match keys::check(&request.csr, &link.registration, &snapshot, algorithm) {
                Ok(key)
                    if link
                        .offered
                        .as_deref()
                        .is_some_and(|o| state::same_key(o, &key)) =>
                {
                    // Offered already: the agent sends a request again when a state that left the
                    // server before the request arrived still asks for a key. Offering it again
                    // would change nothing but send the agent another state, which would again be
                    // older than what is in flight.
                    tracing::trace!(agent = %self.agent.name, mesh = %request.mesh, registration = %request.registration, "a key offered again; nothing changes");
                }
                Ok(key) => {
                    let key = Arc::new(key);
                    link.offered = Some(key.clone());
                    tracing::debug!(agent = %self.agent.name, mesh = %request.mesh, registration = %request.registration, stream = %link.stream.id(), replace_now = request.replace_now, "agent offered a key");
                    link.stream.offer_key(key, request.replace_now).await;
                    self.force = true;
                }
                Err(refusal) => {
                    tracing::warn!(agent = %shown(&self.agent.name), mesh = %shown(&request.mesh), registration = %shown(&request.registration), reason = %refusal, "an agent's key request was refused");
                    return Err(Status::invalid_argument(format!(
                        "the key request for registration {}/{} is refused: {refusal}",
                        request.mesh, request.registration
                    )));
                }
            }
        }
        Ok(())
    }

    /// Shows the registrations and their Workload API streams in the status.
    fn list_registrations(&self) {
        let registrations = self
            .links
            .iter()
            .map(|l| RegistrationStatus {
                mesh: l.registration.proxy.mesh.to_string(),
                name: l.registration.name.clone(),
                workload_streams: l.workload_streams,
            })
            .collect();
        self.listed.update(|s| s.registrations = registrations);
    }
}

/// Resolves when `watch` changes, with whether it may change again; never when `live` is false (its
/// sender is gone).
async fn watch_changed<T>(watch: &mut watch::Receiver<T>, live: bool) -> bool {
    if !live {
        return std::future::pending().await;
    }
    watch.changed().await.is_ok()
}
