//! Counters the daemon exports as metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// SDS counters, shared by all streams. Read them with [`SdsMetrics::get`] or load the
/// atomics directly.
#[derive(Debug, Default)]
pub struct SdsMetrics {
    /// Streams currently open (StreamSecrets and DeltaSecrets).
    pub streams_open: AtomicU64,
    /// Responses sent on streams and fetches.
    pub responses_pushed: AtomicU64,
    /// ACKs received.
    pub acks: AtomicU64,
    /// NACKs received.
    pub nacks: AtomicU64,
    /// Requests refused for authentication or authorization reasons.
    pub auth_failures: AtomicU64,
}

impl SdsMetrics {
    /// Reads one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    pub(crate) fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn decr(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}
