//! Trust anchors a mesh accepts without running their CA: the certificates of MeshTrusts.

use crate::{certs, pem_out};

/// A CA certificate trusted as it is (no key): one certificate of a MeshTrust.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustAnchor {
    /// Lowercase hex SHA-256 of its DER: the scheme of [`crate::CertificateAuthority::id`], so a CA and
    /// its own certificate as an anchor share an id.
    pub id: String,
    /// Its subject, for operators.
    pub subject: String,
    /// The certificate as one PEM block, encoded as [`crate::CertificateAuthority::bundle_pems`] encodes
    /// (equal certificates give equal text).
    pub pem: String,
}

/// Why PEM text does not hold trust anchors. Positions count CERTIFICATE blocks from 1.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnchorError {
    /// The text is not PEM.
    #[error("not valid PEM: {0}")]
    Pem(String),
    /// A block is not a certificate (a private key pasted by mistake would be published to every proxy).
    #[error("holds a block labelled {label}: only CERTIFICATE blocks are accepted, since everything here is published to every proxy of the mesh")]
    NotACertificate {
        /// The block's label, e.g. `PRIVATE KEY`.
        label: String,
    },
    /// There is no certificate at all.
    #[error("holds no CERTIFICATE block")]
    NoCertificate,
    /// A certificate does not decode as X.509.
    #[error("certificate {position} is not a valid X.509 certificate: {reason}")]
    Unparsable {
        /// Its position.
        position: usize,
        /// The parser's complaint.
        reason: String,
    },
    /// A certificate is not a CA (basicConstraints cA is not true): peers would never accept a chain to it.
    #[error("certificate {position} ({subject}) is not a CA: its basicConstraints do not say cA=true; a trust bundle holds CA certificates only")]
    NotCa {
        /// Its position.
        position: usize,
        /// Its subject.
        subject: String,
    },
}

impl TrustAnchor {
    /// Reads every certificate of PEM text as a trust anchor, in order. Refuses text with any block other
    /// than CERTIFICATE, without any certificate, or with a certificate that does not decode or is not a CA.
    pub fn parse_pem(text: &[u8]) -> Result<Vec<TrustAnchor>, AnchorError> {
        let (ders, others) = certs::split_pem(text).map_err(|e| AnchorError::Pem(e.to_string()))?;
        if let Some(label) = others.into_iter().next() {
            return Err(AnchorError::NotACertificate { label });
        }
        if ders.is_empty() {
            return Err(AnchorError::NoCertificate);
        }
        ders.iter()
            .enumerate()
            .map(|(i, der)| TrustAnchor::from_der(i + 1, der))
            .collect()
    }

    /// Reads one DER certificate as a trust anchor (a federated bundle's X.509 authority): refused
    /// when it does not decode or is not a CA.
    pub fn of_der(der: &[u8]) -> Result<TrustAnchor, AnchorError> {
        TrustAnchor::from_der(1, der)
    }

    fn from_der(position: usize, der: &[u8]) -> Result<TrustAnchor, AnchorError> {
        let cert = certs::parse(der).map_err(|reason| AnchorError::Unparsable {
            position,
            reason: reason.to_string(),
        })?;
        let subject = certs::subject(&cert);
        let is_ca = cert
            .basic_constraints()
            .map_err(|e| AnchorError::Unparsable {
                position,
                reason: e.to_string(),
            })?
            .is_some_and(|bc| bc.value.ca);
        if !is_ca {
            return Err(AnchorError::NotCa { position, subject });
        }
        Ok(TrustAnchor {
            id: certs::sha256_hex(der),
            subject,
            pem: pem_out::cert(der),
        })
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};

    use super::*;

    fn cert(ca: bool) -> rcgen::Certificate {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = if ca {
            IsCa::Ca(BasicConstraints::Unconstrained)
        } else {
            IsCa::ExplicitNoCa
        };
        let key = KeyPair::generate().expect("keygen");
        params.self_signed(&key).expect("self-signed")
    }

    #[test]
    fn ca_certificates_are_anchors_with_the_ca_id_scheme() {
        let (a, b) = (cert(true), cert(true));
        // CRLF line ends and surrounding text do not change what is published.
        let text = format!("comment\n{}{}", a.pem().replace('\n', "\r\n"), b.pem());
        let anchors = TrustAnchor::parse_pem(text.as_bytes()).expect("two CAs");
        assert_eq!(anchors.len(), 2);
        assert_eq!(anchors[0].id, certs::sha256_hex(a.der()));
        assert_eq!(anchors[0].pem, pem_out::cert(a.der()));
        assert_eq!(anchors[1].pem, pem_out::cert(b.der()));
    }

    #[test]
    fn keys_garbage_and_leaves_are_refused() {
        let key = "-----BEGIN PRIVATE KEY-----\nMIIBAA==\n-----END PRIVATE KEY-----\n";
        let with_key = format!("{}{key}", cert(true).pem());
        assert_eq!(
            TrustAnchor::parse_pem(with_key.as_bytes()),
            Err(AnchorError::NotACertificate {
                label: "PRIVATE KEY".into()
            })
        );
        let garbage = "-----BEGIN CERTIFICATE-----\nMIIBAA==\n-----END CERTIFICATE-----\n";
        assert!(matches!(
            TrustAnchor::parse_pem(garbage.as_bytes()),
            Err(AnchorError::Unparsable { position: 1, .. })
        ));
        let leaf = format!("{}{}", cert(true).pem(), cert(false).pem());
        let err = TrustAnchor::parse_pem(leaf.as_bytes()).expect_err("a leaf is no anchor");
        assert!(
            matches!(err, AnchorError::NotCa { position: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("cA=true"), "{err}");
        assert_eq!(
            TrustAnchor::parse_pem(b"no pem here"),
            Err(AnchorError::NoCertificate)
        );
    }
}
