//! A loaded certificate authority: the signing certificate, the chain above it, its key, ready to issue.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use meshca_hsm::{HsmError, KeySelector, Token, TokenKey};
use meshca_identity::KeyAlgorithm;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};
use rustls_pki_types::CertificateDer;
use zeroize::{Zeroize, Zeroizing};

use crate::certs::{self, KeyKind};
use crate::key::{KeyError, PrivateKey};
use crate::material::ProvidedCaError;
use crate::pem_out;
use crate::verify::{verify_structure, verify_with, IssuerFacts, VerifyError};
use meshca_identity::{SpiffeId, TrustDomain};

/// How far NotBefore is backdated to tolerate clock skew between peers.
pub(crate) const BACKDATE: Duration = Duration::from_secs(10);

/// What a generated (builtin) CA looks like.
#[derive(Clone, Debug)]
pub struct CaParams {
    /// The trust domain; the CA carries `spiffe://<trust domain>` as its URI SAN.
    pub trust_domain: TrustDomain,
    /// The CA key's algorithm.
    pub key_algorithm: KeyAlgorithm,
    /// How long the CA is valid, from now.
    pub validity: Duration,
    /// A name for the subject, e.g. `default/ca-1` (mesh/backend); a random suffix makes it unique.
    pub name: String,
}

/// Why a CA could not be generated or reloaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaError {
    /// The CA key could not be generated.
    #[error("generating the CA key failed: {0}")]
    Key(#[source] KeyError),
    /// The CA certificate could not be built or signed.
    #[error("building the CA certificate failed: {0}")]
    Certificate(String),
    /// The validity does not fit an X.509 certificate.
    #[error("the CA validity must be more than zero and end before the year 9999 (got {0:?})")]
    Validity(Duration),
    /// A CA meshca persisted earlier could not be loaded.
    #[error("the persisted CA cannot be loaded: {0}")]
    Persisted(#[source] ProvidedCaError),
    /// The CA key could not be made in, or found in, the PKCS#11 token.
    #[error("{0}")]
    Token(#[source] HsmError),
}

/// The CA's private key: in memory, or in a PKCS#11 token.
pub(crate) enum CaKey {
    /// A key meshca holds (PKCS#8, wiped on drop).
    Software(PrivateKey),
    /// A key in the token, which signs there.
    Token(Arc<TokenKey>),
}

impl CaKey {
    fn algorithm(&self) -> KeyAlgorithm {
        match self {
            CaKey::Software(key) => key.algorithm(),
            CaKey::Token(key) => key.algorithm(),
        }
    }
}

impl fmt::Debug for CaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaKey::Software(key) => key.fmt(f),
            CaKey::Token(key) => key.fmt(f),
        }
    }
}

/// What the keystore keeps of a CA's key ([`CertificateAuthority::key_to_store`]).
#[derive(Debug)]
pub enum KeyToStore<'a> {
    /// A software key, as PKCS#8 PEM (wiped when dropped).
    Pem(Zeroizing<String>),
    /// A key in a PKCS#11 token: the keystore keeps where it is.
    Token(&'a TokenKey),
}

/// The CA's signing key as rcgen uses it. A software key's PKCS#8 copy is wiped on drop.
// One per CA: keeping the key pair inline saves an indirection on every signature.
#[allow(clippy::large_enum_variant)]
pub(crate) enum CaSigner {
    Software(KeyPair),
    Token(Arc<TokenKey>),
}

impl Drop for CaSigner {
    fn drop(&mut self) {
        if let CaSigner::Software(key) = self {
            key.zeroize();
        }
    }
}

impl rcgen::PublicKeyData for CaSigner {
    fn der_bytes(&self) -> &[u8] {
        match self {
            CaSigner::Software(key) => key.der_bytes(),
            CaSigner::Token(key) => key.public_key(),
        }
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            CaSigner::Software(key) => rcgen::PublicKeyData::algorithm(key),
            CaSigner::Token(key) => match key.algorithm() {
                KeyAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
                KeyAlgorithm::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
                _ => &rcgen::PKCS_RSA_SHA256,
            },
        }
    }
}

impl rcgen::SigningKey for CaSigner {
    fn sign(&self, msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        match self {
            CaSigner::Software(key) => key.sign(msg),
            // The token's status says why (see `CertificateAuthority::token_failure`).
            CaSigner::Token(key) => key.sign(msg).map_err(|_| rcgen::Error::RemoteKeyError),
        }
    }
}

/// One SVID in this many (the first of each run) has its signature verified before it is published; see
/// [`CertificateAuthority::verify_issued`].
pub const FULL_CHECK_EVERY: u64 = 1024;

/// A certificate authority ready to issue SVIDs. `Debug` shows no key material.
pub struct CertificateAuthority {
    pub(crate) cert_der: Vec<u8>,
    /// Certificates above the signing one, as given (intermediates, then the root if present).
    pub(crate) above: Vec<Vec<u8>>,
    /// What SDS sends after a leaf: every certificate of the chain except the trust anchor.
    pub(crate) after_leaf_der: Vec<Vec<u8>>,
    pub(crate) after_leaf_pem: String,
    pub(crate) anchor_der: Vec<u8>,
    /// The trust anchor as PEM, encoded once: every proxy's certificate record shares it.
    pub(crate) anchor_pems: Arc<[String]>,
    pub(crate) issuer: Issuer<'static, CaSigner>,
    pub(crate) key: CaKey,
    pub(crate) trust_domain: Option<TrustDomain>,
    pub(crate) subject: String,
    pub(crate) not_before: SystemTime,
    pub(crate) not_after: SystemTime,
    pub(crate) id: String,
    /// What the check before publishing compares leaves with, read on first use.
    pub(crate) facts: OnceLock<Result<IssuerFacts, VerifyError>>,
    /// How many SVIDs of this CA were checked: the first of every [`FULL_CHECK_EVERY`] is verified in
    /// full, signature included.
    pub(crate) checked: AtomicU64,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("id", &self.id)
            .field("subject", &self.subject)
            .field("trust_domain", &self.trust_domain)
            .field("key", &self.key)
            .field("not_before", &certs::rfc3339(self.not_before))
            .field("not_after", &certs::rfc3339(self.not_after))
            .field("chain_len", &(1 + self.above.len()))
            .finish()
    }
}

impl CertificateAuthority {
    /// Generates a self-signed CA: `cA=true` with pathLen 0 (it signs only leaves), keyUsage critical
    /// keyCertSign+cRLSign, URI SAN `spiffe://<trust domain>`, a random 126-bit serial, subject
    /// `CN=meshca <name> <random hex>, O=meshca` (unique per CA), SKI and AKI, NotBefore `now - 10s`.
    pub fn generate(params: &CaParams, now: SystemTime) -> Result<Self, CaError> {
        let (key, _) = PrivateKey::generate(params.key_algorithm).map_err(CaError::Key)?;
        let signer = signer_for(&key).map_err(|e| CaError::Certificate(e.to_string()))?;
        let der = self_signed(params, now, &signer)?;
        drop(signer);
        Self::assemble(vec![der], CaKey::Software(key)).map_err(CaError::Persisted)
    }

    /// Generates a CA as [`CertificateAuthority::generate`] does, its key made in `token`: sensitive and
    /// never extractable, labelled as pending until the keystore records it and
    /// [`CertificateAuthority::record_token_key`] gives it the CA's id as its label (a start destroys a
    /// pending key its maker left unrecorded). [`CertificateAuthority::discard`] removes the key of a CA
    /// that is not kept.
    pub fn generate_in_token(
        params: &CaParams,
        now: SystemTime,
        token: &Token,
    ) -> Result<Self, CaError> {
        let key = token
            .generate_pending_key(params.key_algorithm)
            .map_err(CaError::Token)?;
        let key = Arc::new(key);
        let signer = CaSigner::Token(Arc::clone(&key));
        let signed = self_signed(params, now, &signer);
        drop(signer);
        let der = match signed {
            Ok(der) => der,
            Err(error) => {
                let error = match token.status().up {
                    true => error,
                    false => CaError::Token(HsmError::Unavailable {
                        label: token.label().to_owned(),
                        reason: token.status().reason.unwrap_or_default(),
                    }),
                };
                if let Ok(key) = Arc::try_unwrap(key) {
                    let _ = key.destroy();
                }
                return Err(error);
            }
        };
        Self::assemble(vec![der], CaKey::Token(key)).map_err(CaError::Persisted)
    }

    /// Labels the token key of a CA made by [`CertificateAuthority::generate_in_token`] with the CA's id,
    /// once the keystore holds its record (whose `pkcs11:` URI names that label). Does nothing for a
    /// software key.
    pub fn record_token_key(&self) -> Result<(), HsmError> {
        match &self.key {
            CaKey::Software(_) => Ok(()),
            CaKey::Token(key) => key.record_as(&self.id),
        }
    }

    /// Reloads a CA meshca generated and persisted earlier ([`CertificateAuthority::to_pem`]): parses the
    /// chain and the key and checks they match. No other policy is applied.
    pub fn from_persisted(cert_chain_pem: &[u8], key_pem: &[u8]) -> Result<Self, CaError> {
        let load = || {
            let chain = crate::material::read_chain(cert_chain_pem)?;
            let key = PrivateKey::from_pem(key_pem).map_err(ProvidedCaError::UnreadableKey)?;
            Self::assemble(chain, CaKey::Software(key))
        };
        load().map_err(CaError::Persisted)
    }

    /// Reloads a CA meshca generated in a token and persisted earlier: its chain, and the key `selector`
    /// names in `token`, proven to be the certificate's by a signature.
    pub fn from_persisted_in_token(
        cert_chain_pem: &[u8],
        token: &Token,
        selector: KeySelector<'_>,
    ) -> Result<Self, CaError> {
        let chain = crate::material::read_chain(cert_chain_pem).map_err(CaError::Persisted)?;
        let key = find_token_key(&chain, token, selector)?;
        Self::assemble(chain, CaKey::Token(Arc::new(key))).map_err(CaError::Persisted)
    }

    /// Builds the CA from a chain (signing certificate first) and its key: checks the key matches, reads
    /// the trust domain, and builds the rcgen issuer once.
    pub(crate) fn assemble(chain: Vec<Vec<u8>>, key: CaKey) -> Result<Self, ProvidedCaError> {
        let mut chain = chain.into_iter();
        let cert_der = chain.next().ok_or(ProvidedCaError::NoCertificate)?;
        let above: Vec<Vec<u8>> = chain.collect();
        let cert =
            certs::parse(&cert_der).map_err(|reason| ProvidedCaError::UnparsableCertificate {
                position: 1,
                reason: reason.to_string(),
            })?;
        let subject = certs::subject(&cert);

        let signer = match &key {
            CaKey::Software(software) => {
                signer_for(software).map_err(|e| ProvidedCaError::Signer(e.to_string()))?
            }
            CaKey::Token(token_key) => CaSigner::Token(Arc::clone(token_key)),
        };
        let cert_key = cert.public_key();
        let same_type = certs::key_kind(cert_key) == KeyKind::Supported(key.algorithm());
        if !same_type
            || cert_key.subject_public_key.data.as_ref() != rcgen::PublicKeyData::der_bytes(&signer)
        {
            return Err(ProvidedCaError::KeyMismatch { subject });
        }
        let trust_domain = trust_domain_of(&cert, &subject)?;
        let issuer = build_issuer(&cert_der, &cert, signer, &subject)?;

        let mut full: Vec<&Vec<u8>> = Vec::with_capacity(1 + above.len());
        full.push(&cert_der);
        full.extend(above.iter());
        // The trust anchor is the last certificate given: the root, or the CA itself when alone.
        let anchor_der = full.last().map(|d| (*d).clone()).unwrap_or_default();
        let after_leaf_der: Vec<Vec<u8>> = full[..full.len() - 1]
            .iter()
            .map(|d| (*d).clone())
            .collect();
        let mut after_leaf_pem = String::new();
        for der in &after_leaf_der {
            pem_out::push_cert(&mut after_leaf_pem, der);
        }
        let validity = cert.validity();
        let ca = CertificateAuthority {
            not_before: certs::system_time(validity.not_before),
            not_after: certs::system_time(validity.not_after),
            id: certs::sha256_hex(&cert_der),
            cert_der: cert_der.clone(),
            above,
            after_leaf_der,
            after_leaf_pem,
            anchor_pems: Arc::from(vec![pem_out::cert(&anchor_der)]),
            anchor_der,
            issuer,
            key,
            trust_domain,
            subject,
            facts: OnceLock::new(),
            checked: AtomicU64::new(0),
        };
        Ok(ca)
    }

    /// Checks an SVID this CA issued before it is published. Every SVID: everything but the signature
    /// ([`crate::verify_structure`]): the rules, the SPIFFE ID, issuer name and key identifier, validity
    /// and chain. The first SVID of the CA, and one in every [`FULL_CHECK_EVERY`] after it, also in full:
    /// the chain and its signatures verified to the CA's anchors ([`crate::verify_with`]), which proves the
    /// CA's key, certificate and signer agree. Verifying an ECDSA signature costs more than issuing the
    /// certificate; a signature ring just made with that proven key is not re-verified every time.
    pub fn verify_issued(
        &self,
        chain_der: &[Vec<u8>],
        expected: &SpiffeId,
        now: SystemTime,
    ) -> Result<(), VerifyError> {
        let facts = self
            .facts
            .get_or_init(|| {
                IssuerFacts::read(&self.cert_der, &self.after_leaf_der, &self.bundle_der())
            })
            .as_ref()
            .map_err(Clone::clone)?;
        let n = self.checked.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(FULL_CHECK_EVERY) {
            verify_with(chain_der, &facts.anchors, expected, now)?;
        }
        verify_structure(chain_der, facts, expected, now)
    }

    /// The CA's id: lowercase hex SHA-256 of the signing certificate's DER.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The signing certificate's DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The signing certificate's subject, for messages.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// The trust domain from the CA's `spiffe://` URI SAN, if it has one.
    pub fn trust_domain(&self) -> Option<&TrustDomain> {
        self.trust_domain.as_ref()
    }

    /// The signing key's algorithm.
    pub fn key_algorithm(&self) -> KeyAlgorithm {
        self.key.algorithm()
    }

    /// The signing certificate's NotBefore.
    pub fn not_before(&self) -> SystemTime {
        self.not_before
    }

    /// The signing certificate's NotAfter; no SVID outlives it.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// The certificates above the signing one, as given (intermediates, then the root if present).
    pub fn chain_above_der(&self) -> &[Vec<u8>] {
        &self.above
    }

    /// The trust anchors peers need to validate this CA's SVIDs, as DER (the root, or the CA itself).
    pub fn bundle_der(&self) -> Vec<Vec<u8>> {
        vec![self.anchor_der.clone()]
    }

    /// The trust anchors as PEM, one string per certificate (shared, not copied).
    pub fn bundle_pems(&self) -> Arc<[String]> {
        self.anchor_pems.clone()
    }

    /// The certificates SDS sends after a leaf: the chain up to, not including, the root (PEM,
    /// concatenated; empty for a self-signed CA).
    pub fn chain_above_pem(&self) -> &str {
        &self.after_leaf_pem
    }

    /// The certificates sent after a leaf, as DER.
    pub fn chain_after_leaf_der(&self) -> &[Vec<u8>] {
        &self.after_leaf_der
    }

    /// The chain (signing certificate first, then the rest as given) and the key, as PEM, for the
    /// keystore. The key is `None` when it is in a token ([`CertificateAuthority::token_key`]).
    pub fn to_pem(&self) -> (String, Option<Zeroizing<String>>) {
        let key = match self.key_to_store() {
            KeyToStore::Pem(pem) => Some(pem),
            KeyToStore::Token(_) => None,
        };
        (self.chain_pem(), key)
    }

    /// The chain, signing certificate first, then the rest as given, as PEM.
    pub fn chain_pem(&self) -> String {
        let mut chain = pem_out::cert(&self.cert_der);
        for der in &self.above {
            pem_out::push_cert(&mut chain, der);
        }
        chain
    }

    /// What the keystore keeps of the CA's key: the key itself (PEM), or where it is in the token.
    pub fn key_to_store(&self) -> KeyToStore<'_> {
        match &self.key {
            CaKey::Software(key) => KeyToStore::Pem(key.to_pem()),
            CaKey::Token(key) => KeyToStore::Token(key),
        }
    }

    /// The CA's key when it is in a PKCS#11 token.
    pub fn token_key(&self) -> Option<&TokenKey> {
        match &self.key {
            CaKey::Software(_) => None,
            CaKey::Token(key) => Some(key),
        }
    }

    /// Removes the key of a CA made in a token and not kept (another process persisted its CA first).
    /// Does nothing for a software key, which is wiped when dropped.
    pub fn discard(self) -> Result<(), HsmError> {
        let CaKey::Token(key) = &self.key else {
            return Ok(());
        };
        let key = Arc::clone(key);
        drop(self);
        match Arc::try_unwrap(key) {
            Ok(key) => key.destroy(),
            // Still shared (a copy of this CA is in use): it is not this caller's to remove.
            Err(_) => Ok(()),
        }
    }

    /// Why a signature of this CA failed, when its key is in a token that stopped answering.
    pub(crate) fn token_failure(&self) -> Option<HsmError> {
        let token = self.token_key()?.token();
        let status = token.status();
        (!status.up).then(|| HsmError::Unavailable {
            label: token.label().to_owned(),
            reason: status.reason.unwrap_or_default(),
        })
    }
}

/// Loads the CA key into rcgen (this parses the PKCS#8: done once per CA, never per leaf).
fn signer_for(key: &PrivateKey) -> Result<CaSigner, rcgen::Error> {
    let der = rustls_pki_types::PrivatePkcs8KeyDer::from(key.pkcs8_der());
    KeyPair::try_from(&der).map(CaSigner::Software)
}

/// The key `selector` names in `token`, checked against the public key of the chain's first
/// certificate.
pub(crate) fn find_token_key(
    chain: &[Vec<u8>],
    token: &Token,
    selector: KeySelector<'_>,
) -> Result<TokenKey, CaError> {
    let first = chain
        .first()
        .ok_or(CaError::Persisted(ProvidedCaError::NoCertificate))?;
    let cert = certs::parse(first).map_err(|reason| {
        CaError::Persisted(ProvidedCaError::UnparsableCertificate {
            position: 1,
            reason: reason.to_string(),
        })
    })?;
    let KeyKind::Supported(algorithm) = certs::key_kind(cert.public_key()) else {
        return Err(CaError::Persisted(ProvidedCaError::KeyMismatch {
            subject: certs::subject(&cert),
        }));
    };
    token
        .find_key(
            selector,
            algorithm,
            &cert.public_key().subject_public_key.data,
        )
        .map_err(CaError::Token)
}

/// The self-signed certificate of a new CA, signed by `signer`.
fn self_signed(params: &CaParams, now: SystemTime, signer: &CaSigner) -> Result<Vec<u8>, CaError> {
    let (not_before, _) = now
        .checked_sub(BACKDATE)
        .and_then(certs::whole_seconds)
        .ok_or(CaError::Validity(params.validity))?;
    let not_after = now
        .checked_add(params.validity)
        .and_then(certs::whole_seconds)
        .filter(|(t, _)| t.year() < 9999 && !params.validity.is_zero())
        .ok_or(CaError::Validity(params.validity))?
        .0;
    let serial = certs::random_serial().map_err(|e| CaError::Certificate(e.to_string()))?;
    let uri = rcgen::string::Ia5String::try_from(params.trust_domain.id())
        .map_err(|e| CaError::Certificate(e.to_string()))?;

    let mut cert_params = CertificateParams::default();
    cert_params.distinguished_name = ca_subject(&params.name, &serial);
    cert_params.not_before = not_before;
    cert_params.not_after = not_after;
    cert_params.serial_number = Some(SerialNumber::from_slice(&serial));
    cert_params.subject_alt_names = vec![SanType::URI(uri)];
    cert_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    cert_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    cert_params.use_authority_key_identifier_extension = true;
    let cert = cert_params
        .self_signed(signer)
        .map_err(|e| CaError::Certificate(e.to_string()))?;
    Ok(cert.der().to_vec())
}

/// `CN=meshca <name> <16 hex of the serial>, O=meshca`, the CN kept within X.509's 64 characters.
fn ca_subject(name: &str, serial: &[u8; 16]) -> DistinguishedName {
    let suffix = hex::encode(&serial[8..]);
    let budget = 64 - "meshca ".len() - 1 - suffix.len();
    let name: String = name
        .chars()
        .filter(|c| !c.is_control())
        .take(budget)
        .collect();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("meshca {name} {suffix}"));
    dn.push(DnType::OrganizationName, "meshca");
    dn
}

/// The trust domain named by a `spiffe://` URI SAN of the CA, if any.
fn trust_domain_of(
    cert: &x509_parser::certificate::X509Certificate<'_>,
    subject: &str,
) -> Result<Option<TrustDomain>, ProvidedCaError> {
    let uris = certs::uri_sans(cert).map_err(|reason| ProvidedCaError::UnparsableCertificate {
        position: 1,
        reason: reason.to_string(),
    })?;
    let Some(uri) = uris.into_iter().find(|u| u.starts_with("spiffe://")) else {
        return Ok(None);
    };
    let id = SpiffeId::parse(uri).map_err(|source| ProvidedCaError::InvalidSpiffeUri {
        subject: subject.to_owned(),
        uri: uri.to_owned(),
        source,
    })?;
    Ok(Some(id.trust_domain().clone()))
}

/// A signer that only serialises: used to check, without signing, that rcgen reproduces the CA's
/// subject byte for byte as the issuer name of its leaves (it cannot for every name encoding).
struct DryRun(&'static rcgen::SignatureAlgorithm, Vec<u8>);

impl rcgen::PublicKeyData for DryRun {
    fn der_bytes(&self) -> &[u8] {
        &self.1
    }
    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        self.0
    }
}

impl rcgen::SigningKey for DryRun {
    fn sign(&self, _msg: &[u8]) -> Result<Vec<u8>, rcgen::Error> {
        Ok(Vec::new())
    }
}

/// Builds the rcgen issuer once, after checking the subject can be reproduced exactly.
fn build_issuer(
    der: &[u8],
    cert: &x509_parser::certificate::X509Certificate<'_>,
    signer: CaSigner,
    subject: &str,
) -> Result<Issuer<'static, CaSigner>, ProvidedCaError> {
    let unsupported = || ProvidedCaError::UnsupportedSubject {
        subject: subject.to_owned(),
    };
    // rcgen panics on an empty RDN and merges repeated attribute types: refuse those up front.
    let mut seen = Vec::new();
    for rdn in cert.subject().iter() {
        let mut attrs = rdn.iter();
        let (Some(attr), None) = (attrs.next(), attrs.next()) else {
            return Err(unsupported());
        };
        let oid = attr.attr_type().clone();
        if seen.contains(&oid) {
            return Err(unsupported());
        }
        seen.push(oid);
    }
    let cert_der = CertificateDer::from(der);
    let probe_key = DryRun(
        rcgen::PublicKeyData::algorithm(&signer),
        rcgen::PublicKeyData::der_bytes(&signer).to_vec(),
    );
    let probe_issuer =
        Issuer::from_ca_cert_der(&cert_der, &probe_key).map_err(|_| unsupported())?;
    let probe = CertificateParams::default()
        .signed_by(&probe_key, &probe_issuer)
        .map_err(|_| unsupported())?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(probe.der()).map_err(|_| unsupported())?;
    if parsed.issuer().as_raw() != cert.subject().as_raw() {
        return Err(unsupported());
    }
    Issuer::from_ca_cert_der(&cert_der, signer).map_err(|e| ProvidedCaError::Signer(e.to_string()))
}
