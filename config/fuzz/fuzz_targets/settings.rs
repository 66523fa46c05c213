//! Settings environment overrides: any `MESHCA_*` name and value give settings or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: (String, String)| {
    let (name, value) = input;
    let _ = meshca_config::Settings::load(None, [(format!("MESHCA_{name}"), value)]);
});
