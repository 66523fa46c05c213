//! Checks across resources: unique names and references to existing Meshes.

use std::collections::{BTreeMap, BTreeSet};

use super::document::{Resource, ResourceType};
use super::error::{ResourceError, Source};

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

/// Reports every resource whose (type, mesh, name) was already taken by an earlier one, and every
/// mesh-scoped resource whose mesh names no Mesh. `broken_meshes` are Meshes that exist but
/// failed to parse (already reported).
pub(super) fn check(resources: &[Resource], broken_meshes: &[String]) -> Vec<ResourceError> {
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
        .chain(broken_meshes.iter().map(String::as_str))
        .collect();
    for resource in resources {
        if let Some(mesh) = resource.mesh().filter(|m| !meshes.contains(m)) {
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
    errors
}
