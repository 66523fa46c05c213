//! Mesh resources in Kuma's universal YAML format, parsed and checked as a whole.

mod checks;
mod data_source;
mod dataplane;
mod defaults;
mod document;
mod error;
mod federation;
mod identity;
mod mesh;
mod registration;
mod secret;
mod service;
mod trust;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use zeroize::Zeroize;

use crate::bounded::{nesting_depth, LoadLimits};

pub use data_source::DataSource;
pub use dataplane::{Dataplane, Inbound, ZoneEgress, SERVICE_TAG};
pub use defaults::default_resources_yaml;
pub use document::{Resource, ResourceType};
pub use error::{ResourceError, Source};
pub use federation::{BundleEndpoint, EndpointProfile, FederationRelationship, EVERY_MESH};
pub use identity::{Bundled, BundledCa, Extension, MeshIdentity, Provider, SpiffeIdTemplates};
pub use mesh::{Backend, BackendKind, Mesh, MeshServicesMode, Mtls, MtlsMode};
pub use registration::{
    WorkloadRegistration, DEFAULT_JWT_SVID_EXPIRY, MAX_HINT_BYTES, MAX_JWT_SVID_EXPIRY,
};
pub use secret::{Secret, MAX_SECRET_BYTES};
pub use service::{MeshService, ServiceIdentity, ServicePort, TargetPort, ZONE_LABEL};
pub use trust::MeshTrust;

/// Labels or tags: ordered, so iteration and comparison are deterministic.
pub type Labels = BTreeMap<String, String>;

/// Every resource of a resources directory, checked as a whole: names are unique per (type,
/// mesh), every mesh-scoped resource names an existing Mesh, every backend reference resolves.
///
/// The vectors are sorted by (mesh, name), so equal inputs give equal values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Meshes by name.
    pub meshes: BTreeMap<String, Mesh>,
    /// MeshIdentities.
    pub mesh_identities: Vec<MeshIdentity>,
    /// MeshTrusts.
    pub mesh_trusts: Vec<MeshTrust>,
    /// Dataplanes.
    pub dataplanes: Vec<Dataplane>,
    /// ZoneEgresses (sorted by name).
    pub zone_egresses: Vec<ZoneEgress>,
    /// MeshServices.
    pub mesh_services: Vec<MeshService>,
    /// WorkloadRegistrations.
    pub workload_registrations: Vec<WorkloadRegistration>,
    /// FederationRelationships.
    pub federation_relationships: Vec<FederationRelationship>,
    /// Kuma's universal Secrets (key material: zeroized when dropped). The `secret:` data sources of
    /// Mesh backends are resolved from them when the resources are assembled.
    pub secrets: Vec<Secret>,
    /// What the files hold that meshca skips on purpose, worth a look (Kuma's Insight resources): no
    /// error, reported as warnings.
    pub notes: Vec<ResourceError>,
}

impl Resources {
    /// Replaces each `secret:` data source of a Mesh backend with the bytes of that mesh's Secret of
    /// the name (a missing one is an error of the checks, and stays unresolved).
    fn resolve_secrets(&mut self) {
        for mesh in self.meshes.values_mut() {
            let Some(mtls) = &mut mesh.mtls else { continue };
            for backend in &mut mtls.backends {
                if let BackendKind::Provided { cert, key } = &mut backend.kind {
                    for source in [cert, key] {
                        if let DataSource::Secret(name) = &*source {
                            let found = self
                                .secrets
                                .iter()
                                .find(|s| s.mesh == mesh.name && s.name == *name);
                            if let Some(secret) = found {
                                *source = DataSource::Inline(secret.data.to_vec());
                            }
                        }
                    }
                }
            }
        }
    }

    /// Checks resources across documents and files (duplicates, references to Meshes) and
    /// groups them. Use it after [`parse_str`] when not loading a directory.
    pub fn from_resources(resources: Vec<Resource>) -> Result<Resources, Vec<ResourceError>> {
        Resources::build(resources, &[])
    }

    fn build(
        resources: Vec<Resource>,
        broken: &[document::Broken],
    ) -> Result<Resources, Vec<ResourceError>> {
        let errors = checks::check(&resources, broken);
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Resources::assemble(resources))
    }

    /// Sorts resources into their collections, without checks (a later duplicate replaces a Mesh).
    fn assemble(resources: Vec<Resource>) -> Resources {
        let mut out = Resources::default();
        for resource in resources {
            match resource {
                Resource::Mesh(r) => {
                    out.meshes.insert(r.name.clone(), r);
                }
                Resource::MeshIdentity(r) => out.mesh_identities.push(r),
                Resource::MeshTrust(r) => out.mesh_trusts.push(r),
                Resource::Dataplane(r) => out.dataplanes.push(r),
                Resource::ZoneEgress(r) => out.zone_egresses.push(r),
                Resource::MeshService(r) => out.mesh_services.push(r),
                Resource::WorkloadRegistration(r) => out.workload_registrations.push(r),
                Resource::FederationRelationship(r) => out.federation_relationships.push(r),
                Resource::Secret(r) => out.secrets.push(r),
            }
        }
        out.resolve_secrets();
        out.mesh_identities
            .sort_by(|a, b| (&a.mesh, &a.name).cmp(&(&b.mesh, &b.name)));
        out.mesh_trusts
            .sort_by(|a, b| (&a.mesh, &a.name).cmp(&(&b.mesh, &b.name)));
        out.dataplanes
            .sort_by(|a, b| (&a.mesh, &a.name).cmp(&(&b.mesh, &b.name)));
        out.mesh_services
            .sort_by(|a, b| (&a.mesh, &a.name).cmp(&(&b.mesh, &b.name)));
        out.workload_registrations
            .sort_by(|a, b| (&a.mesh, &a.name).cmp(&(&b.mesh, &b.name)));
        out.federation_relationships
            .sort_by(|a, b| (&a.mesh, &a.name).cmp(&(&b.mesh, &b.name)));
        out.zone_egresses.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The Mesh with this name.
    pub fn mesh(&self, name: &str) -> Option<&Mesh> {
        self.meshes.get(name)
    }

    /// The MeshIdentities of one mesh, by name.
    pub fn identities_in<'a>(
        &'a self,
        mesh: &'a str,
    ) -> impl Iterator<Item = &'a MeshIdentity> + 'a {
        self.mesh_identities.iter().filter(move |r| r.mesh == mesh)
    }

    /// The MeshTrusts of one mesh, by name.
    pub fn trusts_in<'a>(&'a self, mesh: &'a str) -> impl Iterator<Item = &'a MeshTrust> + 'a {
        self.mesh_trusts.iter().filter(move |r| r.mesh == mesh)
    }

    /// The Dataplanes of one mesh, by name.
    pub fn dataplanes_in<'a>(&'a self, mesh: &'a str) -> impl Iterator<Item = &'a Dataplane> + 'a {
        self.dataplanes.iter().filter(move |r| r.mesh == mesh)
    }

    /// The MeshServices of one mesh, by name.
    pub fn services_in<'a>(&'a self, mesh: &'a str) -> impl Iterator<Item = &'a MeshService> + 'a {
        self.mesh_services.iter().filter(move |r| r.mesh == mesh)
    }

    /// The WorkloadRegistrations of one mesh, by name.
    pub fn registrations_in<'a>(
        &'a self,
        mesh: &'a str,
    ) -> impl Iterator<Item = &'a WorkloadRegistration> + 'a {
        self.workload_registrations
            .iter()
            .filter(move |r| r.mesh == mesh)
    }

    /// The Dataplanes that `newer` describes otherwise than these resources do, as `(mesh, name)`: a
    /// Dataplane added, removed or changed, or one a WorkloadRegistration added, removed or changed
    /// names. `None` when anything else differs (a Mesh, an identity, a trust, a MeshService, a
    /// ZoneEgress, a FederationRelationship, a Secret): that change may reach any dataplane.
    pub fn dataplane_changes(&self, newer: &Resources) -> Option<BTreeSet<(String, String)>> {
        let others_same = self.meshes == newer.meshes
            && self.mesh_identities == newer.mesh_identities
            && self.mesh_trusts == newer.mesh_trusts
            && self.zone_egresses == newer.zone_egresses
            && self.mesh_services == newer.mesh_services
            && self.federation_relationships == newer.federation_relationships
            && self.secrets == newer.secrets;
        if !others_same {
            return None;
        }
        let mut changed = BTreeSet::new();
        let dataplane = |d: &Dataplane| (d.mesh.clone(), d.name.clone());
        for (old, new) in changed_sorted(&self.dataplanes, &newer.dataplanes, dataplane) {
            changed.extend(old.into_iter().chain(new).map(dataplane));
        }
        let registration = |r: &WorkloadRegistration| (r.mesh.clone(), r.name.clone());
        let registered = changed_sorted(
            &self.workload_registrations,
            &newer.workload_registrations,
            registration,
        );
        for (old, new) in registered {
            changed.extend(
                old.into_iter()
                    .chain(new)
                    .map(|r| (r.mesh.clone(), r.dataplane.clone())),
            );
        }
        Some(changed)
    }

    /// The Dataplane `name` of `mesh`.
    pub fn dataplane(&self, mesh: &str, name: &str) -> Option<&Dataplane> {
        // Sorted by (mesh, name): a lookup per connecting proxy stays cheap with many files.
        self.dataplanes
            .binary_search_by(|d| (d.mesh.as_str(), d.name.as_str()).cmp(&(mesh, name)))
            .ok()
            .map(|i| &self.dataplanes[i])
    }

    /// The MeshService `name` of `mesh`.
    pub fn service(&self, mesh: &str, name: &str) -> Option<&MeshService> {
        self.mesh_services
            .iter()
            .find(|s| s.mesh == mesh && s.name == name)
    }

    /// The WorkloadRegistration `name` of `mesh`.
    pub fn registration(&self, mesh: &str, name: &str) -> Option<&WorkloadRegistration> {
        self.workload_registrations
            .binary_search_by(|r| (r.mesh.as_str(), r.name.as_str()).cmp(&(mesh, name)))
            .ok()
            .map(|i| &self.workload_registrations[i])
    }

    /// The ZoneEgress `name`.
    pub fn zone_egress(&self, name: &str) -> Option<&ZoneEgress> {
        self.zone_egresses.iter().find(|z| z.name == name)
    }

    /// Whether there are no resources at all (a fresh resources directory).
    pub fn is_empty(&self) -> bool {
        self.meshes.is_empty()
            && self.mesh_identities.is_empty()
            && self.mesh_trusts.is_empty()
            && self.dataplanes.is_empty()
            && self.zone_egresses.is_empty()
            && self.mesh_services.is_empty()
            && self.workload_registrations.is_empty()
    }
}

/// Parses the documents of one file. `file` names the source in errors and is the base for
/// relative `file` data sources. Checks each document on its own; checks across resources
/// (duplicates, Mesh references) are done by [`Resources::from_resources`] and [`load_dir`].
pub fn parse_str(file: &Path, text: &str) -> Result<Vec<Resource>, Vec<ResourceError>> {
    let parsed = document::parse_file(file, text);
    if parsed.errors.is_empty() {
        Ok(parsed.resources)
    } else {
        Err(parsed.errors)
    }
}

/// Why a resource file was not parsed; the error is reported against the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
enum ReadError {
    /// The file could not be read, or is not one to read (too large, not a regular file).
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// The file is not UTF-8 text.
    #[error("cannot read: not UTF-8 text")]
    NotUtf8,
    /// The file nests deeper than `limits.yamlDepth`.
    #[error("nests {depth} levels deep; at most {max} are read (limits.yamlDepth)")]
    TooDeep {
        /// How deep it nests.
        depth: usize,
        /// The limit.
        max: usize,
    },
}

/// The text of one resource file, read within `limits` and checked for depth before parsing.
fn read_resource_file(file: &Path, limits: &LoadLimits) -> Result<String, ReadError> {
    let bytes = meshca_files::read(file, limits.file_bytes, "limits.resourceFileBytes")
        .map_err(ReadError::Read)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let mut bytes = e.into_bytes();
        bytes.zeroize();
        ReadError::NotUtf8
    })?;
    let depth = nesting_depth(&text);
    if depth > limits.depth {
        let mut text = text;
        text.zeroize();
        return Err(ReadError::TooDeep {
            depth,
            max: limits.depth,
        });
    }
    Ok(text)
}

fn dir_error(path: &Path, message: String) -> ResourceError {
    ResourceError {
        file: path.to_owned(),
        document: 0,
        resource: None,
        field: String::new(),
        message,
    }
}

/// The resource files of a directory: `*.yaml` and `*.yml`, not hidden, not in subdirectories
/// (symlinks are followed), sorted by name.
fn resource_files(dir: &Path) -> Result<Vec<PathBuf>, Vec<ResourceError>> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (`meshca serve` creates it, with a default Mesh and MeshIdentity, when it is absent)"
        } else {
            ""
        };
        vec![dir_error(
            dir,
            format!("cannot read the resources directory: {e}{hint}"),
        )]
    })?;
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for entry in entries {
        let path = match entry {
            Ok(entry) => entry.path(),
            Err(e) => {
                errors.push(dir_error(
                    dir,
                    format!("cannot list the resources directory: {e}"),
                ));
                continue;
            }
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let is_yaml = matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
        if name.starts_with('.') || !is_yaml {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => files.push(path),
            // A FIFO would block the reader and a device may never end: refused, and said so.
            Ok(_) => errors.push(dir_error(
                &path,
                "cannot read: not a regular file; refused".to_owned(),
            )),
            Err(e) => errors.push(dir_error(&path, format!("cannot read: {e}"))),
        }
    }
    files.sort();
    if errors.is_empty() {
        Ok(files)
    } else {
        Err(errors)
    }
}

/// Loads every resource file of `dir` (see [`parse_str`] for the format) and checks them as a
/// whole. On failure, returns every error of every file, in file and document order. Files are
/// read within `limits`: regular files only, none larger or nested deeper than allowed, and no
/// more of them than allowed.
pub fn load_dir(dir: &Path, limits: &LoadLimits) -> Result<Resources, Vec<ResourceError>> {
    let (resources, errors) = load_dir_lenient(dir, limits);
    if errors.is_empty() {
        Ok(resources)
    } else {
        Err(errors)
    }
}

/// Like [`load_dir`], but also returns the resources that parsed when there are errors, so that checks of
/// later stages (templates, CAs) can report their errors in the same pass. Never apply a result with errors.
pub fn load_dir_lenient(dir: &Path, limits: &LoadLimits) -> (Resources, Vec<ResourceError>) {
    let mut errors = Vec::new();
    let mut files = resource_files(dir).unwrap_or_else(|mut e| {
        errors.append(&mut e);
        Vec::new()
    });
    if files.len() > limits.files {
        errors.push(dir_error(
            dir,
            format!(
                "holds {} resource files; at most {} are read (limits.resourceFiles)",
                files.len(),
                limits.files
            ),
        ));
        files.clear();
    }
    let mut resources = Vec::new();
    let mut broken = Vec::new();
    let mut notes = Vec::new();
    for file in files {
        let mut text = match read_resource_file(&file, limits) {
            Ok(text) => text,
            Err(e) => {
                errors.push(dir_error(&file, e.to_string()));
                continue;
            }
        };
        let mut parsed = document::parse_file(&file, &text);
        // Resource files may hold inline private keys.
        text.zeroize();
        resources.append(&mut parsed.resources);
        errors.append(&mut parsed.errors);
        broken.append(&mut parsed.broken);
        notes.append(&mut parsed.notes);
    }
    errors.append(&mut checks::check(&resources, &broken));
    let mut resources = Resources::assemble(resources);
    resources.notes = notes;
    (resources, errors)
}

/// The entries of two lists sorted by `key` that differ: `(old, new)`, one side `None` where the key is
/// in one list only.
fn changed_sorted<'a, T: PartialEq, K: Ord>(
    old: &'a [T],
    new: &'a [T],
    key: impl Fn(&T) -> K,
) -> Vec<(Option<&'a T>, Option<&'a T>)> {
    let (mut old, mut new) = (old.iter().peekable(), new.iter().peekable());
    let mut changed = Vec::new();
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => return changed,
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(a), Some(b)) => key(a).cmp(&key(b)),
        };
        match order {
            std::cmp::Ordering::Less => changed.push((old.next(), None)),
            std::cmp::Ordering::Greater => changed.push((None, new.next())),
            std::cmp::Ordering::Equal => {
                let (a, b) = (old.next(), new.next());
                if a != b {
                    changed.push((a, b));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
