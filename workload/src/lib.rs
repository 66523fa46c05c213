//! meshca's SPIFFE Workload API: the identities a process on this host gets by asking a unix
//! socket, decided by who the kernel says is calling, never by a token.
//!
//! A caller is identified by the kernel ([`attest`]: its process's uid, gid, binary and unit, held
//! through a pidfd), matched against the `WorkloadRegistration` resources, and served the identity
//! of the Dataplane its registration names, from the same snapshot SDS serves ([`WorkloadApi`]). Its
//! streams report to the owner like SDS streams, so the rollout gate orders CA rotations for
//! workloads as it does for Envoys.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod attest;
mod callers;
pub mod client;
mod follow;
pub mod jwt;
mod jwt_api;
pub mod jwt_keys;
mod jwt_source;
mod messages;
mod options;
pub mod proto;
mod sds_api;
mod service;
mod shared;
mod x509;

pub use callers::{CallerStream, Callers};
pub use jwt_api::{mint_jwt_svid, MintError};
pub use jwt_source::{JwtMinter, JwtSource, RemoteJwt};
pub use options::{WorkloadOptions, DEFAULT_ACK_AFTER, DEFAULT_JWT_KEY_LIFETIME};
pub use service::{WorkloadApi, SECURITY_HEADER};
pub use x509::MAX_RESPONSE_BYTES;
