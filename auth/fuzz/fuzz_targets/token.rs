//! The token verifier (`meshca_auth::Verifier`), which reads every stream's `authorization` header
//! before anything else. Input: the header's value.
//!
//! Checks: neither `verify` nor `read_unverified` panics; the only inputs the fuzz key's verifier
//! accepts are the tokens that key signed (`auth/fuzz/seeds/tokens.txt`): no other spelling of them, no
//! forgery; and then `read_unverified` reads the same claims; another key's verifier accepts nothing.
#![no_main]

use std::sync::LazyLock;

use meshca_auth::{SigningKey, Verifier};

/// A key made for fuzzing only (`cargo run -p meshca-auth --example fuzz-tokens -- auth/fuzz`).
const KEY: &[u8] = include_bytes!("../seeds/token-key.pk8");
/// The tokens it signed, one a line.
const SIGNED: &str = include_str!("../seeds/tokens.txt");
/// A time at which every signed token is valid.
const NOW: u64 = 1_800_000_100;

static VERIFIER: LazyLock<Verifier> = LazyLock::new(|| {
    SigningKey::from_pkcs8(KEY)
        .expect("the fuzz key loads")
        .verifier()
});
static OTHER: LazyLock<Verifier> = LazyLock::new(|| {
    SigningKey::generate()
        .expect("a key is generated")
        .0
        .verifier()
});

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(token) = std::str::from_utf8(data) else {
        return;
    };
    let unverified = Verifier::read_unverified(token);
    if let Ok(claims) = VERIFIER.verify(token, NOW) {
        assert!(
            SIGNED.lines().any(|signed| signed == token),
            "accepted a token the key never signed: {token:?}"
        );
        assert_eq!(unverified.ok(), Some(claims));
    }
    assert!(
        OTHER.verify(token, NOW).is_err(),
        "another key's verifier accepted {token:?}"
    );
});
