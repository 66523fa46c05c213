//! `meshca_sds::fuzzing::grpc_requests`: its input layout and the invariants it checks are documented there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshca_sds::fuzzing::grpc_requests(data));
