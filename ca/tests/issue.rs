//! Generated CAs and SVID issuance, checked with webpki and the independent x509-parser rule checker.

mod common;

use std::time::{Duration, UNIX_EPOCH};

use common::*;
use meshca_ca::{
    check_svid_rules, key_matches, verify_svid, CaError, CertificateAuthority, GeneratedKey,
    IssueError, KeyAlgorithm, PrivateKey,
};
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::*;

fn assert_issues_valid_svid(ca: &CertificateAuthority, leaf_alg: KeyAlgorithm) {
    let req = request(
        "spiffe://default.zone-1.mesh.local/workload/web",
        leaf_alg,
        HOUR,
    );
    let svid = ca.issue(&req, now()).expect("issues");
    check_svid_rules(&svid.chain_der[0])
        .unwrap_or_else(|e| panic!("{leaf_alg} leaf from {:?}: {e:?}", ca.key_algorithm()));
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now())
        .expect("verifies with webpki");
    assert_eq!(svid.key.algorithm(), leaf_alg);
    assert_eq!(svid.issuer_id, ca.id());

    let (_, leaf) = X509Certificate::from_der(&svid.chain_der[0]).expect("parses");
    let spki = leaf.public_key();
    let ours = svid.key.public_key().expect("key parses");
    assert_eq!(
        spki.subject_public_key.data.as_ref(),
        ours.raw(),
        "the certificate holds the key's public half"
    );
    let ku = leaf.key_usage().expect("ku").expect("present").value;
    assert_eq!(ku.key_encipherment(), leaf_alg.rsa_bits().is_some());
    assert!(key_matches(&svid.key, &svid.chain_der[0]));
    let other = ca.issue(&req, now()).expect("issues");
    assert!(
        !key_matches(&other.key, &svid.chain_der[0]),
        "another leaf's key is not this one's"
    );
    assert!(!key_matches(&svid.key, b"not a certificate"));
}

#[test]
fn generated_p256_ca_issues_rule_abiding_svids() {
    let ca = generated("default.zone-1.mesh.local", KeyAlgorithm::EcdsaP256);
    assert_issues_valid_svid(&ca, KeyAlgorithm::EcdsaP256);
    assert_issues_valid_svid(&ca, KeyAlgorithm::EcdsaP384);

    let req = request(
        "spiffe://default.zone-1.mesh.local/workload/web",
        KeyAlgorithm::EcdsaP256,
        HOUR,
    );
    let svid = ca.issue(&req, now()).expect("issues");
    assert_eq!(
        svid.chain_der.len(),
        1,
        "a self-signed CA adds nothing after the leaf"
    );
    assert_eq!(svid.chain_pem.matches("BEGIN CERTIFICATE").count(), 1);
    assert_eq!(
        svid.not_before,
        UNIX_EPOCH + Duration::from_secs(NOW_SECS - 10),
        "now - 10 s, whole seconds"
    );
    assert_eq!(
        svid.not_after,
        UNIX_EPOCH + Duration::from_secs(NOW_SECS) + HOUR
    );
    let (_, leaf) = X509Certificate::from_der(&svid.chain_der[0]).expect("parses");
    assert_eq!(leaf.validity().not_before.timestamp() as u64, NOW_SECS - 10);
    assert_eq!(
        leaf.validity().not_after.timestamp() as u64,
        NOW_SECS + 3600
    );

    let (_, leaf) = X509Certificate::from_der(&svid.chain_der[0]).expect("parses");
    assert_eq!(leaf.subject().iter().count(), 0, "empty subject");
    let san = leaf
        .subject_alternative_name()
        .expect("san")
        .expect("present");
    assert!(san.critical, "SAN is critical because the subject is empty");
    assert_eq!(hex::encode(leaf.raw_serial()), svid.serial);
    assert!(leaf.raw_serial().len() >= 8 && leaf.raw_serial()[0] & 0x80 == 0);
    let aki = leaf
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|k| k.0.to_vec())
            }
            _ => None,
        });
    let (_, ca_cert) = X509Certificate::from_der(ca.cert_der()).expect("parses");
    let ski = ca_cert
        .iter_extensions()
        .find_map(|e| match e.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(k) => Some(k.0.to_vec()),
            _ => None,
        });
    assert!(aki.is_some());
    assert_eq!(aki, ski, "the leaf's AKI is the CA's SKI");

    let other = ca.issue(&req, now()).expect("issues");
    assert_ne!(other.serial, svid.serial, "serials are random");
    assert_ne!(
        other.key.pkcs8_der(),
        svid.key.pkcs8_der(),
        "every SVID has a fresh key"
    );
}

#[test]
fn generated_ca_follows_the_ca_rules() {
    let ca = generated("default.zone-1.mesh.local", KeyAlgorithm::EcdsaP256);
    let (_, cert) = X509Certificate::from_der(ca.cert_der()).expect("parses");
    let bc = cert
        .basic_constraints()
        .expect("bc")
        .expect("present")
        .value;
    assert!(bc.ca);
    assert_eq!(bc.path_len_constraint, Some(0));
    let ku = cert.key_usage().expect("ku").expect("present");
    assert!(ku.critical && ku.value.key_cert_sign() && ku.value.crl_sign());
    let uris: Vec<_> = cert
        .subject_alternative_name()
        .expect("san")
        .expect("present")
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(u.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(uris, ["spiffe://default.zone-1.mesh.local"]);
    assert_eq!(
        ca.trust_domain().map(|t| t.as_str()),
        Some("default.zone-1.mesh.local")
    );
    assert_eq!(cert.validity().not_before.timestamp() as u64, NOW_SECS - 10);
    assert_eq!(
        ca.not_after(),
        UNIX_EPOCH + Duration::from_secs(NOW_SECS) + 365 * DAY
    );
    assert!(cert.raw_serial()[0] & 0x80 == 0 && cert.raw_serial().len() == 16);
    let has_ski = cert.iter_extensions().any(|e| {
        matches!(
            e.parsed_extension(),
            ParsedExtension::SubjectKeyIdentifier(_)
        )
    });
    let has_aki = cert.iter_extensions().any(|e| {
        matches!(
            e.parsed_extension(),
            ParsedExtension::AuthorityKeyIdentifier(_)
        )
    });
    assert!(has_ski && has_aki);
    assert!(cert.subject().to_string().contains("O=meshca"));
    assert!(cert
        .subject()
        .to_string()
        .contains("CN=meshca default/ca-1 "));
    assert_eq!(
        ca.id(),
        hex::encode(ring::digest::digest(&ring::digest::SHA256, ca.cert_der()))
    );
    assert_eq!(ca.bundle_pems().len(), 1);
    assert_eq!(ca.chain_above_pem(), "");
}

#[test]
fn two_generated_cas_have_different_subjects() {
    let a = generated("td", KeyAlgorithm::EcdsaP256);
    let b = generated("td", KeyAlgorithm::EcdsaP256);
    assert_ne!(a.subject(), b.subject());
    assert_ne!(a.id(), b.id());
    // A leaf of one CA does not validate against the other.
    let req = request("spiffe://td/w", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = a.issue(&req, now()).expect("issues");
    assert!(verify_svid(&svid.chain_der, &b.bundle_der(), &req.spiffe_id, now()).is_err());
}

#[test]
fn p384_ca_issues() {
    let ca = generated("td", KeyAlgorithm::EcdsaP384);
    let req = request("spiffe://td/w", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = ca.issue(&req, now()).expect("issues");
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now()).expect("verifies");
    assert_issues_valid_svid(
        &generated("default.zone-1.mesh.local", KeyAlgorithm::EcdsaP384),
        KeyAlgorithm::EcdsaP384,
    );
}

#[test]
fn rsa_ca_issues_p256_and_rsa_leaves() {
    // The one RSA CA keygen of this binary (slow in debug builds).
    let ca = CertificateAuthority::generate(
        &ca_params(
            "default.zone-1.mesh.local",
            KeyAlgorithm::Rsa2048,
            365 * DAY,
        ),
        now(),
    )
    .expect("RSA CA generates");
    assert_eq!(ca.key_algorithm(), KeyAlgorithm::Rsa2048);
    assert_issues_valid_svid(&ca, KeyAlgorithm::EcdsaP256);
    let info = meshca_ca::inspect_pem(ca.bundle_pems()[0].as_bytes()).expect("inspects");
    assert_eq!(info[0].key, "RSA 2048");

    // An RSA leaf (keyEncipherment allowed) from a fixture-keyed RSA CA via the persisted path.
    let (chain, key) = ca.to_pem();
    let key = key.expect("a software key");
    let again =
        CertificateAuthority::from_persisted(chain.as_bytes(), key.as_bytes()).expect("reloads");
    assert_eq!(again.id(), ca.id());
}

#[test]
fn rsa_leaf_gets_key_encipherment() {
    let ca = generated("default.zone-1.mesh.local", KeyAlgorithm::EcdsaP256);
    assert_issues_valid_svid(&ca, KeyAlgorithm::Rsa2048);
}

#[test]
fn not_after_is_clamped_to_the_ca() {
    let ca = CertificateAuthority::generate(&ca_params("td", KeyAlgorithm::EcdsaP256, HOUR), now())
        .expect("CA");
    let req = request("spiffe://td/w", KeyAlgorithm::EcdsaP256, 30 * DAY);
    let svid = ca.issue(&req, now()).expect("issues");
    assert_eq!(svid.not_after, ca.not_after());
    assert!(svid.not_after < now() + 2 * HOUR);
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now()).expect("still verifies");
}

#[test]
fn issuance_refuses_what_it_must() {
    let ca = generated("td", KeyAlgorithm::EcdsaP256);
    let err = ca
        .issue(
            &request("spiffe://td", KeyAlgorithm::EcdsaP256, HOUR),
            now(),
        )
        .expect_err("root");
    assert!(matches!(err, IssueError::RootId(_)), "{err}");

    let err = ca
        .issue(
            &request("spiffe://other/w", KeyAlgorithm::EcdsaP256, HOUR),
            now(),
        )
        .expect_err("td");
    assert!(matches!(err, IssueError::TrustDomainMismatch { .. }));
    assert!(
        err.to_string().contains("spiffe://other/w") && err.to_string().contains("td"),
        "{err}"
    );

    let later = now() + 400 * DAY;
    let err = ca
        .issue(
            &request("spiffe://td/w", KeyAlgorithm::EcdsaP256, HOUR),
            later,
        )
        .expect_err("expired");
    assert!(matches!(err, IssueError::CaNotValid { .. }), "{err}");
    assert!(err.to_string().contains("rotate"));

    let err = ca
        .issue(
            &request("spiffe://td/w", KeyAlgorithm::EcdsaP256, Duration::ZERO),
            now(),
        )
        .expect_err("zero");
    assert!(matches!(err, IssueError::Lifetime(_)));
}

#[test]
fn generate_rejects_bad_validity() {
    for validity in [Duration::ZERO, Duration::from_secs(9000 * 365 * 86_400)] {
        let err = CertificateAuthority::generate(
            &ca_params("td", KeyAlgorithm::EcdsaP256, validity),
            now(),
        )
        .expect_err("bad validity");
        assert!(matches!(err, CaError::Validity(_)), "{err}");
    }
    let before_epoch = UNIX_EPOCH;
    assert!(CertificateAuthority::generate(
        &ca_params("td", KeyAlgorithm::EcdsaP256, HOUR),
        before_epoch
    )
    .is_err());
}

#[test]
fn persisted_round_trip_keeps_the_ca() {
    let ca = generated("td", KeyAlgorithm::EcdsaP256);
    let (chain, key) = ca.to_pem();
    let key = key.expect("a software key");
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"));
    let again =
        CertificateAuthority::from_persisted(chain.as_bytes(), key.as_bytes()).expect("reloads");
    assert_eq!(again.id(), ca.id());
    assert_eq!(again.subject(), ca.subject());
    assert_eq!(again.trust_domain(), ca.trust_domain());
    assert_eq!(again.not_after(), ca.not_after());
    assert_eq!(again.bundle_pems(), ca.bundle_pems());
    let req = request("spiffe://td/w", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = again.issue(&req, now()).expect("issues");
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now())
        .expect("the reloaded CA is the same CA");

    // A different key is refused.
    let (other, _) = PrivateKey::generate(KeyAlgorithm::EcdsaP256).expect("keygen");
    let err = CertificateAuthority::from_persisted(chain.as_bytes(), other.to_pem().as_bytes())
        .expect_err("mismatch");
    assert!(err.to_string().contains("does not match"), "{err}");
}

#[test]
fn debug_output_holds_no_key_material() {
    let ca = generated("td", KeyAlgorithm::EcdsaP256);
    let key_pem = ca.to_pem().1.expect("a software key");
    let body: String = key_pem
        .lines()
        .nth(1)
        .expect("a base64 line")
        .chars()
        .take(24)
        .collect();
    let debug = format!("{ca:?}");
    assert!(debug.contains("[redacted]"), "{debug}");
    assert!(!debug.contains(&body));
    let svid = ca
        .issue(
            &request("spiffe://td/w", KeyAlgorithm::EcdsaP256, HOUR),
            now(),
        )
        .expect("issues");
    let svid_key: String = svid
        .key
        .to_pem()
        .lines()
        .nth(1)
        .expect("line")
        .chars()
        .take(24)
        .collect();
    let debug = format!("{svid:?}");
    assert!(
        debug.contains("PrivateKey([redacted])") && !debug.contains(&svid_key),
        "{debug}"
    );
}

#[test]
fn ca_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CertificateAuthority>();
    assert_send_sync::<meshca_ca::Svid>();
}

#[test]
fn the_floor_does_real_work() {
    // One floor unit generates a key and signs; ten of them take measurable time and all succeed.
    let started = std::time::Instant::now();
    for _ in 0..10 {
        meshca_ca::floor_once().expect("each floor unit runs");
    }
    assert!(started.elapsed() > std::time::Duration::ZERO);
}

/// A key generated ahead is the one the certificate carries; one of another algorithm is not used.
#[test]
fn a_key_generated_ahead_is_the_one_issued() {
    let ca = generated("default.zone-1.mesh.local", KeyAlgorithm::EcdsaP256);
    let req = request(
        "spiffe://default.zone-1.mesh.local/workload/web",
        KeyAlgorithm::Rsa2048,
        HOUR,
    );
    let ahead = GeneratedKey::new(KeyAlgorithm::Rsa2048).expect("generates");
    let public = ahead.public().clone();
    let svid = ca.issue_with_key(&req, Some(ahead), now()).expect("issues");
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now()).expect("verifies");
    let (_, leaf) = X509Certificate::from_der(&svid.chain_der[0]).expect("parses");
    assert_eq!(
        leaf.public_key().subject_public_key.data.as_ref(),
        public.raw()
    );
    assert_eq!(svid.key.public_key().expect("parses"), public);

    let other = GeneratedKey::new(KeyAlgorithm::EcdsaP384).expect("generates");
    let unused = other.public().clone();
    let svid = ca.issue_with_key(&req, Some(other), now()).expect("issues");
    assert_eq!(svid.key.algorithm(), KeyAlgorithm::Rsa2048);
    assert_ne!(svid.key.public_key().expect("parses"), unused);
}

#[test]
fn a_leaf_for_a_requests_key_follows_the_rules_and_holds_that_key() {
    let ca = generated("default.zone-1.mesh.local", KeyAlgorithm::EcdsaP256);
    // The workload's key stays with it: only its request reaches the CA.
    let workload_key =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("a workload key");
    let mut params =
        rcgen::CertificateParams::new(vec!["what.the.request.says".to_owned()]).expect("params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&workload_key)
        .expect("a request")
        .der()
        .to_vec();
    let public = meshca_ca::csr_public_key(&csr).expect("the request verifies");
    let req = request(
        "spiffe://default.zone-1.mesh.local/workload/web",
        KeyAlgorithm::EcdsaP256,
        HOUR,
    );
    let leaf = ca.issue_for_key(&req, &public, now()).expect("issues");
    check_svid_rules(&leaf.chain_der[0]).expect("the SVID rules hold");
    verify_svid(&leaf.chain_der, &ca.bundle_der(), &req.spiffe_id, now())
        .expect("verifies with webpki");
    let (_, cert) = X509Certificate::from_der(&leaf.chain_der[0]).expect("parses");
    assert_eq!(
        cert.public_key().subject_public_key.data.as_ref(),
        rcgen::PublicKeyData::der_bytes(&workload_key),
        "the certificate holds the workload's key"
    );
    // Only the CA's SPIFFE ID: the DNS name the request asked for is not in it.
    let sans = cert
        .subject_alternative_name()
        .expect("SANs parse")
        .expect("present");
    assert_eq!(sans.value.general_names.len(), 1);
    assert_eq!(leaf.issuer_id, ca.id());

    // A key of another algorithm than leaves are issued for is refused.
    let p384 = request(
        "spiffe://default.zone-1.mesh.local/workload/web",
        KeyAlgorithm::EcdsaP384,
        HOUR,
    );
    assert!(matches!(
        ca.issue_for_key(&p384, &public, now()),
        Err(IssueError::KeyAlgorithm {
            found: KeyAlgorithm::EcdsaP256,
            expected: KeyAlgorithm::EcdsaP384
        })
    ));
}
