//! meshca's Secret Discovery Service: Envoy's SDS v3 over gRPC.
//!
//! One owner publishes an immutable [`Snapshot`] through `tokio::sync::watch`; the
//! [`SdsServer`] authenticates each proxy with its token, serves it exactly the secrets it
//! asks for from the current snapshot, pushes what changes, and reports ACKs and NACKs as
//! [`StreamEvent`]s. [`bind`] sets up the unix, TLS and loopback listeners;
//! [`SdsClient`] speaks the same protocol from the other side.
#![forbid(unsafe_code)]

pub mod allowed_hosts;
mod authn;
mod client;
mod delta;
mod describe;
mod error;
mod fetch;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc_service;
pub mod library_logs;
mod listen;
mod log_budget;
mod log_text;
mod metrics;
mod names;
mod options;
mod registry;
mod secret;
mod service;
mod session;
mod shared;
mod sotw;
mod stream;
mod transport;
mod wake;

pub use authn::{AttestedCheck, DISABLE_SPIFFE_VALIDATION_KEY};
pub use client::{connect_channel, decode_secrets, ClientTls, SdsClient};
pub use describe::{describe, tls_certificate_parts, SecretKindView, SecretView};
pub use error::{ClientError, ListenError, ServeError};
pub use listen::{bind, BoundAddr, BoundListeners, ConnPolicy, Listener, PeerProbe};
pub use log_budget::LogBudget;
pub use log_text::shown;
pub use metrics::{AckLag, SdsMetrics, ACK_LAG_BOUNDS};
pub use options::{SdsLimits, ServerOptions};
pub use registry::{StreamInfo, StreamKind, StreamRegistry};
pub use secret::{NO_IDENTITY_SAN, SECRET_TYPE_URL, SPIFFE_VALIDATOR_NAME};
pub use service::{is_sds_method, Attested, SdsServer, SnapshotWaiter, EVENT_BUFFER};
pub use session::token_deadline;
pub use transport::conn::{ConnInfo, OpenStream};
