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
