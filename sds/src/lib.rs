//! meshca's Secret Discovery Service: Envoy's SDS v3 over gRPC.
//!
//! One owner publishes an immutable snapshot through the stream hub (`meshca-serve`); the
//! [`SdsServer`] authenticates each proxy with its token, serves it exactly the secrets it asks for
//! from the current snapshot, pushes what changes, and reports ACKs and NACKs to the owner through the
//! hub. [`SdsClient`] speaks the same protocol from the other side, and [`bootstrap`] writes the Envoy
//! bootstrap that connects a sidecar to it.
#![forbid(unsafe_code)]

mod authn;
pub mod bootstrap;
mod client;
mod delta;
mod describe;
mod error;
mod fetch;
#[doc(hidden)]
pub mod fuzzing;
mod names;
mod registry;
mod secret;
mod service;
mod session;
mod shared;
mod sotw;
mod stream;
mod transport;

pub use authn::DISABLE_SPIFFE_VALIDATION_KEY;
pub use client::{decode_secrets, SdsClient};
pub use describe::{describe, tls_certificate_parts, SecretKindView, SecretView};
pub use error::ClientError;
pub use registry::{StreamInfo, StreamKind, StreamRegistry};
pub use secret::{NO_IDENTITY_SAN, SECRET_TYPE_URL, SPIFFE_VALIDATOR_NAME};
pub use service::{AttestedSds, SdsServer};
