//! `MintJwtSvid`: a JWT-SVID for one of the agent's registrations, for a workload's `FetchJWTSVID` on
//! the agent's host. Signed as the daemon's own Workload API signs them (same keys, same cache).

use std::sync::Arc;

use meshca_auth::Claims;
use meshca_control::ProxyEntry;
use meshca_identity::SpiffeId;
use meshca_serve::shown;
use meshca_serve::StreamCodec;
use meshca_workload::jwt::check_audiences;
use meshca_workload::mint_jwt_svid;
use tokio::time::Instant;
use tonic::codegen::{http, BoxFuture};
use tonic::server::{Grpc, UnaryService};
use tonic::Status;

use super::Shared;
use crate::proto::{JwtSvidRequest, JwtSvidResponse};

/// Answers `MintJwtSvid`: the token is checked on the headers, before the request is read.
pub(crate) async fn serve(
    shared: Arc<Shared>,
    request: http::Request<tonic::body::Body>,
) -> http::Response<tonic::body::Body> {
    let admitted = match shared.admit(&request) {
        Ok(admitted) => admitted,
        Err(status) => return status.into_http(),
    };
    let limit = shared.options.message_bytes;
    let response = Grpc::new(StreamCodec::<JwtSvidResponse, JwtSvidRequest>::default())
        .apply_max_message_size_config(Some(limit), None)
        .unary(
            Mint {
                shared,
                agent: admitted.claims,
            },
            request,
        )
        .await;
    drop(admitted.open);
    response
}

struct Mint {
    shared: Arc<Shared>,
    agent: Arc<Claims>,
}

impl UnaryService<JwtSvidRequest> for Mint {
    type Response = JwtSvidResponse;
    type Future = BoxFuture<tonic::Response<JwtSvidResponse>, Status>;

    fn call(&mut self, request: tonic::Request<JwtSvidRequest>) -> Self::Future {
        let shared = self.shared.clone();
        let agent = self.agent.clone();
        Box::pin(async move {
            let token = mint(&shared, &agent, request.into_inner()).await?;
            Ok(tonic::Response::new(JwtSvidResponse { token }))
        })
    }
}

async fn mint(shared: &Shared, agent: &Claims, request: JwtSvidRequest) -> Result<String, Status> {
    let deadline = Instant::now() + shared.first_message_wait();
    let snapshot = shared.hub.snapshots().borrow().clone();
    let named = || {
        format!(
            "registration {}/{}",
            shown(&request.mesh),
            shown(&request.registration)
        )
    };
    // One answer for a registration that does not exist and one of another agent: an agent learns
    // nothing of registrations that are not its own.
    let registration = snapshot
        .registrations
        .iter()
        .find(|r| *r.proxy.mesh == *request.mesh && r.name == request.registration)
        .filter(|r| r.agent.as_deref() == Some(agent.name.as_str()))
        .ok_or_else(|| {
            Status::permission_denied(format!(
                "{} does not name agent {}",
                named(),
                shown(&agent.name)
            ))
        })?;
    let identity = match snapshot.proxies.get(&registration.proxy) {
        Some(ProxyEntry::Ready(identity)) => identity.clone(),
        Some(ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason }) => {
            return Err(Status::permission_denied(format!(
                "no identity issued for {}: {reason}",
                named()
            )))
        }
        Some(ProxyEntry::Pending) | None => {
            return Err(Status::unavailable(format!(
                "the identity of {} is not ready yet",
                named()
            )))
        }
    };
    let options = &shared.options;
    check_audiences(
        &request.audience,
        options.jwt_audiences_per_request,
        options.jwt_audience_bytes,
    )
    .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let spiffe_id = SpiffeId::parse(&identity.spiffe_id).map_err(|error| {
        Status::internal(format!(
            "{}: its SPIFFE ID {:?} does not parse: {error}",
            named(),
            identity.spiffe_id
        ))
    })?;
    mint_jwt_svid(
        &shared.jwt_keys,
        &shared.jwt_cache,
        &spiffe_id,
        &request.audience,
        registration.jwt_svid_expiry,
        deadline,
    )
    .await
    .map_err(|error| error.status())
}
