//! `FetchSecrets`: one request, one response, every asked name or an error naming the
//! missing one.

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use meshca_control::parse_names;
use tonic::Status;

use crate::authn::{self, Principal};
use crate::names::{self, Lookup};
use crate::secret::{self, SECRET_TYPE_URL};
use crate::session::{Session, Usable};
use crate::shared::Shared;
use crate::transport::wire::DiscoveryRequest;
use meshca_serve::shown;
use meshca_serve::StreamMetrics;

/// Serves one fetch for a proxy whose token was verified (or that was attested).
pub(crate) async fn fetch(
    shared: &Arc<Shared>,
    principal: Principal,
    request: DiscoveryRequest,
) -> Result<DiscoveryResponse, Status> {
    if principal.attested.is_none() {
        authn::check_first_node(request.node.as_ref(), &authn::proxy_key(&principal.claims))
            .map_err(|status| shared.auth_failure(status))?;
    }
    secret::check_type_url(&request.type_url)?;
    shared.check_names(request.resource_names.iter().map(String::as_str))?;
    let asked = parse_names(request.resource_names);
    if asked.is_empty() {
        return Err(Status::invalid_argument(
            "resource_names is empty: name the secrets to fetch (e.g. \"default\", \"system_trust_bundle\")",
        ));
    }
    let ctx = authn::proxy_context(&principal.claims, request.node.as_ref());
    let mut session = Session::open(shared.clone(), principal, ctx, None).await?;
    let Usable { trust, entry } = session.wait_for_identity().await?;
    let mut items = Vec::with_capacity(asked.len());
    for name in asked {
        match names::resolve(&trust, Some(&entry), &session.ctx, &name) {
            Lookup::Found(resolved) => {
                let version = resolved.version();
                items.push((name.to_string(), resolved, version));
            }
            Lookup::Unavailable(why) => {
                return Err(Status::not_found(format!(
                    "secret {} is not available: {why}",
                    shown(name.as_str())
                )))
            }
            Lookup::Unknown => {
                return Err(Status::not_found(format!(
                    "secret {} is not a name proxy {} may fetch: expected \"default\", \
                     its SPIFFE ID or MeshIdentity name, \"identity_cert:secret:{mesh}\", \
                     \"system_trust_bundle\", \"ROOTCA\", \"system_trust_bundle_{mesh}\", \
                     \"mesh_ca:secret:{mesh}\", \"ALL\", \"mesh_ca:secret:all\", \
                     \"system_trust_bundle_egress\" or \"meshservice:<name>\"",
                    shown(name.as_str()),
                    session.key(),
                    mesh = session.key().mesh,
                )))
            }
        }
    }
    let version = names::response_version(
        items
            .iter()
            .map(|(name, _, version)| (name.as_str(), version.as_str())),
    );
    let resources = items
        .iter()
        .map(|(name, resolved, _)| resolved.to_any(name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|keyless| {
            shared.auth_failure(Status::permission_denied(format!(
                "proxy {} is refused: {keyless}",
                session.key()
            )))
        })?;
    StreamMetrics::incr(&shared.metrics().responses_pushed);
    Ok(DiscoveryResponse {
        version_info: version,
        resources,
        type_url: SECRET_TYPE_URL.to_owned(),
        nonce: format!("fetch-{}", session.id()),
        ..Default::default()
    })
}
