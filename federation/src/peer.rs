//! A federation peer as meshca knows it: a foreign trust domain, where its bundle endpoint is and how
//! it proves itself, and the bundle held for it before any fetch.

use std::sync::Arc;

use meshca_identity::{SpiffeId, TrustDomain};
use rustls::pki_types::CertificateDer;

use crate::bundle::SpiffeBundle;
use crate::fetch::{system_roots, EndpointAuth, FetchError};

/// A foreign trust domain whose bundle meshca fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    /// The foreign trust domain.
    pub trust_domain: TrustDomain,
    /// The bundle endpoint's `https` URL.
    pub url: String,
    /// How the endpoint proves itself.
    pub profile: PeerProfile,
    /// The bundle held before the first fetch (`initialBundle`), if any.
    pub initial: Option<Arc<SpiffeBundle>>,
}

/// How a peer's bundle endpoint proves itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerProfile {
    /// `https_spiffe`: an X.509-SVID with this SPIFFE ID, chained to the bundle held for the trust
    /// domain (so a peer's rotation is followed through the bundles it serves).
    Spiffe {
        /// The endpoint's SPIFFE ID.
        id: SpiffeId,
    },
    /// `https_web`: a Web PKI certificate for the URL's host.
    Web {
        /// The roots to check it by (`caFile`); `None` for the system's.
        roots: Option<Arc<[CertificateDer<'static>]>>,
    },
}

impl PeerProfile {
    /// The `profile` spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            PeerProfile::Spiffe { .. } => "https_spiffe",
            PeerProfile::Web { .. } => "https_web",
        }
    }
}

impl Peer {
    /// How to authenticate the endpoint now, holding `held` for the trust domain.
    pub(crate) fn auth(&self, held: Option<&SpiffeBundle>) -> Result<EndpointAuth, FetchError> {
        match &self.profile {
            PeerProfile::Spiffe { id } => {
                let bundle = held.ok_or_else(|| {
                    FetchError::Auth(format!(
                        "no bundle of {} is held to check the endpoint's X.509-SVID by (give the relationship an initialBundle)",
                        self.trust_domain
                    ))
                })?;
                Ok(EndpointAuth::Spiffe {
                    id: id.clone(),
                    bundle: bundle.clone(),
                })
            }
            PeerProfile::Web { roots: Some(roots) } => Ok(EndpointAuth::Web {
                roots: roots.to_vec(),
            }),
            PeerProfile::Web { roots: None } => Ok(EndpointAuth::Web {
                roots: system_roots()?,
            }),
        }
    }
}

/// The CERTIFICATE blocks of PEM text, as roots to check an `https_web` endpoint by (`caFile`,
/// `meshca bundle fetch --ca-file`); other blocks are ignored, and none at all is an error.
pub fn pem_roots(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let blocks = ::pem::parse_many(pem).map_err(|e| format!("not PEM: {e}"))?;
    let roots: Vec<CertificateDer<'static>> = blocks
        .into_iter()
        .filter(|b| b.tag() == "CERTIFICATE")
        .map(|b| CertificateDer::from(b.into_contents()))
        .collect();
    if roots.is_empty() {
        return Err("no CERTIFICATE block".into());
    }
    Ok(roots)
}
