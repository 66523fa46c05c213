//! The SPIFFE bundle reader (`meshca_federation::SpiffeBundle::parse`), which reads what a federation
//! peer's bundle endpoint serves. Input: the document.
//!
//! Checks (`meshca_federation::fuzzing::spiffe_bundle`): it never panics; a bundle it reads renders to
//! bytes that read back to the same bundle, and renders the same bytes again.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    meshca_federation::fuzzing::spiffe_bundle(data);
});
