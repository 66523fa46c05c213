//! Building a [`World`] from resources: meshes and their backends, MeshIdentities, MeshTrusts.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use meshca_ca::{IdentityTemplate, TemplateVars};
use meshca_config::{
    Mesh, MeshIdentity, MeshServicesMode, MeshTrust, Provider, Resources, Settings, ZONE_LABEL,
};
use meshca_identity::LabelMap;
use meshca_keystore::Keystore;

use super::{cas, federation, trust};
use super::{IdentityProvider, InactiveIdentity, MeshIdentityState, MeshState, World};
use crate::error::{IdentityLoadError, UpdateError};

/// Where the CAs of a [`World`] come from and go to.
pub struct CaSource<'a> {
    /// Persisted CAs.
    pub keystore: &'a dyn Keystore,
    /// Whether the load persists and logs what it creates, or only checks.
    pub mode: LoadMode,
    /// Daemon settings (zone for trust-domain templates).
    pub settings: &'a Settings,
    /// The world currently serving: its CAs are reused rather than read again.
    pub previous: Option<&'a World>,
    /// Now, for provided-CA validity checks and new CAs.
    pub now: SystemTime,
}

/// What loading a [`World`] does besides building it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadMode {
    /// The daemon, and the commands that act for it: a CA generated on the way and a created MeshTrust
    /// are persisted in the keystore, and each is logged.
    Apply,
    /// `meshca validate`: a CA the world needs and the keystore lacks is generated in memory, only to
    /// check the world; nothing is written to the keystore and nothing is logged, since nothing that
    /// lasts is created.
    Check,
}

impl std::fmt::Debug for CaSource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaSource")
            .field("mode", &self.mode)
            .field("previous", &self.previous.is_some())
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// Reads and validates the resources directory of `settings` and loads every CA it needs. Every error
/// of every stage is reported at once: CA and template checks run on whatever parsed, even when other
/// files did not.
pub fn load_world(
    settings: &Settings,
    keystore: &dyn Keystore,
    previous: Option<&World>,
    now: SystemTime,
) -> Result<World, Vec<UpdateError>> {
    let (resources, errors) =
        meshca_config::load_dir_lenient(&settings.resources, &settings.limits.load());
    let world = check_world(
        resources,
        errors,
        &CaSource {
            keystore,
            mode: LoadMode::Apply,
            settings,
            previous,
            now,
        },
    )?;
    for warning in &world.warnings {
        tracing::warn!("{warning}");
    }
    for note in &world.notes {
        tracing::debug!("{note}");
    }
    Ok(world)
}

/// Builds the world from `resources` unless `errors` (from parsing them) or the world's own checks
/// found anything; returns all of those errors together.
pub fn check_world(
    resources: Resources,
    errors: Vec<meshca_config::ResourceError>,
    src: &CaSource<'_>,
) -> Result<World, Vec<UpdateError>> {
    let mut errors: Vec<UpdateError> = errors.iter().map(UpdateError::from).collect();
    match World::build(resources, src) {
        Ok(world) if errors.is_empty() => {
            persist(&world, src)?;
            Ok(world)
        }
        Ok(_) => Err(errors),
        Err(mut more) => {
            errors.append(&mut more);
            Err(errors)
        }
    }
}

impl World {
    /// Builds the world for `resources`, loading or generating every CA it needs, and then (with
    /// [`LoadMode::Apply`]) writes the MeshTrusts it creates that changed.
    ///
    /// Returns every error found; nothing of a failed load is used and no created MeshTrust is written
    /// (CAs generated on the way stay in the keystore and are reused by the corrected update).
    pub fn load(resources: Resources, src: &CaSource<'_>) -> Result<World, Vec<UpdateError>> {
        let world = World::build(resources, src)?;
        persist(&world, src)?;
        Ok(world)
    }

    /// Builds the world without writing anything but the CAs it generates (none with
    /// [`LoadMode::Check`]).
    fn build(resources: Resources, src: &CaSource<'_>) -> Result<World, Vec<UpdateError>> {
        let mut errors = Vec::new();
        let mut meshes: BTreeMap<String, MeshState> = resources
            .meshes
            .iter()
            .map(|(name, mesh)| (name.clone(), load_mesh(name, mesh, src, &mut errors)))
            .collect();

        // The MeshIdentities loaded but not applied: the operator hears why, every load.
        let mut inactive_warnings = Vec::new();
        let mut identities: Vec<&MeshIdentity> = resources.mesh_identities.iter().collect();
        identities.sort_by(|a, b| a.name.cmp(&b.name));
        for identity in identities {
            let (Some(mesh), Some(resource)) = (
                meshes.get_mut(&identity.mesh),
                resources.meshes.get(&identity.mesh),
            ) else {
                continue;
            };
            let applied = resource.mesh_services == MeshServicesMode::Exclusive;
            match load_identity(identity, applied, src) {
                Ok(Loaded::Applied(state)) => mesh.identities.push(state),
                Ok(Loaded::Inactive(state)) => {
                    inactive_warnings.push(not_applied(identity, resource));
                    mesh.inactive_identities.push(state);
                }
                Err(e) => errors.push(UpdateError {
                    file: identity.source.file.display().to_string(),
                    resource: format!("MeshIdentity/{}/{}", identity.mesh, identity.name),
                    field: e.field().into(),
                    message: e.to_string(),
                }),
            }
        }

        let mut trusts: Vec<&MeshTrust> = resources.mesh_trusts.iter().collect();
        trusts.sort_by(|a, b| a.name.cmp(&b.name));
        for resource in trusts {
            if let Some(mesh) = meshes.get_mut(&resource.mesh) {
                mesh.trusts.push(trust::load_trust(resource, &mut errors));
            }
        }

        for mesh in meshes.values_mut() {
            for identity in &mesh.identities {
                let IdentityProvider::Bundled {
                    ca,
                    mesh_trust_creation: true,
                    ..
                } = &identity.provider
                else {
                    continue;
                };
                match trust::created_trust(
                    &mesh.name,
                    &identity.name,
                    &identity.trust_domain,
                    ca,
                    src.keystore,
                ) {
                    Ok(created) => mesh.created_trusts.push(created),
                    Err(mut e) => errors.append(&mut e),
                }
            }
        }

        let federation =
            federation::load_federation(&resources, &meshes, src.settings, &mut errors);

        let mut warnings: Vec<UpdateError> =
            resources.notes.iter().map(UpdateError::from).collect();
        // What meshca reads in a Mesh beyond what Kuma does: said, not silently meant.
        let mut notes = Vec::new();
        for mesh in resources.meshes.values() {
            let Some(mtls) = &mesh.mtls else { continue };
            let beyond = if !mtls.secondary_backends.is_empty() {
                Some("mtls.secondaryBackends")
            } else if mtls.backends.len() > 1 {
                Some("mtls.backends")
            } else {
                None
            };
            if let Some(field) = beyond {
                notes.push(UpdateError {
                    file: mesh.source.file.display().to_string(),
                    resource: format!("Mesh/{}", mesh.name),
                    field: field.into(),
                    message: "meshca trusts every backend listed and the secondary ones through a rotation; \
                              Kuma 2.14 allows one backend per Mesh and drops secondaryBackends, so this \
                              Mesh means more to meshca than to Kuma"
                        .into(),
                });
            }
        }
        warnings.append(&mut inactive_warnings);
        // A Dataplane file Kuma would refuse: said before its proxy connects and is refused.
        for dp in &resources.dataplanes {
            let Some(mesh) = meshes.get(&dp.mesh) else {
                continue;
            };
            if let Some(reason) = crate::plan::missing_workload_label(
                mesh,
                &crate::plan::DataplaneInfo::from_file(dp),
            ) {
                warnings.push(UpdateError {
                    file: dp.source.file.display().to_string(),
                    resource: format!("Dataplane/{}/{}", dp.mesh, dp.name),
                    field: "labels".into(),
                    message: format!("{reason}: its proxy is refused, as Kuma refuses it"),
                });
            }
        }
        for service in &resources.mesh_services {
            let local = service.zone().is_none_or(|z| z == src.settings.zone);
            if local && service.dataplane_tags.is_some() && !service.identities.is_empty() {
                warnings.push(UpdateError {
                    file: service.source.file.display().to_string(),
                    resource: format!("MeshService/{}/{}", service.mesh, service.name),
                    field: "spec.identities".into(),
                    message: "computed by meshca from the dataplanes the MeshService selects, in \
                              this zone: the identities the file lists are ignored"
                        .into(),
                });
            }
        }

        if errors.is_empty() {
            Ok(World {
                resources: Arc::new(resources),
                meshes,
                federation,
                warnings,
                notes,
            })
        } else {
            Err(errors)
        }
    }
}

/// Writes the MeshTrusts `world` creates that changed, unless the load only checks.
fn persist(world: &World, src: &CaSource<'_>) -> Result<(), Vec<UpdateError>> {
    match src.mode {
        LoadMode::Apply => trust::persist(world, src.keystore),
        LoadMode::Check => Ok(()),
    }
}

/// A mesh with its enabled and secondary backends loaded; a backend that fails is reported and left out.
fn load_mesh(
    name: &str,
    mesh: &Mesh,
    src: &CaSource<'_>,
    errors: &mut Vec<UpdateError>,
) -> MeshState {
    let mut state = MeshState {
        name: name.to_owned(),
        enabled_backend: None,
        secondary_backends: Vec::new(),
        identities: Vec::new(),
        inactive_identities: Vec::new(),
        trusts: Vec::new(),
        created_trusts: Vec::new(),
    };
    let Some(mtls) = &mesh.mtls else {
        return state;
    };
    let mut load = |backend_name: &str| {
        let i = mtls.backends.iter().position(|b| b.name == backend_name)?;
        match cas::load_backend(name, &mtls.backends[i], src) {
            Ok(backend) => Some(backend),
            Err(e) => {
                errors.push(UpdateError {
                    file: mesh.source.file.display().to_string(),
                    resource: format!("Mesh/{name}"),
                    field: format!("mtls.backends[{i}]"),
                    message: format!("backend {backend_name}: {e}"),
                });
                None
            }
        }
    };
    if let Some(enabled) = &mtls.enabled_backend {
        state.enabled_backend = load(enabled);
    }
    state.secondary_backends = mtls
        .secondary_backends
        .iter()
        .filter_map(|secondary| load(secondary))
        .collect();
    state
}

/// Why `identity` is not applied: its `mesh`'s MeshServices are not `Exclusive`.
fn not_applied(identity: &MeshIdentity, mesh: &Mesh) -> UpdateError {
    UpdateError {
        file: identity.source.file.display().to_string(),
        resource: format!("MeshIdentity/{}/{}", identity.mesh, identity.name),
        field: "mesh".into(),
        message: format!(
            "not applied (DependenciesReady=False/MeshServicesDisabled, as in Kuma 2.14): Mesh {:?} has \
             meshServices.mode {}, and a MeshIdentity needs Exclusive; the dataplanes it selects keep the \
             identity the mesh gives them without it. To apply it, set `meshServices: {{mode: Exclusive}}` \
             on the Mesh",
            mesh.name,
            mesh.mesh_services.as_str()
        ),
    }
}

/// A MeshIdentity as loaded: applied, or read but not applied.
enum Loaded {
    Applied(MeshIdentityState),
    Inactive(InactiveIdentity),
}

/// Loads a MeshIdentity; one its Mesh does not let apply (`applied` false) has its templates checked and
/// no CA loaded or generated, as Kuma 2.14 does not initialize its provider.
fn load_identity(
    identity: &MeshIdentity,
    applied: bool,
    src: &CaSource<'_>,
) -> Result<Loaded, IdentityLoadError> {
    let template = IdentityTemplate::parse(
        identity.spiffe_id.trust_domain.as_deref(),
        identity.spiffe_id.path.as_deref(),
    )
    .map_err(IdentityLoadError::Template)?;
    let no_labels = LabelMap::new();
    // As Kuma renders it: the zone the MeshIdentity comes from (its `kuma.io/zone`, which Kuma sets on
    // whatever a zone creates), else this zone.
    let zone = identity
        .labels
        .get(ZONE_LABEL)
        .filter(|z| !z.is_empty())
        .unwrap_or(&src.settings.zone);
    let vars = TemplateVars {
        mesh: &identity.mesh,
        zone,
        labels: &no_labels,
    };
    let trust_domain = template
        .render_trust_domain(&vars)
        .map_err(IdentityLoadError::TrustDomain)?;
    if !applied {
        return Ok(Loaded::Inactive(InactiveIdentity {
            name: identity.name.clone(),
            match_labels: identity.selector.clone(),
            template,
            trust_domain,
            provider: match &identity.provider {
                None => "none",
                Some(Provider::Spire) => "Spire",
                Some(Provider::Extension(_)) => "Extension",
                Some(Provider::Bundled(_)) => "Bundled",
            },
        }));
    }
    let provider = match &identity.provider {
        None => IdentityProvider::None,
        Some(Provider::Spire) => IdentityProvider::Spire,
        Some(Provider::Extension(extension)) => IdentityProvider::Extension {
            name: extension.name.clone(),
        },
        Some(Provider::Bundled(bundled)) => {
            cas::load_identity_ca(identity, bundled, &trust_domain, src)
                .map_err(IdentityLoadError::Ca)?
        }
    };
    Ok(Loaded::Applied(MeshIdentityState {
        name: identity.name.clone(),
        match_labels: identity.selector.clone(),
        template,
        trust_domain,
        provider,
    }))
}
