//! Provided CAs: a good intermediate+root chain, and one test per refusal with its message.

mod common;

use common::*;
use meshca_ca::{
    check_svid_rules, verify_svid, CertificateAuthority, KeyAlgorithm, ProvidedCaError,
    ProvidedOptions,
};
use rcgen::{IsCa, KeyPair, KeyUsagePurpose, SanType};

const STRICT: ProvidedOptions = ProvidedOptions {
    allow_self_signed: false,
};
const LAX: ProvidedOptions = ProvidedOptions {
    allow_self_signed: true,
};

fn load(
    chain: &str,
    key: &str,
    opts: &ProvidedOptions,
) -> Result<CertificateAuthority, ProvidedCaError> {
    CertificateAuthority::from_pem(chain.as_bytes(), key.as_bytes(), opts, now())
}

fn refuse(chain: &str, key: &str, opts: &ProvidedOptions) -> (ProvidedCaError, String) {
    let err = load(chain, key, opts).expect_err("must be refused");
    let msg = err.to_string();
    (err, msg)
}

#[test]
fn intermediate_and_root_chain_issues_verifiable_svids() {
    let (root, int) = root_and_intermediate();
    let chain = format!("{}{}", int.pem, root.pem);
    let ca = load(&chain, &int.key_pem(), &STRICT).expect("a proper chain loads");
    assert_eq!(ca.trust_domain().map(|t| t.as_str()), Some("corp.example"));
    assert_eq!(
        ca.bundle_der(),
        vec![root.der.clone()],
        "the root is the trust anchor"
    );
    assert_eq!(
        ca.chain_above_pem(),
        int.pem,
        "the intermediate follows leaves; the root does not"
    );

    let req = request(
        "spiffe://corp.example/ns/shop/sa/web",
        KeyAlgorithm::EcdsaP256,
        HOUR,
    );
    let svid = ca.issue(&req, now()).expect("issues");
    assert_eq!(svid.chain_der.len(), 2);
    assert_eq!(svid.chain_der[1], int.der);
    assert_eq!(
        svid.chain_pem.matches("BEGIN CERTIFICATE").count(),
        2,
        "leaf + intermediate, no root"
    );
    check_svid_rules(&svid.chain_der[0]).expect("leaf rules");
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now())
        .expect("verifies to the root");
    // Without the intermediate the leaf does not reach the root.
    assert!(verify_svid(
        &svid.chain_der[..1],
        &ca.bundle_der(),
        &req.spiffe_id,
        now()
    )
    .is_err());

    // The persisted form keeps the whole chain.
    let (pem, key) = ca.to_pem();
    let key = key.expect("a software key");
    let again =
        CertificateAuthority::from_persisted(pem.as_bytes(), key.as_bytes()).expect("reloads");
    assert_eq!(again.bundle_der(), ca.bundle_der());
    assert_eq!(again.chain_above_pem(), ca.chain_above_pem());
}

#[test]
fn intermediate_alone_is_its_own_anchor() {
    let (_root, int) = root_and_intermediate();
    let ca =
        load(&int.pem, &int.key_pem(), &STRICT).expect("an intermediate without its root loads");
    assert_eq!(ca.bundle_der(), vec![int.der.clone()]);
    assert_eq!(ca.chain_above_pem(), "");
}

#[test]
fn ca_without_spiffe_uri_has_no_trust_domain_and_issues_any() {
    let root = self_signed(ca_cert_params("Plain Root", None));
    let ca = load(&root.pem, &root.key_pem(), &LAX).expect("loads");
    assert_eq!(ca.trust_domain(), None);
    let req = request("spiffe://default/web", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = ca.issue(&req, now()).expect("issues");
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, now()).expect("verifies");
}

#[test]
fn self_signed_needs_the_insecure_switch() {
    let root = self_signed(ca_cert_params("Lonely Root", Some("spiffe://corp.example")));
    let (err, msg) = refuse(&root.pem, &root.key_pem(), &STRICT);
    assert!(
        matches!(err, ProvidedCaError::SelfSignedNotAllowed { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("insecureAllowSelfSigned") && msg.contains("Lonely Root"),
        "{msg}"
    );
    load(&root.pem, &root.key_pem(), &LAX).expect("allowed with the switch");
}

#[test]
fn pem_problems() {
    let root = self_signed(ca_cert_params("Root", None));
    let (err, msg) = refuse("", &root.key_pem(), &LAX);
    assert!(matches!(err, ProvidedCaError::NoCertificate), "{err:?}");
    assert!(msg.contains("no certificate"), "{msg}");

    let (err, _) = refuse(
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
        &root.key_pem(),
        &LAX,
    );
    assert!(
        matches!(err, ProvidedCaError::UnreadableCertPem(_)),
        "{err:?}"
    );

    let chain = format!("{}{}", root.pem, root.key_pem());
    let (err, msg) = refuse(&chain, &root.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::UnexpectedPemBlock { ref label } if label == "PRIVATE KEY"),
        "{err:?}"
    );
    assert!(msg.contains("PRIVATE KEY"), "{msg}");

    let junk = pem::encode(&pem::Pem::new(
        "CERTIFICATE",
        vec![0x30, 0x03, 0x02, 0x01, 0x01],
    ));
    let (err, msg) = refuse(&junk, &root.key_pem(), &LAX);
    assert!(
        matches!(
            err,
            ProvidedCaError::UnparsableCertificate { position: 1, .. }
        ),
        "{err:?}"
    );
    assert!(msg.contains("certificate 1"), "{msg}");

    let (err, msg) = refuse(&root.pem, "not a key", &LAX);
    assert!(matches!(err, ProvidedCaError::UnreadableKey(_)), "{err:?}");
    assert!(msg.contains("private key"), "{msg}");
}

#[test]
fn key_must_match() {
    let root = self_signed(ca_cert_params("Root", None));
    let other = new_key();
    let (err, msg) = refuse(&root.pem, &other.serialize_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::KeyMismatch { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("does not match") && msg.contains("CN=Root"),
        "{msg}"
    );
    // The root's key for the intermediate's certificate is a mismatch too.
    let (root, int) = root_and_intermediate();
    let (err, _) = refuse(
        &format!("{}{}", int.pem, root.pem),
        &root.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::KeyMismatch { .. }),
        "{err:?}"
    );
}

#[test]
fn every_certificate_must_be_a_ca() {
    let (root, _) = root_and_intermediate();
    let mut p = ca_cert_params("Not A CA", None);
    p.is_ca = IsCa::ExplicitNoCa;
    let leafish = signed_by(p, &root);
    let (err, msg) = refuse(
        &format!("{}{}", leafish.pem, root.pem),
        &leafish.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::NotCa { position: 1, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("not a CA") && msg.contains("Not A CA"),
        "{msg}"
    );

    // A non-CA above the signing CA is refused with its position.
    let mut p = ca_cert_params("Fake Root", None);
    p.is_ca = IsCa::NoCa;
    let fake_root = self_signed(p);
    let int = signed_by(ca_cert_params("Int", None), &fake_root);
    let (err, _) = refuse(
        &format!("{}{}", int.pem, fake_root.pem),
        &int.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::NotCa { position: 2, .. }),
        "{err:?}"
    );
}

#[test]
fn key_usage_rules() {
    let mut p = ca_cert_params("No CertSign", None);
    p.key_usages = vec![KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let c = self_signed(p);
    let (err, msg) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::MissingKeyCertSign { .. }),
        "{err:?}"
    );
    assert!(msg.contains("keyCertSign"), "{msg}");

    let mut p = ca_cert_params("No KeyUsage", None);
    p.key_usages = vec![];
    let c = self_signed(p);
    let (err, _) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::MissingKeyCertSign { .. }),
        "{err:?}"
    );

    let mut p = ca_cert_params("Agreeable", None);
    p.key_usages.push(KeyUsagePurpose::KeyAgreement);
    let c = self_signed(p);
    let (err, msg) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::HasKeyAgreement { .. }),
        "{err:?}"
    );
    assert!(msg.contains("keyAgreement"), "{msg}");
}

#[test]
fn validity_rules() {
    let mut p = ca_cert_params("Old", None);
    p.not_before = (now() - 400 * DAY).into();
    p.not_after = (now() - DAY).into();
    let c = self_signed(p);
    let (err, msg) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(matches!(err, ProvidedCaError::Expired { .. }), "{err:?}");
    assert!(msg.contains("expired at 2029-12-31T00:00:07Z"), "{msg}");

    let mut p = ca_cert_params("Future", None);
    p.not_before = (now() + DAY).into();
    let c = self_signed(p);
    let (err, msg) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::NotYetValid { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("not valid before 2030-01-02T00:00:07Z"),
        "{msg}"
    );

    // An expired root above a valid intermediate is refused too.
    let mut p = ca_cert_params("Old Root", None);
    p.not_after = (now() - HOUR).into();
    let root = self_signed(p);
    let int = signed_by(ca_cert_params("Int", None), &root);
    let (err, _) = refuse(&format!("{}{}", int.pem, root.pem), &int.key_pem(), &STRICT);
    assert!(
        matches!(err, ProvidedCaError::Expired { position: 2, .. }),
        "{err:?}"
    );
}

#[test]
fn unsupported_key_type() {
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519");
    let c = self_signed_with(ca_cert_params("Edwards", None), key);
    let (err, msg) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::UnsupportedKeyType { ref found, .. } if found == "Ed25519"),
        "{err:?}"
    );
    assert!(msg.contains("Ed25519") && msg.contains("P-256"), "{msg}");
}

#[test]
fn chain_must_link() {
    let (_, int) = root_and_intermediate();
    let stranger = self_signed(ca_cert_params("Stranger Root", None));
    let (err, msg) = refuse(
        &format!("{}{}", int.pem, stranger.pem),
        &int.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::ChainBroken { position: 1, .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("does not link") && msg.contains("Stranger Root"),
        "{msg}"
    );

    // Same subject, different key: the names link but the signature does not.
    let impostor = self_signed(ca_cert_params(
        "Example Root",
        Some("spiffe://corp.example"),
    ));
    let (err, msg) = refuse(
        &format!("{}{}", int.pem, impostor.pem),
        &int.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::ChainBroken { position: 1, .. }),
        "{err:?}"
    );
    assert!(msg.contains("signature"), "{msg}");

    // A root whose own signature is damaged is refused even though the intermediate links to it.
    let (root, int) = root_and_intermediate();
    let mut bad_root = root.der.clone();
    let last = bad_root.len() - 1;
    bad_root[last] ^= 0x01;
    let bad_root_pem = pem::encode(&pem::Pem::new("CERTIFICATE", bad_root));
    let (err, _) = refuse(
        &format!("{}{}", int.pem, bad_root_pem),
        &int.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::ChainBroken { position: 2, .. }),
        "{err:?}"
    );

    // Root first, intermediate second: the wrong order does not link either.
    let (root, int) = root_and_intermediate();
    let (err, _) = refuse(
        &format!("{}{}", root.pem, int.pem),
        &root.key_pem(),
        &STRICT,
    );
    assert!(
        matches!(err, ProvidedCaError::ChainBroken { .. }),
        "{err:?}"
    );
}

#[test]
fn invalid_spiffe_uri_is_named() {
    let mut p = ca_cert_params("Bad URI", None);
    p.subject_alt_names = vec![SanType::URI(
        "spiffe://Corp.Example".try_into().expect("ia5"),
    )];
    let c = self_signed(p);
    let (err, msg) = refuse(&c.pem, &c.key_pem(), &LAX);
    assert!(
        matches!(err, ProvidedCaError::InvalidSpiffeUri { .. }),
        "{err:?}"
    );
    assert!(
        msg.contains("spiffe://Corp.Example") && msg.contains("uppercase"),
        "{msg}"
    );
}

#[test]
fn subject_rcgen_cannot_reproduce_is_refused_not_mangled() {
    // Re-tag the CN (PrintableString "12345") as a NumericString, which rcgen cannot re-encode.
    // The signature no longer matches, so this goes through the persisted path (parse + key match only).
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(
        rcgen::DnType::CommonName,
        rcgen::DnValue::PrintableString("12345".try_into().expect("printable")),
    );
    let mut p = ca_cert_params("x", None);
    p.distinguished_name = dn;
    let c = self_signed(p);
    let needle = [0x06, 0x03, 0x55, 0x04, 0x03, 0x13, 0x05];
    let mut der = c.der.clone();
    let mut patched = 0;
    for i in 0..der.len() - needle.len() {
        if der[i..i + needle.len()] == needle {
            der[i + 5] = 0x12;
            patched += 1;
        }
    }
    assert_eq!(patched, 2, "issuer and subject");
    let pem = pem::encode(&pem::Pem::new("CERTIFICATE", der));
    let err = CertificateAuthority::from_persisted(pem.as_bytes(), c.key_pem().as_bytes())
        .expect_err("refused");
    assert!(err.to_string().contains("cannot reproduce"), "{err}");
}

#[test]
fn a_ca_made_a_moment_ago_issues_leaves_that_start_with_it() {
    // The CA starts at this very second, as one an operator (or an export) has just made; a leaf is
    // backdated for clock skew, but not to before its CA, or path validation would refuse it.
    let issued_at = now();
    let mut params = ca_cert_params("fresh", Some("spiffe://fresh.example"));
    params.not_before = (std::time::UNIX_EPOCH + std::time::Duration::from_secs(NOW_SECS)).into();
    let ca_cert = self_signed(params);
    let ca = load(&ca_cert.pem, &ca_cert.key_pem(), &LAX).expect("loads");
    let req = request("spiffe://fresh.example/web", KeyAlgorithm::EcdsaP256, HOUR);
    let svid = ca.issue(&req, issued_at).expect("issues");
    // The check the owner makes before publishing: within the CA's validity.
    ca.verify_issued(&svid.chain_der, &req.spiffe_id, issued_at)
        .expect("the leaf starts no earlier than its CA");
    verify_svid(&svid.chain_der, &ca.bundle_der(), &req.spiffe_id, issued_at).expect("verifies");
}
