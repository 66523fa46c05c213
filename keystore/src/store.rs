//! The storage interface the daemon programs against.

use std::fmt::Debug;

use crate::error::KeystoreError;
use crate::secret::Secret;

/// Durable storage of named entries: secrets (private keys) and public data (certificates, state).
///
/// Names are relative slash paths (see [`crate::validate_name`]); secrets and public entries share one
/// namespace. Every write replaces the whole entry atomically: a reader sees the old or the new bytes, never a
/// mix, and a crash mid-write leaves the old entry. The daemon holds one as `Arc<dyn Keystore>`.
pub trait Keystore: Send + Sync + Debug {
    /// Reads a secret; `Ok(None)` when there is no such entry. An entry that others could read is an error,
    /// never returned.
    fn get_secret(&self, name: &str) -> Result<Option<Secret>, KeystoreError>;

    /// Creates or replaces a secret, readable by the daemon's user only.
    fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError>;

    /// Reads public data; `Ok(None)` when there is no such entry.
    fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError>;

    /// Creates or replaces public data (world-readable on disk).
    fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError>;

    /// Removes an entry; removing an absent entry succeeds.
    fn delete(&self, name: &str) -> Result<(), KeystoreError>;

    /// Every entry name that starts with `prefix` (a plain string prefix, so `ca/` lists everything under
    /// `ca`, and `""` lists everything), sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError>;
}
