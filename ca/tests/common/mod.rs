//! Helpers shared by the integration tests: a fixed clock and rcgen-built CA chains.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meshca_ca::{CaParams, CertificateAuthority, SvidRequest};
use meshca_identity::{KeyAlgorithm, SpiffeId, TrustDomain};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

pub const HOUR: Duration = Duration::from_secs(3600);
pub const DAY: Duration = Duration::from_secs(86_400);

/// A fixed "now": 2030-01-01T00:00:07.5Z, so every test is reproducible (the half second checks that
/// certificate times are truncated to whole seconds).
pub fn now() -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(1_893_456_007_500)
}

/// `now()` in whole seconds since the epoch.
pub const NOW_SECS: u64 = 1_893_456_007;

pub fn td(name: &str) -> TrustDomain {
    TrustDomain::parse(name).expect("valid trust domain")
}

pub fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).expect("valid SPIFFE ID")
}

pub fn ca_params(trust_domain: &str, key_algorithm: KeyAlgorithm, validity: Duration) -> CaParams {
    CaParams {
        trust_domain: td(trust_domain),
        key_algorithm,
        validity,
        name: "default/ca-1".into(),
    }
}

pub fn generated(trust_domain: &str, key_algorithm: KeyAlgorithm) -> CertificateAuthority {
    CertificateAuthority::generate(&ca_params(trust_domain, key_algorithm, 365 * DAY), now())
        .expect("CA generates")
}

pub fn request(spiffe_id: &str, key_algorithm: KeyAlgorithm, lifetime: Duration) -> SvidRequest {
    SvidRequest {
        spiffe_id: id(spiffe_id),
        key_algorithm,
        lifetime,
    }
}

/// A certificate made by rcgen for provided-CA tests, with its key and params (to sign children).
pub struct TestCert {
    pub params: CertificateParams,
    pub key: KeyPair,
    pub pem: String,
    pub der: Vec<u8>,
}

impl TestCert {
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    pub fn issuer(&self) -> Issuer<'_, &KeyPair> {
        Issuer::from_params(&self.params, &self.key)
    }
}

/// CA params valid from `now - 1 day` for a year, with keyCertSign+cRLSign and a spiffe URI SAN.
pub fn ca_cert_params(cn: &str, uri: Option<&str>) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "Example Corp");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = (now() - DAY).into();
    p.not_after = (now() + 365 * DAY).into();
    p.use_authority_key_identifier_extension = true;
    if let Some(uri) = uri {
        p.subject_alt_names = vec![SanType::URI(uri.try_into().expect("ia5"))];
    }
    p
}

pub fn new_key() -> KeyPair {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("keygen")
}

/// Self-signs `params` with a fresh P-256 key.
pub fn self_signed(params: CertificateParams) -> TestCert {
    self_signed_with(params, new_key())
}

pub fn self_signed_with(params: CertificateParams, key: KeyPair) -> TestCert {
    let cert = params.self_signed(&key).expect("self-sign");
    TestCert {
        pem: cert.pem(),
        der: cert.der().to_vec(),
        params,
        key,
    }
}

/// Signs `params` with `issuer`, using a fresh P-256 key.
pub fn signed_by(params: CertificateParams, issuer: &TestCert) -> TestCert {
    let key = new_key();
    let cert = params.signed_by(&key, &issuer.issuer()).expect("sign");
    TestCert {
        pem: cert.pem(),
        der: cert.der().to_vec(),
        params,
        key,
    }
}

/// A root and an intermediate (both CAs, SPIFFE trust domain `corp.example`).
pub fn root_and_intermediate() -> (TestCert, TestCert) {
    let root = self_signed(ca_cert_params(
        "Example Root",
        Some("spiffe://corp.example"),
    ));
    let int = signed_by(
        ca_cert_params("Example Mesh Intermediate", Some("spiffe://corp.example")),
        &root,
    );
    (root, int)
}
