//! What every protocol meshca serves stands on: the listeners (unix, TLS and loopback, with their
//! connection limits and deadlines), the HTTP/2 and gRPC transport under them, and the stream hub
//! through which every stream (SDS, the Workload API, the agent protocol) reads the owner's snapshots
//! and reports its life to the owner in one way.
//!
//! - [`bind`] sets up the listeners; [`BoundListeners::serve_service`] serves gRPC services on them.
//! - [`Hub`] hands out snapshots and revocations, verifies bearer tokens, wakes the streams a snapshot
//!   concerns, and opens a [`HubStream`] for each stream: the owner's view of it.
//! - [`ledger`] is the ACK bookkeeping every protocol shares: what a peer was sent, and what its
//!   acknowledgements mean.
//! - [`grpc_service`] is the one router every gRPC service here is mounted with.
#![forbid(unsafe_code)]

pub mod allowed_hosts;
mod attested;
mod bearer;
mod channel;
mod codec;
mod conn;
mod error;
pub mod frames;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc_service;
mod h2_header_fixup;
mod hub;
pub mod ledger;
pub mod library_logs;
mod listen;
mod log_budget;
mod metrics;
mod options;
mod wake;

pub use attested::{Attest, Attested, AttestedCheck, AttestedRoutes};
pub use channel::{connect_channel, ClientTls};
pub use codec::{StreamCodec, StreamEncoder};
pub use conn::{ConnInfo, ConnProgress, OpenStream};
pub use error::{ConnectError, ErrorChain, ListenError, ServeError};
pub use hub::{token_deadline, Hub, HubStream, NewStream, SnapshotWaiter, EVENT_BUFFER};
pub use listen::{bind, BoundAddr, BoundListeners, ConnPolicy, Listener, PeerProbe};
pub use log_budget::LogBudget;
pub use meshca_files::{bounded, shown};
pub use metrics::{AckLag, StreamMetrics, ACK_LAG_BOUNDS};
pub use options::{process_load, HubOptions, Keepalive, Load, StreamLimits};

/// Locks `mutex`, whatever a thread that panicked while holding it left: every structure locked here
/// stays consistent between statements.
pub fn lock_unpoisoned<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
