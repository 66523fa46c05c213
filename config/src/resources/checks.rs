//! Checks across resources: unique names, references to existing Meshes and Dataplanes, and hints
//! that a caller could get twice.

use std::collections::{BTreeMap, BTreeSet};

use super::document::{Broken, Resource, ResourceType};
use super::error::{ResourceError, Source};
use super::federation::EVERY_MESH;
use super::registration::WorkloadRegistration;
use crate::Selector;

fn error(resource: &Resource, field: &str, message: String) -> ResourceError {
    let source = resource.source();
    ResourceError {
        file: source.file.clone(),
        document: source.document,
        resource: Some(resource.id()),
        field: field.to_owned(),
        message,
    }
}

/// Reports every resource whose (type, mesh, name) was already taken by an earlier one, every
/// mesh-scoped resource whose mesh names no Mesh, and every WorkloadRegistration whose Dataplane does
/// not exist or whose hint repeats another's (see [`check_registrations`]). `broken` are Meshes and
/// Dataplanes that exist but failed to parse (already reported).
pub(super) fn check(resources: &[Resource], broken: &[Broken]) -> Vec<ResourceError> {
    let mut errors = Vec::new();
    let mut first: BTreeMap<(ResourceType, Option<&str>, &str), &Source> = BTreeMap::new();
    for resource in resources {
        let key = (resource.kind(), resource.mesh(), resource.name());
        if let Some(earlier) = first.get(&key) {
            let scope = match resource.mesh() {
                Some(mesh) => format!(" in mesh {mesh:?}"),
                None => String::new(),
            };
            errors.push(error(
                resource,
                "name",
                format!(
                    "duplicate: a {} named {:?}{scope} is already defined in {earlier}",
                    resource.kind(),
                    resource.name()
                ),
            ));
        } else {
            first.insert(key, resource.source());
        }
    }
    let meshes: BTreeSet<&str> = resources
        .iter()
        .filter(|r| r.kind() == ResourceType::Mesh)
        .map(Resource::name)
        .chain(
            broken
                .iter()
                .filter(|b| b.kind == ResourceType::Mesh)
                .map(|b| b.name.as_str()),
        )
        .collect();
    for resource in resources {
        let every_mesh = matches!(resource, Resource::FederationRelationship(_))
            && resource.mesh() == Some(EVERY_MESH);
        if let Some(mesh) = resource
            .mesh()
            .filter(|m| !every_mesh && !meshes.contains(m))
        {
            let defined = if meshes.is_empty() {
                "no Mesh is defined".to_owned()
            } else {
                format!(
                    "defined: {}",
                    meshes.iter().copied().collect::<Vec<_>>().join(", ")
                )
            };
            errors.push(error(
                resource,
                "mesh",
                format!("no Mesh named {mesh:?} ({defined})"),
            ));
        }
    }
    errors.append(&mut check_registrations(resources, broken));
    errors.append(&mut check_federation(resources));
    errors.append(&mut check_secrets(resources));
    errors
}

/// Every `secret:` data source of a Mesh backend names a universal Secret of that Mesh's mesh.
fn check_secrets(resources: &[Resource]) -> Vec<ResourceError> {
    let secrets: BTreeSet<(&str, &str)> = resources
        .iter()
        .filter_map(|r| match r {
            Resource::Secret(s) => Some((s.mesh.as_str(), s.name.as_str())),
            _ => None,
        })
        .collect();
    let mut errors = Vec::new();
    for resource in resources {
        let Resource::Mesh(mesh) = resource else {
            continue;
        };
        let Some(mtls) = &mesh.mtls else { continue };
        for (i, backend) in mtls.backends.iter().enumerate() {
            let super::BackendKind::Provided { cert, key } = &backend.kind else {
                continue;
            };
            for (part, source) in [("cert", cert), ("key", key)] {
                let super::DataSource::Secret(name) = source else {
                    continue;
                };
                if !secrets.contains(&(mesh.name.as_str(), name.as_str())) {
                    errors.push(error(
                        resource,
                        &format!("mtls.backends[{i}].conf.{part}.secret"),
                        format!(
                            "no Secret named {name:?} in mesh {:?} (a universal `type: Secret` resource, e.g. from kumactl export --include-admin)",
                            mesh.name
                        ),
                    ));
                }
            }
        }
    }
    errors
}

/// A foreign trust domain has one bundle endpoint (meshca fetches it once, whichever meshes trust it),
/// and a mesh trusts it through one relationship: every FederationRelationship of a trust domain names
/// the same endpoint, and no two of one trust domain apply to the same mesh (`*` applies to all). The
/// later one is reported.
fn check_federation(resources: &[Resource]) -> Vec<ResourceError> {
    let mut errors = Vec::new();
    let mut seen: Vec<&super::FederationRelationship> = Vec::new();
    for resource in resources {
        let Resource::FederationRelationship(r) = resource else {
            continue;
        };
        let same_domain = seen.iter().filter(|e| e.trust_domain == r.trust_domain);
        for earlier in same_domain {
            if earlier.endpoint != r.endpoint {
                errors.push(error(
                    resource,
                    "spec.bundleEndpoint",
                    format!(
                        "FederationRelationship {}/{} ({}) names another bundle endpoint for trust domain {}: a trust domain has one endpoint",
                        earlier.mesh, earlier.name, earlier.source, r.trust_domain
                    ),
                ));
                break;
            }
            if earlier.mesh == r.mesh || earlier.mesh == EVERY_MESH || r.mesh == EVERY_MESH {
                errors.push(error(
                    resource,
                    "mesh",
                    format!(
                        "FederationRelationship {}/{} ({}) already federates mesh {} with trust domain {}",
                        earlier.mesh, earlier.name, earlier.source, r.mesh, r.trust_domain
                    ),
                ));
                break;
            }
        }
        seen.push(r);
    }
    errors
}

/// One hint a caller could be given: registrations with the same mesh, agent and selector set, and
/// the hint itself. A caller that matches one of them matches them all.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct HintScope<'a> {
    mesh: &'a str,
    agent: Option<&'a str>,
    selectors: BTreeSet<&'a Selector>,
    hint: &'a str,
}

/// Every WorkloadRegistration names a Dataplane of its own mesh; all the registrations of one
/// Dataplane are served at the same place (one agent, or the server's own socket), since the
/// Dataplane's key is made and held there; and no two with the same mesh, agent and selector set
/// carry the same hint, since a caller matching both would get two SVIDs under one hint (the later
/// one is reported).
fn check_registrations(resources: &[Resource], broken: &[Broken]) -> Vec<ResourceError> {
    let dataplanes: BTreeSet<(&str, &str)> = resources
        .iter()
        .filter_map(|r| match r {
            Resource::Dataplane(d) => Some((d.mesh.as_str(), d.name.as_str())),
            _ => None,
        })
        .chain(
            broken
                .iter()
                .filter(|b| b.kind == ResourceType::Dataplane)
                .map(|b| (b.mesh.as_deref().unwrap_or_default(), b.name.as_str())),
        )
        .collect();
    let mut errors = Vec::new();
    let mut hints: BTreeMap<HintScope<'_>, &WorkloadRegistration> = BTreeMap::new();
    let mut served_at: BTreeMap<(&str, &str), &WorkloadRegistration> = BTreeMap::new();
    for resource in resources {
        let Resource::WorkloadRegistration(r) = resource else {
            continue;
        };
        match served_at.get(&(r.mesh.as_str(), r.dataplane.as_str())) {
            Some(earlier) if earlier.agent != r.agent && earlier.name != r.name => {
                errors.push(error(
                    resource,
                    "spec.agent",
                    format!(
                        "Dataplane {:?} is served {} here but {} by registration {:?} ({}): every registration of a Dataplane must be served at the same place, where its key is held",
                        r.dataplane,
                        place(r.agent.as_deref()),
                        place(earlier.agent.as_deref()),
                        earlier.name,
                        earlier.source,
                    ),
                ));
            }
            Some(_) => {}
            None => {
                served_at.insert((r.mesh.as_str(), r.dataplane.as_str()), r);
            }
        }
        if !dataplanes.contains(&(r.mesh.as_str(), r.dataplane.as_str())) {
            errors.push(error(
                resource,
                "spec.dataplane",
                format!(
                    "Dataplane {:?} does not exist in mesh {:?}",
                    r.dataplane, r.mesh
                ),
            ));
        }
        let Some(hint) = r.hint.as_deref() else {
            continue;
        };
        let scope = HintScope {
            mesh: &r.mesh,
            agent: r.agent.as_deref(),
            selectors: r.selectors.iter().collect(),
            hint,
        };
        match hints.get(&scope) {
            // The same registration twice is a duplicate name, already reported.
            Some(earlier) if earlier.name == r.name => {}
            Some(earlier) => errors.push(error(
                resource,
                "spec.hint",
                format!(
                    "hint {hint:?} is already used by registration {:?} ({}) with the same selectors{}: a caller matching both would get two SVIDs with one hint",
                    earlier.name,
                    earlier.source,
                    match &r.agent {
                        Some(agent) => format!(" on agent {agent:?}"),
                        None => " on the server's own socket".to_owned(),
                    }
                ),
            )),
            None => {
                hints.insert(scope, r);
            }
        }
    }
    errors
}

/// Where a registration is served, for messages: `by agent "host-1"` or `on the server's own socket`.
fn place(agent: Option<&str>) -> String {
    match agent {
        Some(agent) => format!("by agent {agent:?}"),
        None => "on the server's own socket".to_owned(),
    }
}
