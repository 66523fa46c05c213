//! meshca's SPIFFE Workload API: the identities a process on this host gets by asking a unix
//! socket, decided by who the kernel says is calling, never by a token.
//!
//! This crate holds the attestation of callers ([`attest`]): who is at the other end of a
//! connection, as selectors that registrations match. The gRPC server that answers the Workload
//! API is built on it.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod attest;
