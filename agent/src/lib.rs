//! `meshca agent` and its protocol: the SPIFFE Workload API on every host of a fleet, with identities
//! from remote meshca servers and keys that never leave the host.
//!
//! The agent makes each workload's key on its own host, keeps it in memory, and sends the servers only
//! certificate signing requests; the servers push it the registrations that name it, the certificates
//! they signed and every bundle ([`proto`]). The agent acknowledges a state only once every Workload
//! API stream on its host was sent it, so the servers' rollout gate orders a CA rotation for workloads
//! behind agents as it does for Envoys.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod proto;
pub mod server;

pub use server::{AgentOptions, AgentServer, AgentStatus, Agents, RegistrationStatus};
