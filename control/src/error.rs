//! Errors of the reconciler: what is wrong with a resource update, and why a CA or a certificate could
//! not be had.

use std::fmt;

use meshca_ca::{CaError, IdentityError, IssueError, ProvidedCaError, VerifyError};
use meshca_identity::{SpiffeIdError, TrustDomain};
use meshca_keystore::KeystoreError;

/// One problem with a resource update: where it is and what is wrong. An update with any of these is
/// rejected whole.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    /// `<file>: <resource>: <field>: <message>`, leaving out a resource or field the error has not
    /// (an unreadable directory, a file that is not YAML).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.file)?;
        for part in [&self.resource, &self.field] {
            if !part.is_empty() {
                write!(f, "{part}: ")?;
            }
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for UpdateError {}

#[cfg(test)]
mod update_error_tests {
    use super::*;

    #[test]
    fn an_error_about_a_whole_file_names_no_document_or_field() {
        let whole = meshca_config::ResourceError {
            file: "/etc/meshca/resources".into(),
            document: 0,
            resource: None,
            field: String::new(),
            message: "cannot read the resources directory".into(),
        };
        assert_eq!(
            UpdateError::from(&whole).to_string(),
            "/etc/meshca/resources: cannot read the resources directory"
        );
        let unnamed = meshca_config::ResourceError {
            document: 2,
            field: "type".into(),
            ..whole.clone()
        };
        assert_eq!(
            UpdateError::from(&unnamed).to_string(),
            "/etc/meshca/resources: document 2: type: cannot read the resources directory"
        );
    }
}

impl From<&meshca_config::ResourceError> for UpdateError {
    fn from(e: &meshca_config::ResourceError) -> Self {
        UpdateError {
            file: e.file.display().to_string(),
            resource: match (&e.resource, e.document) {
                (Some(resource), _) => resource.clone(),
                // About the whole file (or directory): no document to name.
                (None, 0) => String::new(),
                (None, document) => format!("document {document}"),
            },
            field: e.field.clone(),
            message: e.message.clone(),
        }
    }
}

/// Why a CA could not be loaded, generated or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaLoadError {
    /// A builtin backend asks for an RSA size meshca does not generate.
    #[error("conf.caCert.RSAbits: {0} is not supported (2048, 3072 or 4096)")]
    RsaBits(u32),
    /// A builtin backend's trust domain is its mesh name, which must be a valid trust domain.
    #[error("mesh name is not a valid trust domain: {0}")]
    MeshName(#[source] SpiffeIdError),
    /// A provided CA's certificate or key could not be read from its data source.
    #[error("cannot read the CA {what} ({source_name}): {error}")]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The data source, as the resource names it.
        source_name: String,
        /// What went wrong.
        error: std::io::Error,
    },
    /// A provided CA failed a check.
    #[error(transparent)]
    Provided(#[from] ProvidedCaError),
    /// Generating a CA failed.
    #[error(transparent)]
    Generate(#[from] CaError),
    /// The keystore could not be read or written.
    #[error("keystore: {0}")]
    Keystore(#[from] KeystoreError),
    /// A CA the keystore holds cannot be loaded; meshca never replaces it silently.
    #[error("the persisted CA in the keystore ({cert} with {key}) cannot be loaded: {error}; it is not replaced automatically, restore it or remove both files to generate a new CA")]
    Persisted {
        /// The certificate's keystore name.
        cert: String,
        /// The key's keystore name.
        key: String,
        /// Why it cannot be loaded.
        error: Box<CaError>,
    },
    /// Only one of a CA's two keystore files exists, and no interrupted creation explains it (the keystore
    /// rolls those back by itself): a file was removed or lost.
    #[error("the keystore holds only half of the CA at {path} (certificate or key missing), and no creation of it was interrupted: a file was removed or lost; restore the missing file, or remove both to generate a new CA")]
    HalfPersisted {
        /// The CA's keystore path.
        path: String,
    },
    /// A CA key named by a `pkcs11:` URI, but no token is configured.
    #[error("{source_name} names a key in a PKCS#11 token ({uri}), but keystore.pkcs11 is not set in the settings: set it to the token holding the key")]
    NoToken {
        /// Where the URI came from: a keystore entry or a resource's data source.
        source_name: String,
        /// The URI.
        uri: String,
    },
    /// A CA key named by a `pkcs11:` URI in another token than the configured one.
    #[error("{source_name} names a key in the PKCS#11 token {uri}, but keystore.pkcs11.token is {configured:?}: meshca uses one token")]
    OtherToken {
        /// Where the URI came from.
        source_name: String,
        /// The URI.
        uri: String,
        /// The configured token's label.
        configured: String,
    },
    /// A persisted CA's key reference is not a `pkcs11:` URI.
    #[error("the keystore entry {entry} should hold the pkcs11: URI of a CA key: {reason}; restore it from a backup")]
    KeyReference {
        /// The entry.
        entry: String,
        /// Why it does not parse.
        reason: String,
    },
    /// A MeshIdentity's CA signs for another trust domain than its SPIFFE IDs use.
    #[error("the CA certificate is for trust domain {ca}, but spiffeID.trustDomain renders to {rendered}")]
    TrustDomainMismatch {
        /// The CA's trust domain.
        ca: TrustDomain,
        /// The MeshIdentity's.
        rendered: TrustDomain,
    },
}

/// Why a MeshIdentity cannot be used: the field to fix and what is wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityLoadError {
    /// The SPIFFE ID templates do not parse.
    #[error("{0}")]
    Template(#[source] IdentityError),
    /// The trust domain template does not render for this mesh and zone.
    #[error("{0}")]
    TrustDomain(#[source] IdentityError),
    /// The identity's CA could not be had.
    #[error("{0}")]
    Ca(#[source] CaLoadError),
}

impl IdentityLoadError {
    /// The field of the MeshIdentity resource to fix.
    pub fn field(&self) -> &'static str {
        match self {
            IdentityLoadError::Template(_) => "spec.spiffeID",
            IdentityLoadError::TrustDomain(_) => "spec.spiffeID.trustDomain",
            IdentityLoadError::Ca(CaLoadError::TrustDomainMismatch { .. }) => {
                "spec.provider.bundled.ca.certificate"
            }
            IdentityLoadError::Ca(CaLoadError::Read { .. } | CaLoadError::Provided(_)) => {
                "spec.provider.bundled.ca"
            }
            IdentityLoadError::Ca(_) => "spec.provider.bundled.autogenerate",
        }
    }
}

/// Why a certificate was not issued (the proxy keeps what it has, the failure is logged and counted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueFailure {
    /// The CA could not issue.
    #[error(transparent)]
    Issue(#[from] IssueError),
    /// The new certificate did not verify against its CA and SPIFFE ID, so it was not published.
    #[error("the new certificate failed verification and was not published: {0}")]
    Verify(#[from] VerifyError),
    /// Issuing failed in a way meshca did not foresee (a bug); the proxy is tried again later.
    #[error("{0}")]
    Internal(String),
}

/// How a proxy's token contradicts what the proxy was given (its Dataplane file, or the token that
/// registered it): the token is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimMismatch {
    /// The token claims a label with another value than the proxy was given.
    #[error("the token claims label {label}={value}, but the proxy was given {label}={given}")]
    LabelValue {
        /// The label.
        label: String,
        /// What the token claims.
        value: String,
        /// What the proxy was given.
        given: String,
    },
    /// The token claims a label the proxy was not given.
    #[error("the token claims label {label}={value}, which the proxy was not given")]
    UnknownLabel {
        /// The label.
        label: String,
        /// What the token claims.
        value: String,
    },
    /// The token claims a service none of the proxy's inbounds has.
    #[error(
        "the token claims {}={service}, which none of the proxy's inbounds has",
        meshca_config::SERVICE_TAG
    )]
    UnknownService {
        /// The `kuma.io/service` the token claims.
        service: String,
    },
}

/// Why an identity another replica recorded for a proxy is not served here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotAdoptable {
    #[error("it expires")]
    Expires,
    #[error("its CA is in none of the mesh's bundles")]
    CaNotCarried,
    #[error("its chain does not parse: {0}")]
    ChainUnreadable(String),
    #[error("its chain is empty")]
    EmptyChain,
    #[error("its leaf has no SPIFFE ID")]
    NoSpiffeId,
    #[error("it does not verify against its CA: {0}")]
    Unverified(String),
    #[error("its key does not parse: {0}")]
    KeyUnreadable(String),
    #[error("its key is not its certificate's")]
    KeyMismatch,
    #[error(
        "it was recorded without its key, which only a proxy that a meshca agent serves may be"
    )]
    KeylessNotAgentServed,
    #[error("it carries a key meshca made, but meshca agent {0} serves the proxy now and holds its keys")]
    HeldButAgentServed(String),
    #[error("unknown issuer {0:?}")]
    UnknownIssuer(String),
}
