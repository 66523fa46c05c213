//! The zone egress identity (docs/egress.md): one identity for the egress, whatever the number of
//! meshes, taken from the default mesh, and the bundle that lets sidecars validate it.
//!
//! The choice is pure: [`choose`] reads the accepted world and `defaults.mesh`; [`decide`] turns the
//! choice into the certificate one egress proxy should hold.

use std::fmt;

use meshca_identity::KeyAlgorithm;

use crate::plan::{DataplaneInfo, Decision, Issuance};
use crate::trust::{legacy_trust_domain, BundleKey, CaTrust, EGRESS_SERVICE};
use crate::world::{IdentityProvider, World};

/// How the mesh whose identity the egress uses was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MeshChoice {
    /// `defaults.mesh` names it.
    Setting,
    /// No setting; the mesh is named `default`.
    NamedDefault,
    /// No setting and no mesh named `default`; it is the only mesh.
    OnlyMesh,
    /// None of the above: the lexicographically first mesh that has a MeshIdentity. The operator should
    /// make this explicit with `defaults.mesh`.
    FirstWithIdentity,
}

impl fmt::Display for MeshChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MeshChoice::Setting => "named by defaults.mesh",
            MeshChoice::NamedDefault => "the mesh named default",
            MeshChoice::OnlyMesh => "the only mesh",
            MeshChoice::FirstWithIdentity => {
                "the first mesh with a MeshIdentity, in name order (set defaults.mesh to choose)"
            }
        })
    }
}

/// Who issues the egress identity within the chosen mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EgressIssuer {
    /// A MeshIdentity with a provider that selects every dataplane (`matchLabels: {}`).
    Identity(String),
    /// The mesh's legacy enabled backend.
    Backend(String),
}

impl fmt::Display for EgressIssuer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EgressIssuer::Identity(name) => write!(f, "MeshIdentity {name}"),
            EgressIssuer::Backend(name) => write!(f, "backend {name}"),
        }
    }
}

/// Where the egress identity comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressPlan {
    /// The mesh.
    pub mesh: String,
    /// Why that mesh.
    pub chosen_by: MeshChoice,
    /// Who issues in it.
    pub issuer: EgressIssuer,
}

/// Why the zone egress has no identity to choose.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoEgressIdentity {
    /// `defaults.mesh` names a mesh that is not defined.
    #[error("defaults.mesh names mesh {0:?}, which is not defined")]
    UnknownDefaultMesh(String),
    /// No mesh is defined.
    #[error("no mesh is defined")]
    NoMesh,
    /// Several meshes and nothing to choose one by (the count of meshes).
    #[error("{0} meshes are defined, none is named default and none has a MeshIdentity: set defaults.mesh to the mesh whose identity the zone egress uses")]
    NoDefaultMesh(usize),
    /// The chosen mesh has nothing that issues for the egress.
    #[error("mesh {mesh} ({chosen_by}) has no MeshIdentity with a provider that selects every dataplane (matchLabels: {{}}) and no enabled mTLS backend")]
    NoIssuer {
        /// The mesh.
        mesh: String,
        /// Why that mesh.
        chosen_by: MeshChoice,
    },
}

/// Chooses the mesh and issuer of the egress identity: the mesh `default_mesh` names (`defaults.mesh`);
/// else the mesh named `default`; else the only mesh; else the lexicographically first mesh with a
/// MeshIdentity. Within it, the first MeshIdentity by name, among those with a provider that select
/// every dataplane; else the mesh's legacy enabled backend. The error says why there is none.
pub fn choose(world: &World, default_mesh: Option<&str>) -> Result<EgressPlan, NoEgressIdentity> {
    let (mesh, chosen_by) = match default_mesh {
        Some(name) => match world.meshes.get(name) {
            Some(mesh) => (mesh, MeshChoice::Setting),
            None => return Err(NoEgressIdentity::UnknownDefaultMesh(name.to_owned())),
        },
        None => match world.meshes.get("default") {
            Some(mesh) => (mesh, MeshChoice::NamedDefault),
            None if world.meshes.len() == 1 => {
                let only = world.meshes.values().next().expect("one mesh");
                (only, MeshChoice::OnlyMesh)
            }
            None => match world.meshes.values().find(|m| !m.identities.is_empty()) {
                Some(mesh) => (mesh, MeshChoice::FirstWithIdentity),
                None if world.meshes.is_empty() => return Err(NoEgressIdentity::NoMesh),
                None => return Err(NoEgressIdentity::NoDefaultMesh(world.meshes.len())),
            },
        },
    };
    let selects_all = mesh.identities.iter().find(|i| {
        i.match_labels.as_ref().is_some_and(|m| m.is_empty())
            && !matches!(i.provider, IdentityProvider::None)
    });
    let issuer = match (selects_all, &mesh.enabled_backend) {
        (Some(identity), _) => EgressIssuer::Identity(identity.name.clone()),
        (None, Some(backend)) => EgressIssuer::Backend(backend.name.clone()),
        (None, None) => {
            return Err(NoEgressIdentity::NoIssuer {
                mesh: mesh.name.clone(),
                chosen_by,
            })
        }
    };
    Ok(EgressPlan {
        mesh: mesh.name.clone(),
        chosen_by,
        issuer,
    })
}

/// The certificate the egress proxy `info` should hold under `plan`.
pub fn decide(
    world: &World,
    plan: &EgressPlan,
    info: &DataplaneInfo,
    zone: &str,
    key_algorithm: KeyAlgorithm,
) -> Decision {
    let Some(mesh) = world.meshes.get(&plan.mesh) else {
        return Decision::NoIdentity(format!("mesh {} is not defined", plan.mesh));
    };
    let by = Issuance {
        mesh: &mesh.name,
        labels: &info.labels,
        zone,
        key_algorithm,
        // The egress identity's CA is trusted in the egress bundle before the egress presents a
        // certificate from it, and stays there while the egress still presents one.
        trusted_in: BundleKey::Egress,
    };
    match &plan.issuer {
        EgressIssuer::Identity(name) => match mesh.identities.iter().find(|i| &i.name == name) {
            Some(identity) => by.identity(identity),
            None => Decision::NoIdentity(format!("MeshIdentity {name} is not defined")),
        },
        EgressIssuer::Backend(name) => match &mesh.enabled_backend {
            Some(backend) if &backend.name == name => by.backend(backend, EGRESS_SERVICE),
            _ => Decision::NoIdentity(format!("backend {name} is not enabled")),
        },
    }
}

/// The CAs the egress bundle publishes under `plan` (before the gate adds what break-last keeps): the
/// egress identity's CA, or every CA its legacy backend trusts (an automatic rotation's successor is
/// trusted before it issues).
pub fn egress_cas(world: &World, plan: &EgressPlan) -> Vec<CaTrust> {
    let Some(mesh) = world.meshes.get(&plan.mesh) else {
        return Vec::new();
    };
    match &plan.issuer {
        EgressIssuer::Identity(name) => mesh
            .identities
            .iter()
            .filter(|i| &i.name == name)
            .filter_map(|i| match &i.provider {
                IdentityProvider::Bundled { ca, .. } => {
                    Some(CaTrust::of_ca(BundleKey::Egress, &i.trust_domain, &ca.ca))
                }
                _ => None,
            })
            .collect(),
        EgressIssuer::Backend(name) => {
            let Some(td) = legacy_trust_domain(&mesh.name) else {
                return Vec::new();
            };
            mesh.backends()
                .filter(|b| &b.name == name)
                .flat_map(|b| &b.trusted)
                .map(|g| CaTrust::of_ca(BundleKey::Egress, &td, &g.ca))
                .collect()
        }
    }
}

#[cfg(test)]
#[path = "egress_tests.rs"]
mod tests;
