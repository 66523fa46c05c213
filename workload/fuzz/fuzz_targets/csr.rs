//! The certificate signing request reader (`meshca_ca::csr_public_key`), which takes a workload's public
//! key from the request an agent sends for it. Input: the request's DER.
//!
//! Checks: it never panics; a request it accepts holds a key of an algorithm meshca issues for, of that
//! algorithm's shape (an uncompressed point of the curve's length, or an RSA key of the named size).
#![no_main]

use meshca_ca::{csr_public_key, KeyAlgorithm};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(key) = csr_public_key(data) else {
        return;
    };
    let raw = key.raw();
    match key.algorithm() {
        KeyAlgorithm::EcdsaP256 => assert!(raw.len() == 65 && raw[0] == 4, "a P-256 point"),
        KeyAlgorithm::EcdsaP384 => assert!(raw.len() == 97 && raw[0] == 4, "a P-384 point"),
        rsa => {
            let bits = rsa.rsa_bits().expect("an RSA algorithm");
            assert!(raw.len() > bits as usize / 8, "an RSA key of {bits} bits");
        }
    }
});
