//! Template parsing and rendering never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &str| {
    if let Ok(t) = meshca_ca::Template::parse(data) {
        let labels = meshca_ca::LabelMap::from([("kuma.io/workload".to_string(), "web".to_string())]);
        let _ = t.render(&meshca_ca::TemplateVars {
            mesh: "m",
            zone: "z",
            labels: &labels,
        });
    }
    let _ = meshca_ca::IdentityTemplate::parse(Some(data), Some(data));
});
