//! A keystore paired with a PKCS#11 token (`keystore.pkcs11`): entries stay where they were, and new CA
//! keys are made in the token.

use meshca_hsm::{Pkcs11Uri, Token, TokenKey};

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

/// Why the key a keystore entry records by its `pkcs11:` URI cannot be looked for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordedKeyError {
    /// The entry holds no `pkcs11:` URI.
    #[error("{entry} in the keystore is not a pkcs11: URI: {reason}")]
    NotAUri {
        /// The keystore entry.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No token is configured.
    #[error("{entry} names a key in a PKCS#11 token ({uri}), and keystore.pkcs11 is not set: set it to that token")]
    NoToken {
        /// The keystore entry.
        entry: String,
        /// The URI it holds.
        uri: String,
    },
    /// The URI names another token than the configured one.
    #[error("{entry} names a key in another PKCS#11 token ({uri}) than keystore.pkcs11.token {configured:?}")]
    OtherToken {
        /// The keystore entry.
        entry: String,
        /// The URI it holds.
        uri: String,
        /// The configured token's label.
        configured: String,
    },
}

/// The keystore's token and the `pkcs11:` URI the entry `entry` (holding `data`) records, which must
/// name that token (or none).
pub fn recorded_key<'a>(
    keystore: &'a dyn Keystore,
    entry: &str,
    data: &[u8],
) -> Result<(&'a Token, Pkcs11Uri), RecordedKeyError> {
    let uri = Pkcs11Uri::parse(String::from_utf8_lossy(data).trim()).map_err(|e| {
        RecordedKeyError::NotAUri {
            entry: entry.to_owned(),
            reason: e.to_string(),
        }
    })?;
    let token = keystore.token().ok_or_else(|| RecordedKeyError::NoToken {
        entry: entry.to_owned(),
        uri: uri.to_string(),
    })?;
    if uri.token().is_some_and(|label| label != token.label()) {
        return Err(RecordedKeyError::OtherToken {
            entry: entry.to_owned(),
            uri: uri.to_string(),
            configured: token.label().to_owned(),
        });
    }
    Ok((token, uri))
}
