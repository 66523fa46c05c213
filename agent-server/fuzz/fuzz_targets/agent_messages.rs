//! `meshca_agent_server::fuzzing::agent_messages`: its input layout and the invariants it checks are documented there.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meshca_agent_server::fuzzing::agent_messages(data));
