//! Provided CAs: a certificate chain and key from the operator, checked before use (docs/certificates.md).

use std::time::SystemTime;

use x509_parser::certificate::X509Certificate;

use std::sync::Arc;

use meshca_hsm::{KeySelector, Token};

use crate::authority::{find_token_key, CaError, CaKey, CertificateAuthority};
use crate::certs::{self, KeyKind};
use crate::key::PrivateKey;
use crate::material::{read_chain, ProvidedCaError};

/// Policy for a provided CA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProvidedOptions {
    /// Accept a self-signed signing CA (MeshIdentity `insecureAllowSelfSigned`).
    pub allow_self_signed: bool,
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
