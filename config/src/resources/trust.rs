//! `type: MeshTrust`: CAs of other trust domains that a mesh accepts.

use serde::de::IgnoredAny;
use serde::Deserialize;

use meshca_identity::TrustDomain;

use super::error::{Report, Source};
use super::Labels;

/// A MeshTrust resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshTrust {
    /// The resource name.
    pub name: String,
    /// The mesh it belongs to.
    pub mesh: String,
    /// `labels`.
    pub labels: Labels,
    /// `spec.trustDomain`, a valid SPIFFE trust domain.
    pub trust_domain: TrustDomain,
    /// `spec.caBundles[].pem.value`: PEM text, each with at least one CERTIFICATE block and no other
    /// block; never empty.
    pub ca_bundles: Vec<String>,
    /// Where it was defined.
    pub source: Source,
}

/// `spec`, with the trust domain and the bundle types read as text so that each wrong one is reported
/// with the others.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct TrustSpec {
    trust_domain: Option<String>,
    #[serde(default)]
    ca_bundles: Vec<RawCaBundle>,
    #[serde(rename = "origin")]
    _origin: Option<IgnoredAny>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCaBundle {
    #[serde(rename = "type")]
    kind: Option<String>,
    pem: Option<RawPem>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPem {
    value: String,
}

/// Why a CA bundle's PEM text was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
enum PemBundleError {
    /// The text is not PEM.
    #[error("not valid PEM: {0}")]
    NotPem(String),
    /// A block other than a certificate, named by its label only (it may be a private key).
    #[error("PEM block {index} is labelled {label}: only CERTIFICATE blocks are accepted, because everything in a MeshTrust is published to every proxy of the mesh")]
    NotCertificate {
        /// The 1-based index of the block.
        index: usize,
        /// Its label.
        label: String,
    },
    /// No block at all.
    #[error("no -----BEGIN CERTIFICATE----- block found")]
    Empty,
}

/// Checks that `text` holds PEM CERTIFICATE blocks and nothing else. Everything in a MeshTrust is
/// published to every proxy of its mesh, so any other block (a private key pasted by mistake) is refused,
/// named by its label only, never quoted.
fn check_pem(text: &str) -> Result<(), PemBundleError> {
    let blocks = ::pem::parse_many(text).map_err(|e| PemBundleError::NotPem(e.to_string()))?;
    if let Some((i, block)) = blocks
        .iter()
        .enumerate()
        .find(|(_, b)| b.tag() != "CERTIFICATE")
    {
        return Err(PemBundleError::NotCertificate {
            index: i + 1,
            label: block.tag().to_owned(),
        });
    }
    if blocks.is_empty() {
        return Err(PemBundleError::Empty);
    }
    Ok(())
}

impl TrustSpec {
    pub(super) fn into_typed(
        self,
        name: String,
        mesh: String,
        labels: Labels,
        report: &mut Report,
    ) -> Option<MeshTrust> {
        let trust_domain = match self.trust_domain.as_deref().map(str::parse::<TrustDomain>) {
            Some(Ok(td)) => Some(td),
            Some(Err(e)) => {
                report.error("spec.trustDomain", e.to_string());
                None
            }
            None => {
                report.error(
                    "spec.trustDomain",
                    "required: the trust domain whose CAs the bundles hold",
                );
                None
            }
        };
        if self.ca_bundles.is_empty() {
            report.error("spec.caBundles", "at least one CA bundle is required");
        }
        let mut ca_bundles = Vec::with_capacity(self.ca_bundles.len());
        for (i, bundle) in self.ca_bundles.into_iter().enumerate() {
            let type_field = format!("spec.caBundles[{i}].type");
            let pem_type = match &bundle.kind {
                Some(kind) => report.one_of(type_field, kind, &[("Pem", ())]),
                None => {
                    report.error(type_field, "required; one of Pem");
                    None
                }
            };
            if pem_type.is_none() {
                continue;
            }
            match bundle.pem {
                None => report.error(
                    format!("spec.caBundles[{i}].pem"),
                    "required when type is Pem",
                ),
                Some(pem) => match check_pem(&pem.value) {
                    Ok(()) => ca_bundles.push(pem.value),
                    Err(e) => report.error(format!("spec.caBundles[{i}].pem.value"), e.to_string()),
                },
            }
        }
        Some(MeshTrust {
            name,
            mesh,
            labels,
            trust_domain: trust_domain?,
            ca_bundles,
            source: report.source.clone(),
        })
    }
}
