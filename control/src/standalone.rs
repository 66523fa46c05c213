//! Issuing outside the daemon: `meshca issue --mesh M --name N` takes a certificate for one dataplane
//! straight from the CAs of a [`World`], decided and checked exactly as the owner does.

use std::time::SystemTime;

use meshca_auth::Labels;
use meshca_ca::{Svid, SvidRequest};
use meshca_identity::KeyAlgorithm;

use crate::bundles;
use crate::error::IssueFailure;
use crate::federated::Federated;
use crate::plan::{self, DataplaneInfo, Decision, Desired, Origin};
use crate::world::World;

/// A certificate for one dataplane and the trust of its mesh.
#[derive(Debug)]
pub struct Standalone {
    /// The certificate, its chain and key.
    pub svid: Svid,
    /// Every CA the dataplane's mesh trusts, PEM, concatenated.
    pub bundle_pem: String,
}

/// Why a standalone certificate could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StandaloneError {
    /// The dataplane gets no identity in this configuration.
    #[error("{mesh}/{name} gets no identity: {reason}")]
    NoIdentity {
        /// The mesh.
        mesh: String,
        /// The dataplane.
        name: String,
        /// Why.
        reason: String,
    },
    /// Issuing or checking failed.
    #[error(transparent)]
    Issue(#[from] IssueFailure),
}

/// Issues and verifies the certificate of dataplane `name` in `mesh` at `now`. A dataplane without a
/// resource file is taken as one with no labels and no tags.
pub fn issue_standalone(
    world: &World,
    zone: &str,
    key_algorithm: KeyAlgorithm,
    mesh: &str,
    name: &str,
    now: SystemTime,
) -> Result<Standalone, StandaloneError> {
    let info = match world.resources.dataplane(mesh, name) {
        Some(dp) => DataplaneInfo::from_file(dp),
        None => DataplaneInfo::new(mesh, name, Labels::default(), Vec::new(), Origin::Token),
    };
    let desired = match plan::decide(world.meshes.get(mesh), &info, zone, key_algorithm) {
        Decision::Issue(desired) => desired,
        Decision::NoIdentity(reason) | Decision::Refused(reason) => {
            return Err(StandaloneError::NoIdentity {
                mesh: mesh.to_owned(),
                name: name.to_owned(),
                reason,
            })
        }
    };
    let svid = issue_verified(&desired, None, now)?;
    let bundle_pem = world
        .meshes
        .get(mesh)
        .map(|m| {
            bundles::mesh_anchors(&bundles::mesh_cas(m, world, &Federated::default()))
                .values()
                .flatten()
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    Ok(Standalone { svid, bundle_pem })
}

/// Issues the certificate `desired` describes (with the key generated `ahead`, if one is given and of
/// its algorithm) and verifies it against its CA's bundle and SPIFFE ID before anyone sees it.
pub(crate) fn issue_verified(
    desired: &Desired,
    ahead: Option<meshca_ca::GeneratedKey>,
    now: SystemTime,
) -> Result<Svid, IssueFailure> {
    let request = SvidRequest {
        spiffe_id: desired.spiffe_id.clone(),
        key_algorithm: desired.key_algorithm,
        lifetime: desired.lifetime,
    };
    let svid = desired.ca.issue_with_key(&request, ahead, now)?;
    desired
        .ca
        .verify_issued(&svid.chain_der, &desired.spiffe_id, now)?;
    Ok(svid)
}

/// Issues the certificate `desired` describes over `key`, a key a `meshca agent` holds, and verifies
/// it as [`issue_verified`] does. A key of another algorithm than `desired`'s is refused
/// ([`meshca_ca::IssueError::KeyAlgorithm`]).
pub(crate) fn issue_verified_for_key(
    desired: &Desired,
    key: &meshca_ca::PublicKey,
    now: SystemTime,
) -> Result<meshca_ca::SignedLeaf, IssueFailure> {
    let request = SvidRequest {
        spiffe_id: desired.spiffe_id.clone(),
        key_algorithm: desired.key_algorithm,
        lifetime: desired.lifetime,
    };
    let leaf = desired.ca.issue_for_key(&request, key, now)?;
    desired
        .ca
        .verify_issued(&leaf.chain_der, &desired.spiffe_id, now)?;
    Ok(leaf)
}
