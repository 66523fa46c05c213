//! A keystore paired with a PKCS#11 token (`keystore.pkcs11`): entries stay where they were, and new CA
//! keys are made in the token.

use meshca_hsm::{Token, TokenKey};

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

/// Records `key`, made pending in the keystore's token ([`Token::generate_pending_key`]), by creating
/// `entries` (which name it by a `pkcs11:` URI with the label `label`), then labels it `label`. `true`
/// when this call recorded it; `false` when another process had already created the entries (its key is
/// the one to load; this one is destroyed in the token, and must not be used). A kill at any step
/// leaves what a start settles.
pub fn record_token_key(
    keystore: &dyn Keystore,
    key: &TokenKey,
    label: &str,
    entries: &[NewEntry<'_>],
) -> Result<bool, KeystoreError> {
    crate::crash_point(format_args!(
        "record the key {label} made in the PKCS#11 token"
    ));
    match keystore.create_if_absent(entries) {
        Ok(Creation::Created) => {
            crate::crash_point(format_args!("label the key {label} in the PKCS#11 token"));
            if let Err(error) = key.record_as(label) {
                tracing::warn!(key = label, "a new key in the PKCS#11 token keeps its pending label until the next start: {error}");
            }
            Ok(true)
        }
        outcome => {
            if let Err(error) = key.token().destroy_keys(key.id()) {
                tracing::warn!(key = label, "a key made in the PKCS#11 token and not used could not be destroyed; the next start does: {error}");
            }
            outcome.map(|_| false)
        }
    }
}
