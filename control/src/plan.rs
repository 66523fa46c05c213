//! Pure decisions: which identity a dataplane gets, and when its certificate is renewed.
//!
//! Nothing here does I/O or reads the clock: every function takes what it needs, so the owner's
//! behaviour is testable with any time and any resources.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_auth::{LabelMap, Labels};
use meshca_ca::{CertificateAuthority, TemplateVars, WORKLOAD_LABEL};
use meshca_config::SERVICE_TAG;
use meshca_identity::KeyAlgorithm;
use meshca_identity::SpiffeId;

use crate::snapshot::ClaimRule;
use crate::trust::BundleKey;
use crate::world::{BackendState, IdentityProvider, MeshIdentityState, MeshState};

/// Certificate lifetime when neither the backend nor the MeshIdentity says.
pub const DEFAULT_CERT_LIFETIME: Duration = Duration::from_secs(24 * 3600);

/// What is known of a dataplane, from its resource file or its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataplaneInfo {
    /// Mesh name.
    pub mesh: String,
    /// Dataplane name.
    pub name: String,
    /// Labels; shared with the token that registered the dataplane, if one did. `kuma.io/workload`
    /// defaults to the name for a token's dataplane and a zone egress, never for a Dataplane file: Kuma
    /// refuses a file's dataplane without it when a MeshIdentity's path reads it
    /// ([`missing_workload_label`]).
    pub labels: Labels,
    /// Tags of each inbound (the first inbound's `kuma.io/service` is the legacy identity).
    pub inbound_tags: Vec<Labels>,
    /// Where it came from.
    pub origin: Origin,
}

/// Where a dataplane is described.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// A Dataplane resource file.
    File,
    /// The claims of the token it connected with.
    Token,
}

impl DataplaneInfo {
    /// Builds the info, defaulting `kuma.io/workload` to the name unless it comes from a Dataplane
    /// file (`origin` [`Origin::File`]).
    pub fn new(
        mesh: &str,
        name: &str,
        labels: impl Into<Labels>,
        inbound_tags: Vec<Labels>,
        origin: Origin,
    ) -> DataplaneInfo {
        let mut labels = labels.into();
        if origin == Origin::Token {
            with_workload(&mut labels, name);
        }
        DataplaneInfo {
            mesh: mesh.to_owned(),
            name: name.to_owned(),
            labels,
            inbound_tags,
            origin,
        }
    }

    /// A dataplane described by its resource file.
    pub fn from_file(dp: &meshca_config::Dataplane) -> DataplaneInfo {
        let inbounds = dp
            .inbounds
            .iter()
            .map(|i| Arc::new(LabelMap::from(i.tags.clone())))
            .collect();
        DataplaneInfo::new(
            &dp.mesh,
            &dp.name,
            LabelMap::from(dp.labels.clone()),
            inbounds,
            Origin::File,
        )
    }

    /// A zone egress described by its ZoneEgress file, connected with a token of `mesh`.
    pub fn from_zone_egress(mesh: &str, egress: &meshca_config::ZoneEgress) -> DataplaneInfo {
        let mut info = DataplaneInfo::new(
            mesh,
            &egress.name,
            LabelMap::from(egress.labels.clone()),
            Vec::new(),
            Origin::File,
        );
        // Kuma checks the label of dataplanes only; the egress identity reads it as of a token.
        with_workload(&mut info.labels, &egress.name);
        info
    }

    /// A dataplane registered by the claims of its token (its tags describe its one inbound).
    pub fn from_claims(claims: &meshca_auth::Claims) -> DataplaneInfo {
        let inbounds = if claims.tags.is_empty() {
            Vec::new()
        } else {
            vec![claims.tags.clone()]
        };
        DataplaneInfo::new(
            &claims.mesh,
            &claims.name,
            claims.labels.clone(),
            inbounds,
            Origin::Token,
        )
    }

    /// The `kuma.io/service` of each inbound, in order.
    pub fn services(&self) -> impl Iterator<Item = &str> {
        self.inbound_tags
            .iter()
            .filter_map(|t| t.get(SERVICE_TAG))
            .map(String::as_str)
    }

    /// What a token for this dataplane must not contradict: its labels and services.
    pub fn claim_rule(&self) -> ClaimRule {
        ClaimRule {
            labels: self.labels.clone(),
            services: self.services().map(str::to_owned).collect(),
        }
    }

    /// The tags of each inbound that carries every tag of `selector`.
    pub fn inbounds_with<'a>(
        &'a self,
        selector: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Labels> + 'a {
        self.inbound_tags
            .iter()
            .filter(|tags| selector.iter().all(|(k, v)| tags.get(k) == Some(v)))
    }

    /// Whether one of its inbounds carries every tag of `selector`.
    pub fn has_inbound_with(&self, selector: &BTreeMap<String, String>) -> bool {
        self.inbounds_with(selector).next().is_some()
    }
}

/// Sets `kuma.io/workload` to `name` unless the labels carry it.
fn with_workload(labels: &mut Labels, name: &str) {
    if !labels.contains_key(WORKLOAD_LABEL) {
        let mut with = labels.to_btree_map();
        with.insert(WORKLOAD_LABEL.to_owned(), name.to_owned());
        *labels = Arc::new(with.into());
    }
}

/// Who issues a certificate.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "kebab-case")]
pub enum Issuer {
    /// A legacy `mtls.backends[]` entry.
    Backend(String),
    /// A MeshIdentity with a Bundled provider.
    MeshIdentity(String),
}

impl std::fmt::Display for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Issuer::Backend(n) => write!(f, "backend {n}"),
            Issuer::MeshIdentity(n) => write!(f, "MeshIdentity {n}"),
        }
    }
}

/// The certificate a dataplane should hold.
#[derive(Clone, Debug)]
pub struct Desired {
    /// Who issues it.
    pub issuer: Issuer,
    /// The issuing CA.
    pub ca: Arc<CertificateAuthority>,
    /// The SPIFFE ID it carries.
    pub spiffe_id: SpiffeId,
    /// The MeshIdentity name (an SDS alias of `default`), when one issues.
    pub identity_name: Option<String>,
    /// Whose bundles must trust the CA before it issues this certificate (the rollout gate's key): the
    /// dataplane's mesh, or the egress bundle for the zone egress.
    pub trusted_in: BundleKey,
    /// Key algorithm of the leaf.
    pub key_algorithm: KeyAlgorithm,
    /// Requested lifetime.
    pub lifetime: Duration,
    /// The key to certify when a `meshca agent` holds the dataplane's keys (it made the key on its
    /// host and proved it holds the private half); `None`: meshca makes the key and serves it.
    pub agent_key: Option<Arc<meshca_ca::PublicKey>>,
}

/// The outcome of deciding a dataplane's identity.
#[derive(Clone, Debug)]
pub enum Decision {
    /// Issue (or keep) this certificate.
    Issue(Box<Desired>),
    /// No certificate; the reason is shown in the dataplane's status.
    NoIdentity(String),
    /// The dataplane is refused, as Kuma refuses it when it connects: its streams get
    /// `PERMISSION_DENIED` with the reason, which its status shows too.
    Refused(String),
}

/// Kuma's check of a dataplane when it connects: if the MeshIdentity that selects it best (applied or
/// not; with or without a provider) has a path template that reads `kuma.io/workload`, the dataplane
/// must carry that label. Returns Kuma's message when it does not.
pub fn missing_workload_label(mesh: &MeshState, dp: &DataplaneInfo) -> Option<String> {
    if dp.labels.contains_key(WORKLOAD_LABEL) {
        return None;
    }
    let applied = mesh
        .identities
        .iter()
        .map(|i| (i.name.as_str(), i.match_labels.as_ref(), &i.template));
    let inactive = mesh
        .inactive_identities
        .iter()
        .map(|i| (i.name.as_str(), i.match_labels.as_ref(), &i.template));
    let candidates = applied
        .chain(inactive)
        .map(|(name, selector, template)| (name, selector, (name, template)));
    let (name, template) = meshca_ca::select(candidates, &dp.labels)?;
    template.path().reads_label(WORKLOAD_LABEL).then(|| {
        format!(
            "missing required label '{WORKLOAD_LABEL}' - dataplane is selected by MeshIdentity '{name}' \
             with path template '{}'",
            template.path().as_str()
        )
    })
}

/// Decides the identity of `dp` in `mesh` (docs/certificates.md, "Which identity a dataplane gets").
pub fn decide(
    mesh: Option<&MeshState>,
    dp: &DataplaneInfo,
    zone: &str,
    key_algorithm: KeyAlgorithm,
) -> Decision {
    let Some(mesh) = mesh else {
        return Decision::NoIdentity(format!("mesh {:?} is not defined", dp.mesh));
    };
    if let Some(reason) = missing_workload_label(mesh, dp) {
        return Decision::Refused(reason);
    }
    let with_provider = mesh
        .identities
        .iter()
        .filter(|i| !matches!(i.provider, IdentityProvider::None))
        .map(|i| (i.name.as_str(), i.match_labels.as_ref(), i));
    let by = Issuance {
        mesh: &mesh.name,
        labels: &dp.labels,
        zone,
        key_algorithm,
        trusted_in: BundleKey::mesh(dp.mesh.as_str()),
    };
    if let Some(identity) = meshca_ca::select(with_provider, &dp.labels) {
        return by.identity(identity);
    }
    let Some(backend) = &mesh.enabled_backend else {
        return Decision::NoIdentity(format!(
            "mesh {} has no enabled mTLS backend and no MeshIdentity with a provider selects this dataplane",
            mesh.name
        ));
    };
    let Some(service) = dp.services().next() else {
        return Decision::NoIdentity(format!(
            "backend {} issues legacy identities spiffe://<mesh>/<service>, but the dataplane has no {SERVICE_TAG} tag",
            backend.name
        ));
    };
    by.backend(backend, service)
}

/// What a certificate is issued for: a proxy with `labels`, identified in `mesh`, whose CA must be
/// trusted in the bundles of `trusted_in` first.
pub(crate) struct Issuance<'a> {
    /// The mesh the identity belongs to.
    pub mesh: &'a str,
    /// The proxy's labels, for the SPIFFE ID templates.
    pub labels: &'a LabelMap,
    /// `{{ .Zone }}`.
    pub zone: &'a str,
    /// The leaf's key algorithm.
    pub key_algorithm: KeyAlgorithm,
    /// See [`Desired::trusted_in`].
    pub trusted_in: BundleKey,
}

impl Issuance<'_> {
    /// The certificate `identity` issues, if meshca issues for it.
    pub(crate) fn identity(&self, identity: &MeshIdentityState) -> Decision {
        match &identity.provider {
            IdentityProvider::Bundled { ca, expiry, .. } => {
                let vars = TemplateVars {
                    mesh: self.mesh,
                    zone: self.zone,
                    labels: self.labels,
                };
                match identity.template.render_in(&identity.trust_domain, &vars) {
                    Ok(spiffe_id) => Decision::Issue(Box::new(Desired {
                        issuer: Issuer::MeshIdentity(identity.name.clone()),
                        ca: ca.ca.clone(),
                        spiffe_id,
                        identity_name: Some(identity.name.clone()),
                        trusted_in: self.trusted_in.clone(),
                        key_algorithm: self.key_algorithm,
                        lifetime: expiry.unwrap_or(DEFAULT_CERT_LIFETIME),
                        agent_key: None,
                    })),
                    Err(e) => Decision::NoIdentity(format!(
                        "MeshIdentity {}: the SPIFFE ID does not render: {e}",
                        identity.name
                    )),
                }
            }
            IdentityProvider::Spire => Decision::NoIdentity(format!(
                "MeshIdentity {} uses the Spire provider: its identity is managed by SPIRE, not meshca",
                identity.name
            )),
            IdentityProvider::Extension { name } => Decision::NoIdentity(format!(
                "MeshIdentity {} uses the Extension provider: its identity is managed by extension {name}, not meshca",
                identity.name
            )),
            IdentityProvider::None => Decision::NoIdentity(format!(
                "MeshIdentity {} has no provider: it publishes SPIFFE IDs only",
                identity.name
            )),
        }
    }

    /// The legacy certificate `spiffe://<mesh>/<service>` from `backend`.
    pub(crate) fn backend(&self, backend: &BackendState, service: &str) -> Decision {
        let id = format!("spiffe://{}/{service}", self.mesh);
        match id.parse::<SpiffeId>() {
            Ok(spiffe_id) => Decision::Issue(Box::new(Desired {
                issuer: Issuer::Backend(backend.name.clone()),
                ca: backend.ca.ca.clone(),
                spiffe_id,
                identity_name: None,
                trusted_in: self.trusted_in.clone(),
                key_algorithm: self.key_algorithm,
                lifetime: backend.dp_cert_lifetime.unwrap_or(DEFAULT_CERT_LIFETIME),
                agent_key: None,
            })),
            Err(e) => Decision::NoIdentity(format!("the legacy SPIFFE ID {id} is not valid: {e}")),
        }
    }
}

/// The SPIFFE ID every MeshIdentity of `mesh` that selects `dp` gives it, with or without a provider:
/// what a `meshservice:` context must accept for `dp`'s services while identities are staged (a
/// provider-less MeshIdentity publishes its SPIFFE IDs before any certificate carries them). IDs that
/// do not render are left out (the identity's own status says why).
pub fn selected_identity_ids(
    mesh: Option<&MeshState>,
    dp: &DataplaneInfo,
    zone: &str,
) -> Vec<SpiffeId> {
    let Some(mesh) = mesh else {
        return Vec::new();
    };
    let vars = TemplateVars {
        mesh: &dp.mesh,
        zone,
        labels: &dp.labels,
    };
    mesh.identities
        .iter()
        .filter(|i| {
            i.match_labels
                .as_ref()
                .is_some_and(|wanted| wanted.iter().all(|(k, v)| dp.labels.get(k) == Some(v)))
        })
        .filter_map(|i| i.template.render_in(&i.trust_domain, &vars).ok())
        .collect()
}

/// When a certificate valid from `not_before` to `not_after` is renewed: at `renew_at` of its lifetime, minus
/// up to 5% of the lifetime chosen by `jitter` (a number in `[0, 1)`), so that proxies issued together do not
/// all renew in the same instant. Always before expiry.
pub fn renewal_time(
    not_before: SystemTime,
    not_after: SystemTime,
    renew_at: f64,
    jitter: f64,
) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    let fraction = (renew_at - 0.05 * jitter.clamp(0.0, 1.0)).clamp(0.0, 1.0);
    not_before + lifetime.mul_f64(fraction)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn renewal_is_at_the_fraction_minus_jitter_and_before_expiry() {
        assert_eq!(renewal_time(at(1000), at(2000), 0.8, 0.0), at(1800));
        assert_eq!(renewal_time(at(1000), at(2000), 0.8, 1.0), at(1750));
        for j in [0.0, 0.3, 0.99] {
            let t = renewal_time(at(0), at(86_400), 0.99, j);
            assert!(t < at(86_400));
            assert!(t >= at(81_000));
        }
    }

    #[test]
    fn workload_label_defaults_to_the_name_but_never_overrides() {
        let dp = DataplaneInfo::new("m", "web-1", LabelMap::new(), vec![], Origin::Token);
        assert_eq!(
            dp.labels.get(WORKLOAD_LABEL).map(String::as_str),
            Some("web-1")
        );
        let labels = LabelMap::from([(WORKLOAD_LABEL.to_owned(), "web".to_owned())]);
        let dp = DataplaneInfo::new("m", "web-1", labels, vec![], Origin::File);
        assert_eq!(
            dp.labels.get(WORKLOAD_LABEL).map(String::as_str),
            Some("web")
        );
    }
}
