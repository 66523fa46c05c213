//! Issuing X.509-SVIDs (docs/certificates.md, leaf rules).

use std::fmt;
use std::time::{Duration, SystemTime};

use meshca_identity::KeyAlgorithm;
use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose, SanType,
    SerialNumber,
};

use crate::authority::{CertificateAuthority, BACKDATE};
use crate::certs;
use crate::key::{GeneratedKey, KeyError, PrivateKey, PublicKey};
use crate::pem_out;
use meshca_identity::{SpiffeId, TrustDomain};

/// What to issue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SvidRequest {
    /// The workload's SPIFFE ID (not a root ID).
    pub spiffe_id: SpiffeId,
    /// The algorithm of the new leaf key.
    pub key_algorithm: KeyAlgorithm,
    /// How long the SVID should live; capped at the CA's NotAfter.
    pub lifetime: Duration,
}

/// An issued SVID with its fresh private key.
pub struct Svid {
    /// The SPIFFE ID in its URI SAN.
    pub spiffe_id: SpiffeId,
    /// The leaf followed by any intermediates, never the root (what SDS sends).
    pub chain_pem: String,
    /// The same chain as DER.
    pub chain_der: Vec<Vec<u8>>,
    /// The leaf's private key.
    pub key: PrivateKey,
    /// NotBefore (issuance time minus 10 s).
    pub not_before: SystemTime,
    /// NotAfter.
    pub not_after: SystemTime,
    /// The serial number, lowercase hex.
    pub serial: String,
    /// The issuing CA's [`CertificateAuthority::id`].
    pub issuer_id: String,
}

impl fmt::Debug for Svid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Svid")
            .field("spiffe_id", &self.spiffe_id)
            .field("key", &self.key)
            .field("not_before", &certs::rfc3339(self.not_before))
            .field("not_after", &certs::rfc3339(self.not_after))
            .field("serial", &self.serial)
            .field("issuer_id", &self.issuer_id)
            .field("chain_len", &self.chain_der.len())
            .finish()
    }
}

/// Why an SVID was not issued.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IssueError {
    /// The ID is a trust domain root ID.
    #[error("cannot issue an SVID for the root ID {0}: a workload ID needs a path")]
    RootId(SpiffeId),
    /// The ID's trust domain is not the CA's.
    #[error("cannot issue {id}: the CA {ca_subject:?} belongs to trust domain {ca_trust_domain}")]
    TrustDomainMismatch {
        /// The requested ID.
        id: SpiffeId,
        /// The CA's trust domain.
        ca_trust_domain: TrustDomain,
        /// The CA's subject.
        ca_subject: String,
    },
    /// The CA has expired (or is not valid yet) at the issuance time.
    #[error("the CA {ca_subject:?} is not valid at {now} (valid {not_before} to {not_after}); rotate it")]
    CaNotValid {
        /// The CA's subject.
        ca_subject: String,
        /// The issuance time, RFC 3339.
        now: String,
        /// The CA's NotBefore, RFC 3339.
        not_before: String,
        /// The CA's NotAfter, RFC 3339.
        not_after: String,
    },
    /// The lifetime is zero or the times do not fit a certificate.
    #[error("invalid SVID lifetime {0:?}")]
    Lifetime(Duration),
    /// The leaf key could not be generated.
    #[error("generating the SVID key failed: {0}")]
    Key(#[source] KeyError),
    /// The certificate could not be built or signed.
    #[error("signing the SVID failed: {0}")]
    Sign(String),
    /// The CA's key is in a PKCS#11 token that does not answer: nothing is signed until it does.
    #[error("signing the SVID failed: {0}")]
    Token(#[source] meshca_hsm::HsmError),
    /// A key given to sign for is not of the algorithm the leaf must have.
    #[error(
        "the key is {found}, but leaves are issued for {expected} keys (issuance.keyAlgorithm)"
    )]
    KeyAlgorithm {
        /// The key's algorithm.
        found: KeyAlgorithm,
        /// What the leaf must have.
        expected: KeyAlgorithm,
    },
}

/// An SVID issued over a key its holder keeps ([`CertificateAuthority::issue_for_key`]): the
/// certificates, and no key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedLeaf {
    /// The SPIFFE ID in its URI SAN.
    pub spiffe_id: SpiffeId,
    /// The leaf followed by any intermediates, never the root.
    pub chain_pem: String,
    /// The same chain as DER.
    pub chain_der: Vec<Vec<u8>>,
    /// NotBefore (issuance time minus 10 s).
    pub not_before: SystemTime,
    /// NotAfter.
    pub not_after: SystemTime,
    /// The serial number, lowercase hex.
    pub serial: String,
    /// The issuing CA's [`CertificateAuthority::id`].
    pub issuer_id: String,
}

impl CertificateAuthority {
    /// Issues an SVID for `req.spiffe_id`: a new key, a leaf with exactly one URI SAN, an empty subject
    /// (so the SAN extension is critical), `cA=false`, keyUsage critical digitalSignature (plus
    /// keyEncipherment for RSA keys), EKU serverAuth+clientAuth, a random 126-bit serial, AKI and SKI,
    /// NotBefore `now - 10s`, NotAfter `min(now + lifetime, CA NotAfter)`.
    ///
    /// The result is not verified here (that costs more than issuing); callers run
    /// [`crate::verify_svid`] before publishing it.
    pub fn issue(&self, req: &SvidRequest, now: SystemTime) -> Result<Svid, IssueError> {
        self.issue_with_key(req, None, now)
    }

    /// [`CertificateAuthority::issue`] with a key pair generated ahead of time (RSA keys take tens of
    /// milliseconds each), used if it is of the requested algorithm; otherwise a new key is generated.
    /// A key must be used for one certificate only: it is moved into the SVID.
    pub fn issue_with_key(
        &self,
        req: &SvidRequest,
        ahead: Option<GeneratedKey>,
        now: SystemTime,
    ) -> Result<Svid, IssueError> {
        let window = self.leaf_window(req, now)?;
        let (key, public) = match ahead {
            Some(pair) if pair.algorithm() == req.key_algorithm => pair.into_parts(),
            _ => PrivateKey::generate(req.key_algorithm).map_err(IssueError::Key)?,
        };
        let leaf = self.sign_leaf(req, &public, window)?;
        Ok(Svid {
            spiffe_id: leaf.spiffe_id,
            chain_pem: leaf.chain_pem,
            chain_der: leaf.chain_der,
            key,
            not_before: leaf.not_before,
            not_after: leaf.not_after,
            serial: leaf.serial,
            issuer_id: leaf.issuer_id,
        })
    }

    /// Issues an SVID for `req.spiffe_id` over a key someone else holds (a workload's, from its verified
    /// certificate signing request): the same leaf as [`CertificateAuthority::issue_with_key`] makes,
    /// for `public` instead of a new key. The key must be of `req.key_algorithm`.
    pub fn issue_for_key(
        &self,
        req: &SvidRequest,
        public: &PublicKey,
        now: SystemTime,
    ) -> Result<SignedLeaf, IssueError> {
        if public.algorithm() != req.key_algorithm {
            return Err(IssueError::KeyAlgorithm {
                found: public.algorithm(),
                expected: req.key_algorithm,
            });
        }
        let window = self.leaf_window(req, now)?;
        self.sign_leaf(req, public, window)
    }

    /// Checks a request against the CA at `now`, and the leaf's NotBefore and NotAfter.
    fn leaf_window(&self, req: &SvidRequest, now: SystemTime) -> Result<LeafWindow, IssueError> {
        if req.spiffe_id.is_root() {
            return Err(IssueError::RootId(req.spiffe_id.clone()));
        }
        if let Some(td) = &self.trust_domain {
            if td != req.spiffe_id.trust_domain() {
                return Err(IssueError::TrustDomainMismatch {
                    id: req.spiffe_id.clone(),
                    ca_trust_domain: td.clone(),
                    ca_subject: self.subject.clone(),
                });
            }
        }
        if now >= self.not_after || now < self.not_before {
            return Err(IssueError::CaNotValid {
                ca_subject: self.subject.clone(),
                now: certs::rfc3339(now),
                not_before: certs::rfc3339(self.not_before),
                not_after: certs::rfc3339(self.not_after),
            });
        }
        let bad_lifetime = || IssueError::Lifetime(req.lifetime);
        if req.lifetime.is_zero() {
            return Err(bad_lifetime());
        }
        // Backdated for clock skew, but never to before the CA itself (a CA made a moment ago, as an
        // operator's or an export's may be, would otherwise sign a leaf that fails path validation).
        let (nb, not_before) = now
            .checked_sub(BACKDATE)
            .map(|t| t.max(self.not_before))
            .and_then(certs::whole_seconds)
            .ok_or_else(bad_lifetime)?;
        let wanted_end = now.checked_add(req.lifetime).unwrap_or(self.not_after);
        let (na, not_after) =
            certs::whole_seconds(wanted_end.min(self.not_after)).ok_or_else(bad_lifetime)?;
        if not_after <= not_before {
            return Err(bad_lifetime());
        }
        Ok(LeafWindow {
            nb,
            not_before,
            na,
            not_after,
        })
    }

    /// Builds and signs the leaf for `public`.
    fn sign_leaf(
        &self,
        req: &SvidRequest,
        public: &PublicKey,
        window: LeafWindow,
    ) -> Result<SignedLeaf, IssueError> {
        let serial = certs::random_serial().map_err(|e| IssueError::Sign(e.to_string()))?;
        let uri = rcgen::string::Ia5String::try_from(req.spiffe_id.as_str())
            .map_err(|e| IssueError::Sign(e.to_string()))?;

        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(uri)];
        params.not_before = window.nb;
        params.not_after = window.na;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = if req.key_algorithm.rsa_bits().is_some() {
            vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ]
        } else {
            vec![KeyUsagePurpose::DigitalSignature]
        };
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let cert =
            params
                .signed_by(public, &self.issuer)
                .map_err(|e| match self.token_failure() {
                    Some(failure) => IssueError::Token(failure),
                    None => IssueError::Sign(e.to_string()),
                })?;

        let leaf = cert.der().to_vec();
        let mut chain_pem = String::with_capacity(leaf.len() * 2 + self.after_leaf_pem.len());
        pem_out::push_cert(&mut chain_pem, &leaf);
        chain_pem.push_str(&self.after_leaf_pem);
        let mut chain_der = Vec::with_capacity(1 + self.after_leaf_der.len());
        chain_der.push(leaf);
        chain_der.extend(self.after_leaf_der.iter().cloned());
        Ok(SignedLeaf {
            spiffe_id: req.spiffe_id.clone(),
            chain_pem,
            chain_der,
            not_before: window.not_before,
            not_after: window.not_after,
            serial: hex::encode(serial),
            issuer_id: self.id.clone(),
        })
    }
}

/// A leaf's validity, as rcgen takes it and as the SVID reports it.
struct LeafWindow {
    nb: time::OffsetDateTime,
    not_before: SystemTime,
    na: time::OffsetDateTime,
    not_after: SystemTime,
}
