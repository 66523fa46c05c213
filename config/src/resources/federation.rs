//! `type: FederationRelationship`: a foreign trust domain whose SPIFFE bundle meshca fetches from its
//! bundle endpoint and trusts (the SPIFFE Federation standard; the names are SPIRE's).

use std::path::PathBuf;

use serde::Deserialize;

use meshca_identity::{SpiffeId, TrustDomain};

use super::error::{Report, Source};
use super::Labels;

/// The `mesh` of a relationship every mesh trusts.
pub const EVERY_MESH: &str = "*";

/// A FederationRelationship resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FederationRelationship {
    /// The resource name.
    pub name: String,
    /// The mesh whose proxies and workloads trust the trust domain, or [`EVERY_MESH`].
    pub mesh: String,
    /// `labels`.
    pub labels: Labels,
    /// `spec.trustDomain`: the foreign trust domain.
    pub trust_domain: TrustDomain,
    /// `spec.bundleEndpoint`.
    pub endpoint: BundleEndpoint,
    /// `spec.initialBundle.file` (resolved against the resource file's directory): the bundle held
    /// before the first fetch, a SPIFFE bundle or PEM.
    pub initial_bundle: Option<PathBuf>,
    /// Where it was defined.
    pub source: Source,
}

impl FederationRelationship {
    /// Whether `mesh`'s proxies and workloads trust the relationship's trust domain.
    pub fn applies_to(&self, mesh: &str) -> bool {
        self.mesh == EVERY_MESH || self.mesh == mesh
    }
}

/// Where and how the foreign trust domain's bundle is fetched.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BundleEndpoint {
    /// `url`: an `https` URL (checked when the resources are loaded).
    pub url: String,
    /// `profile`, with what it needs.
    pub profile: EndpointProfile,
}

/// How a bundle endpoint authenticates itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EndpointProfile {
    /// `https_spiffe`: an X.509-SVID with this SPIFFE ID, chained to the bundle held for the trust
    /// domain.
    HttpsSpiffe {
        /// `spiffeID`, in the relationship's trust domain.
        spiffe_id: SpiffeId,
    },
    /// `https_web`: a Web PKI certificate for the URL's host.
    HttpsWeb {
        /// `caFile` (resolved against the resource file's directory): the roots to check it by;
        /// `None` for the system's.
        ca_file: Option<PathBuf>,
    },
}

impl EndpointProfile {
    /// The `profile` spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            EndpointProfile::HttpsSpiffe { .. } => "https_spiffe",
            EndpointProfile::HttpsWeb { .. } => "https_web",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct FederationSpec {
    trust_domain: Option<String>,
    bundle_endpoint: Option<RawEndpoint>,
    initial_bundle: Option<RawFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    url: Option<String>,
    profile: Option<String>,
    #[serde(rename = "spiffeID")]
    spiffe_id: Option<String>,
    #[serde(rename = "caFile")]
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    file: Option<PathBuf>,
}

#[derive(Clone, Copy)]
enum Profile {
    Spiffe,
    Web,
}

const PROFILES: &[(&str, Profile)] = &[
    ("https_spiffe", Profile::Spiffe),
    ("https_web", Profile::Web),
];

impl FederationSpec {
    pub(super) fn into_typed(
        self,
        name: String,
        mesh: String,
        labels: Labels,
        report: &mut Report,
    ) -> Option<FederationRelationship> {
        let trust_domain = match self.trust_domain.as_deref().map(str::parse::<TrustDomain>) {
            Some(Ok(td)) => Some(td),
            Some(Err(e)) => {
                report.error("spec.trustDomain", e.to_string());
                None
            }
            None => {
                report.error(
                    "spec.trustDomain",
                    "required: the foreign trust domain whose bundle is fetched",
                );
                None
            }
        };
        let base = report.base_dir().to_owned();
        let resolve = |path: PathBuf| {
            if path.is_relative() {
                base.join(path)
            } else {
                path
            }
        };
        let initial_bundle = match self.initial_bundle {
            None => None,
            Some(RawFile { file: None }) => {
                report.error(
                    "spec.initialBundle.file",
                    "required: a SPIFFE bundle or PEM file",
                );
                None
            }
            Some(RawFile { file: Some(path) }) if path.as_os_str().is_empty() => {
                report.error("spec.initialBundle.file", "must not be empty");
                None
            }
            Some(RawFile { file: Some(path) }) => Some(resolve(path)),
        };
        let endpoint = match self.bundle_endpoint {
            None => {
                report.error(
                    "spec.bundleEndpoint",
                    "required: the url and profile of the trust domain's bundle endpoint",
                );
                None
            }
            Some(raw) => raw.into_typed(
                trust_domain.as_ref(),
                initial_bundle.is_some(),
                report,
                resolve,
            ),
        };
        Some(FederationRelationship {
            name,
            mesh,
            labels,
            trust_domain: trust_domain?,
            endpoint: endpoint?,
            initial_bundle,
            source: report.source.clone(),
        })
    }
}

impl RawEndpoint {
    fn into_typed(
        self,
        trust_domain: Option<&TrustDomain>,
        has_initial_bundle: bool,
        report: &mut Report,
        resolve: impl Fn(PathBuf) -> PathBuf,
    ) -> Option<BundleEndpoint> {
        let url = match self.url {
            Some(url) if !url.is_empty() => Some(url),
            Some(_) => {
                report.error("spec.bundleEndpoint.url", "must not be empty");
                None
            }
            None => {
                report.error("spec.bundleEndpoint.url", "required: an https URL");
                None
            }
        };
        let profile = match &self.profile {
            Some(p) => report.one_of("spec.bundleEndpoint.profile", p, PROFILES),
            None => {
                report.error(
                    "spec.bundleEndpoint.profile",
                    "required; one of https_spiffe, https_web",
                );
                None
            }
        };
        let profile = match profile? {
            Profile::Spiffe => {
                if self.ca_file.is_some() {
                    report.error(
                        "spec.bundleEndpoint.caFile",
                        "only for profile https_web: an https_spiffe endpoint is checked by the trust domain's own bundle",
                    );
                }
                if !has_initial_bundle {
                    report.error(
                        "spec.initialBundle",
                        "required with profile https_spiffe: the endpoint's certificate is checked by the trust domain's bundle, so the first fetch needs one (a SPIFFE bundle or PEM file, e.g. from `spire-server bundle show -format spiffe` on the peer)",
                    );
                }
                let spiffe_id = match self.spiffe_id.as_deref().map(SpiffeId::parse) {
                    None => {
                        report.error(
                            "spec.bundleEndpoint.spiffeID",
                            "required with profile https_spiffe: the SPIFFE ID the endpoint presents",
                        );
                        None
                    }
                    Some(Err(e)) => {
                        report.error("spec.bundleEndpoint.spiffeID", e.to_string());
                        None
                    }
                    Some(Ok(id)) => match trust_domain {
                        Some(td) if id.trust_domain() != td => {
                            report.error(
                                "spec.bundleEndpoint.spiffeID",
                                format!(
                                    "{id} is not in trust domain {td}: a peer's endpoint is trusted for its own trust domain only"
                                ),
                            );
                            None
                        }
                        _ => Some(id),
                    },
                };
                EndpointProfile::HttpsSpiffe {
                    spiffe_id: spiffe_id?,
                }
            }
            Profile::Web => {
                if self.spiffe_id.is_some() {
                    report.error(
                        "spec.bundleEndpoint.spiffeID",
                        "only for profile https_spiffe: an https_web endpoint presents a Web PKI certificate",
                    );
                }
                let ca_file = match self.ca_file {
                    Some(path) if path.as_os_str().is_empty() => {
                        report.error("spec.bundleEndpoint.caFile", "must not be empty");
                        None
                    }
                    other => other.map(resolve),
                };
                EndpointProfile::HttpsWeb { ca_file }
            }
        };
        Some(BundleEndpoint { url: url?, profile })
    }
}
