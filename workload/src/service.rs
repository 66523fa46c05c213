//! The `SpiffeWorkloadAPI` gRPC service: the security header and routing to the methods (the caller's
//! admission is in [`crate::shared`]).

use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};

use futures::stream::{BoxStream, StreamExt};
use meshca_serve::frames::{self, Encoded};
use meshca_serve::grpc_service::{self, GrpcMethods};
use meshca_serve::StreamCodec;
use meshca_serve::{AttestedRoutes, ConnInfo, ConnPolicy, Hub, PeerProbe, StreamLimits};
use tonic::codegen::{http, BoxFuture};
use tonic::server::{Grpc, ServerStreamingService, UnaryService};
use tonic::Status;

use crate::attest::PeerProcess;
use crate::callers::Callers;
use crate::follow::{Bundles, Follow, Svids, View};
use crate::jwt_api;
use crate::jwt_keys::JwtKeys;
use crate::jwt_source::JwtSource;
use crate::options::WorkloadOptions;
use crate::proto::{
    paths, JwtBundlesRequest, JwtBundlesResponse, X509BundlesRequest, X509SvidRequest,
};
use crate::sds_api::SdsCallers;
use crate::shared::Shared;
use crate::x509::MAX_RESPONSE_BYTES;

/// The metadata every Workload API request must carry, with the value `true`: it proves the request
/// comes from a client that meant to call the Workload API (a browser or a confused proxy cannot set
/// it), so a request without it is refused before anything else happens.
pub const SECURITY_HEADER: &str = "workload.spiffe.io";

/// The Workload API server. Its streams stand on the daemon's stream hub, whose snapshots they serve and
/// through which they report to the owner, so the rollout gate counts them.
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

impl WorkloadApi {
    /// A server of `hub`'s snapshots to the callers of the Workload API socket, signing JWT-SVIDs with
    /// `jwt_keys`.
    pub fn new(hub: Hub, options: WorkloadOptions, jwt_keys: JwtKeys) -> Self {
        WorkloadApi {
            shared: Arc::new(Shared::new(hub, options, Some(JwtSource::Local(jwt_keys)))),
        }
    }

    /// A server of `hub`'s snapshots, with JWT-SVIDs from `jwt` (`None`: X.509-SVIDs and bundles only,
    /// and the JWT methods answer `UNAVAILABLE`).
    pub fn with_jwt_source(hub: Hub, options: WorkloadOptions, jwt: Option<JwtSource>) -> Self {
        WorkloadApi {
            shared: Arc::new(Shared::new(hub, options, jwt)),
        }
    }

    /// The open streams and their callers, for the admin API.
    pub fn callers(&self) -> Callers {
        self.shared.callers.clone()
    }

    /// How a Workload API socket treats its connections: `limits`, the caller's process learned on
    /// each ([`WorkloadApi::peer_probe`]), and at most `connections_per_uid` connections of one user,
    /// so that no user (registered or not) can take every connection slot from the others.
    pub fn conn_policy(&self, limits: StreamLimits) -> ConnPolicy {
        ConnPolicy::new("Workload API", "limits.workloadConnections", limits)
            .with_peer_probe(Self::peer_probe())
            .with_connections_per_uid(
                self.shared.options.connections_per_uid,
                "limits.workloadConnectionsPerUid",
            )
    }

    /// The probe the listener runs on each accepted connection: the caller's process, as the kernel
    /// names it (see [`crate::attest::PeerProcess`]).
    pub fn peer_probe() -> PeerProbe {
        Arc::new(|socket| match PeerProcess::of(socket) {
            Ok(peer) => Some(Arc::new(peer) as Arc<dyn std::any::Any + Send + Sync>),
            Err(error) => {
                tracing::debug!(%error, "the Workload API caller's process could not be identified");
                None
            }
        })
    }
}

impl WorkloadApi {
    /// Every gRPC service of the Workload API socket: the Workload API itself and, when `sds` is given,
    /// SDS for Envoys set up for a SPIRE agent's socket, its callers attested as the Workload API's are
    /// (see [`crate::sds_api`]).
    pub fn routes(&self, sds: Option<AttestedRoutes>) -> tonic::service::Routes {
        let routes = tonic::service::Routes::new(grpc_service::Grpc(self.clone()));
        match sds {
            Some(sds) => sds(routes, Arc::new(SdsCallers(self.shared.clone()))),
            None => routes,
        }
    }
}

/// Whether the request carries the security header exactly once, with the value `true`.
fn has_security_header(headers: &http::HeaderMap) -> bool {
    let mut values = headers.get_all(SECURITY_HEADER).iter();
    matches!((values.next(), values.next()), (Some(v), None) if v == "true")
}

impl GrpcMethods for WorkloadApi {
    const NAME: &'static str = "SpiffeWorkloadAPI";

    fn answer(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        let shared = self.shared.clone();
        Box::pin(async move {
            if !has_security_header(request.headers()) {
                return Ok(
                    Status::invalid_argument("security header missing from request").into_http(),
                );
            }
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
                    let response =
                        Grpc::new(StreamCodec::<JwtBundlesResponse, JwtBundlesRequest>::default())
                            .apply_max_message_size_config(
                                Some(request_bytes),
                                Some(MAX_RESPONSE_BYTES),
                            )
                            .server_streaming(JwtBundlesMethod { shared }, request)
                            .await;
                    oversize_is_exhausted(response, request_bytes)
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
    let response = Grpc::new(StreamCodec::<Resp, Req>::default())
        .apply_max_message_size_config(Some(request_bytes), Some(MAX_RESPONSE_BYTES))
        .unary(Unary { shared, handler }, request)
        .await;
    oversize_is_exhausted(response, request_bytes)
}

/// The status tonic answers a request message over the size limit with, before any handler runs.
const OVERSIZE_CODE: &str = "11";

/// A request over `limits.workloadRequestBytes` is refused with `RESOURCE_EXHAUSTED`, naming the
/// setting, as every other Workload API limit is (tonic's own answer is `OUT_OF_RANGE`). The
/// methods here never answer `OUT_OF_RANGE` themselves, so a response that carries it in its headers
/// (a trailers-only response: nothing was sent) is tonic's refusal of the message's length.
fn oversize_is_exhausted(
    response: http::Response<tonic::body::Body>,
    request_bytes: usize,
) -> http::Response<tonic::body::Body> {
    let oversize = response
        .headers()
        .get("grpc-status")
        .is_some_and(|code| code == OVERSIZE_CODE);
    if !oversize {
        return response;
    }
    Status::resource_exhausted(format!(
        "the request message is larger than {request_bytes} bytes, the most the Workload API \
         accepts (limits.workloadRequestBytes)"
    ))
    .into_http()
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
///
/// tonic reads the request and answers every refusal (the caller's, and its own: a request too large,
/// compressed in a way it does not read) as for any method. The messages do not go through tonic's
/// encoder, which would copy each into a buffer the stream keeps for its life: each is the frame
/// [`Follow`] was handed, shared by every stream that sends the same message, and let go once written
/// ([`meshca_serve::frames`]).
async fn serve_stream<V: View + Answers>(
    shared: Arc<Shared>,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let request_bytes = shared.options.request_bytes;
    let accepted = Arc::new(Mutex::new(None));
    let response = Grpc::new(StreamCodec::<(), V::Request>::default())
        .apply_max_message_size_config(Some(request_bytes), Some(MAX_RESPONSE_BYTES))
        .server_streaming(Method::<V>::new(shared, accepted.clone()), request)
        .await;
    let messages = accepted
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    match messages {
        Some(messages) => frames::response(messages.map(|message| message.map(|m| m.frame()))),
        None => oversize_is_exhausted(response, request_bytes),
    }
}

/// The messages of a stream [`Method`] accepted.
type Messages<M> = BoxStream<'static, Result<Encoded<M>, Status>>;

/// A streaming method whose messages a [`View`] builds. It answers tonic with no messages: those of a
/// stream it accepts are left in `accepted`, for [`serve_stream`] to send.
struct Method<V: View> {
    shared: Arc<Shared>,
    accepted: Arc<Mutex<Option<Messages<V::Message>>>>,
}

impl<V: View> Method<V> {
    fn new(shared: Arc<Shared>, accepted: Arc<Mutex<Option<Messages<V::Message>>>>) -> Self {
        Method { shared, accepted }
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
    type Response = ();
    type ResponseStream = futures::stream::Empty<Result<(), Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<V::Request>) -> Self::Future {
        let shared = self.shared.clone();
        let accepted = self.accepted.clone();
        Box::pin(async move {
            let admitted = shared.admit(request.extensions().get::<ConnInfo>()).await?;
            let snapshot = shared.published().await?;
            let selectors = &admitted.selectors;
            let matched = snapshot
                .registrations
                .matching(shared.options.agent.as_deref(), |s| selectors.contains(s));
            if matched.is_empty() {
                return Err(shared.no_registration(&admitted));
            }
            jwt_api::ensure_keys_of(&shared, &snapshot, &matched);
            let follow = Follow::<V>::new(shared.clone(), admitted);
            *accepted.lock().unwrap_or_else(PoisonError::into_inner) = Some(follow.into_stream());
            Ok(tonic::Response::new(futures::stream::empty()))
        })
    }
}
