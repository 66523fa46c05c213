//! Key, certificate and chain readers never panic on arbitrary input.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = meshca_ca::PrivateKey::from_pem(data);
    let _ = meshca_ca::inspect_pem(data);
    let _ = meshca_ca::CertificateAuthority::from_persisted(data, data);
});
