//! A keystore paired with a PKCS#11 token (`keystore.pkcs11`): entries stay where they were, and new CA
//! keys are made in the token.

use meshca_hsm::Token;

use crate::error::KeystoreError;
use crate::secret::Secret;
use crate::store::{Creation, Keystore, NewEntry};

/// `keystore`, whose [`Keystore::token`] is `token`.
#[derive(Debug)]
pub struct WithToken<K> {
    keystore: K,
    token: Token,
}

impl<K: Keystore> WithToken<K> {
    /// Pairs `keystore` with `token`.
    pub fn new(keystore: K, token: Token) -> WithToken<K> {
        WithToken { keystore, token }
    }
}

impl<K: Keystore> Keystore for WithToken<K> {
    fn get_secret(&self, name: &str) -> Result<Option<Secret>, KeystoreError> {
        self.keystore.get_secret(name)
    }

    fn put_secret(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.keystore.put_secret(name, data)
    }

    fn get_public(&self, name: &str) -> Result<Option<Vec<u8>>, KeystoreError> {
        self.keystore.get_public(name)
    }

    fn put_public(&self, name: &str, data: &[u8]) -> Result<(), KeystoreError> {
        self.keystore.put_public(name, data)
    }

    fn create_if_absent(&self, entries: &[NewEntry<'_>]) -> Result<Creation, KeystoreError> {
        self.keystore.create_if_absent(entries)
    }

    fn delete(&self, name: &str) -> Result<(), KeystoreError> {
        self.keystore.delete(name)
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, KeystoreError> {
        self.keystore.list(prefix)
    }

    fn token(&self) -> Option<&Token> {
        Some(&self.token)
    }
}
