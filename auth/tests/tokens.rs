//! Minting and verifying through the public API, as `meshca token` and the SDS server use it.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use meshca_auth::{
    parse_label, AuthError, Claims, ProxyType, RevocationList, SigningKey, Verifier, MAX_TOKEN_LEN,
};
use proptest::prelude::*;

const NOW: u64 = 1_700_000_000;
const DAY: Duration = Duration::from_secs(86_400);

fn web_claims() -> Claims {
    let labels = BTreeMap::from([parse_label("app=web").expect("valid label")]);
    let tags =
        BTreeMap::from([parse_label("kuma.io/service=web_default_svc_80").expect("valid tag")]);
    Claims::new_dataplane("default", "web-1", labels, tags, DAY, NOW).expect("valid claims")
}

/// One key and one valid token shared by the property tests (key generation per case would dominate).
static FIXTURE: LazyLock<(SigningKey, String)> = LazyLock::new(|| {
    let (key, _) = SigningKey::generate().expect("key generation works");
    let token = key.mint(&web_claims()).expect("mints");
    (key, token)
});

#[test]
fn mint_and_verify_round_trip() {
    let (key, _) = SigningKey::generate().expect("key generation works");
    let claims = web_claims();
    let token = key.mint(&claims).expect("mints");
    let verified = key.verifier().verify(&token, NOW + 60).expect("verifies");
    assert_eq!(verified, claims);
    assert_eq!(verified.node_id(), "default.web-1");
    assert_eq!(verified.proxy_type, ProxyType::Dataplane);
    assert_eq!(
        verified.labels.get("kuma.io/workload").map(String::as_str),
        Some("web-1")
    );
    assert_eq!(
        verified.tags.get("kuma.io/service").map(String::as_str),
        Some("web_default_svc_80")
    );
}

#[test]
fn token_carries_the_documented_claim_names() {
    let (key, _) = SigningKey::generate().expect("key generation works");
    let token = key.mint(&web_claims()).expect("mints");
    let segments: Vec<&str> = token.split('.').collect();
    assert_eq!(segments.len(), 3);
    let header = URL_SAFE_NO_PAD
        .decode(segments[0])
        .expect("base64url header");
    assert_eq!(header, br#"{"alg":"ES256","typ":"JWT"}"#);
    let payload: serde_json::Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(segments[1])
            .expect("base64url claims"),
    )
    .expect("JSON claims");
    assert_eq!(payload["iss"], "meshca");
    assert_eq!(payload["sub"], "default.web-1");
    assert_eq!(payload["mesh"], "default");
    assert_eq!(payload["name"], "web-1");
    assert_eq!(payload["type"], "dataplane");
    assert_eq!(payload["labels"]["app"], "web");
    assert_eq!(payload["tags"]["kuma.io/service"], "web_default_svc_80");
    assert_eq!(payload["iat"], NOW);
    assert_eq!(payload["exp"], NOW + 86_400);
    assert_eq!(payload["jti"].as_str().map(str::len), Some(32));
    assert_eq!(
        URL_SAFE_NO_PAD
            .decode(segments[2])
            .expect("base64url signature")
            .len(),
        64
    );
}

#[test]
fn zone_egress_round_trip() {
    let (key, _) = SigningKey::generate().expect("key generation works");
    let claims = Claims::new(
        ProxyType::ZoneEgress,
        "default",
        "egress-1",
        BTreeMap::new(),
        BTreeMap::new(),
        DAY,
        NOW,
    )
    .expect("valid claims");
    let verified = key
        .verifier()
        .verify(&key.mint(&claims).expect("mints"), NOW)
        .expect("verifies");
    assert_eq!(verified.proxy_type, ProxyType::ZoneEgress);
    assert_eq!(verified.node_id(), "default.egress-1");
}

#[test]
fn expired_token_is_refused() {
    let (key, token) = &*FIXTURE;
    let err = key
        .verifier()
        .verify(token, NOW + 86_400 + 3600)
        .expect_err("expired");
    assert!(matches!(err, AuthError::Expired { .. }), "{err:?}");
}

#[test]
fn revoked_token_is_refused_and_others_pass() {
    let (key, token) = &*FIXTURE;
    let verifier = key.verifier();
    let id = verifier.verify(token, NOW).expect("verifies").id;
    let other = RevocationList::parse("ffffffffffffffffffffffffffffffff\n").expect("valid list");
    assert!(verifier.verify_with(token, NOW, &other).is_ok());
    let revoked = RevocationList::parse(&format!("# incident 42\n{id}\n")).expect("valid list");
    match verifier.verify_with(token, NOW, &revoked) {
        Err(AuthError::Revoked { id: got }) => assert_eq!(got, id),
        other => panic!("expected revoked, got {other:?}"),
    }
}

#[test]
fn token_from_another_key_is_refused() {
    let (_, token) = &*FIXTURE;
    let (other, _) = SigningKey::generate().expect("key generation works");
    assert!(matches!(
        other.verifier().verify(token, NOW),
        Err(AuthError::BadSignature)
    ));
}

#[test]
fn tampered_payload_is_refused() {
    let (key, token) = &*FIXTURE;
    let segments: Vec<&str> = token.split('.').collect();
    let mut payload: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(segments[1]).expect("base64url"))
            .expect("JSON");
    payload["labels"]["kuma.io/workload"] = serde_json::json!("admin");
    let forged = format!(
        "{}.{}.{}",
        segments[0],
        URL_SAFE_NO_PAD.encode(payload.to_string()),
        segments[2]
    );
    assert!(matches!(
        key.verifier().verify(&forged, NOW),
        Err(AuthError::BadSignature)
    ));
}

#[test]
fn alg_none_and_hs256_are_refused() {
    let (key, token) = &*FIXTURE;
    let payload = token.split('.').nth(1).expect("three segments");
    let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
    let hs_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    // HS256 "signed" with the public key as the HMAC secret: the classic key-confusion attack.
    let hs_input = format!("{hs_header}.{payload}");
    let hmac_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key.verifier().public_key());
    let hs_tag = ring::hmac::sign(&hmac_key, hs_input.as_bytes());
    for forged in [
        format!("{none_header}.{payload}."),
        format!("{hs_input}.{}", URL_SAFE_NO_PAD.encode(hs_tag.as_ref())),
    ] {
        let err = key.verifier().verify(&forged, NOW).expect_err("refused");
        assert!(
            matches!(err, AuthError::UnsupportedAlgorithm { .. }),
            "{err:?}"
        );
    }
}

#[test]
fn key_survives_pkcs8_round_trip() {
    let (key, pkcs8) = SigningKey::generate().expect("key generation works");
    assert_eq!(key.pkcs8(), Some(pkcs8.as_slice()));
    let reloaded = SigningKey::from_pkcs8(&pkcs8).expect("reloads");
    assert_eq!(reloaded.verifier(), key.verifier());
    let token = reloaded.mint(&web_claims()).expect("mints");
    assert!(key.verifier().verify(&token, NOW).is_ok());
    let shared = Verifier::from_public_key(key.verifier().public_key()).expect("valid public key");
    assert!(shared.verify(&token, NOW).is_ok());
}

#[test]
fn garbage_keys_are_refused() {
    assert!(matches!(
        SigningKey::from_pkcs8(b"not a key"),
        Err(AuthError::Key { .. })
    ));
    assert!(matches!(
        Verifier::from_public_key(&[4u8; 33]),
        Err(AuthError::Key { .. })
    ));
    // A 65-byte string that is not a curve point is accepted as bytes but never verifies anything.
    let (_, token) = &*FIXTURE;
    let mut not_a_point = [0u8; 65];
    not_a_point[0] = 4;
    let verifier = Verifier::from_public_key(&not_a_point).expect("right shape");
    assert!(matches!(
        verifier.verify(token, NOW),
        Err(AuthError::BadSignature)
    ));
}

#[test]
fn debug_output_never_shows_the_private_key() {
    let (key, pkcs8) = SigningKey::generate().expect("key generation works");
    let debug = format!("{key:?} {key:#?}");
    assert!(debug.contains("[redacted]"), "{debug}");
    assert!(debug.contains(&key.verifier().key_id()), "{debug}");
    let hex: String = pkcs8.iter().map(|b| format!("{b:02x}")).collect();
    assert!(!debug.contains(&hex[hex.len() - 32..]), "{debug}");
    assert!(
        !debug.contains(&format!("{:?}", &pkcs8[pkcs8.len() - 8..])),
        "{debug}"
    );
    assert!(
        !debug.contains(&URL_SAFE_NO_PAD.encode(&pkcs8[pkcs8.len() - 16..])),
        "{debug}"
    );
}

#[test]
fn error_messages_never_contain_the_token() {
    let (key, token) = &*FIXTURE;
    let verifier = key.verifier();
    let revoked = RevocationList::parse(&verifier.verify(token, NOW).expect("verifies").id)
        .expect("valid list");
    let (other, _) = SigningKey::generate().expect("key generation works");
    let errors = [
        verifier
            .verify(token, NOW + 10 * 86_400)
            .expect_err("expired"),
        verifier
            .verify(token, NOW - 3600)
            .expect_err("not yet valid"),
        verifier
            .verify_with(token, NOW, &revoked)
            .expect_err("revoked"),
        other
            .verifier()
            .verify(token, NOW)
            .expect_err("bad signature"),
        verifier
            .verify(&format!("{token}x"), NOW)
            .expect_err("malformed"),
    ];
    for err in errors {
        let message = err.to_string();
        for segment in token.split('.') {
            assert!(!message.contains(segment), "{message}");
        }
    }
}

#[test]
fn oversized_tokens_are_refused_before_minting_and_verifying() {
    let (key, token) = &*FIXTURE;
    let labels: BTreeMap<String, String> = (0..200)
        .map(|i| (format!("label-{i:03}"), "v".repeat(40)))
        .collect();
    let claims = Claims::new_dataplane("default", "web", labels, BTreeMap::new(), DAY, NOW)
        .expect("valid claims");
    assert!(matches!(
        key.mint(&claims),
        Err(AuthError::InvalidClaim { .. })
    ));
    let padded = format!("{token}{}", "A".repeat(MAX_TOKEN_LEN));
    assert!(matches!(
        key.verifier().verify(&padded, NOW),
        Err(AuthError::Malformed { .. })
    ));
}

proptest! {
    #[test]
    fn arbitrary_input_is_refused_without_panic(input in ".{0,600}") {
        let (key, _) = &*FIXTURE;
        prop_assert!(key.verifier().verify(&input, NOW).is_err());
    }

    #[test]
    fn jwt_shaped_garbage_is_refused_without_panic(
        header in "[A-Za-z0-9_-]{0,60}",
        payload in "[A-Za-z0-9_-]{0,300}",
        signature in "[A-Za-z0-9_-]{0,100}",
    ) {
        let (key, _) = &*FIXTURE;
        let token = format!("{header}.{payload}.{signature}");
        prop_assert!(key.verifier().verify(&token, NOW).is_err());
    }

    #[test]
    fn any_single_character_change_is_refused(index in any::<prop::sample::Index>(), replacement in 0x20u8..0x7f) {
        let (key, token) = &*FIXTURE;
        let mut bytes = token.clone().into_bytes();
        let at = index.index(bytes.len());
        prop_assume!(bytes[at] != replacement);
        bytes[at] = replacement;
        let mutated = String::from_utf8(bytes).expect("printable ASCII stays UTF-8");
        prop_assert!(key.verifier().verify(&mutated, NOW).is_err());
    }

    #[test]
    fn any_single_bit_flip_is_refused(index in any::<prop::sample::Index>(), bit in 0u8..8) {
        let (key, token) = &*FIXTURE;
        let mut bytes = token.clone().into_bytes();
        let at = index.index(bytes.len());
        bytes[at] ^= 1 << bit;
        // A flip into a non-UTF-8 byte cannot even reach the verifier as &str; lossy conversion keeps the case.
        let mutated = String::from_utf8_lossy(&bytes);
        prop_assert!(key.verifier().verify(&mutated, NOW).is_err());
    }

    #[test]
    fn truncated_or_extended_tokens_are_refused(cut in any::<prop::sample::Index>(), suffix in "[A-Za-z0-9_.-]{1,8}") {
        let (key, token) = &*FIXTURE;
        let verifier = key.verifier();
        let at = cut.index(token.len());
        prop_assert!(verifier.verify(&token[..at], NOW).is_err());
        let extended = format!("{token}{suffix}");
        prop_assert!(verifier.verify(&extended, NOW).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Every token `mint` returns verifies: in particular its signature is always in the low-S form the
    /// verifier requires (ring returns a high S about half of the time).
    #[test]
    fn minted_tokens_always_verify(
        name in "[a-z][a-z0-9-]{0,20}[a-z0-9]",
        service in "[a-z][a-z0-9_]{0,30}[a-z0-9]",
        valid_for in 1u64..400 * 86_400,
        now in 0u64..4_000_000_000,
    ) {
        let (key, _) = &*FIXTURE;
        let tags = BTreeMap::from([("kuma.io/service".to_owned(), service)]);
        let claims = Claims::new_dataplane(
            "default", name, BTreeMap::new(), tags, Duration::from_secs(valid_for), now,
        ).expect("valid claims");
        let token = key.mint(&claims).expect("mints");
        prop_assert_eq!(key.verifier().verify(&token, now).map_err(|e| e.to_string()), Ok(claims));
    }
}

#[test]
fn an_agent_token_names_no_mesh_and_its_subject_is_the_agent() {
    let (key, _) = SigningKey::generate().expect("key generation works");
    let claims = Claims::new_agent("host-1", DAY, NOW).expect("valid claims");
    let token = key.mint(&claims).expect("mints");
    let payload: serde_json::Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).expect("a claims segment"))
            .expect("base64url claims"),
    )
    .expect("JSON claims");
    assert_eq!(payload["type"], "agent");
    assert_eq!(payload["sub"], "agent:host-1");
    assert_eq!(payload["name"], "host-1");
    assert!(payload.get("mesh").is_none(), "{payload}");
    let verified = key.verifier().verify(&token, NOW).expect("verifies");
    assert_eq!(verified.proxy_type, ProxyType::Agent);
    assert_eq!(verified.name, "host-1");
    assert_eq!(verified.mesh, "");
    assert_eq!(verified.subject(), "agent:host-1");
}

#[test]
fn an_agent_token_with_a_mesh_or_labels_and_a_proxy_token_without_a_mesh_are_invalid() {
    let field_of = |result: Result<Claims, AuthError>| match result {
        Err(AuthError::InvalidClaim { field, .. }) => field,
        other => panic!("expected an invalid claim, got {other:?}"),
    };
    let with_mesh = Claims::new(
        ProxyType::Agent,
        "default",
        "host-1",
        BTreeMap::new(),
        BTreeMap::new(),
        DAY,
        NOW,
    );
    assert_eq!(field_of(with_mesh), "mesh");
    let labelled = Claims::new(
        ProxyType::Agent,
        "",
        "host-1",
        BTreeMap::from([parse_label("app=web").expect("valid label")]),
        BTreeMap::new(),
        DAY,
        NOW,
    );
    assert_eq!(field_of(labelled), "labels");
    let meshless = Claims::new_dataplane("", "web-1", BTreeMap::new(), BTreeMap::new(), DAY, NOW);
    assert_eq!(field_of(meshless), "mesh");
    // An agent's claims turned into a proxy's after the fact are not minted.
    let (key, _) = SigningKey::generate().expect("key generation works");
    let mut turned = Claims::new_agent("host-1", DAY, NOW).expect("valid claims");
    turned.proxy_type = ProxyType::Dataplane;
    assert!(key.mint(&turned).is_err(), "a proxy token needs a mesh");
}
