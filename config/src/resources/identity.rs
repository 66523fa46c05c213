//! `type: MeshIdentity`: which dataplanes get which SPIFFE ID, and from which CA.

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::data_source::{DataSource, SecureDataSource};
use super::error::{Report, Source};
use super::Labels;
use crate::Duration;

/// A MeshIdentity resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshIdentity {
    /// The resource name.
    pub name: String,
    /// The mesh it belongs to (a Mesh of that name exists, once loaded through [`super::Resources`]).
    pub mesh: String,
    /// `labels`.
    pub labels: Labels,
    /// `spec.selector.dataplane.matchLabels`: `Some(empty)` matches every dataplane; `None`
    /// (`selector: {}` or no selector) matches none.
    pub selector: Option<Labels>,
    /// `spec.spiffeID`, as raw templates.
    pub spiffe_id: SpiffeIdTemplates,
    /// `spec.provider`; `None` is SPIFFE-ID-only mode (SANs are published, nothing is issued).
    pub provider: Option<Provider>,
    /// Where it was defined.
    pub source: Source,
}

impl MeshIdentity {
    /// Whether this identity's selector matches a dataplane with these labels.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.selector
            .as_ref()
            .is_some_and(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }

    /// Whether it selects every dataplane (`matchLabels: {}`).
    pub fn selects_all(&self) -> bool {
        self.selector.as_ref().is_some_and(Labels::is_empty)
    }
}

/// `spec.spiffeID`: template strings such as `{{ .Mesh }}.{{ .Zone }}.mesh.local`, unparsed.
/// `None` means the default template applies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpiffeIdTemplates {
    /// `trustDomain`.
    pub trust_domain: Option<String>,
    /// `path`.
    pub path: Option<String>,
}

/// `spec.provider`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// `type: Bundled`: meshca is the CA.
    Bundled(Bundled),
    /// `type: Spire`: identities are managed by SPIRE, outside meshca.
    Spire,
}

/// `spec.provider.bundled`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundled {
    /// `meshTrustCreation: Enabled` (the default): publish a MeshTrust for this identity's CA.
    pub mesh_trust_creation: bool,
    /// `insecureAllowSelfSigned`: a provided CA may be self-signed.
    pub insecure_allow_self_signed: bool,
    /// `certificateParameters.expiry`: the lifetime of issued certificates (never zero).
    pub expiry: Option<Duration>,
    /// Where the CA comes from.
    pub ca: BundledCa,
}

/// The CA of a bundled provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BundledCa {
    /// `autogenerate.enabled: true`: meshca generates and persists the CA.
    Autogenerate,
    /// `ca`: the operator supplies it.
    Provided {
        /// `ca.certificate`.
        certificate: DataSource,
        /// `ca.privateKey`.
        private_key: DataSource,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct IdentitySpec {
    selector: Option<RawSelector>,
    #[serde(rename = "spiffeID")]
    spiffe_id: Option<RawSpiffeId>,
    provider: Option<RawProvider>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSelector {
    dataplane: Option<RawDataplaneSelector>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDataplaneSelector {
    match_labels: Option<Labels>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSpiffeId {
    trust_domain: Option<String>,
    path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum ProviderType {
    Bundled,
    Spire,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    #[serde(rename = "type")]
    kind: ProviderType,
    bundled: Option<RawBundled>,
    spire: Option<IgnoredAny>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
enum Toggle {
    Enabled,
    Disabled,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBundled {
    mesh_trust_creation: Option<Toggle>,
    insecure_allow_self_signed: Option<bool>,
    certificate_parameters: Option<RawCertificateParameters>,
    autogenerate: Option<RawAutogenerate>,
    ca: Option<RawCa>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCertificateParameters {
    expiry: Option<Duration>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAutogenerate {
    enabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawCa {
    certificate: Option<SecureDataSource>,
    private_key: Option<SecureDataSource>,
}

impl IdentitySpec {
    pub(super) fn into_typed(
        self,
        name: String,
        mesh: String,
        labels: Labels,
        report: &mut Report,
    ) -> Option<MeshIdentity> {
        let selector = self
            .selector
            .and_then(|s| s.dataplane)
            .map(|d| d.match_labels.unwrap_or_default());
        let spiffe_id = self
            .spiffe_id
            .map(|s| SpiffeIdTemplates {
                trust_domain: s.trust_domain,
                path: s.path,
            })
            .unwrap_or_default();
        for (field, value) in [
            ("spec.spiffeID.trustDomain", &spiffe_id.trust_domain),
            ("spec.spiffeID.path", &spiffe_id.path),
        ] {
            if value.as_ref().is_some_and(|v| v.trim().is_empty()) {
                report.error(
                    field,
                    "must not be empty; omit it to use the default template",
                );
            }
        }
        let provider = match self.provider {
            None => None,
            Some(raw) => Some(raw.into_typed(report)?),
        };
        Some(MeshIdentity {
            name,
            mesh,
            labels,
            selector,
            spiffe_id,
            provider,
            source: report.source.clone(),
        })
    }
}

impl RawProvider {
    fn into_typed(self, report: &mut Report) -> Option<Provider> {
        match self.kind {
            ProviderType::Spire => {
                if self.bundled.is_some() {
                    report.error("spec.provider.bundled", "not allowed when type is Spire");
                    return None;
                }
                Some(Provider::Spire)
            }
            ProviderType::Bundled => {
                if self.spire.is_some() {
                    report.error("spec.provider.spire", "not allowed when type is Bundled");
                }
                match self.bundled {
                    Some(bundled) => bundled.into_typed(report).map(Provider::Bundled),
                    None => {
                        report.error(
                            "spec.provider.bundled",
                            "required when type is Bundled (e.g. bundled: {autogenerate: {enabled: true}})",
                        );
                        None
                    }
                }
            }
        }
    }
}

impl RawBundled {
    fn into_typed(self, report: &mut Report) -> Option<Bundled> {
        const FIELD: &str = "spec.provider.bundled";
        let expiry = self.certificate_parameters.and_then(|c| c.expiry);
        if expiry.is_some_and(|d| d.0.is_zero()) {
            report.error(
                format!("{FIELD}.certificateParameters.expiry"),
                "must be greater than zero",
            );
        }
        let autogenerate = self.autogenerate.and_then(|a| a.enabled).unwrap_or(false);
        let ca = match (autogenerate, self.ca) {
            (true, None) => Some(BundledCa::Autogenerate),
            (true, Some(_)) => {
                report.error(
                    FIELD,
                    "set either autogenerate.enabled: true or ca, not both",
                );
                None
            }
            (false, None) => {
                report.error(
                    FIELD,
                    "no CA: set autogenerate.enabled: true, or ca.certificate and ca.privateKey",
                );
                None
            }
            (false, Some(ca)) => {
                let mut part = |source: Option<SecureDataSource>, name: &str| match source {
                    Some(s) => s.into_typed(&format!("{FIELD}.ca.{name}"), report),
                    None => {
                        report.error(format!("{FIELD}.ca.{name}"), "required when ca is set");
                        None
                    }
                };
                let certificate = part(ca.certificate, "certificate");
                let private_key = part(ca.private_key, "privateKey");
                match (certificate, private_key) {
                    (Some(certificate), Some(private_key)) => Some(BundledCa::Provided {
                        certificate,
                        private_key,
                    }),
                    _ => None,
                }
            }
        };
        Some(Bundled {
            mesh_trust_creation: self.mesh_trust_creation != Some(Toggle::Disabled),
            insecure_allow_self_signed: self.insecure_allow_self_signed.unwrap_or(false),
            expiry,
            ca: ca?,
        })
    }
}
