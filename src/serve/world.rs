//! An accepted configuration: the validated resources plus every CA they need, loaded or generated.
//!
//! A [`World`] is built whole or not at all: [`World::load`] returns every error it finds, and the caller keeps
//! the previous world serving when there is any.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_ca::{
    CaParams, CertificateAuthority, IdentityTemplate, ProvidedOptions, TemplateVars, TrustDomain,
};
use meshca_config::{
    BackendKind, BundledCa, DataSource, KeyAlgorithm, MeshIdentity, Provider, Resources, Settings,
};
use meshca_keystore::Keystore;

use super::generations::{self, Validity};

/// Validity of a CA meshca generates when the resource does not say.
const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// One problem with a resource update: where it is and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UpdateError {
    /// The file the resource came from.
    pub file: String,
    /// `Type/mesh/name` of the resource.
    pub resource: String,
    /// Dotted path of the field to fix.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for UpdateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}: {}",
            self.file, self.resource, self.field, self.message
        )
    }
}

impl From<&meshca_config::ResourceError> for UpdateError {
    fn from(e: &meshca_config::ResourceError) -> Self {
        UpdateError {
            file: e.file.display().to_string(),
            resource: e
                .resource
                .clone()
                .unwrap_or_else(|| format!("document {}", e.document)),
            field: e.field.clone(),
            message: e.message.clone(),
        }
    }
}

/// A loaded certificate authority and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedCa {
    /// The authority itself.
    pub ca: Arc<CertificateAuthority>,
    /// Whether meshca generated it (builtin / autogenerate) or read it (provided).
    pub generated: bool,
}

/// A legacy `mtls.backends[]` entry that is enabled or secondary, with its CA.
#[derive(Debug, Clone)]
pub struct BackendState {
    /// Backend name.
    pub name: String,
    /// `builtin` or `provided`.
    pub kind: &'static str,
    /// Certificate lifetime from `dpCert.rotation.expiration`.
    pub dp_cert_lifetime: Option<Duration>,
    /// The backend's issuing CA.
    pub ca: LoadedCa,
    /// Every CA generation its bundles carry (the issuing one included), in creation order: for builtin
    /// backends the automatic rotation's predecessor or successor too.
    pub generations: Vec<LoadedCa>,
    /// When automatic rotation next changes something.
    pub next_event: Option<SystemTime>,
    /// Every generation this backend has, trusted or expired, for the next load to reuse.
    all_generations: Vec<LoadedCa>,
}

/// What issues certificates for a MeshIdentity.
#[derive(Debug, Clone)]
pub enum IdentityProvider {
    /// No provider: SPIFFE-ID-only mode; publishes SANs, issues nothing.
    None,
    /// Identities managed by SPIRE, outside meshca.
    Spire,
    /// meshca issues from this CA.
    Bundled {
        /// The identity's CA.
        ca: LoadedCa,
        /// `certificateParameters.expiry`.
        expiry: Option<Duration>,
        /// Whether the CA is published as a MeshTrust of the mesh.
        mesh_trust_creation: bool,
    },
}

/// A MeshIdentity with its parsed templates and provider.
#[derive(Debug, Clone)]
pub struct IdentityState {
    /// Resource name.
    pub name: String,
    /// `selector.dataplane.matchLabels`; `None` selects nothing.
    pub match_labels: Option<BTreeMap<String, String>>,
    /// The parsed SPIFFE ID templates.
    pub template: IdentityTemplate,
    /// The trust domain, rendered from mesh and zone.
    pub trust_domain: TrustDomain,
    /// Who issues.
    pub provider: IdentityProvider,
}

/// A MeshTrust resource: extra CAs trusted for a trust domain.
#[derive(Debug, Clone)]
pub struct TrustState {
    /// Resource name.
    pub name: String,
    /// The trust domain its CAs sign for.
    pub trust_domain: String,
    /// PEM certificates, one per entry.
    pub pems: Vec<String>,
}

/// One mesh of an accepted configuration.
#[derive(Debug, Clone)]
pub struct MeshState {
    /// Mesh name.
    pub name: String,
    /// The legacy enabled backend, if mTLS is on.
    pub enabled_backend: Option<BackendState>,
    /// Legacy backends still trusted but not issuing.
    pub secondary_backends: Vec<BackendState>,
    /// MeshIdentities, sorted by name.
    pub identities: Vec<IdentityState>,
    /// MeshTrusts, sorted by name.
    pub trusts: Vec<TrustState>,
}

/// An accepted configuration.
#[derive(Debug, Clone)]
pub struct World {
    /// The resources it was built from.
    pub resources: Arc<Resources>,
    /// Meshes by name.
    pub meshes: BTreeMap<String, MeshState>,
}

/// Where the CAs of a [`World`] come from and go to.
pub struct CaSource<'a> {
    /// Persisted CAs.
    pub keystore: &'a dyn Keystore,
    /// Daemon settings (zone for trust-domain templates).
    pub settings: &'a Settings,
    /// The world currently serving: its CAs are reused rather than read again.
    pub previous: Option<&'a World>,
    /// Now, for provided-CA validity checks and new CAs.
    pub now: SystemTime,
}

impl World {
    /// Builds the world for `resources`, loading or generating every CA it needs.
    ///
    /// Returns every error found; nothing of a failed load is used (CAs generated on the way stay in the
    /// keystore and are reused by the corrected update).
    pub fn load(resources: Resources, src: &CaSource<'_>) -> Result<World, Vec<UpdateError>> {
        let mut errors = Vec::new();
        let mut meshes = BTreeMap::new();
        for (name, mesh) in &resources.meshes {
            let file = mesh.source.file.display().to_string();
            let res = format!("Mesh/{name}");
            let mut state = MeshState {
                name: name.clone(),
                enabled_backend: None,
                secondary_backends: Vec::new(),
                identities: Vec::new(),
                trusts: Vec::new(),
            };
            if let Some(mtls) = &mesh.mtls {
                let find = |b: &str| mtls.backends.iter().position(|x| x.name == b);
                let mut load = |backend_name: &str| -> Option<BackendState> {
                    let i = find(backend_name)?;
                    let backend = &mtls.backends[i];
                    let field = format!("mtls.backends[{i}]");
                    match load_backend(name, backend, src) {
                        Ok(s) => Some(s),
                        Err(message) => {
                            errors.push(UpdateError {
                                file: file.clone(),
                                resource: res.clone(),
                                field,
                                message: format!("backend {backend_name}: {message}"),
                            });
                            None
                        }
                    }
                };
                if let Some(enabled) = &mtls.enabled_backend {
                    state.enabled_backend = load(enabled);
                }
                for secondary in &mtls.secondary_backends {
                    if let Some(s) = load(secondary) {
                        state.secondary_backends.push(s);
                    }
                }
            }
            meshes.insert(name.clone(), state);
        }

        let mut identities: Vec<&MeshIdentity> = resources.mesh_identities.iter().collect();
        identities.sort_by(|a, b| a.name.cmp(&b.name));
        for identity in identities {
            let Some(mesh) = meshes.get_mut(&identity.mesh) else {
                continue;
            };
            match load_identity(identity, src) {
                Ok(s) => mesh.identities.push(s),
                Err(mut e) => errors.append(&mut e),
            }
        }

        let mut trusts: Vec<_> = resources.mesh_trusts.iter().collect();
        trusts.sort_by(|a, b| a.name.cmp(&b.name));
        for trust in trusts {
            let Some(mesh) = meshes.get_mut(&trust.mesh) else {
                continue;
            };
            let file = trust.source.file.display().to_string();
            let resource = format!("MeshTrust/{}/{}", trust.mesh, trust.name);
            if let Err(e) = trust.trust_domain.parse::<TrustDomain>() {
                errors.push(UpdateError {
                    file: file.clone(),
                    resource: resource.clone(),
                    field: "spec.trustDomain".into(),
                    message: e.to_string(),
                });
            }
            let mut pems = Vec::new();
            for (i, bundle) in trust.ca_bundles.iter().enumerate() {
                match split_certificates(bundle.as_bytes()) {
                    Ok(mut p) => pems.append(&mut p),
                    Err(message) => errors.push(UpdateError {
                        file: file.clone(),
                        resource: resource.clone(),
                        field: format!("spec.caBundles[{i}].pem.value"),
                        message,
                    }),
                }
            }
            mesh.trusts.push(TrustState {
                name: trust.name.clone(),
                trust_domain: trust.trust_domain.clone(),
                pems,
            });
        }

        if errors.is_empty() {
            Ok(World {
                resources: Arc::new(resources),
                meshes,
            })
        } else {
            Err(errors)
        }
    }

    /// When automatic CA rotation next changes something, if it ever does.
    pub fn next_rotation_event(&self) -> Option<SystemTime> {
        self.meshes
            .values()
            .flat_map(|m| m.enabled_backend.iter().chain(&m.secondary_backends))
            .filter_map(|b| b.next_event)
            .min()
    }

    /// Every CA of the world, as `(mesh, role, CA)`.
    pub fn authorities(&self) -> impl Iterator<Item = (&str, String, &LoadedCa)> {
        self.meshes.values().flat_map(|m| {
            let backends = m
                .enabled_backend
                .iter()
                .chain(&m.secondary_backends)
                .flat_map(move |b| {
                    b.generations
                        .iter()
                        .map(move |g| (m.name.as_str(), format!("backend {}", b.name), g))
                });
            let identities = m.identities.iter().filter_map(move |i| match &i.provider {
                IdentityProvider::Bundled { ca, .. } => {
                    Some((m.name.as_str(), format!("MeshIdentity {}", i.name), ca))
                }
                _ => None,
            });
            backends.chain(identities)
        })
    }
}

/// Splits PEM text into its CERTIFICATE blocks, each re-encoded on its own.
pub fn split_certificates(pem_text: &[u8]) -> Result<Vec<String>, String> {
    let blocks = ::pem::parse_many(pem_text).map_err(|e| format!("not valid PEM: {e}"))?;
    let certs: Vec<String> = blocks
        .iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| ::pem::encode(b).replace("\r\n", "\n"))
        .collect();
    if certs.is_empty() {
        return Err("holds no CERTIFICATE block".into());
    }
    Ok(certs)
}

fn load_backend(
    mesh: &str,
    backend: &meshca_config::Backend,
    src: &CaSource<'_>,
) -> Result<BackendState, String> {
    let previous = src.previous.and_then(|w| w.meshes.get(mesh)).and_then(|m| {
        m.enabled_backend
            .iter()
            .chain(&m.secondary_backends)
            .find(|b| b.name == backend.name)
    });
    let dp_cert_lifetime = backend.dp_cert_expiration.map(|d| d.as_std());
    match &backend.kind {
        BackendKind::Builtin {
            ca_rsa_bits,
            ca_expiration,
        } => {
            let key_algorithm = match ca_rsa_bits {
                None => KeyAlgorithm::EcdsaP256,
                Some(bits) => KeyAlgorithm::rsa_from_bits(*bits).ok_or_else(|| {
                    format!("conf.caCert.RSAbits: {bits} is not supported (2048, 3072 or 4096)")
                })?,
            };
            let td: TrustDomain = mesh
                .parse()
                .map_err(|e| format!("mesh name is not a valid trust domain: {e}"))?;
            let params = CaParams {
                trust_domain: td,
                key_algorithm,
                validity: ca_expiration
                    .map(|d| d.as_std())
                    .unwrap_or(DEFAULT_CA_VALIDITY),
                name: format!("{mesh}/{}", backend.name),
            };
            let base = format!("ca/{mesh}/backend/{}", backend.name);
            let mut all = match previous {
                Some(p) if p.kind == "builtin" => p.all_generations.clone(),
                _ => load_generations(src, &base, &params)?,
            };
            let (lineage, next_event) = loop {
                let validity: Vec<Validity> = all
                    .iter()
                    .map(|g| Validity {
                        not_before: g.ca.not_before(),
                        not_after: g.ca.not_after(),
                    })
                    .collect();
                let Some(lineage) = generations::lineage(&validity, src.now) else {
                    // Every generation expired (the daemon was down longer than a CA's life): start afresh.
                    all.push(generate_generation(src, &base, all.len(), &params)?);
                    continue;
                };
                if lineage.needs_successor {
                    all.push(generate_generation(src, &base, all.len(), &params)?);
                    continue;
                }
                let next = lineage.next_event;
                break (lineage, next);
            };
            Ok(BackendState {
                name: backend.name.clone(),
                kind: "builtin",
                dp_cert_lifetime,
                ca: all[lineage.active].clone(),
                generations: lineage.trusted.iter().map(|&i| all[i].clone()).collect(),
                next_event,
                all_generations: all,
            })
        }
        BackendKind::Provided { cert, key } => {
            let ca = load_provided(cert, key, true, src.now)?;
            Ok(BackendState {
                name: backend.name.clone(),
                kind: "provided",
                dp_cert_lifetime,
                generations: vec![ca.clone()],
                all_generations: vec![ca.clone()],
                ca,
                next_event: None,
            })
        }
    }
}

/// The keystore path of generation `index` of the CA at `base` (the first generation is `base` itself).
fn generation_path(base: &str, index: usize) -> String {
    if index == 0 {
        base.to_owned()
    } else {
        format!("{base}/gen-{index}")
    }
}

/// Every persisted generation of a builtin CA, in creation order; the first is generated if there is none.
fn load_generations(
    src: &CaSource<'_>,
    base: &str,
    params: &CaParams,
) -> Result<Vec<LoadedCa>, String> {
    let mut all = vec![load_or_generate(src, base, params)?];
    loop {
        let path = generation_path(base, all.len());
        let exists = src
            .keystore
            .get_public(&format!("{path}/cert.pem"))
            .map_err(|e| e.to_string())?
            .is_some();
        if !exists {
            return Ok(all);
        }
        all.push(load_or_generate(src, &path, params)?);
    }
}

/// Generates and persists generation `index` of a builtin CA.
fn generate_generation(
    src: &CaSource<'_>,
    base: &str,
    index: usize,
    params: &CaParams,
) -> Result<LoadedCa, String> {
    tracing::info!(ca = %params.name, generation = index, "automatic CA rotation: generating the next CA generation");
    load_or_generate(src, &generation_path(base, index), params)
}

fn load_identity(
    identity: &MeshIdentity,
    src: &CaSource<'_>,
) -> Result<IdentityState, Vec<UpdateError>> {
    let err = |field: &str, message: String| UpdateError {
        file: identity.source.file.display().to_string(),
        resource: format!("MeshIdentity/{}/{}", identity.mesh, identity.name),
        field: field.into(),
        message,
    };
    let template = IdentityTemplate::parse(
        identity.spiffe_id.trust_domain.as_deref(),
        identity.spiffe_id.path.as_deref(),
    )
    .map_err(|e| vec![err("spec.spiffeID", e.to_string())])?;
    let no_labels = BTreeMap::new();
    let vars = TemplateVars {
        mesh: &identity.mesh,
        zone: &src.settings.zone,
        labels: &no_labels,
    };
    let trust_domain = template
        .render_trust_domain(&vars)
        .map_err(|e| vec![err("spec.spiffeID.trustDomain", e.to_string())])?;

    let provider = match &identity.provider {
        None => IdentityProvider::None,
        Some(Provider::Spire) => IdentityProvider::Spire,
        Some(Provider::Bundled(b)) => {
            let previous = src
                .previous
                .and_then(|w| w.meshes.get(&identity.mesh))
                .and_then(|m| m.identities.iter().find(|i| i.name == identity.name))
                .and_then(|i| match &i.provider {
                    IdentityProvider::Bundled { ca, .. } if ca.generated => Some(ca.clone()),
                    _ => None,
                });
            let ca = match &b.ca {
                BundledCa::Autogenerate => match previous {
                    Some(ca) if ca.ca.trust_domain() == Some(&trust_domain) => ca,
                    _ => {
                        let params = CaParams {
                            trust_domain: trust_domain.clone(),
                            key_algorithm: KeyAlgorithm::EcdsaP256,
                            validity: DEFAULT_CA_VALIDITY,
                            name: format!("{}/{}", identity.mesh, identity.name),
                        };
                        let path = format!(
                            "ca/{}/identity/{}/{}",
                            identity.mesh, identity.name, trust_domain
                        );
                        load_or_generate(src, &path, &params)
                            .map_err(|m| vec![err("spec.provider.bundled.autogenerate", m)])?
                    }
                },
                BundledCa::Provided {
                    certificate,
                    private_key,
                } => load_provided(
                    certificate,
                    private_key,
                    b.insecure_allow_self_signed,
                    src.now,
                )
                .map_err(|m| vec![err("spec.provider.bundled.ca", m)])?,
            };
            if let Some(ca_td) = ca.ca.trust_domain() {
                if ca_td != &trust_domain {
                    return Err(vec![err(
                        "spec.provider.bundled.ca.certificate",
                        format!(
                            "the CA certificate is for trust domain {ca_td}, but spiffeID.trustDomain renders to {trust_domain}"
                        ),
                    )]);
                }
            }
            IdentityProvider::Bundled {
                ca,
                expiry: b.expiry.map(|d| d.as_std()),
                mesh_trust_creation: b.mesh_trust_creation,
            }
        }
    };
    Ok(IdentityState {
        name: identity.name.clone(),
        match_labels: identity.selector.clone(),
        template,
        trust_domain,
        provider,
    })
}

/// Reads a provided CA (cert chain + key) and checks it (DESIGN §6).
fn load_provided(
    cert: &DataSource,
    key: &DataSource,
    allow_self_signed: bool,
    now: SystemTime,
) -> Result<LoadedCa, String> {
    let cert_pem = cert
        .read()
        .map_err(|e| format!("cannot read the CA certificate ({cert}): {e}"))?;
    let key_pem = zeroize::Zeroizing::new(
        key.read()
            .map_err(|e| format!("cannot read the CA key ({key}): {e}"))?,
    );
    let ca = CertificateAuthority::from_pem(
        &cert_pem,
        &key_pem,
        &ProvidedOptions { allow_self_signed },
        now,
    )
    .map_err(|e| e.to_string())?;
    Ok(LoadedCa {
        ca: Arc::new(ca),
        generated: false,
    })
}

/// Loads a generated CA from the keystore, or generates and persists it the first time.
///
/// A persisted CA that cannot be read is an error: meshca never silently replaces a CA.
fn load_or_generate(src: &CaSource<'_>, path: &str, params: &CaParams) -> Result<LoadedCa, String> {
    let cert_name = format!("{path}/cert.pem");
    let key_name = format!("{path}/key.pem");
    let cert = src
        .keystore
        .get_public(&cert_name)
        .map_err(|e| e.to_string())?;
    let key = src
        .keystore
        .get_secret(&key_name)
        .map_err(|e| e.to_string())?;
    let ca = match (cert, key) {
        (Some(cert), Some(key)) => CertificateAuthority::from_persisted(&cert, key.expose()).map_err(|e| {
            format!("the persisted CA in the keystore ({cert_name} with {key_name}) cannot be loaded: {e}; it is not replaced automatically, restore it or remove both files to generate a new CA")
        })?,
        (None, None) => {
            let ca = CertificateAuthority::generate(params, src.now).map_err(|e| e.to_string())?;
            let (chain, key) = ca.to_pem();
            // Key first: a crash between the two writes leaves a key without a cert, reported on the
            // next start rather than a cert whose key is lost.
            src.keystore.put_secret(&key_name, key.as_bytes()).map_err(|e| e.to_string())?;
            src.keystore.put_public(&cert_name, chain.as_bytes()).map_err(|e| e.to_string())?;
            tracing::info!(ca = %params.name, trust_domain = %params.trust_domain, id = %ca.id(), "generated a new CA");
            ca
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(format!(
                "the keystore holds only half of the CA at {path} (certificate or key missing); restore the missing file or remove both to generate a new CA"
            ))
        }
    };
    Ok(LoadedCa {
        ca: Arc::new(ca),
        generated: true,
    })
}
