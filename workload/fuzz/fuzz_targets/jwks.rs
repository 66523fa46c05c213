//! The JWK Set parser (`meshca_workload::jwt::JwksDocument::parse`), which reads a trust domain's JWT
//! bundle. Input: the document.
//!
//! Checks: `parse` never panics; a document it accepts renders to bytes that parse back to the same
//! keys, and renders the same bytes again (one canonical form).
#![no_main]

use meshca_workload::jwt::JwksDocument;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(document) = JwksDocument::parse(data) else {
        return;
    };
    let rendered = document.to_bytes();
    let again = JwksDocument::parse(&rendered).expect("a rendered JWK Set parses");
    assert_eq!(again, document, "the rendered JWK Set holds other keys");
    assert_eq!(again.to_bytes(), rendered, "rendering is not canonical");
});
