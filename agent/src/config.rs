//! What `meshca agent` is told: its servers, its token, where it serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use meshca_config::{ServerAddr, ServerAddrError};
use meshca_workload::WorkloadOptions;

/// The default Workload API socket of `meshca agent`.
pub use meshca_config::DEFAULT_AGENT_LISTEN as DEFAULT_LISTEN;

/// The default admin listener of `meshca agent` (`/ready`, `/api/status`).
pub use meshca_config::DEFAULT_AGENT_ADMIN as DEFAULT_ADMIN;

/// How long a server may take to send the first state of a stream before the agent tries the next.
pub const DEFAULT_FIRST_STATE_TIMEOUT: Duration = Duration::from_secs(15);

/// Everything `meshca agent` runs with.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The servers, tried in order.
    pub servers: Vec<ServerAddr>,
    /// The agent token's file (read again at every connection, so a renewed token is picked up).
    pub token_file: PathBuf,
    /// PEM of the CAs that sign the servers' SDS certificates (TLS to TCP servers).
    pub sds_ca: Option<Vec<u8>>,
    /// The Workload API socket.
    pub listen: PathBuf,
    /// The admin listener (`/ready`, `/api/status`); `None`: none.
    pub admin: Option<SocketAddr>,
    /// The Workload API server's options ([`WorkloadOptions::agent`] is set by the agent).
    pub workload: WorkloadOptions,
    /// How long a server may take to send a stream's first state.
    pub first_state_timeout: Duration,
    /// The shortest and the longest wait before connecting again after a failure.
    pub backoff: (Duration, Duration),
}

impl AgentConfig {
    /// A configuration with the defaults for everything but the servers and the token.
    pub fn new(servers: Vec<ServerAddr>, token_file: PathBuf) -> AgentConfig {
        AgentConfig {
            servers,
            token_file,
            sds_ca: None,
            listen: PathBuf::from(DEFAULT_LISTEN),
            admin: Some(DEFAULT_ADMIN),
            workload: WorkloadOptions::default(),
            first_state_timeout: DEFAULT_FIRST_STATE_TIMEOUT,
            backoff: (Duration::from_millis(500), Duration::from_secs(30)),
        }
    }
}
