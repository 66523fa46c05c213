//! The `SpiffeWorkloadAPI` gRPC service: the security header, the caller's attestation, and routing to
//! the methods.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::stream::BoxStream;
use meshca_control::Snapshot;
use meshca_sds::{ConnInfo, LogBudget, SdsServer};
use tonic::codegen::{http, Body, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService, UnaryService};
use tonic::Status;
use tonic_prost::ProstCodec;

use crate::attest::{self, AttestError, AttestLimits, PeerProcess, Selectors};
use crate::callers::Callers;
use crate::follow::{Bundles, Follow, Svids, View};
use crate::jwt::JwtSvidCache;
use crate::jwt_api;
use crate::jwt_keys::JwtKeys;
use crate::proto::{
    paths, JwtBundlesRequest, JwtBundlesResponse, X509BundlesRequest, X509SvidRequest,
};
use crate::x509::MAX_RESPONSE_BYTES;

/// The metadata every Workload API request must carry, with the value `true`: it proves the request
/// comes from a client that meant to call the Workload API (a browser or a confused proxy cannot set
/// it), so a request without it is refused before anything else happens.
pub const SECURITY_HEADER: &str = "workload.spiffe.io";

/// The default of [`WorkloadOptions::ack_after`] (the setting `workloadApi.ackAfter`).
pub const DEFAULT_ACK_AFTER: Duration = Duration::from_secs(1);

/// Tunables and bounds of the Workload API server.
#[derive(Debug, Clone)]
pub struct WorkloadOptions {
    /// How long a stream waits for its caller's identity before failing with `UNAVAILABLE`.
    pub identity_wait: Duration,
    /// How long after a message is written it counts as ACKed for the rollout gate: a Workload API
    /// client sends nothing back, so this is the time a workload gets to put a new bundle or SVID in
    /// use (a SPIFFE library does at once; an application reloading files from spiffe-helper takes
    /// longer).
    pub ack_after: Duration,
    /// Concurrent streams of one caller (one process).
    pub streams_per_caller: usize,
    /// The largest request message, in bytes.
    pub request_bytes: usize,
    /// Bounds on attesting a caller.
    pub attest: AttestLimits,
    /// Warnings about refused callers logged per minute.
    pub warnings_per_minute: u32,
    /// Audiences one JWT-SVID request may ask for (`limits.jwtAudiencesPerRequest`).
    pub jwt_audiences_per_request: usize,
    /// The longest audience, in bytes (`limits.jwtAudienceBytes`).
    pub jwt_audience_bytes: usize,
    /// Signed JWT-SVIDs kept for reuse (`limits.jwtSvidCacheEntries`).
    pub jwt_svid_cache_entries: usize,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            identity_wait: Duration::from_secs(15),
            ack_after: DEFAULT_ACK_AFTER,
            streams_per_caller: 64,
            request_bytes: 64 * 1024,
            attest: AttestLimits::default(),
            warnings_per_minute: 10,
            jwt_audiences_per_request: 32,
            jwt_audience_bytes: 1024,
            jwt_svid_cache_entries: 4096,
        }
    }
}

/// The Workload API server. It rides on the daemon's SDS server, whose snapshots it serves and
/// through which its streams report to the owner, so the rollout gate counts them.
#[derive(Clone)]
pub struct WorkloadApi {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WorkloadApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadApi")
            .field("options", &self.shared.options)
            .finish_non_exhaustive()
    }
}

/// What every request of one server shares.
pub(crate) struct Shared {
    pub(crate) sds: SdsServer,
    pub(crate) options: WorkloadOptions,
    /// Open streams per caller process.
    streams: Mutex<HashMap<u32, usize>>,
    /// The open streams, for operators.
    pub(crate) callers: Callers,
    refusals_logged: LogBudget,
    /// The JWT signing keys of every trust domain.
    pub(crate) jwt_keys: JwtKeys,
    /// Signed JWT-SVIDs kept for reuse.
    pub(crate) jwt_cache: Mutex<JwtSvidCache>,
}

impl WorkloadApi {
    /// A server that serves what `sds` serves, to the callers of the Workload API socket, signing
    /// JWT-SVIDs with `jwt_keys`.
    pub fn new(sds: SdsServer, options: WorkloadOptions, jwt_keys: JwtKeys) -> Self {
        WorkloadApi {
            shared: Arc::new(Shared {
                sds,
                jwt_keys,
                jwt_cache: Mutex::new(JwtSvidCache::new(options.jwt_svid_cache_entries)),
                refusals_logged: LogBudget::new(options.warnings_per_minute),
                options,
                streams: Mutex::new(HashMap::new()),
                callers: Callers::default(),
            }),
        }
    }

    /// The open streams and their callers, for the admin API.
    pub fn callers(&self) -> Callers {
        self.shared.callers.clone()
    }

    /// The probe the listener runs on each accepted connection: the caller's process, as the kernel
    /// names it (see [`crate::attest::PeerProcess`]).
    pub fn peer_probe() -> meshca_sds::PeerProbe {
        Arc::new(|socket| match PeerProcess::of(socket) {
            Ok(peer) => Some(Arc::new(peer) as Arc<dyn std::any::Any + Send + Sync>),
            Err(error) => {
                tracing::debug!(%error, "the Workload API caller's process could not be identified");
                None
            }
        })
    }
}

/// One open stream's place in its caller's limit; released when the stream ends.
pub(crate) struct CallerSlot {
    shared: Arc<Shared>,
    pid: u32,
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        let mut streams = self
            .shared
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(open) = streams.get_mut(&self.pid) {
            *open -= 1;
            if *open == 0 {
                streams.remove(&self.pid);
            }
        }
    }
}

/// A caller that passed attestation, with its stream slot.
pub(crate) struct Admitted {
    pub selectors: Arc<Selectors>,
    pub caller: String,
    /// The caller's pid, uid and gid.
    pub ids: (u32, u32, u32),
    pub slot: CallerSlot,
    pub open: Option<meshca_sds::OpenStream>,
}

impl Shared {
    /// Attests the caller of a request on `conn` and takes a slot of its stream limit.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        conn: Option<&ConnInfo>,
    ) -> Result<Admitted, Status> {
        let peer = conn.and_then(ConnInfo::peer::<PeerProcess>).ok_or_else(|| {
            Status::unauthenticated(
                "the Workload API identifies callers by their process: connect over its unix socket",
            )
        })?;
        let slot = self.take_slot(peer.pid())?;
        let limits = self.options.attest;
        let attested = {
            let peer = peer.clone();
            tokio::task::spawn_blocking(move || attest::attest(&peer, &limits)).await
        };
        let caller = match attested {
            Ok(Ok(caller)) => caller,
            Ok(Err(error)) => return Err(self.refuse_attestation(&peer, error)),
            Err(_) => return Err(Status::unavailable("workload attestation failed")),
        };
        Ok(Admitted {
            caller: format!("pid {} uid {}", caller.pid, caller.uid),
            ids: (caller.pid, caller.uid, caller.gid),
            selectors: Arc::new(caller.selectors),
            slot,
            open: conn.map(ConnInfo::stream_opened),
        })
    }

    fn take_slot(self: &Arc<Self>, pid: u32) -> Result<CallerSlot, Status> {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        let open = streams.entry(pid).or_default();
        if *open >= self.options.streams_per_caller {
            return Err(Status::resource_exhausted(format!(
                "the caller has {} Workload API streams open, the most one process may \
                 (limits.workloadStreamsPerCaller)",
                *open
            )));
        }
        *open += 1;
        Ok(CallerSlot {
            shared: self.clone(),
            pid,
        })
    }

    fn refuse_attestation(&self, peer: &PeerProcess, error: AttestError) -> Status {
        if self.refusals_logged.admit().is_some() {
            tracing::warn!(pid = peer.pid(), %error, "refused a Workload API caller");
        }
        match error {
            AttestError::CallerGone { .. } => Status::unauthenticated(
                "could not verify that the caller is still the process that connected",
            ),
            _ => Status::unavailable("workload attestation failed"),
        }
    }

    /// The snapshot to match callers against: the newest one, once the owner has published its first
    /// (a caller right after the start waits for it, then `UNAVAILABLE`, which clients retry).
    pub(crate) async fn published(&self) -> Result<Arc<Snapshot>, Status> {
        let mut snapshots = self.sds.snapshots();
        let first = async {
            loop {
                let snapshot = snapshots.borrow_and_update().clone();
                if snapshot.generation > 0 {
                    return Ok(snapshot);
                }
                if snapshots.changed().await.is_err() {
                    return Err(Status::unavailable("the server is shutting down"));
                }
            }
        };
        tokio::time::timeout(self.options.identity_wait, first)
            .await
            .unwrap_or_else(|_| {
                Err(Status::unavailable(
                    "the daemon is starting: it has not published its identities yet",
                ))
            })
    }

    /// Refuses a caller that matches no registration (it may be registered later: clients retry).
    pub(crate) fn no_registration(&self, caller: &str) -> Status {
        if self.refusals_logged.admit().is_some() {
            tracing::info!(%caller, "a Workload API caller matches no WorkloadRegistration");
        }
        Status::permission_denied("no identity issued: the caller matches no WorkloadRegistration")
    }
}

/// Whether the request carries the security header exactly once, with the value `true`.
fn has_security_header(headers: &http::HeaderMap) -> bool {
    let mut values = headers.get_all(SECURITY_HEADER).iter();
    matches!((values.next(), values.next()), (Some(v), None) if v == "true")
}

impl NamedService for WorkloadApi {
    const NAME: &'static str = "SpiffeWorkloadAPI";
}

impl<B> Service<http::Request<B>> for WorkloadApi
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
        let shared = self.shared.clone();
        Box::pin(async move {
            if !has_security_header(request.headers()) {
                return Ok(
                    Status::invalid_argument("security header missing from request").into_http(),
                );
            }
            let request = request.map(tonic::body::Body::new);
            Ok(match request.uri().path() {
                paths::FETCH_X509_SVID => serve_stream::<Svids>(shared, request).await,
                paths::FETCH_X509_BUNDLES => serve_stream::<Bundles>(shared, request).await,
                paths::FETCH_WIT_SVID | paths::FETCH_WIT_BUNDLES => {
                    Status::unimplemented("WIT-SVIDs are not supported").into_http()
                }
                paths::FETCH_JWT_SVID => {
                    serve_unary(shared, request, |s, r| {
                        Box::pin(jwt_api::fetch_jwt_svid(s, r))
                    })
                    .await
                }
                paths::VALIDATE_JWT_SVID => {
                    serve_unary(shared, request, |s, r| {
                        Box::pin(jwt_api::validate_jwt_svid(s, r))
                    })
                    .await
                }
                paths::FETCH_JWT_BUNDLES => {
                    let request_bytes = shared.options.request_bytes;
                    Grpc::new(ProstCodec::<JwtBundlesResponse, JwtBundlesRequest>::default())
                        .apply_max_message_size_config(
                            Some(request_bytes),
                            Some(MAX_RESPONSE_BYTES),
                        )
                        .server_streaming(JwtBundlesMethod { shared }, request)
                        .await
                }
                _ => Status::unimplemented("no such method of the Workload API").into_http(),
            })
        })
    }
}

/// A unary method's handler.
type UnaryHandler<Req, Resp> =
    fn(Arc<Shared>, tonic::Request<Req>) -> BoxFuture<tonic::Response<Resp>, Status>;

/// Answers a unary method: requests no larger than the limit, responses under what clients accept.
async fn serve_unary<Req, Resp>(
    shared: Arc<Shared>,
    request: http::Request<tonic::body::Body>,
    handler: UnaryHandler<Req, Resp>,
) -> http::Response<tonic::body::Body>
where
    Req: prost::Message + Default + Send + 'static,
    Resp: prost::Message + Send + 'static,
{
    let request_bytes = shared.options.request_bytes;
    Grpc::new(ProstCodec::<Resp, Req>::default())
        .apply_max_message_size_config(Some(request_bytes), Some(MAX_RESPONSE_BYTES))
        .unary(Unary { shared, handler }, request)
        .await
}

/// A unary method and what it runs.
struct Unary<Req, Resp> {
    shared: Arc<Shared>,
    handler: UnaryHandler<Req, Resp>,
}

impl<Req: Send + 'static, Resp: Send + 'static> UnaryService<Req> for Unary<Req, Resp> {
    type Response = Resp;
    type Future = BoxFuture<tonic::Response<Resp>, Status>;

    fn call(&mut self, request: tonic::Request<Req>) -> Self::Future {
        (self.handler)(self.shared.clone(), request)
    }
}

/// `FetchJWTBundles`.
struct JwtBundlesMethod {
    shared: Arc<Shared>,
}

impl ServerStreamingService<JwtBundlesRequest> for JwtBundlesMethod {
    type Response = JwtBundlesResponse;
    type ResponseStream = BoxStream<'static, Result<JwtBundlesResponse, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<JwtBundlesRequest>) -> Self::Future {
        Box::pin(jwt_api::fetch_jwt_bundles(self.shared.clone(), request))
    }
}

/// Answers a streaming method whose messages `V` builds: requests no larger than the limit, responses
/// under what clients accept.
async fn serve_stream<V: View + Answers>(
    shared: Arc<Shared>,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let request_bytes = shared.options.request_bytes;
    Grpc::new(ProstCodec::<V::Message, V::Request>::default())
        .apply_max_message_size_config(Some(request_bytes), Some(MAX_RESPONSE_BYTES))
        .server_streaming(Method::<V>::new(shared), request)
        .await
}

/// A streaming method whose messages a [`View`] builds.
struct Method<V> {
    shared: Arc<Shared>,
    _view: std::marker::PhantomData<fn() -> V>,
}

impl<V> Method<V> {
    fn new(shared: Arc<Shared>) -> Self {
        Method {
            shared,
            _view: std::marker::PhantomData,
        }
    }
}

/// The requests of the two streaming methods carry no parameters.
trait EmptyRequest: prost::Message + Default + Send + 'static {}
impl EmptyRequest for X509SvidRequest {}
impl EmptyRequest for X509BundlesRequest {}

/// Which request each view answers.
trait Answers {
    type Request: EmptyRequest;
}
impl Answers for Svids {
    type Request = X509SvidRequest;
}
impl Answers for Bundles {
    type Request = X509BundlesRequest;
}

impl<V: View + Answers> ServerStreamingService<V::Request> for Method<V> {
    type Response = V::Message;
    type ResponseStream = BoxStream<'static, Result<V::Message, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<V::Request>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move {
            let admitted = shared.admit(request.extensions().get::<ConnInfo>()).await?;
            let snapshot = shared.published().await?;
            let selectors = &admitted.selectors;
            let matched = snapshot
                .registrations
                .matching(None, |s| selectors.contains(s));
            if matched.is_empty() {
                return Err(shared.no_registration(&admitted.caller));
            }
            jwt_api::ensure_keys_of(&shared, &snapshot, &matched);
            let follow = Follow::<V>::new(shared.clone(), admitted);
            Ok(tonic::Response::new(follow.into_stream()))
        })
    }
}
