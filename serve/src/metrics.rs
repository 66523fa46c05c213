//! Counters the daemon exports as metrics (as `meshca_sds_*`: SDS was their first protocol).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds, in seconds, of the ACK-lag histogram buckets (the last bucket is unbounded).
pub const ACK_LAG_BOUNDS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Time from sending a response to receiving its ACK, as a histogram of atomics.
#[derive(Debug, Default)]
pub struct AckLag {
    /// Per-bucket (not cumulative) counts; index `ACK_LAG_BOUNDS.len()` is the overflow bucket.
    buckets: [AtomicU64; 13],
    sum_micros: AtomicU64,
}

impl AckLag {
    /// Counts one ACK that came `lag` after its response.
    pub fn observe(&self, lag: Duration) {
        let secs = lag.as_secs_f64();
        let i = ACK_LAG_BOUNDS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(ACK_LAG_BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(lag.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    /// `(sum in seconds, count, per-bucket (upper bound, count))`, the overflow bucket bounded by +Inf.
    pub fn read(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let bounds = ACK_LAG_BOUNDS.iter().copied().chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds
            .zip(&self.buckets)
            .map(|(b, c)| (b, c.load(Ordering::Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        (
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
            count,
            buckets,
        )
    }
}

/// The counters of the hub's listeners and streams (SDS's own, and the refusals and limits of every
/// protocol on them), shared by all streams. Read them with [`StreamMetrics::get`] or load the
/// atomics directly.
#[derive(Debug, Default)]
pub struct StreamMetrics {
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
    /// Connections closed as soon as they were accepted: their listener was at its limit.
    pub connections_shed: AtomicU64,
    /// Connections the HTTP/2 server closed because their peer did not answer its keepalive ping.
    pub connections_keepalive_closed: AtomicU64,
    /// Streams and requests refused for going over a limit (streams per proxy, names per stream,
    /// name length).
    pub over_limit: AtomicU64,
    /// Log lines left out by a rate limit.
    pub log_lines_suppressed: AtomicU64,
    /// Time from a push to its ACK.
    pub ack_lag: AckLag,
}

impl StreamMetrics {
    /// Reads one counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Adds one to `counter`.
    pub fn incr(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Takes one from `counter`.
    pub fn decr(counter: &AtomicU64) {
        counter.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_lag_lands_in_the_right_buckets() {
        let lag = AckLag::default();
        lag.observe(Duration::from_millis(3));
        lag.observe(Duration::from_millis(40));
        lag.observe(Duration::from_secs(60));
        let (sum, count, buckets) = lag.read();
        assert_eq!(count, 3);
        assert!((sum - 60.043).abs() < 1e-9, "{sum}");
        assert_eq!(buckets[0], (0.005, 1));
        assert_eq!(buckets[3], (0.05, 1));
        assert_eq!(buckets[12], (f64::INFINITY, 1));
        assert_eq!(buckets.iter().map(|b| b.1).sum::<u64>(), 3);
    }
}
