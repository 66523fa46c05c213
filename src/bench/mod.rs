//! `meshca bench sds`: SDS fan-out against an in-process daemon (targets and figures: BENCHMARKS.md).
//!
//! The pieces: [`fleet`] (many `StreamSecrets` streams multiplexed over a few HTTP/2 connections, each
//! ACKing like Envoy and timing when a rotation reaches it), [`child`] (the fleet in its own process, so
//! the daemon's memory is measured alone) and [`sds`] (the daemon, the rotation and the report).

pub mod child;
pub mod fleet;
pub mod sds;

use anyhow::{anyhow, Context};

/// The resident set size of a process (`VmRSS` of `/proc/<pid>/status`), in bytes.
pub fn rss_bytes(pid: Option<u32>) -> anyhow::Result<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let status = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    parse_vm_rss(&status).ok_or_else(|| anyhow!("{path} has no VmRSS line"))
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib * 1024)
}

/// The value at quantile `q` (0..=1) of sorted `values`, by nearest rank; `None` when empty.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_in_bytes() {
        let status = "Name:\tmeshca\nVmPeak:\t  9000 kB\nVmRSS:\t    1234 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(status), Some(1234 * 1024));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        assert!(rss_bytes(None).is_ok_and(|b| b > 0));
    }

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), Some(50.0));
        assert_eq!(quantile(&values, 0.99), Some(99.0));
        assert_eq!(quantile(&values, 1.0), Some(100.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
