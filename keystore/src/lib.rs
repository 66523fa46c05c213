//! Durable storage for meshca's CA keys, token keys and generated state.
//!
//! Everything is addressed by a relative slash path such as `ca/default/ca-1/key.pem` (see [`validate_name`]).
//! Secrets come back as [`Secret`], which zeroizes on drop and never prints. [`FileKeystore`] keeps them on
//! disk: mode 0600 files in a 0700 tree, replaced atomically. [`MemoryKeystore`] is for tests. The PostgreSQL
//! keystore of replicas implements the same [`Keystore`] in the `meshca-db` crate. [`WithToken`] pairs a
//! keystore with the PKCS#11 token CA keys are made in.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod crash;
mod error;
mod file;
mod fsops;
mod journal;
mod memory;
mod name;
mod secret;
mod store;
mod with_token;

pub use crash::{crash_point, CRASH_AT_ENV};
pub use error::KeystoreError;
pub use file::FileKeystore;
pub use memory::MemoryKeystore;
pub use name::{validate_name, validate_prefix};
pub use secret::Secret;
pub use store::{Creation, Keystore, NewEntry};
pub use with_token::{record_token_key, recorded_key, RecordedKeyError, WithToken};
