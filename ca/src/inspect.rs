//! `meshca inspect FILE`: decode a PEM certificate, chain or bundle.

use crate::certs;

/// What `meshca inspect` shows about one certificate.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CertInfo {
    /// Its `spiffe://` URI SANs.
    pub spiffe_ids: Vec<String>,
    /// Its subject, RFC 4514 style (empty for most SVIDs).
    pub subject: String,
    /// Its issuer.
    pub issuer: String,
    /// Its serial number, lowercase hex.
    pub serial: String,
    /// NotBefore, RFC 3339.
    pub not_before: String,
    /// NotAfter, RFC 3339.
    pub not_after: String,
    /// Its key: `ECDSA P-256`, `ECDSA P-384`, `RSA 2048`, ...
    pub key: String,
    /// Whether basicConstraints says cA=true.
    pub is_ca: bool,
    /// Lowercase hex SHA-256 of the DER.
    pub fingerprint_sha256: String,
}

/// Why a file could not be inspected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InspectError {
    /// The data is not readable PEM.
    #[error("not readable PEM: {0}")]
    Pem(String),
    /// The PEM holds no certificate.
    #[error("the file holds no certificate (no \"BEGIN CERTIFICATE\" block)")]
    NoCertificate,
    /// A certificate does not parse.
    #[error("certificate {position} cannot be parsed: {reason}")]
    Unparsable {
        /// Its position in the file, from 1.
        position: usize,
        /// The parser's complaint.
        reason: String,
    },
}

/// Decodes every `CERTIFICATE` block of PEM data, in order. Other blocks (keys) are skipped, never shown.
pub fn inspect_pem(data: &[u8]) -> Result<Vec<CertInfo>, InspectError> {
    let (ders, _) = certs::split_pem(data).map_err(|e| InspectError::Pem(e.to_string()))?;
    if ders.is_empty() {
        return Err(InspectError::NoCertificate);
    }
    ders.iter()
        .enumerate()
        .map(|(i, der)| {
            let unparsable = |reason: String| InspectError::Unparsable {
                position: i + 1,
                reason,
            };
            let cert = certs::parse(der).map_err(|e| unparsable(e.to_string()))?;
            let spiffe_ids = certs::uri_sans(&cert)
                .map_err(|e| unparsable(e.to_string()))?
                .into_iter()
                .filter(|u| u.starts_with("spiffe://"))
                .map(str::to_owned)
                .collect();
            let validity = cert.validity();
            Ok(CertInfo {
                spiffe_ids,
                subject: cert.subject().to_string(),
                issuer: cert.issuer().to_string(),
                serial: hex::encode(cert.raw_serial()),
                not_before: certs::rfc3339(certs::system_time(validity.not_before)),
                not_after: certs::rfc3339(certs::system_time(validity.not_after)),
                key: certs::describe_key(cert.public_key()),
                is_ca: cert.is_ca(),
                fingerprint_sha256: certs::sha256_hex(der),
            })
        })
        .collect()
}
