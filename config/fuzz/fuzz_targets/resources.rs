//! Resource YAML: parsing any input returns resources or errors, never panics or hangs.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(resources) = meshca_config::parse_str(std::path::Path::new("fuzz.yaml"), text) {
            let _ = meshca_config::Resources::from_resources(resources);
        }
    }
});
