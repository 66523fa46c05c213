//! Provided CAs: a certificate chain and key from the operator, checked before use (docs/certificates.md).

use std::time::SystemTime;

use x509_parser::certificate::X509Certificate;

use std::sync::Arc;

use meshca_hsm::{KeySelector, Token};

use crate::authority::{find_token_key, CaError, CaKey, CertificateAuthority};
use crate::certs::{self, KeyKind};
use crate::key::{KeyError, PrivateKey};
use meshca_identity::SpiffeIdError;

/// Policy for a provided CA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProvidedOptions {
    /// Accept a self-signed signing CA (MeshIdentity `insecureAllowSelfSigned`).
    pub allow_self_signed: bool,
}

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

impl CertificateAuthority {
    /// Loads a provided CA: the PEM holds the signing CA, optionally followed by the CAs above it up to
    /// the root. Every certificate must be a CA with keyCertSign and without keyAgreement, valid at `now`,
    /// with a supported key; each must be signed by the next; the key must match the first; a self-signed
    /// signing CA needs `allow_self_signed`.
    pub fn from_pem(
        cert_chain_pem: &[u8],
        key_pem: &[u8],
        opts: &ProvidedOptions,
        now: SystemTime,
    ) -> Result<Self, ProvidedCaError> {
        let chain = checked_chain(cert_chain_pem, opts, now)?;
        let key = PrivateKey::from_pem(key_pem).map_err(ProvidedCaError::UnreadableKey)?;
        CertificateAuthority::assemble(chain, CaKey::Software(key))
    }

    /// Loads a provided CA whose key is in a PKCS#11 token, named by `selector`: the chain is checked as
    /// [`CertificateAuthority::from_pem`] checks it, and the key in the token is proven to be the
    /// certificate's by a signature.
    pub fn from_pem_in_token(
        cert_chain_pem: &[u8],
        token: &Token,
        selector: KeySelector<'_>,
        opts: &ProvidedOptions,
        now: SystemTime,
    ) -> Result<Self, CaError> {
        let chain = checked_chain(cert_chain_pem, opts, now).map_err(CaError::Persisted)?;
        let key = find_token_key(&chain, token, selector)?;
        CertificateAuthority::assemble(chain, CaKey::Token(Arc::new(key)))
            .map_err(CaError::Persisted)
    }
}

/// A provided CA's chain, read and checked: every certificate a CA with keyCertSign and without
/// keyAgreement, valid at `now`, with a supported key, each signed by the next.
fn checked_chain(
    cert_chain_pem: &[u8],
    opts: &ProvidedOptions,
    now: SystemTime,
) -> Result<Vec<Vec<u8>>, ProvidedCaError> {
    let chain = read_chain(cert_chain_pem)?;
    let parsed = chain
        .iter()
        .enumerate()
        .map(|(i, der)| {
            certs::parse(der).map_err(|reason| ProvidedCaError::UnparsableCertificate {
                position: i + 1,
                reason: reason.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, cert) in parsed.iter().enumerate() {
        check_ca_cert(i + 1, cert, now)?;
    }
    for (i, pair) in parsed.windows(2).enumerate() {
        check_link(i + 1, &pair[0], &pair[1])?;
    }
    let signing = &parsed[0];
    if parsed.len() == 1 && is_self_signed(signing) && !opts.allow_self_signed {
        return Err(ProvidedCaError::SelfSignedNotAllowed {
            subject: certs::subject(signing),
        });
    }
    // A root given last must at least verify its own signature.
    if let Some(last) = parsed
        .last()
        .filter(|c| parsed.len() > 1 && c.subject().as_raw() == c.issuer().as_raw())
    {
        check_link(parsed.len(), last, last)?;
    }
    drop(parsed);
    Ok(chain)
}

fn is_self_signed(cert: &X509Certificate<'_>) -> bool {
    cert.subject().as_raw() == cert.issuer().as_raw() && cert.verify_signature(None).is_ok()
}

/// The per-certificate rules of a provided CA chain (docs/certificates.md).
fn check_ca_cert(
    position: usize,
    cert: &X509Certificate<'_>,
    now: SystemTime,
) -> Result<(), ProvidedCaError> {
    let subject = certs::subject(cert);
    let unparsable = |reason: String| ProvidedCaError::UnparsableCertificate { position, reason };
    let is_ca = cert
        .basic_constraints()
        .map_err(|e| unparsable(e.to_string()))?
        .is_some_and(|bc| bc.value.ca);
    if !is_ca {
        return Err(ProvidedCaError::NotCa { position, subject });
    }
    let usage = cert.key_usage().map_err(|e| unparsable(e.to_string()))?;
    if !usage.as_ref().is_some_and(|ku| ku.value.key_cert_sign()) {
        return Err(ProvidedCaError::MissingKeyCertSign { position, subject });
    }
    if usage.as_ref().is_some_and(|ku| ku.value.key_agreement()) {
        return Err(ProvidedCaError::HasKeyAgreement { position, subject });
    }
    let validity = cert.validity();
    let not_before = certs::system_time(validity.not_before);
    let not_after = certs::system_time(validity.not_after);
    if now > not_after {
        return Err(ProvidedCaError::Expired {
            position,
            subject,
            not_after: certs::rfc3339(not_after),
        });
    }
    if now < not_before {
        return Err(ProvidedCaError::NotYetValid {
            position,
            subject,
            not_before: certs::rfc3339(not_before),
        });
    }
    if let KeyKind::Unsupported(found) = certs::key_kind(cert.public_key()) {
        return Err(ProvidedCaError::UnsupportedKeyType {
            position,
            subject,
            found,
        });
    }
    Ok(())
}

/// Checks that `cert` names `issuer` as its issuer and carries a valid signature from its key.
fn check_link(
    position: usize,
    cert: &X509Certificate<'_>,
    issuer: &X509Certificate<'_>,
) -> Result<(), ProvidedCaError> {
    let broken = |reason: &str| ProvidedCaError::ChainBroken {
        position,
        subject: certs::subject(cert),
        issuer_subject: certs::subject(issuer),
        reason: reason.to_owned(),
    };
    if cert.issuer().as_raw() != issuer.subject().as_raw() {
        return Err(broken(
            "its issuer name is not the next certificate's subject",
        ));
    }
    cert.verify_signature(Some(issuer.public_key()))
        .map_err(|e| broken(&format!("the signature does not verify ({e})")))
}
