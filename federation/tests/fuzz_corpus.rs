//! Replays the `spiffe_bundle` fuzz target's committed corpus (`federation/fuzz/corpus/`) without the
//! fuzzer's instrumentation, so that `cargo test` checks its invariants on every input it found.

#[test]
fn the_spiffe_bundle_corpus_holds_its_invariants() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/spiffe_bundle");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus") {
        let path = entry.expect("an entry").path();
        meshca_federation::fuzzing::spiffe_bundle(&std::fs::read(&path).expect("an input"));
        count += 1;
    }
    assert!(count >= 4, "the corpus holds its seeds: {count} inputs");
}
