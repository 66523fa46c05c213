//! The daemon's token signing key.

use std::fmt;

use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
use zeroize::Zeroizing;

use crate::claims::Claims;
use crate::error::AuthError;
use crate::jwt::{self, WireClaims, HEADER_JSON};
use crate::low_s;
use crate::verify::{Verifier, MAX_TOKEN_LEN};

/// An ECDSA P-256 key that mints proxy tokens (ES256).
///
/// The PKCS#8 document is kept in zeroize-on-drop memory so the caller can persist it (keystore, mode 0600);
/// `Debug` prints only the public key id. ring holds its own copy of the private scalar, which it does not
/// promise to wipe: keep one `SigningKey` per process, not many short-lived ones.
pub struct SigningKey {
    pair: EcdsaKeyPair,
    pkcs8: Zeroizing<Vec<u8>>,
    rng: SystemRandom,
}

impl SigningKey {
    /// Generates a new key; returns it and its PKCS#8 (DER) document for persistence.
    pub fn generate() -> Result<(SigningKey, Zeroizing<Vec<u8>>), AuthError> {
        let rng = SystemRandom::new();
        let document = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| AuthError::Key {
                reason: "generating a P-256 key failed (system random source unavailable?)"
                    .to_owned(),
            })?;
        let pkcs8 = Zeroizing::new(document.as_ref().to_vec());
        let key = SigningKey::from_pkcs8(&pkcs8)?;
        Ok((key, pkcs8))
    }

    /// Loads a key from a PKCS#8 (DER) document holding an ECDSA P-256 private key, as written by
    /// [`SigningKey::generate`].
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<SigningKey, AuthError> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng).map_err(
            |rejected| AuthError::Key {
                reason: format!(
                    "the stored key is not a PKCS#8 ECDSA P-256 private key ({rejected}); \
                     restore it from backup or remove it to generate a new one (every minted token then \
                     stops verifying)"
                ),
            },
        )?;
        Ok(SigningKey {
            pair,
            pkcs8: Zeroizing::new(pkcs8.to_vec()),
            rng,
        })
    }

    /// The PKCS#8 (DER) document of this key, for persistence. Handle as a secret.
    pub fn pkcs8(&self) -> &[u8] {
        &self.pkcs8
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
        Verifier::from_validated_public_key(self.pair.public_key().as_ref())
    }

    /// Signs arbitrary header and payload bytes, always with a low-S signature. Crate-private: tests use it to
    /// forge well-signed tokens with wrong content.
    pub(crate) fn sign(&self, header: &[u8], payload: &[u8]) -> Result<String, AuthError> {
        let signing_input = format!("{}.{}", jwt::encode(header), jwt::encode(payload));
        let failed = |reason: &str| AuthError::Key {
            reason: reason.to_owned(),
        };
        let signature = self
            .pair
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| failed("signing a token failed (system random source unavailable?)"))?;
        // ring may return either of the two valid `s`; the verifier accepts only the low one.
        let mut fixed: [u8; 64] = signature
            .as_ref()
            .try_into()
            .map_err(|_| failed("ring returned an ES256 signature that is not 64 bytes"))?;
        low_s::normalize(&mut fixed);
        Ok(format!("{signing_input}.{}", jwt::encode(&fixed)))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("alg", &"ES256")
            .field("key_id", &self.verifier().key_id())
            .field("private_key", &format_args!("[redacted]"))
            .finish()
    }
}
