//! `meshca bench sds` and `meshca bench workload`: SDS and Workload API fan-out against an in-process
//! daemon (targets and figures: BENCHMARKS.md).
//!
//! The pieces: [`fleet`] (many streams multiplexed over a few HTTP/2 connections, timing when a
//! rotation reaches each: `StreamSecrets` streams ACKing like Envoy, or `FetchX509SVID` streams
//! ([`fleet::workload_stream`]) reading like a SPIFFE library), [`child`] (the fleet in its own process, so
//! the daemon's memory is measured alone), [`harness`] (the daemon, the idle fleet and the rotation,
//! as both benches run them) and [`sds`] and [`workload`] (each bench's setup and report). `meshca
//! bench agents` ([`agents`]) runs the same with simulated `meshca agent`s ([`fleet::agent_stream`]). With
//! `--console-clients`, `bench sds` also follows the daemon's web console with [`console`] clients.

pub mod agents;
pub mod child;
pub mod console;
pub mod federation;
pub mod fleet;
pub mod harness;
pub mod reconciles;
pub mod sds;
pub mod workload;

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

/// The CPU time (user and system) a process has used so far, in seconds: `/proc/<pid>/stat`'s `utime`
/// and `stime`, which Linux counts in `USER_HZ` ticks (100 per second on every architecture it
/// exports them for), so the figure has a resolution of 10 ms.
pub fn cpu_seconds(pid: Option<u32>) -> anyhow::Result<f64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    let ticks = parse_cpu_ticks(&stat).ok_or_else(|| anyhow!("{path} has no utime and stime"))?;
    Ok(ticks as f64 / USER_HZ)
}

/// The unit of `/proc/<pid>/stat`'s times.
const USER_HZ: f64 = 100.0;

/// `utime + stime` of a `/proc/<pid>/stat` line: fields 14 and 15, counted after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // The fields after the name start with the third, the state.
    let mut fields = after_name.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
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
    fn cpu_time_is_read_after_the_command_name() {
        // A command name with a space and a parenthesis must not shift the fields.
        let stat =
            "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 37 0 0 20 0 9 0 5 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(287));
        assert_eq!(parse_cpu_ticks("4242 (meshca) S 1"), None);
        assert_eq!(parse_cpu_ticks("no name here"), None);
        // This very test has used some CPU, and the figure only grows.
        let first = cpu_seconds(None).expect("this process's own stat");
        let burn: u64 = (0..2_000_000u64).fold(0, |a, i| a.wrapping_add(i * i));
        assert!(burn > 0);
        assert!(cpu_seconds(None).expect("read again") >= first);
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
