//! The SDS gRPC service: construction and the three RPCs.

use std::convert::Infallible;
use std::sync::Arc;

use meshca_auth::{Claims, RevocationList, Verifier};

use crate::authn::{AttestedCheck, Principal};
use tokio::sync::{mpsc, watch};
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::Status;

use meshca_control::{ProxyKey, Snapshot, StreamEvent, StreamId};

use crate::delta::Delta;
use crate::grpc_service::{Grpc, GrpcMethods};
use crate::log_text::shown;
use crate::metrics::SdsMetrics;
use crate::options::{SdsLimits, ServerOptions};
use crate::registry::StreamRegistry;
use crate::shared::Shared;
use crate::sotw::Sotw;
use crate::stream::Protocol;
use crate::transport::conn::ConnInfo;
use crate::transport::grpc;
use crate::transport::outbox::OutboxStream;
use crate::transport::wire::DiscoveryRequest;
use crate::{authn, fetch, session, stream};

/// A good capacity for the event channel handed to [`SdsServer::new`]: enough for a burst of
/// connections and ACKs while the owner reconciles; when it is full, streams wait to report.
pub const EVENT_BUFFER: usize = 4096;

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
            shared: Arc::new(Shared::new(
                snapshots,
                verifier,
                revocations,
                events,
                options,
            )),
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

    /// A new stream id, unique among this server's streams and those of any service that reports its
    /// streams through [`SdsServer::report`].
    pub fn next_stream_id(&self) -> StreamId {
        self.shared.next_stream_id()
    }

    /// Verifies the `authorization: Bearer <token>` header of a request of another service on this
    /// server's listeners (the agent protocol) exactly as SDS verifies its streams' tokens: signed by
    /// this server's key, not expired, not revoked. Unlike SDS it accepts a token of any type; the
    /// caller checks the type. Every failure is `UNAUTHENTICATED`, counted and logged as SDS's are.
    pub fn verify_bearer(&self, headers: &http::HeaderMap) -> Result<Claims, Status> {
        self.shared.verify_bearer(headers)
    }

    /// The revoked tokens, as the server's streams read them: a stream whose token appears in a new
    /// list ends.
    pub fn revocations(&self) -> watch::Receiver<Arc<RevocationList>> {
        self.shared.revocations.clone()
    }

    /// How long a stream waits for its first request (and for its proxy's identity) before it fails.
    pub fn first_request_wait(&self) -> std::time::Duration {
        self.shared.options.identity_wait
    }

    /// Resolves once [`SdsServer::close_streams`] was called: streams of other services on the same
    /// listeners end then too, so that a graceful shutdown can complete.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        self.shared.shutdown.clone().cancelled_owned()
    }

    /// The snapshots this server serves.
    pub fn snapshots(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.shared.snapshots.clone()
    }

    /// A wait for the snapshots that concern `proxy`, rung by the dispatcher that wakes this server's
    /// streams. Subscribe before reading the snapshot.
    pub fn snapshot_waiter(&self, proxy: &ProxyKey) -> SnapshotWaiter {
        SnapshotWaiter(self.shared.waiter(proxy))
    }

    /// Reports a stream event to the owner, as this server's streams do: another service whose streams
    /// must count for the rollout gate (the Workload API) reports through here. Waits while the
    /// owner's channel is full.
    pub async fn report(&self, event: StreamEvent) {
        self.shared.emit(event).await;
    }

    /// [`SdsServer::report`] where nothing can wait (a `Drop`): sent at once when there is room, else
    /// by a task that waits for room; never dropped while the owner listens.
    pub fn report_from_drop(&self, event: StreamEvent) {
        self.shared.emit_from_drop(event);
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
        Grpc(self)
    }
}

/// A caller another service authenticated instead of by a token: the Workload API socket, which knows
/// its callers by their process. Its requests carry no token and their node ids are not checked; the
/// rest is as for a proxy with a token.
pub struct Attested {
    /// What the caller is served as: the proxy, its labels, and the expiry that ends its streams.
    pub claims: Claims,
    /// Asked of each snapshot the caller is served from; an error ends its stream (its registration
    /// went away).
    pub check: AttestedCheck,
    /// Kept for as long as the stream or fetch runs (e.g. the caller's place in a limit).
    pub hold: Box<dyn std::any::Any + Send + Sync>,
}

impl std::fmt::Debug for Attested {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attested")
            .field("proxy", &authn::proxy_key(&self.claims))
            .finish_non_exhaustive()
    }
}

/// One stream's wait for the snapshots that concern its proxy (see [`SdsServer::snapshot_waiter`]).
#[derive(Debug)]
pub struct SnapshotWaiter(crate::wake::Waiter);

impl SnapshotWaiter {
    /// Resolves when a snapshot may concern the proxy (since the last time this resolved); false once
    /// no snapshot will come any more (the server is shutting down). Cancel-safe.
    pub async fn changed(&mut self) -> bool {
        self.0.changed().await
    }
}

/// SDS's service name: its three methods are routed to [`SdsServer`], all framed by
/// [`crate::transport::grpc`]: every request's token is checked on its headers, before any of its body is
/// read.
impl GrpcMethods for SdsServer {
    const NAME: &'static str = "envoy.service.secret.v3.SecretDiscoveryService";

    fn answer(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        self.serve_as(request, None)
    }
}

const STREAM_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/StreamSecrets";
const DELTA_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/DeltaSecrets";
const FETCH_SECRETS: &str = "/envoy.service.secret.v3.SecretDiscoveryService/FetchSecrets";

/// Whether a request path is one of the SDS methods.
pub fn is_sds_method(path: &str) -> bool {
    matches!(path, STREAM_SECRETS | DELTA_SECRETS | FETCH_SECRETS)
}

impl SdsServer {
    /// Serves an SDS request of a caller that `attested` speaks for: no token is read and the node ids
    /// of its requests are not checked; everything else (names, limits, ACKs, the rollout gate) is as
    /// for a proxy with a token. A path that is no SDS method answers `UNIMPLEMENTED`.
    pub fn serve_attested(
        &self,
        request: http::Request<tonic::body::Body>,
        attested: Attested,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        self.serve_as(request, Some(attested))
    }

    /// Routes an SDS request: authenticated by its token, or by `attested`.
    fn serve_as(
        &self,
        request: http::Request<tonic::body::Body>,
        attested: Option<Attested>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        let response = match request.uri().path() {
            STREAM_SECRETS => self.open_stream::<Sotw>(request, attested),
            DELTA_SECRETS => self.open_stream::<Delta>(request, attested),
            FETCH_SECRETS => return self.fetch(request, attested),
            _ => Status::unimplemented("").into_http(),
        };
        Box::pin(async move { Ok(response) })
    }
}

impl SdsServer {
    /// `StreamSecrets` or `DeltaSecrets`: authenticates the stream's token and answers with its
    /// responses, driven by [`stream::run`] from inside the response body (no task of its own).
    fn open_stream<P: Protocol>(
        &self,
        request: http::Request<tonic::body::Body>,
        attested: Option<Attested>,
    ) -> http::Response<tonic::body::Body>
    where
        P::Request: prost::Message + Default,
        P::Response: grpc::Encode,
    {
        let (parts, body) = request.into_parts();
        let Admitted {
            principal,
            open,
            hold,
        } = match self.admit(parts, attested) {
            Ok(admitted) => admitted,
            Err(status) => return status.into_http(),
        };
        let start = Box::new(stream::Start {
            shared: self.shared.clone(),
            principal,
            inbound: grpc::Requests::new(body, self.shared.options.limits.request_bytes),
        });
        grpc::response::<P::Response>(Box::pin(OutboxStream::new(|outbox| async move {
            stream::run::<P>(start, outbox).await;
            drop(open);
            drop(hold);
        })))
    }

    /// Checks a request's headers: an uncompressed body and a valid token (unless `attested` speaks
    /// for the caller). Nothing of its body has been read: a request that fails here is answered
    /// without reading any.
    fn admit(
        &self,
        parts: http::request::Parts,
        attested: Option<Attested>,
    ) -> Result<Admitted, Status> {
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
        let (principal, hold) = match attested {
            Some(Attested {
                claims,
                check,
                hold,
            }) => (
                Principal {
                    claims,
                    attested: Some(check),
                },
                Some(hold),
            ),
            None => (
                Principal::token(self.shared.authenticate(&parts.headers)?),
                None,
            ),
        };
        // Counted only once authenticated: a refused request must not keep its connection open.
        Ok(Admitted {
            principal,
            open: opened_on_connection(&parts.extensions),
            hold,
        })
    }

    /// `FetchSecrets`: authenticates the token on the headers, then reads the one request message
    /// the way a stream reads its first (through the trimmer, bounded in size and in time), and
    /// answers it.
    fn fetch(
        &self,
        request: http::Request<tonic::body::Body>,
        attested: Option<Attested>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        let (parts, body) = request.into_parts();
        let Admitted {
            principal,
            open,
            hold,
        } = match self.admit(parts, attested) {
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
                    fetch::fetch(&shared, principal, request).await
                }
                Ok(None) => Err(Status::invalid_argument(
                    "the request ended without a message: FetchSecrets takes one DiscoveryRequest",
                )),
                Err(status) => Err(status),
            };
            drop(open);
            drop(hold);
            Ok(match answer {
                Ok(response) => grpc::response(Box::pin(futures::stream::once(async move {
                    Ok::<_, Status>(response)
                }))),
                Err(status) => status.into_http(),
            })
        })
    }
}

/// A request whose headers were accepted.
struct Admitted {
    principal: Principal,
    /// The request counted as a stream open on its connection.
    open: Option<crate::transport::conn::StreamGuard>,
    /// What the attesting service asked to keep while the request runs.
    hold: Option<Box<dyn std::any::Any + Send + Sync>>,
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
    use meshca_control::StreamId;

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
            let response = server.open_stream::<Sotw>(request_with_encoding(encoding), None);
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
