//! A CA's material as given (provided by the operator, or persisted by meshca): its chain read from PEM,
//! and why such material cannot be used. Both the CA itself and the checks of a provided one use it.

use meshca_identity::SpiffeIdError;

use crate::certs;
use crate::key::KeyError;

/// Why a provided CA (or a persisted one) cannot be used. Positions count from 1, the signing CA.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProvidedCaError {
    /// The certificate data is not readable PEM.
    #[error("the CA certificate is not readable PEM: {0}")]
    UnreadableCertPem(String),
    /// The certificate PEM holds no `CERTIFICATE` block.
    #[error("the CA certificate file holds no certificate (no \"BEGIN CERTIFICATE\" block)")]
    NoCertificate,
    /// The certificate PEM holds a block of another type.
    #[error("the CA certificate file holds a {label:?} block; it must hold only certificates (the signing CA first, then its issuers)")]
    UnexpectedPemBlock {
        /// The PEM label found.
        label: String,
    },
    /// A certificate does not parse.
    #[error("certificate {position} of the CA chain cannot be parsed: {reason}")]
    UnparsableCertificate {
        /// Its position in the chain (1 = signing CA).
        position: usize,
        /// The parser's complaint.
        reason: String,
    },
    /// The key does not parse or is of an unsupported type.
    #[error("the CA private key cannot be used: {0}")]
    UnreadableKey(#[source] KeyError),
    /// The key is not the signing certificate's key.
    #[error("the CA private key does not match the certificate {subject:?} (the first certificate must be the one the key belongs to)")]
    KeyMismatch {
        /// The signing certificate's subject.
        subject: String,
    },
    /// A certificate is not a CA.
    #[error("certificate {position} of the CA chain ({subject:?}) is not a CA: basicConstraints cA must be true")]
    NotCa {
        /// Its position in the chain.
        position: usize,
        /// Its subject.
        subject: String,
    },
    /// A certificate may not sign certificates.
    #[error("certificate {position} of the CA chain ({subject:?}) lacks keyUsage keyCertSign")]
    MissingKeyCertSign {
        /// Its position in the chain.
        position: usize,
        /// Its subject.
        subject: String,
    },
    /// A certificate has keyUsage keyAgreement, which a mesh CA must not have.
    #[error("certificate {position} of the CA chain ({subject:?}) has keyUsage keyAgreement, which a CA must not have")]
    HasKeyAgreement {
        /// Its position in the chain.
        position: usize,
        /// Its subject.
        subject: String,
    },
    /// A certificate has expired.
    #[error("certificate {position} of the CA chain ({subject:?}) expired at {not_after}")]
    Expired {
        /// Its position in the chain.
        position: usize,
        /// Its subject.
        subject: String,
        /// Its NotAfter, RFC 3339.
        not_after: String,
    },
    /// A certificate is not valid yet.
    #[error(
        "certificate {position} of the CA chain ({subject:?}) is not valid before {not_before}"
    )]
    NotYetValid {
        /// Its position in the chain.
        position: usize,
        /// Its subject.
        subject: String,
        /// Its NotBefore, RFC 3339.
        not_before: String,
    },
    /// A certificate's key type is not supported.
    #[error("certificate {position} of the CA chain ({subject:?}) has an unsupported key type {found}; use ECDSA P-256, ECDSA P-384 or RSA 2048/3072/4096")]
    UnsupportedKeyType {
        /// Its position in the chain.
        position: usize,
        /// Its subject.
        subject: String,
        /// The key type found.
        found: String,
    },
    /// A certificate was not issued by the next one.
    #[error("the CA chain does not link: certificate {position} ({subject:?}) is not signed by {issuer_subject:?}: {reason}; order the file as signing CA first, then each issuer up to the root")]
    ChainBroken {
        /// Position of the certificate whose issuer check failed.
        position: usize,
        /// Its subject.
        subject: String,
        /// The subject of the certificate expected to have signed it (the next one, or itself for a root).
        issuer_subject: String,
        /// What failed.
        reason: String,
    },
    /// The signing CA is self-signed and the policy does not allow it.
    #[error("the CA {subject:?} is self-signed; set insecureAllowSelfSigned on the MeshIdentity to accept it, or provide a CA issued by your root")]
    SelfSignedNotAllowed {
        /// Its subject.
        subject: String,
    },
    /// The CA's `spiffe://` URI SAN is not a valid SPIFFE ID.
    #[error("the CA {subject:?} has an invalid SPIFFE URI SAN {uri:?}: {source}")]
    InvalidSpiffeUri {
        /// Its subject.
        subject: String,
        /// The URI.
        uri: String,
        /// The rule it breaks.
        source: SpiffeIdError,
    },
    /// The subject uses a form meshca cannot reproduce exactly as its leaves' issuer name.
    #[error("the CA subject {subject:?} uses multi-valued or repeated attributes or string types meshca cannot reproduce as the issuer name of its certificates")]
    UnsupportedSubject {
        /// Its subject.
        subject: String,
    },
    /// The key could not be loaded for signing.
    #[error("the CA key cannot be loaded for signing: {0}")]
    Signer(String),
}

/// Reads a chain of PEM certificates (DER, in order), refusing other block types.
pub(crate) fn read_chain(pem: &[u8]) -> Result<Vec<Vec<u8>>, ProvidedCaError> {
    let (certs, others) =
        certs::split_pem(pem).map_err(|e| ProvidedCaError::UnreadableCertPem(e.to_string()))?;
    if let Some(label) = others.into_iter().next() {
        return Err(ProvidedCaError::UnexpectedPemBlock { label });
    }
    if certs.is_empty() {
        return Err(ProvidedCaError::NoCertificate);
    }
    Ok(certs)
}
