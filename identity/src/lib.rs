//! meshca's pure identity types, parsed once at the boundary and trusted everywhere after: a
//! [`SpiffeId`], its [`TrustDomain`], and the [`KeyAlgorithm`] of the keys meshca generates.
//!
//! No I/O, no async, no crypto: every other crate (settings, resources, the CA, the reconciler)
//! shares these types, so a value that parsed once never needs checking again.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod key_algorithm;
mod spiffe_id;

pub use key_algorithm::{KeyAlgorithm, UnknownKeyAlgorithm};
pub use spiffe_id::{SpiffeId, SpiffeIdError, TrustDomain, MAX_ID_LEN, MAX_TRUST_DOMAIN_LEN};
