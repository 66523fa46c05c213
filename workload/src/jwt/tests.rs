//! Minting and validating together, with tokens forged by a real key to be wrong in one way each.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

const NOW: u64 = 1_800_000_000;
const TD: &str = "example.org";
const ID: &str = "spiffe://example.org/ns/default/sa/web";

fn key() -> JwtSigningKey {
    JwtSigningKey::generate().expect("key generation works")
}

fn auds(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// A key lookup that knows `key` in trust domain `TD` only.
fn bundle(key: &JwtSigningKey) -> impl Fn(&str, &str) -> Option<JwtPublicKey> {
    let document = JwksDocument::new([key.public()]);
    move |td: &str, kid: &str| {
        if td == TD {
            document.get(kid).cloned()
        } else {
            None
        }
    }
}

fn header(key: &JwtSigningKey) -> Value {
    json!({"alg": "ES256", "kid": key.kid(), "typ": "JWT"})
}

fn claims() -> Value {
    json!({"sub": ID, "aud": ["db"], "exp": NOW + 300, "iat": NOW})
}

/// A token with this header and these claims, correctly signed by `key`.
fn forge(key: &JwtSigningKey, header: &Value, claims: &Value) -> String {
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let signature = key.sign(input.as_bytes()).expect("signing works");
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
}

fn check(key: &JwtSigningKey, token: &str) -> Result<ValidatedJwt, JwtError> {
    validate(token, "db", &bundle(key), NOW)
}

fn segment(token: &str, index: usize) -> Value {
    let part = token.split('.').nth(index).expect("three segments");
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(part).expect("base64url")).expect("json")
}

#[test]
fn minted_token_has_the_exact_header_and_claims() {
    let key = key();
    let token = mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints");
    let header_text = URL_SAFE_NO_PAD
        .decode(token.split('.').next().expect("header"))
        .expect("base64url");
    assert_eq!(
        String::from_utf8(header_text).expect("utf-8"),
        format!(r#"{{"alg":"ES256","kid":"{}","typ":"JWT"}}"#, key.kid())
    );
    assert_eq!(
        segment(&token, 1),
        json!({"sub": ID, "aud": ["db"], "exp": NOW + 300, "iat": NOW}),
        "aud is an array even for one audience"
    );
    let signature = URL_SAFE_NO_PAD
        .decode(token.split('.').nth(2).expect("signature"))
        .expect("base64url");
    assert_eq!(signature.len(), 64, "JOSE form r || s");
    let valid = check(&key, &token).expect("validates");
    assert_eq!(valid.spiffe_id.as_str(), ID);
    assert_eq!(valid.claims.get("iat"), Some(&json!(NOW)));
}

#[test]
fn forged_good_token_validates() {
    // Guards the refusals below: each fails for the reason it names, not a typo in the fixture.
    let key = key();
    check(&key, &forge(&key, &header(&key), &claims())).expect("validates");
    let mut no_typ = header(&key);
    no_typ.as_object_mut().expect("object").remove("typ");
    check(&key, &forge(&key, &no_typ, &claims())).expect("typ may be absent");
    let mut jose = header(&key);
    jose["typ"] = json!("JOSE");
    check(&key, &forge(&key, &jose, &claims())).expect("typ may be JOSE");
    let mut one = claims();
    one["aud"] = json!("db");
    check(&key, &forge(&key, &header(&key), &one)).expect("aud may be a string");
    let mut many = claims();
    many["aud"] = json!(["x", "db"]);
    check(&key, &forge(&key, &header(&key), &many)).expect("aud may hold others");
    let mut extra = claims();
    extra["jti"] = json!("abc");
    extra["nbf"] = json!(NOW + CLOCK_SKEW_SECS);
    let valid = check(&key, &forge(&key, &header(&key), &extra)).expect("extra claims are kept");
    assert_eq!(valid.claims.get("jti"), Some(&json!("abc")));
}

#[test]
fn mint_refuses_what_it_cannot_sign() {
    let key = key();
    let a = auds(&["db"]);
    let cases: [(Result<String, JwtError>, &str); 6] = [
        (mint(&key, "web", &a, NOW, NOW + 1), "InvalidSubject"),
        (
            mint(&key, "spiffe://example.org", &a, NOW, NOW + 1),
            "RootSubject",
        ),
        (mint(&key, ID, &[], NOW, NOW + 1), "AudienceMissing"),
        (
            mint(&key, ID, &auds(&["db", ""]), NOW, NOW + 1),
            "EmptyAudience",
        ),
        (mint(&key, ID, &a, NOW, NOW), "InvalidLifetime"),
        (
            mint(&key, ID, &["x".repeat(MAX_TOKEN_BYTES)], NOW, NOW + 1),
            "TokenTooLong",
        ),
    ];
    for (result, variant) in cases {
        let err = result.expect_err(variant);
        assert!(
            format!("{err:?}").starts_with(variant),
            "{variant}: {err:?}"
        );
    }
}

#[test]
fn algorithms_other_than_es256_are_refused() {
    let key = key();
    for alg in ["none", "RS256", "HS256", "ES384", "es256"] {
        let mut header = header(&key);
        header["alg"] = json!(alg);
        let token = forge(&key, &header, &claims());
        let err = check(&key, &token).expect_err(alg);
        assert!(
            matches!(&err, JwtError::UnsupportedAlgorithm { alg: quoted } if quoted.contains(alg)),
            "{alg}: {err:?}"
        );
        // An unsigned token, as `alg: none` is sent.
        let (unsigned, _) = token.rsplit_once('.').expect("three segments");
        let err = check(&key, &format!("{unsigned}.")).expect_err(alg);
        assert!(
            matches!(err, JwtError::UnsupportedAlgorithm { .. }),
            "{err:?}"
        );
    }
    let mut numeric = header(&key);
    numeric["alg"] = json!(7);
    let err = check(&key, &forge(&key, &numeric, &claims())).expect_err("numeric alg");
    assert!(
        matches!(err, JwtError::UnsupportedAlgorithm { .. }),
        "{err:?}"
    );
    let mut missing = header(&key);
    missing.as_object_mut().expect("object").remove("alg");
    let err = check(&key, &forge(&key, &missing, &claims())).expect_err("no alg");
    assert!(matches!(err, JwtError::MissingAlgorithm), "{err:?}");
}

#[test]
fn header_must_hold_a_kid_and_nothing_unknown() {
    let key = key();
    let mut no_kid = header(&key);
    no_kid.as_object_mut().expect("object").remove("kid");
    let err = check(&key, &forge(&key, &no_kid, &claims())).expect_err("no kid");
    assert!(matches!(err, JwtError::MissingKeyId), "{err:?}");

    let mut empty_kid = header(&key);
    empty_kid["kid"] = json!("");
    let err = check(&key, &forge(&key, &empty_kid, &claims())).expect_err("empty kid");
    assert!(matches!(err, JwtError::MissingKeyId), "{err:?}");

    for field in ["jku", "x5u", "crit", "cty"] {
        let mut extra = header(&key);
        extra[field] = json!("x");
        let err = check(&key, &forge(&key, &extra, &claims())).expect_err(field);
        assert!(
            matches!(&err, JwtError::UnsupportedHeaderField { field: quoted } if quoted.contains(field)),
            "{field}: {err:?}"
        );
    }

    let mut typ = header(&key);
    typ["typ"] = json!("at+jwt");
    let err = check(&key, &forge(&key, &typ, &claims())).expect_err("typ");
    assert!(matches!(err, JwtError::UnsupportedType { .. }), "{err:?}");
}

#[test]
fn the_key_must_be_known_in_the_subjects_trust_domain() {
    let key = key();
    let other = JwtSigningKey::generate().expect("key");
    let err = check(&key, &forge(&other, &header(&other), &claims())).expect_err("unknown kid");
    assert!(
        matches!(&err, JwtError::UnknownKey { trust_domain, .. } if trust_domain == TD),
        "{err:?}"
    );

    // Signed by a key of example.org, naming a workload of another trust domain.
    let mut foreign = claims();
    foreign["sub"] = json!("spiffe://other.org/web");
    let err = check(&key, &forge(&key, &header(&key), &foreign)).expect_err("wrong td");
    assert!(
        matches!(&err, JwtError::UnknownKey { trust_domain, .. } if trust_domain == "other.org"),
        "{err:?}"
    );

    // Another key that claims the first one's kid.
    let err = check(&key, &forge(&other, &header(&key), &claims())).expect_err("kid reused");
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err:?}");
}

#[test]
fn the_subject_must_be_a_workloads_spiffe_id() {
    let key = key();
    for (sub, variant) in [
        (json!("web"), "InvalidSubject"),
        (json!("spiffe://Example.org/web"), "InvalidSubject"),
        (json!("https://example.org/web"), "InvalidSubject"),
        (json!("spiffe://example.org"), "RootSubject"),
        (json!(7), "InvalidClaim"),
    ] {
        let mut claims = claims();
        claims["sub"] = sub.clone();
        let err = check(&key, &forge(&key, &header(&key), &claims)).expect_err("refused");
        assert!(format!("{err:?}").starts_with(variant), "{sub}: {err:?}");
    }
    let mut no_sub = claims();
    no_sub.as_object_mut().expect("object").remove("sub");
    let err = check(&key, &forge(&key, &header(&key), &no_sub)).expect_err("no sub");
    assert!(
        matches!(err, JwtError::MissingClaim { claim: "sub" }),
        "{err:?}"
    );
}

#[test]
fn tampering_breaks_the_signature() {
    let key = key();
    let token = mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints");
    let parts: Vec<&str> = token.split('.').collect();

    let mut claims = segment(&token, 1);
    claims["aud"] = json!(["db", "admin"]);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let tampered = format!("{}.{payload}.{}", parts[0], parts[2]);
    let err = check(&key, &tampered).expect_err("tampered payload");
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err:?}");

    let mut signature = URL_SAFE_NO_PAD.decode(parts[2]).expect("base64url");
    signature[10] ^= 1;
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        URL_SAFE_NO_PAD.encode(&signature)
    );
    let err = check(&key, &tampered).expect_err("tampered signature");
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err:?}");

    let short = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        URL_SAFE_NO_PAD.encode(&signature[..63])
    );
    let err = check(&key, &short).expect_err("short signature");
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err:?}");
}

/// The token with its signature's `s` replaced by `n - s`: as valid a signature, another spelling.
fn malleated(token: &str) -> String {
    let (input, signature) = token.rsplit_once('.').expect("three segments");
    let mut signature = URL_SAFE_NO_PAD.decode(signature).expect("base64url");
    let high = meshca_auth_order_minus(&signature[32..]);
    signature[32..].copy_from_slice(&high);
    format!("{input}.{}", URL_SAFE_NO_PAD.encode(&signature))
}

#[test]
fn a_high_s_signature_under_a_meshca_key_is_refused() {
    let key = key();
    let token = mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints");
    check(&key, &token).expect("the low form validates");
    let err = check(&key, &malleated(&token)).expect_err("the high form is a rewritten token");
    assert!(matches!(err, JwtError::HighS { .. }), "{err:?}");
    assert!(err.to_string().contains("low-S"), "{err}");
}

#[test]
fn a_high_s_signature_of_another_issuer_is_accepted() {
    // Other issuers do not normalize `s`; (r, n - s) is as valid a signature as (r, s).
    let key = key();
    let token = malleated(&mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints"));
    let public = key.public().of_another_issuer();
    let keys =
        |td: &str, kid: &str| (td == "example.org" && kid == public.kid()).then(|| public.clone());
    validate(&token, "db", &keys, NOW).expect("high-S of another issuer validates");
}

/// `n - s` for the P-256 order `n`, written out here so the test does not share the code it checks.
fn meshca_auth_order_minus(s: &[u8]) -> [u8; 32] {
    const N: [u8; 32] = [
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63,
        0x25, 0x51,
    ];
    let mut out = [0u8; 32];
    let mut borrow = 0i16;
    for i in (0..32).rev() {
        let mut digit = i16::from(N[i]) - i16::from(s[i]) - borrow;
        borrow = i16::from(digit < 0);
        if digit < 0 {
            digit += 0x100;
        }
        out[i] = u8::try_from(digit).expect("a byte");
    }
    out
}

#[test]
fn audience_must_match() {
    let key = key();
    let token = mint(&key, ID, &auds(&["db", "cache"]), NOW, NOW + 300).expect("mints");
    validate(&token, "cache", &bundle(&key), NOW).expect("second audience matches");
    let err = validate(&token, "admin", &bundle(&key), NOW).expect_err("wrong audience");
    assert!(matches!(err, JwtError::AudienceMismatch { .. }), "{err:?}");
    let err = validate(&token, "", &bundle(&key), NOW).expect_err("no audience");
    assert!(matches!(err, JwtError::AudienceMissing), "{err:?}");

    for (aud, variant) in [
        (json!([]), "InvalidClaim"),
        (json!([1]), "InvalidClaim"),
        (json!({"db": true}), "InvalidClaim"),
    ] {
        let mut claims = claims();
        claims["aud"] = aud.clone();
        let err = check(&key, &forge(&key, &header(&key), &claims)).expect_err("refused");
        assert!(format!("{err:?}").starts_with(variant), "{aud}: {err:?}");
    }
    let mut no_aud = claims();
    no_aud.as_object_mut().expect("object").remove("aud");
    let err = check(&key, &forge(&key, &header(&key), &no_aud)).expect_err("no aud");
    assert!(
        matches!(err, JwtError::MissingClaim { claim: "aud" }),
        "{err:?}"
    );
}

#[test]
fn times_are_checked() {
    let key = key();
    let token = mint(&key, ID, &auds(&["db"]), NOW - 300, NOW + 1).expect("mints");
    validate(&token, "db", &bundle(&key), NOW).expect("one second left");
    let err = validate(&token, "db", &bundle(&key), NOW + 1).expect_err("expired");
    assert!(
        matches!(err, JwtError::Expired { expires_at, now } if expires_at == NOW + 1 && now == NOW + 1),
        "{err:?}"
    );

    let future = mint(
        &key,
        ID,
        &auds(&["db"]),
        NOW + CLOCK_SKEW_SECS + 1,
        NOW + 600,
    )
    .expect("mints");
    let err = check(&key, &future).expect_err("iat in the future");
    assert!(
        matches!(err, JwtError::NotYetValid { claim: "iat", .. }),
        "{err:?}"
    );

    let mut nbf = claims();
    nbf["nbf"] = json!(NOW + CLOCK_SKEW_SECS + 1);
    let err = check(&key, &forge(&key, &header(&key), &nbf)).expect_err("nbf");
    assert!(
        matches!(err, JwtError::NotYetValid { claim: "nbf", .. }),
        "{err:?}"
    );

    let mut fractional = claims();
    fractional["exp"] = json!((NOW + 10) as f64 + 0.5);
    check(&key, &forge(&key, &header(&key), &fractional)).expect("a fractional exp is a date");

    for exp in [json!(-1), json!("soon"), Value::Null] {
        let mut claims = claims();
        claims["exp"] = exp.clone();
        let err = check(&key, &forge(&key, &header(&key), &claims)).expect_err("bad exp");
        assert!(
            matches!(err, JwtError::InvalidClaim { claim: "exp", .. }),
            "{exp}: {err:?}"
        );
    }
    let mut no_exp = claims();
    no_exp.as_object_mut().expect("object").remove("exp");
    let err = check(&key, &forge(&key, &header(&key), &no_exp)).expect_err("no exp");
    assert!(
        matches!(err, JwtError::MissingClaim { claim: "exp" }),
        "{err:?}"
    );
}

#[test]
fn malformed_tokens_are_refused() {
    let key = key();
    let token = mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints");
    let parts: Vec<&str> = token.split('.').collect();
    for bad in [
        String::new(),
        "abc".to_owned(),
        format!("{}.{}", parts[0], parts[1]),
        format!("{token}.{}", parts[2]),
        format!("{}..{}", parts[0], parts[2]),
        format!(".{}.{}", parts[1], parts[2]),
        format!("{}=.{}.{}", parts[0], parts[1], parts[2]),
        format!("{}.{}!.{}", parts[0], parts[1], parts[2]),
        format!("{}.{}.{}*", parts[0], parts[1], parts[2]),
        format!(
            "{}.{}.{}",
            URL_SAFE_NO_PAD.encode("[1]"),
            parts[1],
            parts[2]
        ),
        format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode("not json"),
            parts[2]
        ),
    ] {
        let err = check(&key, &bad).expect_err("malformed");
        assert!(
            matches!(err, JwtError::Malformed { .. }),
            "{bad:?}: {err:?}"
        );
        assert!(
            !err.to_string().contains(parts[2]),
            "no token in the message"
        );
    }
}

#[test]
fn an_oversized_token_is_refused_before_decoding() {
    let key = key();
    let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
    let err = check(&key, &huge).expect_err("too long");
    assert!(matches!(err, JwtError::TokenTooLong { len, .. } if len == MAX_TOKEN_BYTES + 1));
}

#[test]
fn jwks_renders_the_standard_form_and_parses_back() {
    let (a, b) = (key(), key());
    let document = JwksDocument::new([b.public(), a.public(), a.public()]);
    let bytes = document.to_bytes();
    let json: Value = serde_json::from_slice(&bytes).expect("json");
    let keys = json["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 2, "one entry per kid");
    let mut kids = [a.kid(), b.kid()];
    kids.sort_unstable();
    assert_eq!(keys[0]["kid"], json!(kids[0]), "ordered by kid");
    assert_eq!(keys[1]["kid"], json!(kids[1]));
    let first = keys[0].as_object().expect("object");
    assert_eq!(
        first.keys().map(String::as_str).collect::<Vec<_>>(),
        ["crv", "kid", "kty", "x", "y"],
        "no use, nothing else"
    );
    assert_eq!(first["kty"], json!("EC"));
    assert_eq!(first["crv"], json!("P-256"));
    assert_eq!(JwksDocument::parse(&bytes).expect("parses"), document);
    assert_eq!(
        JwksDocument::new([a.public(), b.public()]).to_bytes(),
        bytes,
        "deterministic"
    );
    let x = URL_SAFE_NO_PAD
        .decode(first["x"].as_str().expect("x"))
        .expect("b64");
    let y = URL_SAFE_NO_PAD
        .decode(first["y"].as_str().expect("y"))
        .expect("b64");
    assert_eq!(
        thumbprint(&x.try_into().expect("32"), &y.try_into().expect("32")),
        kids[0],
        "kid is the thumbprint"
    );
}

#[test]
fn jwks_parse_skips_foreign_keys_and_refuses_broken_ones() {
    let key = key();
    let mut set: Value =
        serde_json::from_slice(&JwksDocument::new([key.public()]).to_bytes()).expect("json");
    let good = set["keys"][0].clone();
    set["keys"] = json!([
        good,
        {"kty": "RSA", "kid": "r1", "n": "AQAB", "e": "AQAB"},
        {"kty": "EC", "crv": "P-384", "kid": "p384", "x": "", "y": ""},
        {"kty": "EC", "crv": "P-256", "use": "x509-svid", "x5c": ["AA"]},
        {"kty": "RSA", "use": "x509-svid", "x5c": ["AA"]},
    ]);
    set["spiffe_sequence"] = json!(3);
    let parsed = JwksDocument::parse(set.to_string().as_bytes()).expect("parses");
    assert_eq!(parsed.keys(), [key.public()]);

    let refusals: [(Value, &str); 8] = [
        (json!([]), "not a JSON object"),
        (json!({}), "no `keys`"),
        (json!({"keys": {}}), "not an array"),
        (json!({"keys": [1]}), "key 0 is not a JSON object"),
        (
            json!({"keys": [{"kty": "EC", "crv": "P-256", "x": good["x"], "y": good["y"]}]}),
            "key 0 has no `kid`",
        ),
        (json!({"keys": [good, good]}), "earlier key"),
        (
            json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k", "x": "AAAA", "y": good["y"]}]}),
            "`x` is not 32 bytes",
        ),
        (
            json!({"keys": [{"kty": "EC", "crv": "P-256", "kid": "k", "x": good["x"]}]}),
            "no string `y`",
        ),
    ];
    for (document, expected) in refusals {
        let err = JwksDocument::parse(document.to_string().as_bytes()).expect_err("refused");
        assert!(
            matches!(&err, JwtError::Jwks { reason } if reason.contains(expected)),
            "{document}: {err}"
        );
    }
    let err = JwksDocument::parse(&vec![b' '; MAX_JWKS_BYTES + 1]).expect_err("too big");
    assert!(err.to_string().contains("at most"), "{err}");
}

#[test]
fn jwks_lookup_validates_a_token() {
    let key = key();
    let bytes = JwksDocument::new([key.public()]).to_bytes();
    let parsed = JwksDocument::parse(&bytes).expect("parses");
    let token = mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints");
    let keys = |td: &str, kid: &str| (td == TD).then(|| parsed.get(kid).cloned()).flatten();
    validate(&token, "db", &keys, NOW).expect("validates with the parsed bundle");
}

fn path_segment() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_-][a-zA-Z0-9._-]{0,15}".prop_filter("not a dot segment", |s| s != "." && s != "..")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn mint_then_validate_round_trips(
        segments in prop::collection::vec(path_segment(), 1..5),
        audiences in prop::collection::vec("\\PC{1,40}", 1..6),
        pick in any::<prop::sample::Index>(),
        lifetime in 1u64..100_000,
    ) {
        let key = key();
        let id = format!("spiffe://{TD}/{}", segments.join("/"));
        let token = mint(&key, &id, &audiences, NOW, NOW + lifetime).expect("mints");
        let audience = pick.get(&audiences);
        let valid = validate(&token, audience, &bundle(&key), NOW).expect("validates");
        prop_assert_eq!(valid.spiffe_id.as_str(), id.as_str());
        prop_assert_eq!(valid.claims.get("aud"), Some(&json!(audiences)));
    }

    #[test]
    fn validate_never_panics_on_any_string(token in "\\PC{0,300}", audience in "\\PC{0,10}") {
        let key = key();
        prop_assert!(validate(&token, &audience, &bundle(&key), NOW).is_err());
    }

    #[test]
    fn mutations_of_a_valid_token_are_refused_without_panic(
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let key = key();
        let token = mint(&key, ID, &auds(&["db"]), NOW, NOW + 300).expect("mints");
        let mut bytes = token.clone().into_bytes();
        for (at, byte) in &edits {
            let i = at.index(bytes.len());
            bytes[i] = *byte;
        }
        let Ok(mutated) = String::from_utf8(bytes) else { return Ok(()) };
        let result = validate(&mutated, "db", &bundle(&key), NOW);
        // Strict base64url (canonical trailing bits) gives each token one spelling, so any change
        // is a different signed message.
        prop_assert_eq!(result.is_ok(), mutated == token, "{:?}", result);
    }
}

/// The fuzz target's seeds (`workload/fuzz/`) are what it assumes: the listed tokens validate with the
/// fuzz key at the target's time and list `db`; every other committed input is refused. Otherwise the
/// target's "only these are accepted" would check nothing.
#[test]
fn fuzz_seeds_hold_what_the_fuzz_target_assumes() {
    const FUZZ_NOW: u64 = 1_800_000_100;
    let key = JwtSigningKey::from_pkcs8(include_bytes!("../../fuzz/seeds/jwt-key.pk8"))
        .expect("the fuzz key loads");
    let signed = include_str!("../../fuzz/seeds/jwt-svids.txt");
    let keys = bundle(&key);
    for token in signed.lines() {
        validate(token, "db", &keys, FUZZ_NOW).expect("a seed token validates");
    }
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/jwt_svid");
    let mut refused = 0;
    for entry in std::fs::read_dir(&corpus).expect("the committed corpus") {
        let input = std::fs::read_to_string(entry.expect("entry").path()).expect("utf-8");
        if !signed.lines().any(|token| token == input) {
            assert!(
                validate(&input, "db", &keys, FUZZ_NOW).is_err(),
                "{input:?}"
            );
            refused += 1;
        }
    }
    assert!(refused >= 5, "the near misses are committed");
    let bundle = include_bytes!("../../fuzz/seeds/jwks.json");
    assert_eq!(
        JwksDocument::parse(bundle)
            .expect("the seed bundle parses")
            .keys(),
        [key.public()]
    );
}
