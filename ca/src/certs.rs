//! Certificate helpers shared by loading, issuance, verification and inspection.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_identity::KeyAlgorithm;
use ring::rand::{SecureRandom, SystemRandom};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::time::ASN1Time;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::der;

/// Why a certificate helper failed; its text is what callers put in their own errors.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertsError {
    #[error("trailing bytes after the certificate")]
    TrailingBytes,
    #[error(transparent)]
    Parse(#[from] x509_parser::nom::Err<x509_parser::error::X509Error>),
    #[error(transparent)]
    Extension(#[from] x509_parser::error::X509Error),
    #[error(transparent)]
    Pem(#[from] ::pem::PemError),
    #[error("the system random generator failed")]
    Random,
}

/// Parses one DER certificate, refusing trailing bytes.
pub(crate) fn parse(der: &[u8]) -> Result<X509Certificate<'_>, CertsError> {
    match x509_parser::parse_x509_certificate(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(CertsError::TrailingBytes),
        Err(e) => Err(e.into()),
    }
}

/// Splits PEM data into the DER of its `CERTIFICATE` blocks; other block types are returned by label.
pub(crate) fn split_pem(data: &[u8]) -> Result<(Vec<Vec<u8>>, Vec<String>), CertsError> {
    let blocks = ::pem::parse_many(data)?;
    let mut certs = Vec::new();
    let mut others = Vec::new();
    for block in blocks {
        if block.tag() == "CERTIFICATE" {
            certs.push(block.into_contents());
        } else {
            others.push(block.tag().to_owned());
        }
    }
    Ok((certs, others))
}

/// A key type as a certificate carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum KeyKind {
    Supported(KeyAlgorithm),
    Unsupported(String),
}

/// Classifies a SubjectPublicKeyInfo: ECDSA P-256/P-384 and RSA 2048/3072/4096 are supported.
pub(crate) fn key_kind(spki: &SubjectPublicKeyInfo<'_>) -> KeyKind {
    let oid = spki.algorithm.algorithm.as_bytes();
    if oid == der::OID_EC_PUBLIC_KEY {
        let curve = spki.algorithm.parameters.as_ref().map(|p| p.data);
        return match curve {
            Some(c) if c == der::OID_P256 => KeyKind::Supported(KeyAlgorithm::EcdsaP256),
            Some(c) if c == der::OID_P384 => KeyKind::Supported(KeyAlgorithm::EcdsaP384),
            Some(c) => KeyKind::Unsupported(format!("ECDSA {}", der::oid_name(c))),
            None => KeyKind::Unsupported("ECDSA without a named curve".into()),
        };
    }
    if oid == der::OID_RSA {
        let bits = match spki.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(rsa)) => rsa.key_size(),
            _ => return KeyKind::Unsupported("RSA (unreadable key)".into()),
        };
        return match u32::try_from(bits)
            .ok()
            .and_then(KeyAlgorithm::rsa_from_bits)
        {
            Some(alg) => KeyKind::Supported(alg),
            None => KeyKind::Unsupported(format!("RSA {bits}")),
        };
    }
    KeyKind::Unsupported(der::oid_name(oid))
}

/// A human description of a key: `ECDSA P-256`, `RSA 2048`, `Ed25519`.
pub(crate) fn describe_key(spki: &SubjectPublicKeyInfo<'_>) -> String {
    match key_kind(spki) {
        KeyKind::Supported(alg) => describe_algorithm(alg).to_owned(),
        KeyKind::Unsupported(s) => s,
    }
}

/// A human description of a supported key algorithm.
pub(crate) fn describe_algorithm(alg: KeyAlgorithm) -> &'static str {
    match alg {
        KeyAlgorithm::EcdsaP256 => "ECDSA P-256",
        KeyAlgorithm::EcdsaP384 => "ECDSA P-384",
        KeyAlgorithm::Rsa2048 => "RSA 2048",
        KeyAlgorithm::Rsa3072 => "RSA 3072",
        KeyAlgorithm::Rsa4096 => "RSA 4096",
    }
}

/// The URI SANs of a certificate (an unreadable SAN extension yields an error).
pub(crate) fn uri_sans<'a>(cert: &'a X509Certificate<'_>) -> Result<Vec<&'a str>, CertsError> {
    let Some(san) = cert.subject_alternative_name()? else {
        return Ok(Vec::new());
    };
    Ok(san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(*uri),
            _ => None,
        })
        .collect())
}

/// An ASN.1 time as a `SystemTime` (times before 1970 clamp to the epoch).
pub(crate) fn system_time(t: ASN1Time) -> SystemTime {
    let secs = u64::try_from(t.timestamp()).unwrap_or(0);
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// A time truncated to whole seconds (what X.509 can hold), as rcgen wants it and as a `SystemTime`.
pub(crate) fn whole_seconds(t: SystemTime) -> Option<(time::OffsetDateTime, SystemTime)> {
    let secs = t.duration_since(UNIX_EPOCH).ok()?.as_secs();
    let odt = time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).ok()?).ok()?;
    Some((odt, UNIX_EPOCH + Duration::from_secs(secs)))
}

/// RFC 3339 text of a time.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    time::OffsetDateTime::from(t)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{t:?}"))
}

/// A random positive serial number of 16 bytes with the top bit clear and the next set, so it always
/// encodes in 16 bytes and carries 126 random bits.
pub(crate) fn random_serial() -> Result<[u8; 16], CertsError> {
    let mut serial = [0u8; 16];
    SystemRandom::new()
        .fill(&mut serial)
        .map_err(|_| CertsError::Random)?;
    serial[0] = (serial[0] & 0x7f) | 0x40;
    Ok(serial)
}

/// Lowercase hex SHA-256 of some bytes.
pub(crate) fn sha256_hex(data: &[u8]) -> String {
    hex::encode(ring::digest::digest(&ring::digest::SHA256, data))
}

/// A certificate's subject for messages, e.g. `CN=meshca default/ca-1 1a2b, O=meshca`.
pub(crate) fn subject(cert: &X509Certificate<'_>) -> String {
    let s = cert.subject().to_string();
    if s.is_empty() {
        "(empty subject)".into()
    } else {
        s
    }
}
