//! SPIFFE ID parsing never panics, and whatever parses prints back to the same text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| {
    if let Ok(id) = meshca_identity::SpiffeId::parse(data) {
        assert_eq!(id.as_str(), data);
        assert!(id.as_str().len() <= meshca_identity::MAX_ID_LEN);
    }
    let _ = meshca_identity::TrustDomain::parse(data);
});
