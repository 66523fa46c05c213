//! The SDS gRPC service: construction and the three RPCs.

use std::convert::Infallible;
use std::sync::Arc;

use meshca_serve::grpc_service::{Grpc, GrpcMethods};
use meshca_serve::{
    shown, Attest, Attested, AttestedRoutes, BoundListeners, ConnInfo, Hub, OpenStream, ServeError,
    StreamLimits, StreamMetrics,
};
use tokio_util::sync::CancellationToken;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::Status;

use crate::authn::Principal;
use crate::delta::Delta;
use crate::registry::StreamRegistry;
use crate::shared::Shared;
use crate::sotw::Sotw;
use crate::stream::Protocol;
use crate::transport::grpc;
use crate::transport::outbox::OutboxStream;
use crate::transport::wire::DiscoveryRequest;
use crate::{fetch, session, stream};

/// The SDS server. Cheap to clone; every clone serves the same streams.
#[derive(Clone)]
pub struct SdsServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SdsServer")
            .field("hub", &self.shared.hub)
            .field("streams", &self.shared.registry.len())
            .finish()
    }
}

impl SdsServer {
    /// A server whose streams are `hub`'s.
    pub fn on(hub: Hub) -> Self {
        Self {
            shared: Arc::new(Shared::new(hub)),
        }
    }

    /// The hub the server's streams stand on.
    pub fn hub(&self) -> &Hub {
        &self.shared.hub
    }

    /// The limits the server enforces.
    pub fn limits(&self) -> &StreamLimits {
        self.shared.limits()
    }

    /// The open streams, for the admin API.
    pub fn registry(&self) -> StreamRegistry {
        self.shared.registry.clone()
    }

    /// The server's counters (its hub's).
    pub fn metrics(&self) -> Arc<StreamMetrics> {
        self.shared.hub.metrics().clone()
    }

    /// Ends every open stream of the hub with `UNAVAILABLE` and refuses new ones.
    pub fn close_streams(&self) {
        self.shared.hub.close_streams();
    }

    /// The routes of a gRPC server with SDS on them; other services of the hub's listeners (the agent
    /// protocol) are added beside it.
    pub fn routes(self) -> tonic::service::Routes {
        tonic::service::Routes::new(self.into_service())
    }

    /// Serves SDS alone on `bound` until `shutdown` fires (see [`BoundListeners::serve_hub`]).
    pub async fn serve(
        self,
        bound: BoundListeners,
        shutdown: CancellationToken,
    ) -> Result<(), ServeError> {
        let hub = self.shared.hub.clone();
        bound.serve_hub(&hub, self.routes(), shutdown).await
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

    /// SDS for the callers `attest` knows without a token (the Workload API socket's, by their process):
    /// each request is served as the caller `attest` says it is, without a token, its node ids
    /// unchecked; everything else (names, limits, ACKs, the rollout gate) is as for a proxy with a token.
    pub fn attested_by(self, attest: Arc<dyn Attest>) -> Grpc<AttestedSds> {
        Grpc(AttestedSds { sds: self, attest })
    }

    /// This server's SDS, added to the routes of a socket whose callers another service attests (see
    /// [`SdsServer::attested_by`]).
    pub fn attested_routes(self) -> AttestedRoutes {
        Box::new(move |routes, attest| routes.add_service(self.attested_by(attest)))
    }

    /// [`SdsServer::attested_routes`] of a new server on `hub`: for a socket whose SDS streams are listed
    /// nowhere else (a `meshca agent`'s).
    pub fn attested_routes_on(hub: Hub) -> AttestedRoutes {
        SdsServer::on(hub).attested_routes()
    }
}

/// SDS on a socket whose callers another service attests (see [`SdsServer::attested_by`]).
#[derive(Clone)]
pub struct AttestedSds {
    sds: SdsServer,
    attest: Arc<dyn Attest>,
}

impl std::fmt::Debug for AttestedSds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttestedSds")
            .field("sds", &self.sds)
            .finish_non_exhaustive()
    }
}

impl GrpcMethods for AttestedSds {
    const NAME: &'static str = <SdsServer as GrpcMethods>::NAME;

    fn answer(
        &self,
        request: http::Request<tonic::body::Body>,
    ) -> BoxFuture<http::Response<tonic::body::Body>, Infallible> {
        let (sds, attest) = (self.sds.clone(), self.attest.clone());
        Box::pin(async move {
            let conn = request.extensions().get::<ConnInfo>().cloned();
            match attest.attest(conn).await {
                Ok(attested) => sds.serve_as(request, Some(attested)).await,
                Err(status) => Ok(status.into_http()),
            }
        })
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

impl SdsServer {
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
            inbound: grpc::Requests::new(body, self.shared.limits().request_bytes),
            progress: open.as_ref().map(OpenStream::progress),
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
            let limit = shared.limits().request_bytes;
            let mut inbound = grpc::Requests::<DiscoveryRequest>::new(body, limit);
            let progress = open.as_ref().map(OpenStream::progress);
            let answer = match session::first_request(&shared, inbound.message(), progress.as_ref())
                .await
            {
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
    open: Option<OpenStream>,
    /// What the attesting service asked to keep while the request runs.
    hold: Option<Box<dyn std::any::Any + Send + Sync>>,
}

/// Counts an authenticated request as a stream open on its connection (which keeps the connection
/// from being closed as idle) until the guard drops. Requests that did not come through the hub's
/// listeners (a server embedded elsewhere) have no connection to count on.
fn opened_on_connection(extensions: &http::Extensions) -> Option<OpenStream> {
    extensions.get::<ConnInfo>().map(ConnInfo::stream_opened)
}

#[cfg(test)]
mod tests {
    use meshca_auth::RevocationList;
    use meshca_control::{Snapshot, StreamEvent};
    use meshca_serve::HubOptions;
    use tokio::sync::{mpsc, watch};

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
        let server = SdsServer::on(Hub::new(
            snapshot_rx,
            signing.verifier(),
            revocation_rx,
            events,
            HubOptions::default(),
        ));
        (server, event_rx)
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
