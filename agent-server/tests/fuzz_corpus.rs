//! The committed fuzz corpus (agent/fuzz/corpus/, docs/fuzzing.md), replayed through the agent's fuzz
//! entry point on every test run: what the fuzzer once found stays checked, without its
//! instrumentation.

use std::path::Path;

#[test]
fn the_committed_corpus_keeps_every_invariant() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/agent_messages");
    let mut inputs = 0;
    for entry in std::fs::read_dir(&dir).expect("the target's corpus") {
        let path = entry.expect("a corpus entry").path();
        let input = std::fs::read(&path).expect("a corpus file");
        let outcome =
            std::panic::catch_unwind(|| meshca_agent_server::fuzzing::agent_messages(&input));
        assert!(outcome.is_ok(), "{} fails", path.display());
        inputs += 1;
    }
    assert!(inputs > 0, "no seed in {}", dir.display());
}
