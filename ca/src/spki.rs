//! Reading a SubjectPublicKeyInfo, as a certificate signing request or a certificate carries it, into
//! one of the keys meshca issues leaves for; and the public key of a certificate.

use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey as ParsedKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::key::PublicKey;
use meshca_identity::KeyAlgorithm;

/// Why a SubjectPublicKeyInfo is not a key meshca issues for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SpkiError {
    /// It does not parse.
    Malformed(String),
    /// A key of another kind (named).
    UnsupportedKey(String),
}

/// Why a certificate's public key could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertificateKeyError {
    /// Not a DER X.509 certificate (or bytes after it), or its key does not parse.
    #[error("not a DER X.509 certificate with a readable public key: {0}")]
    Malformed(String),
    /// A key of a kind meshca issues no leaves for.
    #[error("the certificate's key is {0}; leaves are issued for ECDSA P-256 or P-384 and RSA 2048, 3072 or 4096 keys")]
    UnsupportedKey(String),
}

/// The public key a DER certificate certifies (its SubjectPublicKeyInfo), read as
/// [`crate::csr_public_key`] reads a request's.
pub fn certificate_public_key(der: &[u8]) -> Result<PublicKey, CertificateKeyError> {
    let (rest, cert) = X509Certificate::from_der(der)
        .map_err(|error| CertificateKeyError::Malformed(error.to_string()))?;
    if !rest.is_empty() {
        return Err(CertificateKeyError::Malformed(format!(
            "{} bytes follow the certificate",
            rest.len()
        )));
    }
    public_key(cert.public_key()).map_err(|e| match e {
        SpkiError::Malformed(m) => CertificateKeyError::Malformed(m),
        SpkiError::UnsupportedKey(k) => CertificateKeyError::UnsupportedKey(k),
    })
}

/// The key `spki` holds, with its algorithm.
pub(crate) fn public_key(spki: &SubjectPublicKeyInfo<'_>) -> Result<PublicKey, SpkiError> {
    let algorithm = key_algorithm(spki)?;
    Ok(PublicKey::from_parts(
        algorithm,
        spki.subject_public_key.data.to_vec(),
    ))
}

/// Which of meshca's key algorithms a SubjectPublicKeyInfo holds.
fn key_algorithm(spki: &SubjectPublicKeyInfo<'_>) -> Result<KeyAlgorithm, SpkiError> {
    let oid = &spki.algorithm.algorithm;
    if *oid == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        return match curve {
            Some(curve) if curve == OID_EC_P256 => Ok(KeyAlgorithm::EcdsaP256),
            Some(curve) if curve == OID_NIST_EC_P384 => Ok(KeyAlgorithm::EcdsaP384),
            Some(curve) => Err(SpkiError::UnsupportedKey(format!("ECDSA on curve {curve}"))),
            None => Err(SpkiError::UnsupportedKey(
                "ECDSA without a named curve".to_owned(),
            )),
        };
    }
    if *oid == OID_PKCS1_RSAENCRYPTION {
        let bits = match spki.parsed() {
            Ok(ParsedKey::RSA(rsa)) => modulus_bits(rsa.modulus),
            _ => return Err(SpkiError::Malformed("an unreadable RSA key".to_owned())),
        };
        return match bits {
            2048 => Ok(KeyAlgorithm::Rsa2048),
            3072 => Ok(KeyAlgorithm::Rsa3072),
            4096 => Ok(KeyAlgorithm::Rsa4096),
            other => Err(SpkiError::UnsupportedKey(format!("RSA with {other} bits"))),
        };
    }
    Err(SpkiError::UnsupportedKey(format!("of algorithm {oid}")))
}

/// The size in bits of a big-endian unsigned integer (leading zero bytes and bits not counted).
fn modulus_bits(modulus: &[u8]) -> usize {
    let significant = modulus
        .iter()
        .position(|b| *b != 0)
        .map_or(&[][..], |first| &modulus[first..]);
    match significant.first() {
        Some(top) => significant.len() * 8 - top.leading_zeros() as usize,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_900_000_000)
    }

    fn ca(key_algorithm: KeyAlgorithm) -> crate::CertificateAuthority {
        let params = crate::CaParams {
            trust_domain: "td".parse().expect("a trust domain"),
            key_algorithm,
            validity: Duration::from_secs(86_400),
            name: "default/ca-1".into(),
        };
        crate::CertificateAuthority::generate(&params, now()).expect("a CA")
    }

    #[test]
    fn modulus_bits_count_from_the_top_set_bit() {
        assert_eq!(modulus_bits(&[0x00, 0x80, 0x00]), 16);
        assert_eq!(modulus_bits(&[0x01, 0x00]), 9);
        assert_eq!(modulus_bits(&[0x00, 0x00]), 0);
        assert_eq!(modulus_bits(&[]), 0);
    }

    #[test]
    fn a_certificate_yields_the_key_it_certifies() {
        for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Rsa2048] {
            let now = now();
            let ca = ca(algorithm);
            let (_, public) = crate::PrivateKey::generate(KeyAlgorithm::EcdsaP384).expect("a key");
            let request = crate::SvidRequest {
                spiffe_id: "spiffe://td/web".parse().expect("an id"),
                key_algorithm: KeyAlgorithm::EcdsaP384,
                lifetime: std::time::Duration::from_secs(3600),
            };
            let leaf = ca.issue_for_key(&request, &public, now).expect("issued");
            assert_eq!(
                certificate_public_key(&leaf.chain_der[0]).expect("read"),
                public
            );
            // The CA's own certificate holds the CA's key, of its algorithm.
            assert_eq!(
                certificate_public_key(ca.cert_der())
                    .expect("read")
                    .algorithm(),
                algorithm
            );
        }
    }

    #[test]
    fn garbage_and_trailing_bytes_are_refused() {
        assert!(matches!(
            certificate_public_key(b"not a certificate"),
            Err(CertificateKeyError::Malformed(_))
        ));
        let ca = ca(KeyAlgorithm::EcdsaP256);
        let mut der = ca.cert_der().to_vec();
        der.push(0);
        assert!(matches!(
            certificate_public_key(&der),
            Err(CertificateKeyError::Malformed(_))
        ));
    }
}
