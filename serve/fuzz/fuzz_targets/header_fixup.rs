//! `meshca_serve::fuzzing::header_fixup`: its input layout and the invariants it checks are documented there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshca_serve::fuzzing::header_fixup(data));
