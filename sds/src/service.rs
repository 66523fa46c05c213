//! The SDS gRPC service: construction and the three RPCs.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_auth::{Claims, RevocationList, Verifier};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::NamedService;
use tonic::Status;

use meshca_control::{ProxyKey, Snapshot, StreamEvent, StreamId};

use crate::delta::Delta;
use crate::log_budget::LogBudget;
use crate::log_text::shown;
use crate::metrics::SdsMetrics;
use crate::registry::StreamRegistry;
use crate::sotw::Sotw;
use crate::stream::Protocol;
use crate::transport::conn::ConnInfo;
use crate::transport::grpc;
use crate::transport::outbox::OutboxStream;
use crate::transport::wire::DiscoveryRequest;
use crate::wake::{Waiter, Wakes};
use crate::{authn, fetch, session, stream};

/// A good capacity for the event channel handed to [`SdsServer::new`]: enough for a burst of
/// connections and ACKs while the owner reconciles; when it is full, streams wait to report.
pub const EVENT_BUFFER: usize = 4096;

/// Tunables of the SDS server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerOptions {
    /// How long a stream or fetch waits for the proxy's identity to become ready (or for
    /// the first request of a stream) before failing with `UNAVAILABLE`.
    pub identity_wait: Duration,
    /// What one client can make the server hold or wait for.
    pub limits: SdsLimits,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            identity_wait: Duration::from_secs(15),
            limits: SdsLimits::default(),
        }
    }
}

impl ServerOptions {
    /// Options with a different identity wait.
    pub fn with_identity_wait(mut self, identity_wait: Duration) -> Self {
        self.identity_wait = identity_wait;
        self
    }

    /// Options with different limits.
    pub fn with_limits(mut self, limits: SdsLimits) -> Self {
        self.limits = limits;
        self
    }
}

/// Bounds on what a client can make the SDS server hold or wait for (the daemon takes them from
/// the `limits:` settings; the defaults here are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SdsLimits {
    /// Open connections per listener; more are closed as soon as they are accepted.
    pub connections_per_listener: usize,
    /// Time a new connection has to finish its TLS handshake and open its first authenticated
    /// stream.
    pub connect_timeout: Duration,
    /// Time a connection may stay open without an authenticated stream once its streams ended.
    pub idle_timeout: Duration,
    /// Concurrent streams per connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub streams_per_connection: u32,
    /// Concurrent streams of one proxy, over all connections.
    pub streams_per_proxy: usize,
    /// Resource names one stream may subscribe to.
    pub names_per_stream: usize,
    /// Resource names one proxy may subscribe to, over all its streams.
    pub names_per_proxy: usize,
    /// The longest resource name, in bytes.
    pub name_bytes: usize,
    /// The largest request message, in bytes.
    pub request_bytes: usize,
    /// Warnings logged per proxy, and per listener for refused peers, per minute.
    pub warnings_per_minute: u32,
}

impl Default for SdsLimits {
    fn default() -> Self {
        SdsLimits {
            connections_per_listener: 16_384,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            streams_per_connection: 1024,
            streams_per_proxy: 256,
            names_per_stream: 256,
            names_per_proxy: 4096,
            name_bytes: 512,
            request_bytes: 1024 * 1024,
            warnings_per_minute: 10,
        }
    }
}

/// State shared by every stream of one server.
pub(crate) struct Shared {
    pub(crate) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(crate) verifier: Verifier,
    pub(crate) revocations: watch::Receiver<Arc<RevocationList>>,
    pub(crate) events: mpsc::Sender<StreamEvent>,
    pub(crate) options: ServerOptions,
    pub(crate) registry: StreamRegistry,
    pub(crate) metrics: Arc<SdsMetrics>,
    pub(crate) shutdown: CancellationToken,
    /// Log lines about refused requests, which anyone who can connect can cause.
    refusals_logged: LogBudget,
    next_id: AtomicU64,
    /// Where streams wait for the snapshots that concern them.
    wakes: Arc<Wakes>,
    /// Starts the task that wakes them, with the first stream (it needs the runtime).
    dispatcher: std::sync::Once,
}

impl Shared {
    /// A waiter for the streams of `key`, woken by the snapshots that concern them. Subscribe before
    /// reading the snapshot.
    pub(crate) fn waiter(&self, key: &ProxyKey) -> Waiter {
        self.dispatcher.call_once(|| {
            // The generation seen now is the dispatcher's start: any later publish wakes someone.
            let mut snapshots = self.snapshots.clone();
            let last = snapshots.borrow_and_update().generation;
            tokio::spawn(crate::wake::dispatch(
                self.wakes.clone(),
                snapshots,
                last,
                self.revocations.clone(),
                self.shutdown.clone(),
            ));
        });
        self.wakes.subscribe(key)
    }

    pub(crate) fn next_stream_id(&self) -> StreamId {
        StreamId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Reports an event to the owner. The channel is bounded: when the owner falls behind, the stream
    /// waits here (backpressure on that proxy) rather than dropping the event, which the owner's view
    /// of streams and ACKs depends on.
    pub(crate) async fn emit(&self, event: StreamEvent) {
        // The owner may have stopped listening during shutdown; nothing to do then.
        let _ = self.events.send(event).await;
    }

    /// [`Self::emit`] where nothing can wait (a `Drop`): sent at once when there is room, else by a
    /// task that waits for room. Never dropped while the owner listens.
    pub(crate) fn emit_from_drop(&self, event: StreamEvent) {
        match self.events.try_send(event) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                let events = self.events.clone();
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = events.send(event).await;
                    });
                }
            }
        }
    }

    pub(crate) fn auth_failure(&self, status: Status) -> Status {
        SdsMetrics::incr(&self.metrics.auth_failures);
        if let Some(suppressed) = self.refusals_logged.admit() {
            tracing::info!(
                code = ?status.code(),
                message = status.message(),
                suppressed,
                "SDS request refused"
            );
        }
        status
    }

    /// Refuses a request carrying a name longer than [`SdsLimits::name_bytes`] (`INVALID_ARGUMENT`)
    /// or more names than [`SdsLimits::names_per_stream`] (`RESOURCE_EXHAUSTED`).
    pub(crate) fn check_names<'r>(
        &self,
        names: impl Iterator<Item = &'r str>,
    ) -> Result<(), Status> {
        let most_bytes = self.options.limits.name_bytes;
        let mut count = 0;
        for name in names {
            count += 1;
            if name.len() > most_bytes {
                SdsMetrics::incr(&self.metrics.over_limit);
                return Err(Status::invalid_argument(format!(
                    "resource name {} is longer than {most_bytes} bytes (limits.nameBytes)",
                    shown(name),
                )));
            }
        }
        self.check_name_count(count)
    }

    /// Refuses a subscription of more than [`SdsLimits::names_per_stream`] names.
    pub(crate) fn check_name_count(&self, names: usize) -> Result<(), Status> {
        let most = self.options.limits.names_per_stream;
        if names > most {
            SdsMetrics::incr(&self.metrics.over_limit);
            return Err(Status::resource_exhausted(format!(
                "{names} resource names in one subscription; at most {most} are served \
                 (limits.namesPerStream)"
            )));
        }
        Ok(())
    }

    /// Verifies the bearer token of a request against the current revocation list.
    pub(crate) fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<Claims, Status> {
        let revoked = self.revocations.borrow().clone();
        authn::authenticate(metadata, &self.verifier, &revoked, SystemTime::now())
            .map_err(|status| self.auth_failure(status))
    }
}

/// The SDS server. Cheap to clone; every clone serves the same streams.
#[derive(Clone)]
pub struct SdsServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdsServer")
            .field("options", &self.shared.options)
            .field("streams", &self.shared.registry.len())
            .finish()
    }
}

impl SdsServer {
    /// A server that serves `snapshots`, authenticates with `verifier` and the current
    /// `revocations`, and reports stream events on `events` (bounded: see [`EVENT_BUFFER`]).
    pub fn new(
        snapshots: watch::Receiver<Arc<Snapshot>>,
        verifier: Verifier,
        revocations: watch::Receiver<Arc<RevocationList>>,
        events: mpsc::Sender<StreamEvent>,
        options: ServerOptions,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                snapshots,
                verifier,
                revocations,
                events,
                registry: StreamRegistry::default(),
                metrics: Arc::new(SdsMetrics::default()),
                shutdown: CancellationToken::new(),
                refusals_logged: LogBudget::new(options.limits.warnings_per_minute),
                next_id: AtomicU64::new(1),
                wakes: Arc::default(),
                dispatcher: std::sync::Once::new(),
                options,
            }),
        }
    }

    /// The limits the server enforces.
    pub fn limits(&self) -> &SdsLimits {
        &self.shared.options.limits
    }

    /// The open streams, for the admin API.
    pub fn registry(&self) -> StreamRegistry {
        self.shared.registry.clone()
    }

    /// The server's counters.
    pub fn metrics(&self) -> Arc<SdsMetrics> {
        self.shared.metrics.clone()
    }

    /// Ends every open stream with `UNAVAILABLE` (so a graceful HTTP/2 shutdown can
    /// complete) and refuses new ones. [`crate::BoundListeners::serve`] calls it when its
    /// shutdown token fires.
    pub fn close_streams(&self) {
        self.shared.shutdown.cancel();
    }

    /// The tonic service, for embedding in another tonic server. It answers what the generated
    /// `SecretDiscoveryServiceServer` answers, but frames the two streaming methods itself
    /// ([`crate::transport::grpc`]) so that an idle stream holds no message buffer.
    pub fn into_service(
        self,
    ) -> impl Service<
        http::Request<tonic::body::Body>,
        Response = http::Response<tonic::body::Body>,
        Error = Infallible,
        Future = BoxFuture<http::Response<tonic::body::Body>, Infallible>,
    > + NamedService
           + Clone
           + Send
           + Sync
           + 'static {
        GrpcService { server: self }
    }
}

/// Routes the three SDS methods to [`SdsServer`], all framed by [`crate::transport::grpc`]: every request's
/// token is checked on its headers, before any of its body is read.
#[derive(Clone)]
struct GrpcService {
    server: SdsServer,
}

impl NamedService for GrpcService {
    const NAME: &'static str = "envoy.service.secret.v3.SecretDiscoveryService";
}

const STREAM_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";
const DELTA_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets";
const FETCH_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets";

impl<B> Service<http::Request<B>> for GrpcService
where
    B: Body<Data = tonic::codegen::Bytes> + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let server = self.server.clone();
        match request.uri().path() {
            STREAM_SECRETS => {
                let response = server.open_stream::<Sotw>(request.map(tonic::body::Body::new));
                Box::pin(async move { Ok(response) })
            }
            DELTA_SECRETS => {
                let response = server.open_stream::<Delta>(request.map(tonic::body::Body::new));
                Box::pin(async move { Ok(response) })
            }
            FETCH_SECRETS => server.fetch(request.map(tonic::body::Body::new)),
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

impl SdsServer {
    /// `StreamSecrets` or `DeltaSecrets`: authenticates the stream's token and answers with its
    /// responses, driven by [`stream::run`] from inside the response body (no task of its own).
    fn open_stream<P: Protocol>(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> http::Response<tonic::body::Body>
    where
        P::Request: prost::Message + Default,
        P::Response: grpc::Encode,
    {
        let (parts, body) = request.into_parts();
        let (claims, open) = match self.admit(parts) {
            Ok(admitted) => admitted,
            Err(status) => return status.into_http(),
        };
        let start = Box::new(stream::Start {
            shared: self.shared.clone(),
            claims,
            inbound: grpc::Requests::new(body, self.shared.options.limits.request_bytes),
        });
        grpc::response::<P::Response>(Box::pin(OutboxStream::new(|outbox| async move {
            stream::run::<P>(start, outbox).await;
            drop(open);
        })))
    }

    /// Checks a request's headers: an uncompressed body and a valid token. Nothing of its body has
    /// been read: a request that fails here is answered without reading any.
    fn admit(
        &self,
        parts: http::request::Parts,
    ) -> Result<(Claims, Option<crate::transport::conn::StreamGuard>), Status> {
        if let Some(encoding) = parts
            .headers
            .get("grpc-encoding")
            .filter(|e| *e != "identity")
        {
            return Err(Status::unimplemented(format!(
                "requests compressed with {} are not accepted; send them uncompressed",
                shown(&String::from_utf8_lossy(encoding.as_bytes()))
            )));
        }
        let extensions = parts.extensions;
        let metadata = tonic::metadata::MetadataMap::from_headers(parts.headers);
        let claims = self.shared.authenticate(&metadata)?;
        // Counted only once authenticated: a refused request must not keep its connection open.
        Ok((claims, opened_on_connection(&extensions)))
    }

    /// `FetchSecrets`: authenticates the token on the headers, then reads the one request message
    /// the way a stream reads its first (through the trimmer, bounded in size and in time), and
    /// answers it.
    fn fetch(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        let (parts, body) = request.into_parts();
        let (claims, open) = match self.admit(parts) {
            Ok(admitted) => admitted,
            Err(status) => return Box::pin(async move { Ok(status.into_http()) }),
        };
        let shared = self.shared.clone();
        Box::pin(async move {
            let limit = shared.options.limits.request_bytes;
            let mut inbound = grpc::Requests::<DiscoveryRequest>::new(body, limit);
            let answer = match session::first_request(&shared, inbound.message()).await {
                Ok(Some(request)) => {
                    // The rest of the body (its end) is not waited for: the answer needs nothing
                    // more, and what the body held goes now.
                    drop(inbound);
                    fetch::fetch(&shared, claims, request).await
                }
                Ok(None) => Err(Status::invalid_argument(
                    "the request ended without a message: FetchSecrets takes one DiscoveryRequest",
                )),
                Err(status) => Err(status),
            };
            drop(open);
            Ok(match answer {
                Ok(response) => grpc::response(Box::pin(futures::stream::once(async move {
                    Ok::<_, Status>(response)
                }))),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// Counts an authenticated request as a stream open on its connection (which keeps the connection
/// from being closed as idle) until the guard drops. Requests that did not come through
/// [`crate::bind`]'s listeners (a server embedded elsewhere) have no connection to count on.
fn opened_on_connection(
    extensions: &http::Extensions,
) -> Option<crate::transport::conn::StreamGuard> {
    extensions
        .get::<ConnInfo>()
        .map(|info| info.tracker.stream_opened())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with_encoding(encoding: Option<&str>) -> http::Request<tonic::body::Body> {
        let mut request = http::Request::new(tonic::body::Body::empty());
        if let Some(encoding) = encoding {
            request
                .headers_mut()
                .insert("grpc-encoding", encoding.parse().expect("a header value"));
        }
        request
    }

    #[tokio::test]
    async fn a_compressed_stream_is_refused_before_its_token_is_read() {
        let (server, _events) = server_with_events(16);
        let status_of = |encoding| {
            let response = server.open_stream::<Sotw>(request_with_encoding(encoding));
            response.headers()["grpc-status"]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(status_of(Some("gzip")), "12", "UNIMPLEMENTED");
        // Uncompressed streams go on to authentication, which finds no token.
        assert_eq!(status_of(Some("identity")), "16", "UNAUTHENTICATED");
        assert_eq!(status_of(None), "16", "UNAUTHENTICATED");
    }

    fn server_with_events(capacity: usize) -> (SdsServer, mpsc::Receiver<StreamEvent>) {
        let (signing, _pkcs8) = meshca_auth::SigningKey::generate().expect("a token key");
        let (_snapshots, snapshot_rx) = watch::channel(Arc::new(Snapshot::empty()));
        let (_revocations, revocation_rx) = watch::channel(Arc::new(RevocationList::new()));
        let (events, event_rx) = mpsc::channel(capacity);
        let server = SdsServer::new(
            snapshot_rx,
            signing.verifier(),
            revocation_rx,
            events,
            ServerOptions::default(),
        );
        (server, event_rx)
    }

    #[tokio::test]
    async fn a_full_event_channel_delays_events_but_never_drops_them() {
        let (server, mut events) = server_with_events(1);
        let shared = &server.shared;
        shared
            .emit(StreamEvent::Disconnected {
                stream: StreamId(1),
            })
            .await;
        // The channel is full: a stream would wait here; a Drop hands the event to a task.
        shared.emit_from_drop(StreamEvent::Disconnected {
            stream: StreamId(2),
        });
        let mut waiting = Box::pin(shared.emit(StreamEvent::Disconnected {
            stream: StreamId(3),
        }));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "a sender waits while the owner is behind"
        );
        let receive = async {
            let mut seen = Vec::new();
            for _ in 0..3 {
                let event = events.recv().await.expect("every event arrives");
                seen.push(event.stream().0);
            }
            seen
        };
        let ((), mut seen) = tokio::join!(waiting, receive);
        seen.sort();
        assert_eq!(seen, [1, 2, 3]);
    }

    #[tokio::test]
    async fn methods_outside_sds_are_unimplemented() {
        let (server, _events) = server_with_events(1);
        let mut service = server.into_service();
        let request = http::Request::builder()
            .uri("/envoy.service.secret.v3.SecretDiscoveryService/Nothing")
            .body(tonic::body::Body::empty())
            .expect("a valid request");
        let response = service.call(request).await.expect("infallible");
        let status = response
            .headers()
            .get("grpc-status")
            .expect("a gRPC status");
        assert_eq!(status, &(tonic::Code::Unimplemented as i32).to_string());
    }
}
