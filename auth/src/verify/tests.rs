//! Tokens that are correctly signed but wrong inside: only the crate can forge these.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::{AuthError, Claims, SigningKey, CLOCK_SKEW_LEEWAY_SECS};

const NOW: u64 = 1_700_000_000;
const JTI: &str = "0123456789abcdef0123456789abcdef";

fn key() -> SigningKey {
    SigningKey::generate().expect("key generation works").0
}

fn good_payload() -> serde_json::Value {
    json!({
        "iss": "meshca", "sub": "default.web", "mesh": "default", "name": "web", "type": "dataplane",
        "labels": {"kuma.io/workload": "web"}, "tags": {"kuma.io/service": "web"},
        "iat": NOW, "exp": NOW + 3600, "jti": JTI,
    })
}

fn forge(key: &SigningKey, header: &str, payload: &serde_json::Value) -> String {
    key.sign(header.as_bytes(), payload.to_string().as_bytes())
        .expect("signing works")
}

const HEADER: &str = r#"{"alg":"ES256","typ":"JWT"}"#;

#[test]
fn forged_good_payload_verifies() {
    // Guards the other tests in this file: they fail for the reason they name, not a typo in the fixture.
    let key = key();
    let claims = key
        .verifier()
        .verify(&forge(&key, HEADER, &good_payload()), NOW)
        .expect("well-formed token verifies");
    assert_eq!(claims.node_id(), "default.web");
    assert_eq!(claims.id, JTI);
}

#[test]
fn wrong_issuer_is_refused() {
    let key = key();
    let mut payload = good_payload();
    payload["iss"] = json!("kuma");
    let err = key.verifier().verify(&forge(&key, HEADER, &payload), NOW);
    assert!(matches!(err, Err(AuthError::WrongIssuer { .. })), "{err:?}");
}

#[test]
fn inconsistent_or_missing_claims_are_refused() {
    let key = key();
    type Mutation = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: [(&str, Mutation); 8] = [
        ("sub", Box::new(|p| p["sub"] = json!("default.other"))),
        ("exp", Box::new(|p| p["exp"] = json!(NOW))),
        ("jti", Box::new(|p| p["jti"] = json!("short"))),
        ("jti", Box::new(|p| p["jti"] = json!(JTI.to_uppercase()))),
        (
            "mesh",
            Box::new(|p| {
                p["mesh"] = json!("de.fault");
                p["sub"] = json!("de.fault.web");
            }),
        ),
        (
            "name",
            Box::new(|p| {
                p["name"] = json!("");
                p["sub"] = json!("default.");
            }),
        ),
        (
            "labels",
            Box::new(|p| p["labels"] = json!({"bad key": "x"})),
        ),
        (
            "tags",
            Box::new(|p| p["tags"] = json!({"kuma.io/service": "bad value"})),
        ),
    ];
    for (field, mutate) in cases {
        let mut payload = good_payload();
        mutate(&mut payload);
        match key.verifier().verify(&forge(&key, HEADER, &payload), NOW) {
            Err(AuthError::InvalidClaim { field: got, .. }) => assert_eq!(got, field),
            other => panic!("expected invalid {field}, got {other:?}"),
        }
    }
}

#[test]
fn payloads_that_are_not_claim_sets_are_malformed() {
    let key = key();
    let verifier = key.verifier();
    let mut missing_exp = good_payload();
    missing_exp.as_object_mut().expect("object").remove("exp");
    let mut unknown_type = good_payload();
    unknown_type["type"] = json!("gateway");
    let mut negative_iat = good_payload();
    negative_iat["iat"] = json!(-1);
    for payload in [
        missing_exp,
        unknown_type,
        negative_iat,
        json!([1, 2]),
        json!("text"),
    ] {
        let err = verifier.verify(&forge(&key, HEADER, &payload), NOW);
        assert!(
            matches!(err, Err(AuthError::Malformed { .. })),
            "{payload}: {err:?}"
        );
    }
    let not_json = key
        .sign(HEADER.as_bytes(), b"not json")
        .expect("signing works");
    assert!(matches!(
        verifier.verify(&not_json, NOW),
        Err(AuthError::Malformed { .. })
    ));
}

#[test]
fn only_the_exact_header_is_accepted() {
    let key = key();
    let verifier = key.verifier();
    for (header, unsupported) in [
        (r#"{"alg":"HS256","typ":"JWT"}"#, true),
        (r#"{"alg":"none","typ":"JWT"}"#, true),
        (r#"{"alg":"ES384","typ":"JWT"}"#, true),
        (r#"{"alg":null,"typ":"JWT"}"#, true),
        (r#"{"typ":"JWT"}"#, false),
        (r#"{"alg":"ES256"}"#, false),
        (r#"{"alg":"ES256","typ":"JWT","kid":"x"}"#, false),
        (r#"{"alg":"ES256","typ":"JWT","jku":"https://evil"}"#, false),
        (r#"{"typ":"JWT","alg":"ES256"}"#, false),
        (r#"{"alg": "ES256","typ":"JWT"}"#, false),
        ("not json", false),
    ] {
        let err = verifier
            .verify(&forge(&key, header, &good_payload()), NOW)
            .expect_err(header);
        if unsupported {
            assert!(
                matches!(err, AuthError::UnsupportedAlgorithm { .. }),
                "{header}: {err:?}"
            );
        } else {
            assert!(
                matches!(err, AuthError::Malformed { .. }),
                "{header}: {err:?}"
            );
        }
    }
}

#[test]
fn clock_skew_leeway_boundaries() {
    let key = key();
    let verifier = key.verifier();
    let claims = Claims::new_dataplane(
        "default",
        "web",
        BTreeMap::new(),
        BTreeMap::new(),
        Duration::from_secs(100),
        NOW,
    )
    .expect("valid claims");
    let token = key.mint(&claims).expect("mints");
    let exp = NOW + 100;
    assert!(verifier
        .verify(&token, exp + CLOCK_SKEW_LEEWAY_SECS - 1)
        .is_ok());
    assert!(matches!(
        verifier.verify(&token, exp + CLOCK_SKEW_LEEWAY_SECS),
        Err(AuthError::Expired { expires_at, .. }) if expires_at == exp
    ));
    assert!(verifier
        .verify(&token, NOW - CLOCK_SKEW_LEEWAY_SECS)
        .is_ok());
    assert!(matches!(
        verifier.verify(&token, NOW - CLOCK_SKEW_LEEWAY_SECS - 1),
        Err(AuthError::NotYetValid { issued_at, .. }) if issued_at == NOW
    ));
}

#[test]
fn nbf_in_the_future_is_refused_beyond_the_leeway() {
    let key = key();
    let verifier = key.verifier();
    let with_nbf = |nbf: u64| {
        let mut payload = good_payload();
        payload["nbf"] = json!(nbf);
        forge(&key, HEADER, &payload)
    };
    let later = NOW + 600;
    match verifier.verify(&with_nbf(later), NOW) {
        Err(err @ AuthError::NotBefore { not_before, now }) => {
            assert_eq!((not_before, now), (later, NOW));
            assert!(err.to_string().contains("not valid before"), "{err}");
        }
        other => panic!("a token not valid for 10 minutes was accepted: {other:?}"),
    }
    let edge = NOW + CLOCK_SKEW_LEEWAY_SECS;
    assert!(matches!(
        verifier.verify(&with_nbf(edge + 1), NOW),
        Err(AuthError::NotBefore { .. })
    ));
    let claims = verifier
        .verify(&with_nbf(edge), NOW)
        .expect("an nbf within the clock-skew leeway is accepted");
    assert_eq!(claims.not_before, Some(edge));
    assert!(
        verifier.verify(&with_nbf(NOW - 60), NOW).is_ok(),
        "an nbf in the past is accepted"
    );
    assert!(
        verifier.verify(&with_nbf(later), later).is_ok(),
        "the same token is accepted once its nbf is reached"
    );
}

/// The token with its signature's `s` replaced by `n - s`.
fn flip_s(token: &str) -> String {
    let (signing_input, signature) = token.rsplit_once('.').expect("three segments");
    let mut signature = crate::jwt::decode(signature, "signature").expect("base64url");
    let flipped = crate::low_s::order_minus(&signature[32..]);
    signature[32..].copy_from_slice(&flipped);
    format!("{signing_input}.{}", crate::jwt::encode(&signature))
}

#[test]
fn high_s_signature_is_refused() {
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
    let key = key();
    let verifier = key.verifier();
    let token = forge(&key, HEADER, &good_payload());
    verifier
        .verify(&token, NOW)
        .expect("the minted token verifies");
    let flipped = flip_s(&token);
    assert_ne!(flipped, token);
    // The flipped signature is mathematically valid (ring accepts it): only the low-S rule refuses it.
    let (input, signature) = flipped.rsplit_once('.').expect("three segments");
    UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, verifier.public_key())
        .verify(
            input.as_bytes(),
            &crate::jwt::decode(signature, "signature").expect("base64url"),
        )
        .expect("(r, n - s) is a valid ECDSA signature");
    let err = verifier.verify(&flipped, NOW).expect_err("high S refused");
    assert!(matches!(err, AuthError::HighS), "{err:?}");
    assert!(err.to_string().contains("low-S"), "{err}");
}

#[test]
fn minted_signatures_are_always_low_s() {
    // ring picks a random nonce, so about half of its raw signatures have a high S: 64 mints without one
    // normalised would be a 2^-64 accident.
    let key = key();
    for _ in 0..64 {
        let token = forge(&key, HEADER, &good_payload());
        let signature = token.rsplit_once('.').expect("three segments").1;
        let signature = crate::jwt::decode(signature, "signature").expect("base64url");
        assert!(crate::low_s::is_low_s(&signature), "{token}");
    }
}

#[test]
fn unverified_reading_names_the_proxy_but_still_checks_the_format() {
    let key = key();
    let token = forge(&key, HEADER, &good_payload());
    let claims = crate::Verifier::read_unverified(&token).expect("well-formed");
    assert_eq!(claims.node_id(), "default.web");
    assert_eq!(
        claims.tags.get("kuma.io/service").map(String::as_str),
        Some("web")
    );
    // Expired, or signed by any key: still read (it is not a verification).
    let mut expired = good_payload();
    expired["exp"] = json!(NOW - 1);
    expired["iat"] = json!(NOW - 10);
    let other = self::key();
    assert!(crate::Verifier::read_unverified(&forge(&other, HEADER, &expired)).is_ok());
    // Malformed ones are not.
    assert!(crate::Verifier::read_unverified("a.b").is_err());
    let mut bad = good_payload();
    bad["sub"] = json!("other.web");
    assert!(crate::Verifier::read_unverified(&forge(&key, HEADER, &bad)).is_err());
}
