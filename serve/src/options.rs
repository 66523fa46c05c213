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
    /// The process's CPU time so far, every thread together ([`process_cpu_time`]): a stream whose
    /// first request has not come is given another identity wait when the server was busy in the
    /// last one. Tests put a clock of their own here.
    pub cpu_clock: fn() -> Duration,
}

impl Default for HubOptions {
    fn default() -> Self {
        Self {
            identity_wait: Duration::from_secs(15),
            limits: StreamLimits::default(),
            cpu_clock: process_cpu_time,
        }
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

    /// Options reading the process's CPU time from `clock` (tests: a server that is never, or
    /// always, busy).
    pub fn with_cpu_clock(mut self, clock: fn() -> Duration) -> Self {
        self.cpu_clock = clock;
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
