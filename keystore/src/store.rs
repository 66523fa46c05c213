//! The storage interface the daemon programs against.

use std::fmt::{self, Debug};

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

    /// Creates a group of entries that belong together (a CA's key and certificate, a token key) unless they
    /// exist: for writers in any thread or process, exactly one creates them and every other gets
    /// [`Creation::Existing`] and must read the winner's entries instead of using its own. The check and the
    /// writes happen under the keystore's writers' lock.
    ///
    /// The creation is all-or-nothing, even when the process is killed in the middle: a later call (or
    /// opening the keystore again) finds either none of the entries or all of them, never some (the file
    /// keystore keeps a journal and rolls back an unfinished group nobody was told about; the database
    /// writes it in one transaction). So a crash never needs a human.
    ///
    /// Generate the data before calling (it may be thrown away): nothing slow runs under the lock. When only
    /// some of the entries exist although no creation was interrupted (a file removed by hand or lost),
    /// nothing is written and the result is [`KeystoreError::PartlyPresent`], for the operator to resolve:
    /// the rest may be a CA that already issued certificates, and it is never replaced silently.
    fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError>;

    /// Removes an entry; removing an absent entry succeeds.
    fn delete(&self, name: &str) -> Result<(), KeystoreError>;

    /// Every entry name that starts with `prefix` (a plain string prefix, so `ca/` lists everything under
    /// `ca`, and `""` lists everything), sorted.
    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError>;

    /// The PKCS#11 token CA keys are made in, when there is one (see [`crate::WithToken`]): the keystore
    /// then holds a CA's certificate and the `pkcs11:` URI of its key, and the token the key.
    fn token(&self) -> Option<&meshca_hsm::Token> {
        None
    }
}

/// One entry of a group written by [`Keystore::create_if_absent`]. `Debug` shows the name only.
#[derive(Clone, Copy)]
pub struct NewEntry<'a> {
    name: &'a str,
    data: &'a [u8],
    secret: bool,
}

impl<'a> NewEntry<'a> {
    /// A secret entry, stored like [`Keystore::put_secret`] stores it.
    pub fn secret(name: &'a str, data: &'a [u8]) -> NewEntry<'a> {
        NewEntry {
            name,
            data,
            secret: true,
        }
    }

    /// A public entry, stored like [`Keystore::put_public`] stores it.
    pub fn public(name: &'a str, data: &'a [u8]) -> NewEntry<'a> {
        NewEntry {
            name,
            data,
            secret: false,
        }
    }

    /// The entry's name.
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The bytes to store.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// Whether the entry is a secret.
    pub fn is_secret(&self) -> bool {
        self.secret
    }
}

impl fmt::Debug for NewEntry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NewEntry")
            .field("name", &self.name)
            .field("secret", &self.secret)
            .finish_non_exhaustive()
    }
}

/// What [`Keystore::create_if_absent`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Creation {
    /// None of the entries existed: this caller wrote all of them.
    Created,
    /// All of them existed (another writer was first): nothing was written; read them.
    Existing,
}
