//! Durations: parsing never panics, and whatever parses displays back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meshca_config::Duration;

fuzz_target!(|text: &str| {
    if let Ok(d) = text.parse::<Duration>() {
        assert_eq!(d.to_string().parse::<Duration>(), Ok(d));
    }
});
