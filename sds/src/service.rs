//! The SDS gRPC service: construction and the three RPCs.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};
use futures::Stream;
use meshca_auth::{Claims, RevocationList, Verifier};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::events::{StreamEvent, StreamId};
use crate::metrics::SdsMetrics;
use crate::registry::StreamRegistry;
use crate::snapshot::Snapshot;
use crate::{authn, delta, fetch, sotw};

/// Responses buffered per stream before the stream task waits for the proxy to read.
const STREAM_BUFFER: usize = 4;

/// Tunables of the SDS server.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerOptions {
    /// How long a stream or fetch waits for the proxy's identity to become ready (or for
    /// the first request of a stream) before failing with `UNAVAILABLE`.
    pub identity_wait: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            identity_wait: Duration::from_secs(15),
        }
    }
}

impl ServerOptions {
    /// Options with a different identity wait.
    pub fn with_identity_wait(mut self, identity_wait: Duration) -> Self {
        self.identity_wait = identity_wait;
        self
    }
}

/// State shared by every stream of one server.
pub(crate) struct Shared {
    pub(crate) snapshots: watch::Receiver<Arc<Snapshot>>,
    pub(crate) verifier: Verifier,
    pub(crate) revocations: watch::Receiver<Arc<RevocationList>>,
    pub(crate) events: mpsc::UnboundedSender<StreamEvent>,
    pub(crate) options: ServerOptions,
    pub(crate) registry: StreamRegistry,
    pub(crate) metrics: Arc<SdsMetrics>,
    pub(crate) shutdown: CancellationToken,
    next_id: AtomicU64,
}

impl Shared {
    pub(crate) fn next_stream_id(&self) -> StreamId {
        StreamId(self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn emit(&self, event: StreamEvent) {
        // The owner may have stopped listening during shutdown; nothing to do then.
        let _ = self.events.send(event);
    }

    pub(crate) fn auth_failure(&self, status: Status) -> Status {
        SdsMetrics::incr(&self.metrics.auth_failures);
        tracing::info!(code = ?status.code(), message = status.message(), "SDS request refused");
        status
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
    /// `revocations`, and reports stream events on `events`.
    pub fn new(
        snapshots: watch::Receiver<Arc<Snapshot>>,
        verifier: Verifier,
        revocations: watch::Receiver<Arc<RevocationList>>,
        events: mpsc::UnboundedSender<StreamEvent>,
        options: ServerOptions,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                snapshots,
                verifier,
                revocations,
                events,
                options,
                registry: StreamRegistry::default(),
                metrics: Arc::new(SdsMetrics::default()),
                shutdown: CancellationToken::new(),
                next_id: AtomicU64::new(1),
            }),
        }
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

    /// The tonic service, for embedding in another tonic server.
    pub fn into_service(self) -> SecretDiscoveryServiceServer<SdsServer> {
        SecretDiscoveryServiceServer::new(self)
    }
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl SecretDiscoveryService for SdsServer {
    type DeltaSecretsStream = ResponseStream<DeltaDiscoveryResponse>;
    type StreamSecretsStream = ResponseStream<DiscoveryResponse>;

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let claims = self.shared.authenticate(request.metadata())?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(sotw::run(
            self.shared.clone(),
            claims,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn delta_secrets(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        let claims = self.shared.authenticate(request.metadata())?;
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(delta::run(
            self.shared.clone(),
            claims,
            request.into_inner(),
            tx,
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(
        &self,
        request: Request<DiscoveryRequest>,
    ) -> Result<Response<DiscoveryResponse>, Status> {
        let claims = self.shared.authenticate(request.metadata())?;
        fetch::fetch(&self.shared, claims, request.into_inner())
            .await
            .map(Response::new)
    }
}
