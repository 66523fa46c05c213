//! What the embedder tunes: the hub's options and the limits on what a client can make it hold.

use std::time::Duration;

/// Tunables of the hub and its streams.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HubOptions {
    /// How long a stream or fetch waits for the proxy's identity to become ready (or for
    /// the first request of a stream) before failing with `UNAVAILABLE`.
    pub identity_wait: Duration,
    /// What one client can make the server hold or wait for.
    pub limits: StreamLimits,
    /// The server's work so far ([`process_load`]): a stream whose first request has not come is
    /// given another identity wait when the server was busy in the last one. Tests put a clock of
    /// their own here.
    pub load_clock: fn() -> Load,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            identity_wait: Duration::from_secs(15),
            limits: StreamLimits::default(),
            load_clock: process_load,
        }
    }
}

/// How much the server has worked so far, two ways. Either can show a busy server the other misses: a
/// server starved of the cores (by a client on the same machine, or by the hypervisor) spends little
/// CPU time, but its runtime's workers stay awake with tasks queued; work on threads outside the
/// runtime (signing, the allocator) is CPU time the workers do not see.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// The CPU time of the process, every thread together.
    pub cpu: Duration,
    /// How long the async runtime's workers have been awake with tasks to run, summed over workers:
    /// wall-clock time, whether or not a core was running them.
    pub runtime_busy: Duration,
}

impl Load {
    /// Whether the server was busy between `earlier` and this reading, `period` apart: it spent at
    /// least `share` of one core's time, or its workers were awake with work for at least that share
    /// of one worker's time.
    pub fn busy_since(&self, earlier: &Load, period: Duration, share: f64) -> bool {
        let floor = period.mul_f64(share);
        self.cpu.saturating_sub(earlier.cpu) >= floor
            || self.runtime_busy.saturating_sub(earlier.runtime_busy) >= floor
    }
}

/// This process's [`Load`]: [`process_cpu_time`], and the busy time of the tokio runtime it is called
/// on (none outside one).
pub fn process_load() -> Load {
    let runtime_busy = tokio::runtime::Handle::try_current()
        .map(|handle| {
            let metrics = handle.metrics();
            (0..metrics.num_workers())
                .map(|worker| metrics.worker_total_busy_duration(worker))
                .sum()
        })
        .unwrap_or_default();
    Load {
        cpu: process_cpu_time(),
        runtime_busy,
    }
}

/// The CPU time this process has used so far, every thread together (`CLOCK_PROCESS_CPUTIME_ID`).
pub fn process_cpu_time() -> Duration {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or_default(),
        u32::try_from(now.tv_nsec).unwrap_or_default(),
    )
}

impl HubOptions {
    /// Options with a different identity wait.
    pub fn with_identity_wait(mut self, identity_wait: Duration) -> Self {
        self.identity_wait = identity_wait;
        self
    }

    /// Options with different limits.
    pub fn with_limits(mut self, limits: StreamLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Options reading the server's load from `clock` (tests: a server that is never, or always,
    /// busy).
    pub fn with_load_clock(mut self, clock: fn() -> Load) -> Self {
        self.load_clock = clock;
        self
    }
}

/// Bounds on what a client can make the SDS server hold or wait for (the daemon takes them from
/// the `limits:` settings; the defaults here are the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamLimits {
    /// Open connections per listener; more are closed as soon as they are accepted.
    pub connections_per_listener: usize,
    /// Time a new connection has to finish its TLS handshake and open its first authenticated
    /// stream.
    pub connect_timeout: Duration,
    /// Time a connection may stay open without an authenticated stream once its streams ended.
    pub idle_timeout: Duration,
    /// Concurrent streams per connection (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`).
    pub streams_per_connection: u32,
    /// Concurrent streams of one proxy, over all connections.
    pub streams_per_proxy: usize,
    /// Resource names one stream may subscribe to.
    pub names_per_stream: usize,
    /// Resource names one proxy may subscribe to, over all its streams.
    pub names_per_proxy: usize,
    /// The longest resource name, in bytes.
    pub name_bytes: usize,
    /// The largest request message, in bytes.
    pub request_bytes: usize,
    /// Warnings logged per proxy, and per listener for refused peers, per minute.
    pub warnings_per_minute: u32,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            connections_per_listener: 16_384,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            streams_per_connection: 1024,
            streams_per_proxy: 256,
            names_per_stream: 256,
            names_per_proxy: 4096,
            name_bytes: 512,
            request_bytes: 1024 * 1024,
            warnings_per_minute: 10,
        }
    }
}

/// HTTP/2 PING interval, so that dead peers are noticed and their streams closed.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// How long a PING may stay unanswered before the connection is closed.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// When the HTTP/2 server pings a connection whose peer has sent nothing, and how long it waits for
/// the answer before closing the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// How long a peer may send nothing before it is pinged.
    pub interval: Duration,
    /// How long the ping may stay unanswered.
    pub timeout: Duration,
}

impl Keepalive {
    /// The longest a live peer stays silent: a ping follows `interval` of silence, and a live peer
    /// answers it within `timeout`. A connection whose peer was silent for longer was closed by the
    /// keepalive.
    pub(crate) fn longest_silence(&self) -> Duration {
        self.interval + self.timeout
    }
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            interval: KEEPALIVE_INTERVAL,
            timeout: KEEPALIVE_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn busy_is_either_clock_past_the_share() {
        let secs = Duration::from_secs;
        let load = |cpu, runtime_busy| Load {
            cpu: secs(cpu),
            runtime_busy: secs(runtime_busy),
        };
        let start = load(100, 200);
        let period = secs(10);
        // Half a core's time on either clock is busy; just under on both is not.
        assert!(load(105, 200).busy_since(&start, period, 0.5));
        assert!(load(100, 205).busy_since(&start, period, 0.5));
        assert!(!load(104, 204).busy_since(&start, period, 0.5));
        assert!(!start.busy_since(&start, period, 0.5));
        // A clock read out of order (a test's, or a restarted runtime's) is not busy.
        assert!(!start.busy_since(&load(200, 300), period, 0.5));
    }

    #[test]
    fn outside_a_runtime_the_load_is_the_cpu_time() {
        let load = process_load();
        assert_eq!(load.runtime_busy, Duration::ZERO);
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        assert!(
            process_load().cpu > load.cpu,
            "this thread's spin is CPU time"
        );
    }

    #[test]
    fn a_worker_running_a_task_is_runtime_busy_time() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("a runtime");
        let before = runtime.block_on(async { process_load() });
        let work = Duration::from_millis(30);
        let task = runtime.spawn(async move {
            let spin = Instant::now();
            while spin.elapsed() < work {
                std::hint::spin_loop();
            }
        });
        runtime.block_on(task).expect("the task ran");
        // The worker reports its busy time when it next runs out of work, which it does now: wait for
        // that, bounded.
        let give_up = Instant::now() + Duration::from_secs(30);
        loop {
            let now = runtime.block_on(async { process_load() });
            if now.runtime_busy.saturating_sub(before.runtime_busy) >= work {
                break;
            }
            assert!(
                Instant::now() < give_up,
                "busy time never reported: {now:?}"
            );
            std::thread::yield_now();
        }
    }
}
