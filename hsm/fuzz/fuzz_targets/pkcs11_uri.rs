//! The RFC 7512 `pkcs11:` URI parser (`meshca_hsm::Pkcs11Uri::parse`), on arbitrary text: bytes that
//! are not UTF-8 are read lossily, so that they still reach the parser.
//!
//! Invariants: parsing never panics and every refusal displays; a URI that parses has a canonical
//! form within the parser's 4 KiB bound that parses back to an equal value and prints the same
//! text again.
#![no_main]

use meshca_hsm::Pkcs11Uri;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match Pkcs11Uri::parse(&text) {
        Err(e) => {
            let _ = e.to_string();
        }
        Ok(uri) => {
            let canonical = uri.to_string();
            assert!(canonical.len() <= 4096, "{canonical:?}: over 4 KiB");
            let again = Pkcs11Uri::parse(&canonical).unwrap_or_else(|e| {
                panic!("{text:?} parsed, its canonical form {canonical:?} not: {e}")
            });
            assert_eq!(again, uri, "{text:?} -> {canonical:?}");
            assert_eq!(
                again.to_string(),
                canonical,
                "{text:?}: two canonical forms"
            );
        }
    }
});
