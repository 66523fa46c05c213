//! The committed fuzz corpus of the `pkcs11:` URI parser (hsm/fuzz/corpus/, docs/fuzzing.md), replayed
//! with the fuzz target's invariants on every test run: what the fuzzer once found stays checked,
//! without its instrumentation.

use std::path::Path;

use meshca_hsm::Pkcs11Uri;

#[test]
fn the_committed_corpus_keeps_every_invariant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/pkcs11_uri");
    let (mut inputs, mut parsed) = (0, 0);
    for entry in std::fs::read_dir(&dir).expect("the target's corpus") {
        let path = entry.expect("a corpus entry").path();
        let input = std::fs::read(&path).expect("a corpus file");
        let text = String::from_utf8_lossy(&input);
        inputs += 1;
        let Ok(uri) = Pkcs11Uri::parse(&text) else {
            continue;
        };
        parsed += 1;
        let canonical = uri.to_string();
        assert!(canonical.len() <= 4096, "{}: over 4 KiB", path.display());
        let again = Pkcs11Uri::parse(&canonical);
        assert_eq!(
            again.as_ref(),
            Ok(&uri),
            "{}: {canonical:?}",
            path.display()
        );
        assert_eq!(
            again.map(|u| u.to_string()),
            Ok(canonical),
            "{}",
            path.display()
        );
    }
    assert!(inputs > 0, "no seed in {}", dir.display());
    assert!(parsed > 0, "no input in {} parses", dir.display());
}
