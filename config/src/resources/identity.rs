//! `type: MeshIdentity`: which dataplanes get which SPIFFE ID, and from which CA.

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::data_source::{DataSource, Holds, SecureDataSource};
use super::error::{Report, Source};
use super::Labels;
use crate::names::{cut, ECHO_CHARS, MAX_NAME_LEN};
use crate::Duration;
use meshca_identity::{IdentityError, Template};

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
    /// `type: Extension` (Kuma 2.14): identities are issued by an extension plugged into the control
    /// plane, outside meshca.
    Extension(Extension),
}

/// `spec.provider.extension`: a provider meshca recognises and leaves to the extension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extension {
    /// `name`: the extension that issues (never empty).
    pub name: String,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProviderType {
    Bundled,
    Spire,
    Extension,
}

/// The `type` spellings of a provider, in Kuma's order.
const PROVIDER_TYPES: [(&str, ProviderType); 3] = [
    ("Bundled", ProviderType::Bundled),
    ("Spire", ProviderType::Spire),
    ("Extension", ProviderType::Extension),
];

impl ProviderType {
    fn as_str(self) -> &'static str {
        match self {
            ProviderType::Bundled => "Bundled",
            ProviderType::Spire => "Spire",
            ProviderType::Extension => "Extension",
        }
    }
}

/// `spec.provider`, with `type` read as text: a wrong type is reported with the provider's other
/// violations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    #[serde(rename = "type")]
    kind: Option<String>,
    bundled: Option<RawBundled>,
    spire: Option<IgnoredAny>,
    extension: Option<RawExtension>,
}

/// `spec.provider.extension`: the extension's own `config` is its business, so only its shape is
/// checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExtension {
    name: Option<String>,
    config: Option<yaml_serde::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBundled {
    mesh_trust_creation: Option<String>,
    insecure_allow_self_signed: Option<bool>,
    certificate_parameters: Option<RawCertificateParameters>,
    autogenerate: Option<RawAutogenerate>,
    ca: Option<RawCa>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCertificateParameters {
    expiry: Option<String>,
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
    /// The typed MeshIdentity, or `None` with every violation of the spec in `report` (one wrong
    /// field does not hide the next).
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
        check_templates(&spiffe_id, report);
        let provider = match self.provider {
            None => Some(None),
            Some(raw) => raw.into_typed(report).map(Some),
        };
        Some(MeshIdentity {
            name,
            mesh,
            labels,
            selector,
            spiffe_id,
            provider: provider?,
            source: report.source.clone(),
        })
    }
}

/// Reports a `spiffeID` template that is empty or does not parse, each under its own field. Rendering
/// needs a mesh, a zone and a dataplane's labels, so it is checked later.
fn check_templates(spiffe_id: &SpiffeIdTemplates, report: &mut Report) {
    for (field, value, is_trust_domain) in [
        ("spec.spiffeID.trustDomain", &spiffe_id.trust_domain, true),
        ("spec.spiffeID.path", &spiffe_id.path, false),
    ] {
        let Some(value) = value else { continue };
        if value.trim().is_empty() {
            report.error(
                field,
                "must not be empty; omit it to use the default template",
            );
            continue;
        }
        match Template::parse(value) {
            Err(e) => report.error(field, format!("the template does not parse: {e}")),
            Ok(template) if is_trust_domain && template.uses_labels() => {
                report.error(field, IdentityError::TrustDomainUsesLabels.to_string());
            }
            Ok(_) => {}
        }
    }
}

impl RawProvider {
    fn into_typed(self, report: &mut Report) -> Option<Provider> {
        const FIELD: &str = "spec.provider";
        let kind = match &self.kind {
            Some(kind) => report.one_of(format!("{FIELD}.type"), kind, &PROVIDER_TYPES),
            None => {
                report.error(
                    format!("{FIELD}.type"),
                    "required; one of Bundled, Spire, Extension",
                );
                None
            }
        };
        // The section of another type than the one named is refused; with no valid type, every
        // section present is still checked, so that its violations are reported too.
        let wanted = |section: ProviderType| kind.is_none_or(|k| k == section);
        for (section, set) in [
            (ProviderType::Bundled, self.bundled.is_some()),
            (ProviderType::Spire, self.spire.is_some()),
            (ProviderType::Extension, self.extension.is_some()),
        ] {
            if let Some(kind) = kind.filter(|_| set && !wanted(section)) {
                report.error(
                    format!("{FIELD}.{}", section.as_str().to_lowercase()),
                    format!("not allowed when type is {}", kind.as_str()),
                );
            }
        }
        let bundled = self
            .bundled
            .filter(|_| wanted(ProviderType::Bundled))
            .map(|b| b.into_typed(report));
        let extension = self
            .extension
            .filter(|_| wanted(ProviderType::Extension))
            .map(|e| e.into_typed(report));
        match kind? {
            ProviderType::Spire => Some(Provider::Spire),
            ProviderType::Bundled => match bundled {
                Some(bundled) => bundled.map(Provider::Bundled),
                None => {
                    report.error(
                        format!("{FIELD}.bundled"),
                        "required when type is Bundled (e.g. bundled: {autogenerate: {enabled: true}})",
                    );
                    None
                }
            },
            ProviderType::Extension => match extension {
                Some(extension) => extension.map(Provider::Extension),
                None => {
                    report.error(
                        format!("{FIELD}.extension"),
                        "required when type is Extension (e.g. extension: {name: my-provider})",
                    );
                    None
                }
            },
        }
    }
}

impl RawExtension {
    fn into_typed(self, report: &mut Report) -> Option<Extension> {
        const FIELD: &str = "spec.provider.extension";
        let name = match self.name {
            Some(name) if name.trim().is_empty() => {
                report.error(format!("{FIELD}.name"), "must not be empty");
                None
            }
            // Quoted in every status line of the dataplanes it selects: bounded and printable.
            Some(name) if name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) => {
                report.error(
                    format!("{FIELD}.name"),
                    format!(
                        "{:?} is not a name: at most {MAX_NAME_LEN} bytes, no control characters",
                        cut(&name, ECHO_CHARS)
                    ),
                );
                None
            }
            Some(name) => Some(name),
            None => {
                report.error(
                    format!("{FIELD}.name"),
                    "required: the name of the extension that issues the identities",
                );
                None
            }
        };
        let config_ok = self.config.is_none_or(|c| c.is_mapping());
        if !config_ok {
            report.error(
                format!("{FIELD}.config"),
                "must be an object (the extension's own settings)",
            );
        }
        name.filter(|_| config_ok).map(|name| Extension { name })
    }
}

impl RawBundled {
    fn into_typed(self, report: &mut Report) -> Option<Bundled> {
        const FIELD: &str = "spec.provider.bundled";
        let mesh_trust_creation = match &self.mesh_trust_creation {
            None => Some(true),
            Some(value) => report.one_of(
                format!("{FIELD}.meshTrustCreation"),
                value,
                &[("Enabled", true), ("Disabled", false)],
            ),
        };
        let expiry_field = format!("{FIELD}.certificateParameters.expiry");
        let expiry = match self.certificate_parameters.and_then(|c| c.expiry) {
            None => Some(None),
            Some(text) => match text.parse::<Duration>() {
                Ok(d) if d.0.is_zero() => {
                    report.error(expiry_field, "must be greater than zero");
                    None
                }
                Ok(d) => Some(Some(d)),
                Err(e) => {
                    report.error(expiry_field, e.to_string());
                    None
                }
            },
        };
        let autogenerate = self.autogenerate.and_then(|a| a.enabled).unwrap_or(false);
        match (autogenerate, self.ca.is_some()) {
            (true, true) => report.error(
                format!("{FIELD}.ca"),
                "shouldn't be defined once using autogenerated: set either autogenerate.enabled: true or ca, not both",
            ),
            (false, false) => report.error(
                FIELD,
                "no CA: set autogenerate.enabled: true, or ca.certificate and ca.privateKey",
            ),
            _ => {}
        }
        // The CA's data sources are checked even when `ca` is not allowed, to report them too.
        let provided = self.ca.map(|ca| ca.into_typed(report));
        let ca = match (autogenerate, provided) {
            (true, None) => Some(BundledCa::Autogenerate),
            (false, Some(provided)) => provided,
            (true, Some(_)) | (false, None) => None,
        };
        Some(Bundled {
            mesh_trust_creation: mesh_trust_creation?,
            insecure_allow_self_signed: self.insecure_allow_self_signed.unwrap_or(false),
            expiry: expiry?,
            ca: ca?,
        })
    }
}

impl RawCa {
    /// The provided CA, or `None` with the violations of both data sources reported.
    fn into_typed(self, report: &mut Report) -> Option<BundledCa> {
        const FIELD: &str = "spec.provider.bundled.ca";
        let mut part = |source: Option<SecureDataSource>, name: &str, holds| match source {
            Some(s) => s.into_typed(&format!("{FIELD}.{name}"), holds, report),
            None => {
                report.error(format!("{FIELD}.{name}"), "required when ca is set");
                None
            }
        };
        let certificate = part(self.certificate, "certificate", Holds::Certificate);
        let private_key = part(self.private_key, "privateKey", Holds::Key);
        Some(BundledCa::Provided {
            certificate: certificate?,
            private_key: private_key?,
        })
    }
}
