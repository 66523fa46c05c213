use super::*;
use crate::test_fixtures::rsa_2048_pkcs8_pem;

#[test]
fn ring_pkcs8_ends_with_the_public_point() {
    // The issuance path relies on this layout instead of re-parsing each new key.
    for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384] {
        for _ in 0..8 {
            let (private, public) = PrivateKey::generate(algorithm).expect("keygen");
            let parsed = private.public_key().expect("ring parses its own key");
            assert_eq!(public, parsed, "{algorithm}");
            assert_eq!(public.raw()[0], 0x04, "uncompressed point");
            assert_eq!(private.algorithm(), algorithm);
        }
    }
}

#[test]
fn debug_never_prints_key_material() {
    let (private, _) = PrivateKey::generate(KeyAlgorithm::EcdsaP256).expect("keygen");
    assert_eq!(format!("{private:?}"), "PrivateKey([redacted])");
    assert_eq!(format!("{:#?}", private.clone()), "PrivateKey([redacted])");
}

#[test]
fn pem_round_trips() {
    for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384] {
        let (private, public) = PrivateKey::generate(algorithm).expect("keygen");
        let pem = private.to_pem();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
        let back = PrivateKey::from_pem(pem.as_bytes()).expect("reads its own PEM");
        assert_eq!(back.pkcs8_der(), private.pkcs8_der());
        assert_eq!(back.algorithm(), algorithm);
        assert_eq!(back.public_key().expect("public"), public);
    }
    let rsa = PrivateKey::from_pem(rsa_2048_pkcs8_pem().as_bytes()).expect("fixture");
    assert_eq!(rsa.algorithm(), KeyAlgorithm::Rsa2048);
}

/// Extracts the inner key of a PKCS#8 document (what SEC1 and PKCS#1 files hold).
fn inner_key(pkcs8: &[u8]) -> Vec<u8> {
    let (_, info, _) = der::read_tlv(pkcs8).expect("seq");
    let (_, _, rest) = der::read_tlv(info).expect("version");
    let (_, _, rest) = der::read_tlv(rest).expect("alg id");
    let (_, key, _) = der::read_tlv(rest).expect("key");
    key.to_vec()
}

fn pem_block(label: &str, der: &[u8]) -> String {
    ::pem::encode(&::pem::Pem::new(label, der.to_vec()))
}

#[test]
fn sec1_and_pkcs1_are_converted_to_pkcs8() {
    for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::EcdsaP384] {
        let (private, public) = PrivateKey::generate(algorithm).expect("keygen");
        let sec1 = inner_key(private.pkcs8_der());
        // openssl's `ecparam -genkey` writes an EC PARAMETERS block first; it is skipped.
        let params = pem_block("EC PARAMETERS", &[0x06, 0x03, 0x2b, 0x65, 0x70]);
        let file = format!("{params}{}", pem_block("EC PRIVATE KEY", &sec1));
        let back = PrivateKey::from_pem(file.as_bytes()).expect("SEC1");
        assert_eq!(back.algorithm(), algorithm);
        assert_eq!(back.public_key().expect("public"), public);
    }
    let rsa = PrivateKey::from_pem(rsa_2048_pkcs8_pem().as_bytes()).expect("fixture");
    let pkcs1 = inner_key(rsa.pkcs8_der());
    let back =
        PrivateKey::from_pem(pem_block("RSA PRIVATE KEY", &pkcs1).as_bytes()).expect("PKCS#1");
    assert_eq!(back.algorithm(), KeyAlgorithm::Rsa2048);
    assert_eq!(
        back.public_key().expect("public"),
        rsa.public_key().expect("public")
    );
}

#[test]
fn unsupported_keys_are_named() {
    let err = |data: &[u8]| PrivateKey::from_pem(data).expect_err("must fail");

    let ed25519 =
        ring::signature::Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("keygen");
    let e = err(pem_block("PRIVATE KEY", ed25519.as_ref()).as_bytes());
    assert_eq!(e, KeyError::UnsupportedAlgorithm("Ed25519".into()));
    assert!(e.to_string().contains("Ed25519"));

    let e = err(pem_block("ENCRYPTED PRIVATE KEY", &[1, 2, 3]).as_bytes());
    assert!(
        matches!(e, KeyError::UnsupportedPem { ref label, .. } if label == "ENCRYPTED PRIVATE KEY")
    );
    assert!(e.to_string().contains("decrypt"));

    let e = err(pem_block("DSA PRIVATE KEY", &[1, 2, 3]).as_bytes());
    assert!(e.to_string().contains("DSA PRIVATE KEY"), "{e}");

    assert_eq!(err(b""), KeyError::NoKey);
    assert!(matches!(
        err(b"-----BEGIN PRIVATE KEY-----\n!!!\n-----END PRIVATE KEY-----\n"),
        KeyError::Pem(_)
    ));
    assert!(matches!(
        err(pem_block("PRIVATE KEY", &[0x30, 0x03, 1, 2, 3]).as_bytes()),
        KeyError::Malformed(_)
    ));

    let (a, _) = PrivateKey::generate(KeyAlgorithm::EcdsaP256).expect("keygen");
    let two = format!("{}{}", a.to_pem().as_str(), a.to_pem().as_str());
    assert_eq!(err(two.as_bytes()), KeyError::MultipleKeys(2));

    // A P-256 key whose embedded public point was tampered with is rejected by ring.
    let mut bad = a.pkcs8_der().to_vec();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(
        err(pem_block("PRIVATE KEY", &bad).as_bytes()),
        KeyError::Malformed(_)
    ));
}

// RSA key generation itself is exercised by the integration tests (tests/issue.rs), once per binary.
