//! Entry points for the coverage-guided fuzz targets in `serve/fuzz/` (docs/fuzzing.md), for the
//! parsers of this crate that read a peer's bytes before anything about it is known. Each takes an
//! arbitrary byte string (the first bytes choose a limit and where reads are cut), drives the parser's
//! sans-IO core, and panics when an invariant fails. `cargo test` replays the committed corpus through
//! them (`serve/tests/fuzz_corpus.rs`). Hidden from the documentation: this is not an API.

use crate::h2_header_fixup::HeaderFixup;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The unix socket's `:authority` rewriter. Input: a limit byte (0: the 16 KiB the server uses,
/// else that many times 8 bytes), three read-size bytes, then the bytes after the HTTP/2 preface.
///
/// Checks: held bytes never exceed the documented bound after any read; no byte is lost or made
/// up; the output does not depend on where reads cut the stream; a stream that does not overflow
/// comes out the same length, changed only where an `:authority` was replaced, and the output
/// (whose authorities are all valid) passes through a second time byte for byte.
pub fn header_fixup(data: &[u8]) {
    let Some((&[limit, sizes @ ..], frames)) = data.split_first_chunk::<4>() else {
        return;
    };
    let max_block = match limit {
        0 => 16 * 1024,
        n => usize::from(n) * 8,
    };
    let input = [PREFACE, frames].concat();
    let whole = fixup(&input, &[], max_block);
    let cut = fixup(&input, &sizes, max_block);
    assert_eq!(
        whole, cut,
        "the output depends on where reads cut the stream"
    );
    let (output, overflow) = whole;
    if overflow {
        return;
    }
    assert_eq!(output.len(), input.len());
    for (sent, passed) in input.iter().zip(&output) {
        assert!(
            sent == passed || b"localhostx-".contains(passed),
            "a byte changed to {passed:#04x}, which no replacement authority holds"
        );
    }
    let again = fixup(&output, &sizes, max_block);
    assert_eq!(
        again,
        (output, false),
        "valid traffic does not pass unchanged"
    );
}

/// Feeds `input` to a rewriter in reads of `sizes` (cycled); its output and whether it overflowed.
fn fixup(input: &[u8], sizes: &[u8], max_block: usize) -> (Vec<u8>, bool) {
    let mut core = HeaderFixup::new(max_block);
    let mut out = Vec::new();
    let mut fed = 0;
    for chunk in chunks(input, sizes) {
        let result = core.feed(chunk);
        fed += chunk.len();
        assert!(
            core.held() <= core.bound(),
            "{} bytes held, over the bound of {}",
            core.held(),
            core.bound()
        );
        out.extend_from_slice(core.output());
        core.consume(core.output().len());
        if result.is_err() {
            assert_eq!(core.held(), 0, "bytes kept after an overflow");
            return (out, true);
        }
        assert_eq!(out.len() + core.held(), fed, "bytes lost or made up");
    }
    core.finish();
    out.extend_from_slice(core.output());
    (out, false)
}

/// `data` cut into pieces of the sizes `sizes` gives, cycled (all of it at once when `sizes` is
/// empty): a size byte `s` reads `1 + s * s / 4` bytes, from 1 to about 16 KiB.
pub fn chunks<'a>(mut data: &'a [u8], sizes: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut turn = 0;
    std::iter::from_fn(move || {
        if data.is_empty() {
            return None;
        }
        let size = match sizes.get(turn % sizes.len().max(1)) {
            Some(&s) => 1 + usize::from(s) * usize::from(s) / 4,
            None => data.len(),
        };
        turn += 1;
        let (chunk, rest) = data.split_at(size.min(data.len()));
        data = rest;
        Some(chunk)
    })
}
