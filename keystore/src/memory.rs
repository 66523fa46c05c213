//! An in-memory keystore for tests.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

use zeroize::Zeroizing;

use crate::error::KeystoreError;
use crate::name::{validate_name, validate_prefix};
use crate::secret::Secret;
use crate::store::{Creation, Keystore, NewEntry};

/// A [`Keystore`] in process memory, for tests of code that uses a keystore. Nothing survives the process.
///
/// It applies the same name rules as [`crate::FileKeystore`], and, like it, refuses to return public data
/// through [`Keystore::get_secret`] ([`KeystoreError::InsecurePermissions`] with mode 0644).
#[derive(Default)]
pub struct MemoryKeystore {
    entries: Mutex<BTreeMap<String, Entry>>,
}

struct Entry {
    data: Zeroizing<Vec<u8>>,
    secret: bool,
}

impl MemoryKeystore {
    /// An empty keystore.
    pub fn new() -> MemoryKeystore {
        MemoryKeystore::default()
    }

    fn entries(&self) -> MutexGuard<'_, BTreeMap<String, Entry>> {
        // The map is consistent after any panic (each operation is one insert or remove), so poisoning is moot.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn put(&self, name: &str, data: &[u8], secret: bool) -> Result<(), KeystoreError> {
        validate_name(name)?;
        let entry = Entry {
            data: Zeroizing::new(data.to_vec()),
            secret,
        };
        self.entries().insert(name.to_owned(), entry);
        Ok(())
    }
}

impl Keystore for MemoryKeystore {
    fn get_secret(&self, name: &str) -> Result<Option<Secret>, KeystoreError> {
        validate_name(name)?;
        match self.entries().get(name) {
            None => Ok(None),
            Some(entry) if entry.secret => Ok(Some(Secret::from(entry.data.to_vec()))),
            Some(_) => Err(KeystoreError::InsecurePermissions {
                path: PathBuf::from(name),
                mode: 0o644,
            }),
        }
    }

    fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.put(name, data, true)
    }

    fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError> {
        validate_name(name)?;
        Ok(self.entries().get(name).map(|entry| entry.data.to_vec()))
    }

    fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.put(name, data, false)
    }

    fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError> {
        for entry in entries {
            validate_name(entry.name())?;
        }
        let mut map = self.entries();
        let (present, missing): (Vec<&NewEntry<'_>>, Vec<&NewEntry<'_>>) =
            entries.iter().partition(|e| map.contains_key(e.name()));
        if missing.is_empty() {
            return Ok(Creation::Existing);
        }
        if !present.is_empty() {
            let names =
                |list: Vec<&NewEntry<'_>>| list.iter().map(|e| e.name().to_owned()).collect();
            return Err(KeystoreError::PartlyPresent {
                present: names(present),
                missing: names(missing),
            });
        }
        for entry in entries {
            let stored = Entry {
                data: Zeroizing::new(entry.data().to_vec()),
                secret: entry.is_secret(),
            };
            map.insert(entry.name().to_owned(), stored);
        }
        Ok(Creation::Created)
    }

    fn delete(&self, name: &str) -> Result<(), KeystoreError> {
        validate_name(name)?;
        self.entries().remove(name);
        Ok(())
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError> {
        validate_prefix(prefix)?;
        Ok(self
            .entries()
            .keys()
            .filter(|name| name.starts_with(prefix))
            .cloned()
            .collect())
    }
}

impl fmt::Debug for MemoryKeystore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryKeystore")
            .field("entries", &self.entries().len())
            .finish()
    }
}
