//! FederationRelationships: the foreign trust domains meshca fetches bundles of, one peer per trust
//! domain, checked when the resources are loaded (the endpoint's URL, the initial bundle and the
//! `caFile` read and parsed now, so that a bad file rejects the update rather than a fetch failing later).

use std::collections::BTreeMap;
use std::sync::Arc;

use meshca_ca::TrustAnchor;
use meshca_config::{EndpointProfile, FederationRelationship, Resources, Settings};
use meshca_federation::fetch::check_url;
use meshca_federation::{pem_roots, BundleLimits, Peer, PeerProfile, SpiffeBundle};
use meshca_identity::TrustDomain;

use super::{IdentityProvider, MeshState};
use crate::error::UpdateError;
use crate::trust::legacy_trust_domain;

/// A foreign trust domain meshca federates with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FederatedDomain {
    /// Where its bundle is fetched, and the bundle held before the first fetch.
    pub peer: Peer,
    /// The meshes whose proxies and workloads trust it (`*`: every mesh), with the relationships
    /// that say so, `mesh/name`.
    pub relationships: Vec<(String, String)>,
    /// The initial bundle's X.509 authorities, as trust anchors.
    pub initial_anchors: Vec<TrustAnchor>,
}

impl FederatedDomain {
    /// Whether `mesh`'s proxies and workloads trust the trust domain.
    pub fn applies_to(&self, mesh: &str) -> bool {
        self.relationships
            .iter()
            .any(|(m, _)| m == meshca_config::EVERY_MESH || m == mesh)
    }
}

/// The limits a federated bundle is read within.
pub fn bundle_limits(settings: &Settings) -> BundleLimits {
    BundleLimits {
        max_bytes: usize::try_from(settings.limits.federation_bundle_bytes).unwrap_or(usize::MAX),
        max_keys: usize::try_from(settings.limits.federation_bundle_keys).unwrap_or(usize::MAX),
    }
}

/// Every trust domain a mesh issues for: its MeshIdentities' and, with legacy mTLS, the mesh's name.
fn local_trust_domains(meshes: &BTreeMap<String, MeshState>) -> BTreeMap<TrustDomain, String> {
    let mut local = BTreeMap::new();
    for mesh in meshes.values() {
        for identity in &mesh.identities {
            if matches!(identity.provider, IdentityProvider::Bundled { .. }) {
                local
                    .entry(identity.trust_domain.clone())
                    .or_insert_with(|| format!("MeshIdentity {}/{}", mesh.name, identity.name));
            }
        }
        if mesh.enabled_backend.is_some() {
            if let Some(td) = legacy_trust_domain(&mesh.name) {
                local
                    .entry(td)
                    .or_insert_with(|| format!("mesh {}'s mTLS backend", mesh.name));
            }
        }
    }
    local
}

/// The federated trust domains of `resources`, one per trust domain (the resources were checked to
/// name one endpoint per trust domain). Every problem goes to `errors`, naming the relationship's file,
/// resource and field.
pub(super) fn load_federation(
    resources: &Resources,
    meshes: &BTreeMap<String, MeshState>,
    settings: &Settings,
    errors: &mut Vec<UpdateError>,
) -> BTreeMap<TrustDomain, FederatedDomain> {
    let local = local_trust_domains(meshes);
    let limits = bundle_limits(settings);
    let mut domains: BTreeMap<TrustDomain, FederatedDomain> = BTreeMap::new();
    for r in &resources.federation_relationships {
        let at = (r.mesh.clone(), r.name.clone());
        if let Some(domain) = domains.get_mut(&r.trust_domain) {
            domain.relationships.push(at);
            continue;
        }
        let mut error = |field: &str, message: String| {
            errors.push(UpdateError {
                file: r.source.file.display().to_string(),
                resource: format!("FederationRelationship/{}/{}", r.mesh, r.name),
                field: field.to_owned(),
                message,
            })
        };
        if let Some(issuer) = local.get(&r.trust_domain) {
            error(
                "spec.trustDomain",
                format!(
                    "meshca issues for trust domain {} ({issuer}): a federation peer is never trusted for a local trust domain",
                    r.trust_domain
                ),
            );
            continue;
        }
        if let Err(e) = check_url(&r.endpoint.url) {
            error("spec.bundleEndpoint.url", e.to_string());
        }
        let initial =
            r.initial_bundle
                .as_ref()
                .and_then(|path| match read_initial(r, path, limits) {
                    Ok(bundle) => Some(bundle),
                    Err(message) => {
                        error("spec.initialBundle.file", message);
                        None
                    }
                });
        let initial_anchors = initial.as_ref().map_or_else(Vec::new, anchors_of);
        let profile = match &r.endpoint.profile {
            EndpointProfile::HttpsSpiffe { spiffe_id } => PeerProfile::Spiffe {
                id: spiffe_id.clone(),
            },
            EndpointProfile::HttpsWeb { ca_file: None } => PeerProfile::Web { roots: None },
            EndpointProfile::HttpsWeb {
                ca_file: Some(path),
            } => match meshca_files::read(
                path,
                meshca_files::PEM_FILE_BYTES,
                meshca_files::PEM_FILE_BOUND,
            )
            .map_err(|e| e.to_string())
            .and_then(|bytes| pem_roots(&bytes))
            {
                Ok(roots) => PeerProfile::Web {
                    roots: Some(Arc::from(roots)),
                },
                Err(e) => {
                    error(
                        "spec.bundleEndpoint.caFile",
                        format!("{}: {e}", path.display()),
                    );
                    continue;
                }
            },
        };
        domains.insert(
            r.trust_domain.clone(),
            FederatedDomain {
                peer: Peer {
                    trust_domain: r.trust_domain.clone(),
                    url: r.endpoint.url.clone(),
                    profile,
                    initial: initial.map(Arc::new),
                },
                relationships: vec![at],
                initial_anchors,
            },
        );
    }
    domains
}

fn read_initial(
    r: &FederationRelationship,
    path: &std::path::Path,
    limits: BundleLimits,
) -> Result<SpiffeBundle, String> {
    let bytes = meshca_files::read(
        path,
        limits.max_bytes as u64,
        "limits.federationBundleBytes",
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    SpiffeBundle::parse_initial(&r.trust_domain, &bytes, limits)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// A bundle's X.509 authorities as trust anchors. The bundle's parser checked each is a CA of the
/// trust domain, so none is refused here; one that were would be left out, logged.
pub fn anchors_of(bundle: &SpiffeBundle) -> Vec<TrustAnchor> {
    bundle
        .x509_authorities()
        .iter()
        .filter_map(|a| match TrustAnchor::of_der(a.der()) {
            Ok(anchor) => Some(anchor),
            Err(e) => {
                tracing::warn!(trust_domain = %bundle.trust_domain(), error = %e, "a federated X.509 authority is left out");
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
