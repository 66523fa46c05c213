//! The committed fuzz corpus (sds/fuzz/corpus/, docs/fuzzing.md), replayed through the SDS fuzz entry
//! points on every test run: what the fuzzer once found stays checked, without its instrumentation.

use std::path::Path;

/// A fuzz entry point: panics when an invariant fails.
type Target = fn(&[u8]);

#[test]
fn the_committed_corpus_keeps_every_invariant() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let targets: [(&str, Target); 2] = [
        ("grpc_requests", meshca_sds::fuzzing::grpc_requests),
        ("request_trimmer", meshca_sds::fuzzing::request_trimmer),
    ];
    for (target, run) in targets {
        let dir = corpus.join(target);
        let mut inputs = 0;
        for entry in std::fs::read_dir(&dir).expect("the target's corpus") {
            let path = entry.expect("a corpus entry").path();
            let input = std::fs::read(&path).expect("a corpus file");
            let outcome = std::panic::catch_unwind(|| run(&input));
            assert!(outcome.is_ok(), "{} fails", path.display());
            inputs += 1;
        }
        assert!(inputs > 0, "no seed in {}", dir.display());
    }
}
