//! The drills and benches of meshca, and the Envoy bootstrap builder they share with `meshca bootstrap`.
//!
//! `meshca drill`: play a rotation or migration against an in-process daemon and simulated Envoy
//! proxies that hold real mTLS connections to each other, and report every failed handshake.
//!
//! The pieces: [`proxy`] (one SDS stream per proxy, Envoy-like delayed apply then ACK), [`tls`]
//! (rustls configs from what a proxy applied, SPIFFE ID checks), [`traffic`] (handshakes between
//! random pairs, counted per phase), [`fleet`] (the proxies and waiting on their state), [`scenario`]
//! (each drill as a script of resource edits) and [`play`] (which plays a script). In the `workload`
//! drill the members are [`workload`]s on the SPIFFE Workload API instead of proxies, on the daemon's own
//! socket or, with `--agent`, behind [`agents`]. With `--envoy`,
//! [`envoy`] runs real Envoy sidecars instead of the simulated proxies and counts HTTP requests through
//! them, each a new mTLS handshake. [`federation`] plays two daemons of two trust domains federated
//! both ways.

//! [`bench`] holds `meshca bench sds`; [`bootstrap`] the Envoy bootstraps. Drills and benches start a
//! daemon in process through `meshca-daemon`.
#![forbid(unsafe_code)]

pub mod agents;
pub mod bench;
pub mod envoy;
pub mod failover;
pub mod federation;
pub mod fleet;
pub mod pause;
pub mod play;
pub mod proxy;
pub mod report;
pub mod rng;
pub mod sandbox;
pub mod scenario;
pub mod tls;
pub mod token;
pub mod traffic;
pub mod workload;

pub use scenario::Scenario;
