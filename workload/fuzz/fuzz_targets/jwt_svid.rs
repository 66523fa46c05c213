//! The JWT-SVID validator (`meshca_workload::jwt::validate`), which reads the token a workload hands
//! to `ValidateJWTSVID`. Input: the token.
//!
//! Checks: `validate` never panics; the only inputs accepted with the fuzz key's bundle are the
//! JWT-SVIDs that key signed (`workload/fuzz/seeds/jwt-svids.txt`): no other spelling of them, no
//! forgery, and each names a SPIFFE ID of the bundle's trust domain; with another key's bundle nothing
//! is accepted.
#![no_main]

use std::sync::LazyLock;

use meshca_workload::jwt::{validate, JwtPublicKey, JwtSigningKey};

/// A key made for fuzzing only (`cargo run -p meshca-workload --example jwt-fuzz-seeds -- workload/fuzz`).
const KEY: &[u8] = include_bytes!("../seeds/jwt-key.pk8");
/// The JWT-SVIDs it signed, one a line; every one lists the audience `db`.
const SIGNED: &str = include_str!("../seeds/jwt-svids.txt");
/// A time at which every signed token is valid.
const NOW: u64 = 1_800_000_100;
/// The trust domain of the signed tokens.
const TRUST_DOMAIN: &str = "example.org";

static FUZZ_KEY: LazyLock<JwtPublicKey> = LazyLock::new(|| {
    JwtSigningKey::from_pkcs8(KEY)
        .expect("the fuzz key loads")
        .public()
});
static OTHER_KEY: LazyLock<JwtPublicKey> = LazyLock::new(|| {
    JwtSigningKey::generate()
        .expect("a key is generated")
        .public()
});

/// A bundle lookup that knows `key` in [`TRUST_DOMAIN`] only.
fn bundle(key: &JwtPublicKey) -> impl Fn(&str, &str) -> Option<JwtPublicKey> + '_ {
    move |trust_domain: &str, kid: &str| {
        (trust_domain == TRUST_DOMAIN && kid == key.kid()).then(|| key.clone())
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(valid) = validate(token, "db", &bundle(&FUZZ_KEY), NOW) {
        assert!(
            SIGNED.lines().any(|signed| signed == token),
            "accepted a token the key never signed: {token:?}"
        );
        assert_eq!(valid.spiffe_id.trust_domain().as_str(), TRUST_DOMAIN);
    }
    assert!(
        validate(token, "db", &bundle(&OTHER_KEY), NOW).is_err(),
        "another key's bundle accepted {token:?}"
    );
});
