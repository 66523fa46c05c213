//! `meshca_sds::fuzzing::request_trimmer`: its input layout and the invariants it checks are documented there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshca_sds::fuzzing::request_trimmer(data));
