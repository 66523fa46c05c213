//! The pre-publication verifier and the rule checker must reject what breaks the rules; inspection.

mod common;

use common::*;
use meshca_ca::{
    check_svid_rules, inspect_pem, verify_structure, verify_svid, InspectError, IssuerFacts,
    KeyAlgorithm, VerifyError,
};
use rcgen::{
    DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose, SanType,
    SerialNumber,
};

/// A leaf made by rcgen under `root`, starting from a rule-abiding SVID shape; `edit` breaks it.
fn leaf_with(root: &TestCert, edit: impl FnOnce(&mut rcgen::CertificateParams)) -> Vec<u8> {
    let mut p = rcgen::CertificateParams::default();
    p.distinguished_name = DistinguishedName::new();
    p.subject_alt_names = vec![SanType::URI(
        "spiffe://corp.example/w".try_into().expect("ia5"),
    )];
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    p.serial_number = Some(SerialNumber::from_slice(&[0x41; 16]));
    p.not_before = (now() - HOUR).into();
    p.not_after = (now() + HOUR).into();
    p.use_authority_key_identifier_extension = true;
    edit(&mut p);
    signed_by(p, root).der
}

/// A change that breaks one rule of a baseline leaf.
type Edit = Box<dyn FnOnce(&mut rcgen::CertificateParams)>;

fn broken_rules(der: &[u8]) -> Vec<String> {
    check_svid_rules(der).expect_err("must break a rule")
}

#[test]
fn the_baseline_rcgen_leaf_passes() {
    let root = self_signed(ca_cert_params("Root", None));
    let leaf = leaf_with(&root, |_| {});
    check_svid_rules(&leaf).expect("baseline is valid");
    verify_svid(
        &[leaf],
        std::slice::from_ref(&root.der),
        &id("spiffe://corp.example/w"),
        now(),
    )
    .expect("verifies");
}

#[test]
fn rule_checker_names_each_broken_rule() {
    let root = self_signed(ca_cert_params("Root", None));
    let cases: Vec<(&str, Edit)> = vec![
        (
            "exactly one URI SAN",
            Box::new(|p| {
                p.subject_alt_names.push(SanType::URI(
                    "spiffe://corp.example/x".try_into().expect("ia5"),
                ))
            }),
        ),
        (
            "exactly one URI SAN",
            Box::new(|p| {
                p.subject_alt_names = vec![SanType::DnsName("web".try_into().expect("ia5"))]
            }),
        ),
        (
            "root ID",
            Box::new(|p| {
                p.subject_alt_names = vec![SanType::URI(
                    "spiffe://corp.example".try_into().expect("ia5"),
                )]
            }),
        ),
        (
            "not a valid SPIFFE ID",
            Box::new(|p| {
                p.subject_alt_names = vec![SanType::URI(
                    "spiffe://corp.example/a/../b".try_into().expect("ia5"),
                )]
            }),
        ),
        (
            "cA must be false",
            Box::new(|p| p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained)),
        ),
        (
            "basicConstraints is missing",
            Box::new(|p| p.is_ca = IsCa::NoCa),
        ),
        ("keyUsage is missing", Box::new(|p| p.key_usages.clear())),
        (
            "digitalSignature",
            Box::new(|p| p.key_usages = vec![KeyUsagePurpose::KeyEncipherment]),
        ),
        (
            "keyCertSign",
            Box::new(|p| p.key_usages.push(KeyUsagePurpose::KeyCertSign)),
        ),
        (
            "keyEncipherment is only allowed for RSA",
            Box::new(|p| p.key_usages.push(KeyUsagePurpose::KeyEncipherment)),
        ),
        (
            "bits an SVID must not have",
            Box::new(|p| p.key_usages.push(KeyUsagePurpose::KeyAgreement)),
        ),
        (
            "serverAuth and clientAuth",
            Box::new(|p| p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth]),
        ),
        (
            "serverAuth and clientAuth",
            Box::new(|p| p.extended_key_usages.clear()),
        ),
        (
            "at least 64",
            Box::new(|p| p.serial_number = Some(SerialNumber::from_slice(&[0x01, 0x02, 0x03]))),
        ),
        (
            "has 0 bits",
            Box::new(|p| p.serial_number = Some(SerialNumber::from_slice(&[0x00; 9]))),
        ),
        (
            "authorityKeyIdentifier",
            Box::new(|p| p.use_authority_key_identifier_extension = false),
        ),
    ];
    for (want, edit) in cases {
        let errors = broken_rules(&leaf_with(&root, edit));
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "want {want:?} in {errors:?}"
        );
    }
    // A non-empty subject makes a non-critical SAN acceptable; the empty-subject rule is checked on
    // certificates with an empty subject only (rcgen marks the SAN critical then, so the rule passes).
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "web");
    check_svid_rules(&leaf_with(&root, |p| p.distinguished_name = dn))
        .expect("subject + non-critical SAN is fine");
    // A CA certificate is not an SVID.
    let errors = broken_rules(&root.der);
    assert!(errors.len() >= 3, "{errors:?}");
    assert_eq!(broken_rules(b"junk").len(), 1);
}

#[test]
fn non_critical_san_with_empty_subject_is_caught() {
    // rcgen always marks the SAN critical for an empty subject, so flip the criticality byte by hand:
    // the rule checker reads the DER and does not care about the signature.
    let root = self_signed(ca_cert_params("Root", None));
    let mut der = leaf_with(&root, |_| {});
    // SAN extension: OID 2.5.29.17 (06 03 55 1d 11) followed by BOOLEAN TRUE (01 01 ff).
    let needle = [0x06, 0x03, 0x55, 0x1d, 0x11, 0x01, 0x01, 0xff];
    let at = der
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("critical SAN present");
    der[at + 7] = 0x00;
    let errors = broken_rules(&der);
    assert!(
        errors.iter().any(|e| e.contains("must be critical")),
        "{errors:?}"
    );
}

#[test]
fn verify_rejects_wrong_id_wrong_anchor_and_bad_times() {
    let ca = generated("td", KeyAlgorithm::EcdsaP256);
    let req = request("spiffe://td/web", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = ca.issue(&req, now()).expect("issues");
    let anchors = ca.bundle_der();
    verify_svid(&svid.chain_der, &anchors, &req.spiffe_id, now()).expect("baseline verifies");

    let err = verify_svid(&svid.chain_der, &anchors, &id("spiffe://td/api"), now())
        .expect_err("wrong id");
    assert!(
        matches!(err, VerifyError::WrongId { ref found, .. } if found == &["spiffe://td/web".to_string()]),
        "{err}"
    );

    let other = generated("td", KeyAlgorithm::EcdsaP256);
    let err = verify_svid(&svid.chain_der, &other.bundle_der(), &req.spiffe_id, now())
        .expect_err("other CA");
    assert!(matches!(err, VerifyError::Chain { .. }), "{err}");

    let err = verify_svid(&svid.chain_der, &anchors, &req.spiffe_id, now() + 2 * HOUR)
        .expect_err("expired");
    assert!(matches!(err, VerifyError::Chain { .. }), "{err}");
    let err = verify_svid(&svid.chain_der, &anchors, &req.spiffe_id, now() - HOUR)
        .expect_err("not yet valid");
    assert!(matches!(err, VerifyError::Chain { .. }), "{err}");

    assert_eq!(
        verify_svid(&[], &anchors, &req.spiffe_id, now()),
        Err(VerifyError::EmptyChain)
    );
    let err = verify_svid(&svid.chain_der, &[b"junk".to_vec()], &req.spiffe_id, now())
        .expect_err("bad anchor");
    assert!(
        matches!(err, VerifyError::BadAnchor { position: 1, .. }),
        "{err}"
    );

    // A leaf that breaks a rule fails even though webpki would accept its chain.
    let root = self_signed(ca_cert_params("Root", None));
    let leaf = leaf_with(&root, |p| p.key_usages.push(KeyUsagePurpose::KeyCertSign));
    let err = verify_svid(
        &[leaf],
        std::slice::from_ref(&root.der),
        &id("spiffe://corp.example/w"),
        now(),
    )
    .expect_err("rules");
    assert!(matches!(err, VerifyError::Rules(_)), "{err}");
}

#[test]
fn verify_rejects_a_leaf_outliving_its_issuer() {
    let mut p = ca_cert_params("Short Root", None);
    p.not_after = (now() + HOUR).into();
    let root = self_signed(p);
    let leaf = leaf_with(&root, |p| p.not_after = (now() + 2 * HOUR).into());
    let err = verify_svid(
        &[leaf],
        std::slice::from_ref(&root.der),
        &id("spiffe://corp.example/w"),
        now(),
    )
    .expect_err("outlives");
    assert!(matches!(err, VerifyError::OutlivesIssuer { .. }), "{err}");
}

#[test]
fn inspect_decodes_chains_and_skips_keys() {
    let (root, int) = root_and_intermediate();
    let ca = meshca_ca::CertificateAuthority::from_pem(
        format!("{}{}", int.pem, root.pem).as_bytes(),
        int.key_pem().as_bytes(),
        &meshca_ca::ProvidedOptions::default(),
        now(),
    )
    .expect("loads");
    let svid = ca
        .issue(
            &request("spiffe://corp.example/w", KeyAlgorithm::EcdsaP384, HOUR),
            now(),
        )
        .expect("issues");
    let file = format!(
        "{}{}{}",
        svid.chain_pem,
        svid.key.to_pem().as_str(),
        root.pem
    );
    let infos = inspect_pem(file.as_bytes()).expect("inspects");
    assert_eq!(
        infos.len(),
        3,
        "leaf, intermediate, root; the key is skipped"
    );
    let leaf = &infos[0];
    assert_eq!(leaf.spiffe_ids, ["spiffe://corp.example/w"]);
    assert_eq!(leaf.subject, "");
    assert!(
        leaf.issuer.contains("CN=Example Mesh Intermediate"),
        "{}",
        leaf.issuer
    );
    assert_eq!(leaf.serial, svid.serial);
    assert_eq!(leaf.key, "ECDSA P-384");
    assert!(!leaf.is_ca);
    assert_eq!(leaf.not_before, "2029-12-31T23:59:57Z");
    assert_eq!(leaf.not_after, "2030-01-01T01:00:07Z");
    assert_eq!(
        leaf.fingerprint_sha256,
        hex::encode(ring::digest::digest(
            &ring::digest::SHA256,
            &svid.chain_der[0]
        ))
    );
    assert!(infos[1].is_ca && infos[2].is_ca);
    assert_eq!(infos[2].key, "ECDSA P-256");
    assert_eq!(infos[1].spiffe_ids, ["spiffe://corp.example"]);

    assert_eq!(inspect_pem(b""), Err(InspectError::NoCertificate));
    assert_eq!(
        inspect_pem(svid.key.to_pem().as_bytes()),
        Err(InspectError::NoCertificate)
    );
    let junk = pem::encode(&pem::Pem::new("CERTIFICATE", vec![1, 2, 3]));
    assert!(matches!(
        inspect_pem(junk.as_bytes()),
        Err(InspectError::Unparsable { position: 1, .. })
    ));
}

#[test]
fn a_ca_verifies_its_own_svids_with_anchors_read_once_and_the_same_verdicts() {
    let ca = generated("td", KeyAlgorithm::EcdsaP256);
    let req = request("spiffe://td/web", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = ca.issue(&req, now()).expect("issues");
    for _ in 0..2 {
        ca.verify_issued(&svid.chain_der, &req.spiffe_id, now())
            .expect("verifies, first with fresh anchors then with the ones kept");
    }
    let err = ca
        .verify_issued(&svid.chain_der, &id("spiffe://td/api"), now())
        .expect_err("wrong id");
    assert!(matches!(err, VerifyError::WrongId { .. }), "{err}");
    let other = generated("td", KeyAlgorithm::EcdsaP256);
    let foreign = other.issue(&req, now()).expect("issues");
    let err = ca
        .verify_issued(&foreign.chain_der, &req.spiffe_id, now())
        .expect_err("another CA's SVID");
    assert!(matches!(err, VerifyError::Chain { .. }), "{err}");
    let err = ca
        .verify_issued(&svid.chain_der, &req.spiffe_id, now() + 2 * HOUR)
        .expect_err("expired");
    assert!(matches!(err, VerifyError::Chain { .. }), "{err}");
}

#[test]
fn an_intermediate_that_allows_only_client_auth_fails_the_server_auth_pass() {
    let root = self_signed(ca_cert_params("Root", None));
    let mut p = ca_cert_params("Client-only Intermediate", None);
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let intermediate = signed_by(p, &root);
    let leaf = leaf_with(&intermediate, |_| {});
    let err = verify_svid(
        &[leaf, intermediate.der.clone()],
        std::slice::from_ref(&root.der),
        &id("spiffe://corp.example/w"),
        now(),
    )
    .expect_err("the chain may not serve serverAuth");
    assert!(
        matches!(
            err,
            VerifyError::Chain {
                usage: "serverAuth",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn the_structural_check_holds_a_leaf_to_its_ca_without_the_signature() {
    let ca = generated("td", KeyAlgorithm::EcdsaP256);
    let req = request("spiffe://td/web", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = ca.issue(&req, now()).expect("issues");
    let facts = IssuerFacts::read(ca.cert_der(), ca.chain_after_leaf_der(), &ca.bundle_der())
        .expect("the CA's facts");
    verify_structure(&svid.chain_der, &facts, &req.spiffe_id, now()).expect("its own SVID");

    let err = verify_structure(&svid.chain_der, &facts, &id("spiffe://td/api"), now())
        .expect_err("wrong id");
    assert!(matches!(err, VerifyError::WrongId { .. }), "{err}");
    let err = verify_structure(&svid.chain_der, &facts, &req.spiffe_id, now() + 2 * HOUR)
        .expect_err("expired");
    assert!(matches!(err, VerifyError::Chain { .. }), "{err}");
    let other = generated("td", KeyAlgorithm::EcdsaP256);
    let foreign = other.issue(&req, now()).expect("issues");
    let err = verify_structure(&foreign.chain_der, &facts, &req.spiffe_id, now())
        .expect_err("another CA's SVID");
    assert!(err.to_string().contains("issuer name"), "{err}");
    let mut longer = svid.chain_der.clone();
    longer.push(other.cert_der().to_vec());
    let err = verify_structure(&longer, &facts, &req.spiffe_id, now()).expect_err("extra chain");
    assert!(err.to_string().contains("chain after the leaf"), "{err}");

    // An impostor CA with the very same subject but another key: the key identifier gives it away.
    let real = self_signed(ca_cert_params("Twin", None));
    let impostor = self_signed(ca_cert_params("Twin", None));
    let facts = IssuerFacts::read(&real.der, &[], std::slice::from_ref(&real.der)).expect("facts");
    let leaf = leaf_with(&impostor, |_| {});
    let err = verify_structure(&[leaf], &facts, &id("spiffe://corp.example/w"), now())
        .expect_err("impostor");
    assert!(err.to_string().contains("authorityKeyIdentifier"), "{err}");
}
