//! Checks run on every SVID before it is published, and the independent rule checker the tests use.

use std::time::{SystemTime, UNIX_EPOCH};

use rustls_pki_types::{CertificateDer, TrustAnchor, UnixTime};
use webpki::{EndEntityCert, KeyUsage};
use x509_parser::certificate::X509Certificate;
use x509_parser::x509::X509Version;

use crate::certs::{self, KeyKind};
use meshca_identity::SpiffeId;

/// Why an SVID must not be published.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The chain is empty.
    #[error("the SVID chain is empty")]
    EmptyChain,
    /// A trust anchor is not a usable certificate.
    #[error("trust anchor {position} is not usable: {reason}")]
    BadAnchor {
        /// Its position in the bundle, from 1.
        position: usize,
        /// What is wrong.
        reason: String,
    },
    /// The leaf does not validate to the anchors (webpki) for the given usage.
    #[error("the SVID does not validate to the trust bundle for {usage}: {reason}")]
    Chain {
        /// `clientAuth` or `serverAuth`.
        usage: &'static str,
        /// webpki's complaint.
        reason: String,
    },
    /// The leaf's SPIFFE ID is not the expected one.
    #[error("the SVID carries {found:?}, expected {expected}")]
    WrongId {
        /// The expected ID.
        expected: SpiffeId,
        /// The URI SANs found.
        found: Vec<String>,
    },
    /// The leaf outlives the certificate that issued it.
    #[error("the SVID's NotAfter {leaf} is later than its issuer's {issuer}")]
    OutlivesIssuer {
        /// The leaf's NotAfter, RFC 3339.
        leaf: String,
        /// The issuer's NotAfter, RFC 3339.
        issuer: String,
    },
    /// The leaf breaks SVID rules.
    #[error("the SVID breaks the X.509-SVID rules: {}", .0.join("; "))]
    Rules(Vec<String>),
}

/// Trust anchors read once, to verify many SVIDs against them: each in webpki's form, with the subject
/// and NotAfter the "within its issuer" check reads.
#[derive(Debug)]
pub struct Anchors {
    webpki: Vec<TrustAnchor<'static>>,
    /// (raw subject, NotAfter in Unix seconds) of each anchor.
    issuers: Vec<(Vec<u8>, i64)>,
}

impl Anchors {
    /// Reads `anchors_der`; an anchor webpki or x509-parser cannot use is an error naming its position.
    pub fn parse(anchors_der: &[Vec<u8>]) -> Result<Anchors, VerifyError> {
        let mut webpki = Vec::with_capacity(anchors_der.len());
        let mut issuers = Vec::with_capacity(anchors_der.len());
        for (i, der) in anchors_der.iter().enumerate() {
            let bad = |reason: String| VerifyError::BadAnchor {
                position: i + 1,
                reason,
            };
            let cert = CertificateDer::from(der.as_slice());
            let anchor = webpki::anchor_from_trusted_cert(&cert).map_err(|e| bad(e.to_string()))?;
            webpki.push(anchor.to_owned());
            let parsed = certs::parse(der).map_err(|e| bad(e.to_string()))?;
            issuers.push((
                parsed.subject().as_raw().to_vec(),
                parsed.validity().not_after.timestamp(),
            ));
        }
        Ok(Anchors { webpki, issuers })
    }
}

/// Verifies an SVID chain (leaf first, then intermediates) before it is published: webpki path
/// validation to `anchors_der` at `now` for both clientAuth and serverAuth, exactly one URI SAN equal to
/// `expected`, NotAfter within the issuer's, and every leaf rule of [`check_svid_rules`].
pub fn verify_svid(
    chain_der: &[Vec<u8>],
    anchors_der: &[Vec<u8>],
    expected: &SpiffeId,
    now: SystemTime,
) -> Result<(), VerifyError> {
    verify_with(chain_der, &Anchors::parse(anchors_der)?, expected, now)
}

/// What the check of every SVID compares a leaf with: its issuing CA's anchors, and the facts of the
/// CA's signing certificate and chain, read once per CA.
#[derive(Debug)]
pub struct IssuerFacts {
    /// The trust anchors, for full chain verification.
    pub anchors: Anchors,
    /// The signing certificate's raw subject (every leaf's issuer).
    subject: Vec<u8>,
    /// Its subjectKeyIdentifier, if it has one (every leaf's authorityKeyIdentifier).
    key_id: Option<Vec<u8>>,
    /// Its NotBefore and NotAfter, Unix seconds.
    validity: (i64, i64),
    /// What follows the leaf in every chain it issues.
    chain_after_leaf: Vec<Vec<u8>>,
}

impl IssuerFacts {
    /// Reads the facts of a CA: its signing certificate, what follows a leaf, and its anchors.
    pub fn read(
        signing_der: &[u8],
        chain_after_leaf: &[Vec<u8>],
        anchors_der: &[Vec<u8>],
    ) -> Result<IssuerFacts, VerifyError> {
        let anchors = Anchors::parse(anchors_der)?;
        let bad = |reason: String| VerifyError::BadAnchor {
            position: 0,
            reason: format!("the signing certificate: {reason}"),
        };
        let cert = certs::parse(signing_der).map_err(|e| bad(e.to_string()))?;
        let key_id = cert
            .iter_extensions()
            .find_map(|ext| match ext.parsed_extension() {
                x509_parser::extensions::ParsedExtension::SubjectKeyIdentifier(id) => {
                    Some(id.0.to_vec())
                }
                _ => None,
            });
        let validity = cert.validity();
        Ok(IssuerFacts {
            anchors,
            subject: cert.subject().as_raw().to_vec(),
            key_id,
            validity: (
                validity.not_before.timestamp(),
                validity.not_after.timestamp(),
            ),
            chain_after_leaf: chain_after_leaf.to_vec(),
        })
    }
}

/// The leaf of an SVID, parsed once, held to every SVID rule and carrying exactly `expected`.
fn checked_leaf<'a>(
    leaf_der: &'a [u8],
    expected: &SpiffeId,
) -> Result<X509Certificate<'a>, VerifyError> {
    let leaf = certs::parse(leaf_der)
        .map_err(|e| VerifyError::Rules(vec![format!("the certificate does not parse: {e}")]))?;
    check_rules(&leaf).map_err(VerifyError::Rules)?;
    let uris = certs::uri_sans(&leaf).map_err(|e| VerifyError::Rules(vec![e.to_string()]))?;
    if uris.as_slice() != [expected.as_str()] {
        return Err(VerifyError::WrongId {
            expected: expected.clone(),
            found: uris.iter().map(|u| (*u).to_owned()).collect(),
        });
    }
    Ok(leaf)
}

/// The check of an SVID its CA just issued, everything but the signature: the leaf parsed once and held
/// to every SVID rule and the expected SPIFFE ID, issued by the CA (issuer name,
/// authorityKeyIdentifier), within the CA's validity and valid at `now`, followed by exactly the CA's
/// chain. The signature is ring's, made a moment ago with the CA's key, whose signatures
/// [`crate::CertificateAuthority::verify_issued`] verifies in full on the CA's first SVID and one in
/// [`crate::FULL_CHECK_EVERY`] after it.
pub fn verify_structure(
    chain_der: &[Vec<u8>],
    facts: &IssuerFacts,
    expected: &SpiffeId,
    now: SystemTime,
) -> Result<(), VerifyError> {
    let (leaf_der, rest) = chain_der.split_first().ok_or(VerifyError::EmptyChain)?;
    let leaf = checked_leaf(leaf_der, expected)?;
    let not_issued = |reason: &str| VerifyError::Chain {
        usage: "clientAuth",
        reason: reason.to_owned(),
    };
    if leaf.issuer().as_raw() != facts.subject.as_slice() {
        return Err(not_issued("the issuer name is not the CA's subject"));
    }
    if let Some(key_id) = &facts.key_id {
        let aki = leaf
            .iter_extensions()
            .find_map(|ext| match ext.parsed_extension() {
                x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(aki) => {
                    aki.key_identifier.as_ref().map(|k| k.0)
                }
                _ => None,
            });
        if aki != Some(key_id.as_slice()) {
            return Err(not_issued(
                "the authorityKeyIdentifier is not the CA's subjectKeyIdentifier",
            ));
        }
    }
    if rest != facts.chain_after_leaf.as_slice() {
        return Err(not_issued("the chain after the leaf is not the CA's"));
    }
    let validity = leaf.validity();
    let now_secs = now
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if now_secs < validity.not_before.timestamp() || now_secs > validity.not_after.timestamp() {
        return Err(not_issued("the certificate is not valid now"));
    }
    if validity.not_before.timestamp() < facts.validity.0 {
        return Err(not_issued("the certificate starts before its CA"));
    }
    if validity.not_after.timestamp() > facts.validity.1 {
        return Err(VerifyError::OutlivesIssuer {
            leaf: certs::rfc3339(certs::system_time(validity.not_after)),
            issuer: rfc3339_unix(facts.validity.1),
        });
    }
    Ok(())
}

/// [`verify_svid`] against anchors read once. The leaf is parsed once and its chain verified once: the
/// leaf rules require both serverAuth and clientAuth in its extendedKeyUsage, so one webpki pass (for
/// clientAuth) proves the signatures; a second pass, for serverAuth, runs only when intermediates could
/// restrict usages on the way.
pub fn verify_with(
    chain_der: &[Vec<u8>],
    anchors: &Anchors,
    expected: &SpiffeId,
    now: SystemTime,
) -> Result<(), VerifyError> {
    let (leaf_der, rest) = chain_der.split_first().ok_or(VerifyError::EmptyChain)?;
    let leaf = checked_leaf(leaf_der, expected)?;

    let intermediates: Vec<CertificateDer<'_>> = rest
        .iter()
        .map(|d| CertificateDer::from(d.as_slice()))
        .collect();
    let leaf_cert = CertificateDer::from(leaf_der.as_slice());
    let chain_err = |usage, e: webpki::Error| VerifyError::Chain {
        usage,
        reason: e.to_string(),
    };
    let end_entity = EndEntityCert::try_from(&leaf_cert).map_err(|e| chain_err("clientAuth", e))?;
    let time = UnixTime::since_unix_epoch(now.duration_since(UNIX_EPOCH).unwrap_or_default());
    let usages: &[(&str, KeyUsage)] = if intermediates.is_empty() {
        &[("clientAuth", KeyUsage::client_auth())]
    } else {
        &[
            ("clientAuth", KeyUsage::client_auth()),
            ("serverAuth", KeyUsage::server_auth()),
        ]
    };
    for (name, usage) in usages {
        end_entity
            .verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                &anchors.webpki,
                &intermediates,
                time,
                *usage,
                None,
                None,
            )
            .map_err(|e| chain_err(name, e))?;
    }
    check_within_issuer(&leaf, rest.first().map(Vec::as_slice), &anchors.issuers)
}

/// The leaf's NotAfter must not be later than its issuer's: the first intermediate, or the anchor whose
/// subject is the leaf's issuer.
fn check_within_issuer(
    leaf: &X509Certificate<'_>,
    intermediate: Option<&[u8]>,
    anchors: &[(Vec<u8>, i64)],
) -> Result<(), VerifyError> {
    let parsed_intermediate;
    let candidates: Vec<(&[u8], i64)> = match intermediate {
        Some(der) => {
            parsed_intermediate = certs::parse(der).ok();
            parsed_intermediate
                .iter()
                .map(|c| (c.subject().as_raw(), c.validity().not_after.timestamp()))
                .collect()
        }
        None => anchors
            .iter()
            .map(|(subject, end)| (subject.as_slice(), *end))
            .collect(),
    };
    let leaf_end = leaf.validity().not_after.timestamp();
    for (subject, issuer_end) in candidates {
        if subject != leaf.issuer().as_raw() {
            continue;
        }
        if leaf_end > issuer_end {
            return Err(VerifyError::OutlivesIssuer {
                leaf: certs::rfc3339(certs::system_time(leaf.validity().not_after)),
                issuer: rfc3339_unix(issuer_end),
            });
        }
    }
    Ok(())
}

/// RFC 3339 of a Unix time in seconds.
fn rfc3339_unix(secs: i64) -> String {
    let t = u64::try_from(secs)
        .map(|s| UNIX_EPOCH + std::time::Duration::from_secs(s))
        .unwrap_or(UNIX_EPOCH);
    certs::rfc3339(t)
}

/// Checks every X.509-SVID leaf rule (docs/certificates.md) with x509-parser, independently of how the leaf was
/// built. Returns every broken rule, not only the first.
pub fn check_svid_rules(leaf_der: &[u8]) -> Result<(), Vec<String>> {
    let cert =
        certs::parse(leaf_der).map_err(|e| vec![format!("the certificate does not parse: {e}")])?;
    check_rules(&cert)
}

/// The rules of [`check_svid_rules`] on a parsed leaf.
fn check_rules(cert: &X509Certificate<'_>) -> Result<(), Vec<String>> {
    let mut broken = Vec::new();
    if cert.version() != X509Version::V3 {
        broken.push("it is not an X.509 v3 certificate".to_owned());
    }
    check_san(cert, &mut broken);
    check_basic_constraints(cert, &mut broken);
    let is_rsa = matches!(
        certs::key_kind(cert.public_key()),
        KeyKind::Supported(alg) if alg.rsa_bits().is_some()
    );
    if let KeyKind::Unsupported(found) = certs::key_kind(cert.public_key()) {
        broken.push(format!("its key type {found} is not supported"));
    }
    check_key_usage(cert, is_rsa, &mut broken);
    match cert.extended_key_usage() {
        Ok(Some(eku)) if eku.value.server_auth && eku.value.client_auth => {}
        Ok(_) => broken.push("extendedKeyUsage must include serverAuth and clientAuth".to_owned()),
        Err(e) => broken.push(format!("extendedKeyUsage is unreadable: {e}")),
    }
    check_serial(cert.raw_serial(), &mut broken);
    let has_aki = cert.iter_extensions().any(|ext| {
        matches!(
            ext.parsed_extension(),
            x509_parser::extensions::ParsedExtension::AuthorityKeyIdentifier(_)
        )
    });
    if !has_aki {
        broken.push("authorityKeyIdentifier is missing".to_owned());
    }
    let validity = cert.validity();
    if validity.not_before.timestamp() >= validity.not_after.timestamp() {
        broken.push("NotBefore is not before NotAfter".to_owned());
    }
    if broken.is_empty() {
        Ok(())
    } else {
        Err(broken)
    }
}

fn check_san(cert: &X509Certificate<'_>, broken: &mut Vec<String>) {
    let san = match cert.subject_alternative_name() {
        Ok(Some(san)) => san,
        Ok(None) => {
            broken.push("subjectAltName is missing (it must hold the SPIFFE ID)".to_owned());
            return;
        }
        Err(e) => {
            broken.push(format!("subjectAltName is unreadable: {e}"));
            return;
        }
    };
    if cert.subject().iter().next().is_none() && !san.critical {
        broken.push("the subject is empty, so subjectAltName must be critical".to_owned());
    }
    let uris = certs::uri_sans(cert).unwrap_or_default();
    match uris.as_slice() {
        [uri] => match SpiffeId::parse(uri) {
            Ok(id) if id.is_root() => {
                broken.push(format!("the URI SAN {uri} is a trust domain root ID"))
            }
            Ok(_) => {}
            Err(e) => broken.push(format!("the URI SAN {uri:?} is not a valid SPIFFE ID: {e}")),
        },
        _ => broken.push(format!(
            "there must be exactly one URI SAN, found {}",
            uris.len()
        )),
    }
}

fn check_basic_constraints(cert: &X509Certificate<'_>, broken: &mut Vec<String>) {
    match cert.basic_constraints() {
        Ok(Some(bc)) if !bc.value.ca && bc.value.path_len_constraint.is_none() => {}
        Ok(Some(bc)) if bc.value.ca => broken.push("basicConstraints cA must be false".to_owned()),
        Ok(Some(_)) => broken.push("basicConstraints must not set pathLenConstraint".to_owned()),
        Ok(None) => {
            broken.push("basicConstraints is missing (cA=false must be explicit)".to_owned())
        }
        Err(e) => broken.push(format!("basicConstraints is unreadable: {e}")),
    }
}

fn check_key_usage(cert: &X509Certificate<'_>, is_rsa: bool, broken: &mut Vec<String>) {
    let ku = match cert.key_usage() {
        Ok(Some(ku)) => ku,
        Ok(None) => {
            broken.push("keyUsage is missing".to_owned());
            return;
        }
        Err(e) => {
            broken.push(format!("keyUsage is unreadable: {e}"));
            return;
        }
    };
    if !ku.critical {
        broken.push("keyUsage must be critical".to_owned());
    }
    let v = ku.value;
    if !v.digital_signature() {
        broken.push("keyUsage must include digitalSignature".to_owned());
    }
    if v.key_cert_sign() || v.crl_sign() {
        broken.push("keyUsage must not include keyCertSign or cRLSign".to_owned());
    }
    if v.key_encipherment() && !is_rsa {
        broken.push("keyUsage keyEncipherment is only allowed for RSA keys".to_owned());
    }
    if v.non_repudiation()
        || v.data_encipherment()
        || v.key_agreement()
        || v.encipher_only()
        || v.decipher_only()
    {
        broken.push(format!("keyUsage has bits an SVID must not have ({v})"));
    }
}

fn check_serial(raw: &[u8], broken: &mut Vec<String>) {
    let Some(&first) = raw.first() else {
        broken.push("the serial number is empty".to_owned());
        return;
    };
    if first & 0x80 != 0 {
        broken.push("the serial number is negative".to_owned());
        return;
    }
    let significant: &[u8] = match raw.iter().position(|&b| b != 0) {
        Some(i) => &raw[i..],
        None => &[],
    };
    let bits = significant.first().map_or(0, |b| {
        (significant.len() - 1) * 8 + (8 - b.leading_zeros() as usize)
    });
    if bits < 64 {
        broken.push(format!(
            "the serial number has {bits} bits; at least 64 random bits are required"
        ));
    }
}

/// Whether `key` is the private key of the certificate `cert_der` (its subject public key).
pub fn key_matches(key: &crate::PrivateKey, cert_der: &[u8]) -> bool {
    let Ok(cert) = certs::parse(cert_der) else {
        return false;
    };
    let Ok(public) = key.public_key() else {
        return false;
    };
    cert.public_key().subject_public_key.data.as_ref() == public.raw()
}

#[cfg(test)]
mod tests {
    use super::check_serial;

    #[test]
    fn serial_rules() {
        let check = |raw: &[u8]| {
            let mut broken = Vec::new();
            check_serial(raw, &mut broken);
            broken
        };
        assert!(check(&[0x40; 16]).is_empty());
        assert!(
            check(&[0x00, 0x80, 0, 0, 0, 0, 0, 0, 0]).is_empty(),
            "64 bits with a sign byte"
        );
        assert!(check(&[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff])[0].contains("63 bits"));
        assert!(check(&[0x80; 16])[0].contains("negative"));
        assert!(check(&[])[0].contains("empty"));
        assert!(check(&[0; 12])[0].contains("0 bits"));
    }
}
