//! `meshca agent`: the SPIFFE Workload API on every host of a fleet, with identities from remote meshca
//! servers and keys that never leave the host. The protocol and its server side are the
//! `meshca-agent-server` crate.
//!
//! The agent makes each workload's key on its own host, keeps it in memory, and sends the servers only
//! certificate signing requests; the servers push it the registrations that name it, the certificates
//! they signed and every bundle ([`proto`]). The agent acknowledges a state only once every Workload
//! API stream on its host was sent it, so the servers' rollout gate orders a CA rotation for workloads
//! behind agents as it does for Envoys.
//!
//! [`Agent::start`] runs it: a local Workload API server (the `meshca-workload` crate) over a
//! snapshot the agent builds from each state ([`local`]), a stream to one server at a time, moving to
//! the next when one fails, and an admin listener ([`status`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::net::SocketAddr;
use std::path::PathBuf;

pub mod config;
mod gate;
pub mod keys;
pub mod local;
mod run;
pub mod status;

pub use config::{AgentConfig, ServerAddr, ServerAddrError, DEFAULT_ADMIN, DEFAULT_LISTEN};
/// The protocol, from the crate that serves its server side.
pub use meshca_agent_server::proto;
pub use run::{read_token, Agent, LocalSds};
pub use status::{AgentStatus, StatusHandle};

/// Why the agent cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// No server is named.
    #[error("agent.servers: name at least one meshca server (host:port, https://host:port or unix:///path)")]
    NoServer,
    /// The token file cannot be read.
    #[error("agent.tokenFile: cannot read {}: {source}", path.display())]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The token file holds no agent token.
    #[error("agent.tokenFile: {} holds no usable agent token: {reason}", path.display())]
    Token {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The SDS CA holds no certificate.
    #[error("agent.sdsCa: the file holds no PEM certificate")]
    SdsCa,
    /// The Workload API socket cannot be bound.
    #[error("agent.listen: cannot listen on unix://{}: {reason}", path.display())]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The admin listener is not on loopback.
    #[error("agent.admin: {addr} is not a loopback address; the status endpoint listens on loopback only")]
    AdminNotLoopback {
        /// The address.
        addr: SocketAddr,
    },
    /// The admin listener cannot be bound.
    #[error("agent.admin: cannot listen on {addr}: {source}")]
    AdminBind {
        /// The address.
        addr: SocketAddr,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// Something that should not fail did.
    #[error("{0}")]
    Internal(String),
}

impl AgentError {
    /// Whether the operator must fix the input (exit code 2).
    pub fn is_invalid_input(&self) -> bool {
        !matches!(self, AgentError::Internal(_))
    }
}
