//! The stream loop's own size, measured for both protocols.

use std::future::Future;

use super::*;
use crate::delta::Delta;
use crate::sotw::Sotw;

fn state_size<A, B, F: Future>(_: fn(A, B) -> F) -> usize {
    std::mem::size_of::<F>()
}

/// Every idle stream holds this state for its life. Opening and handling are boxed, so it is what
/// the loop waits with: about 1.5 KiB (it was 6 KiB).
#[test]
fn an_open_streams_state_stays_small() {
    for (protocol, size) in [
        ("sotw", state_size(run::<Sotw>)),
        ("delta", state_size(run::<Delta>)),
    ] {
        assert!(size <= 2048, "{protocol}: {size} bytes");
    }
}
