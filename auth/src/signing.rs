//! The daemon's token signing key.

use std::fmt;

use meshca_hsm::TokenKey;
use zeroize::Zeroizing;

use crate::claims::Claims;
use crate::error::AuthError;
use crate::es256::Es256Key;
use crate::jwt::{self, WireClaims, HEADER_JSON};
use crate::verify::{Verifier, MAX_TOKEN_LEN};

/// An ECDSA P-256 key that mints proxy tokens (ES256).
///
/// The PKCS#8 document is kept in zeroize-on-drop memory so the caller can persist it (keystore, mode 0600);
/// `Debug` prints only the public key id. ring holds its own copy of the private scalar, which it does not
/// promise to wipe: keep one `SigningKey` per process, not many short-lived ones.
pub struct SigningKey {
    key: Es256Key,
}

impl SigningKey {
    /// Generates a new key; returns it and its PKCS#8 (DER) document for persistence.
    pub fn generate() -> Result<(SigningKey, Zeroizing<Vec<u8>>), AuthError> {
        let key = Es256Key::generate().map_err(|reason| AuthError::Key { reason })?;
        let pkcs8 = key.pkcs8().cloned().unwrap_or_default();
        Ok((SigningKey { key }, pkcs8))
    }

    /// Loads a key from a PKCS#8 (DER) document holding an ECDSA P-256 private key, as written by
    /// [`SigningKey::generate`].
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<SigningKey, AuthError> {
        let key = Es256Key::from_pkcs8(pkcs8).map_err(|rejected| AuthError::Key {
            reason: format!(
                "the stored key is not a PKCS#8 ECDSA P-256 private key ({rejected}); \
                 restore it from backup or remove it to generate a new one (every minted token then \
                 stops verifying)"
            ),
        })?;
        Ok(SigningKey { key })
    }

    /// A key in a PKCS#11 token, which must be ECDSA P-256.
    pub fn from_token_key(key: TokenKey) -> Result<SigningKey, AuthError> {
        let key = Es256Key::from_token_key(key).map_err(|reason| AuthError::Key { reason })?;
        Ok(SigningKey { key })
    }

    /// The PKCS#8 (DER) document of this key, for persistence (handle as a secret); `None` for a key in
    /// a token, which never leaves it.
    pub fn pkcs8(&self) -> Option<&[u8]> {
        self.key.pkcs8().map(|pkcs8| pkcs8.as_slice())
    }

    /// The key in the token, when it is in one.
    pub fn token_key(&self) -> Option<&TokenKey> {
        self.key.token_key()
    }

    /// Signs `claims` into a compact JWT (`header.claims.signature`).
    ///
    /// Fails when a claim is invalid (the same checks [`Verifier::verify`] applies, so every minted token is
    /// one the verifier accepts within its validity window) or the token would exceed [`MAX_TOKEN_LEN`].
    pub fn mint(&self, claims: &Claims) -> Result<String, AuthError> {
        claims.validate()?;
        let payload = serde_json::to_vec(&WireClaims::from_claims(claims)).map_err(|e| {
            AuthError::Malformed {
                reason: format!("the claims could not be encoded: {e}"),
            }
        })?;
        let token = self.sign(HEADER_JSON.as_bytes(), &payload)?;
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::InvalidClaim {
                field: "labels",
                reason: format!(
                    "the token would be {} bytes, more than the {MAX_TOKEN_LEN} a verifier accepts; use fewer \
                     or shorter labels and tags",
                    token.len()
                ),
            });
        }
        Ok(token)
    }

    /// The verifier for tokens this key mints.
    pub fn verifier(&self) -> Verifier {
        Verifier::from_validated_public_key(self.key.public_key())
    }

    /// Signs arbitrary header and payload bytes, always with a low-S signature. Crate-private: tests use it to
    /// forge well-signed tokens with wrong content.
    pub(crate) fn sign(&self, header: &[u8], payload: &[u8]) -> Result<String, AuthError> {
        let signing_input = format!("{}.{}", jwt::encode(header), jwt::encode(payload));
        let fixed = self
            .key
            .sign(signing_input.as_bytes())
            .map_err(|reason| AuthError::Key {
                reason: format!("signing a token: {reason}"),
            })?;
        Ok(format!("{signing_input}.{}", jwt::encode(&fixed)))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("alg", &"ES256")
            .field("key_id", &self.verifier().key_id())
            .field("private_key", &self.key.whereabouts())
            .finish()
    }
}
