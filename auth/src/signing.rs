//! The daemon's token signing key.

use std::fmt;
use std::sync::Arc;

use meshca_hsm::TokenKey;
use meshca_identity::KeyAlgorithm;
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
    inner: Inner,
    /// The uncompressed public point.
    public_key: Vec<u8>,
}

// A handful per process: keeping the key pair inline saves an indirection on every signature.
#[allow(clippy::large_enum_variant)]
enum Inner {
    Software {
        pair: EcdsaKeyPair,
        pkcs8: Zeroizing<Vec<u8>>,
        rng: SystemRandom,
    },
    /// In a PKCS#11 token (`keystore.pkcs11`): every signature is made there.
    Token(Arc<TokenKey>),
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
        let public_key = pair.public_key().as_ref().to_vec();
        Ok(SigningKey {
            inner: Inner::Software {
                pair,
                pkcs8: Zeroizing::new(pkcs8.to_vec()),
                rng,
            },
            public_key,
        })
    }

    /// A key in a PKCS#11 token, which must be ECDSA P-256.
    pub fn from_token_key(key: TokenKey) -> Result<SigningKey, AuthError> {
        if key.algorithm() != KeyAlgorithm::EcdsaP256 {
            return Err(AuthError::Key {
                reason: format!(
                    "the key {:?} in the PKCS#11 token is {}, not ECDSA P-256",
                    key.label(),
                    key.algorithm()
                ),
            });
        }
        Ok(SigningKey {
            public_key: key.public_key().to_vec(),
            inner: Inner::Token(Arc::new(key)),
        })
    }

    /// The PKCS#8 (DER) document of this key, for persistence (handle as a secret); `None` for a key in
    /// a token, which never leaves it.
    pub fn pkcs8(&self) -> Option<&[u8]> {
        match &self.inner {
            Inner::Software { pkcs8, .. } => Some(pkcs8),
            Inner::Token(_) => None,
        }
    }

    /// The key in the token, when it is in one.
    pub fn token_key(&self) -> Option<&TokenKey> {
        match &self.inner {
            Inner::Software { .. } => None,
            Inner::Token(key) => Some(key),
        }
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
        Verifier::from_validated_public_key(&self.public_key)
    }

    /// Signs arbitrary header and payload bytes, always with a low-S signature. Crate-private: tests use it to
    /// forge well-signed tokens with wrong content.
    pub(crate) fn sign(&self, header: &[u8], payload: &[u8]) -> Result<String, AuthError> {
        let signing_input = format!("{}.{}", jwt::encode(header), jwt::encode(payload));
        let failed = |reason: &str| AuthError::Key {
            reason: reason.to_owned(),
        };
        let signature = match &self.inner {
            Inner::Software { pair, rng, .. } => pair
                .sign(rng, signing_input.as_bytes())
                .map_err(|_| failed("signing a token failed (system random source unavailable?)"))?
                .as_ref()
                .to_vec(),
            Inner::Token(key) => key.sign_raw(signing_input.as_bytes()).map_err(|e| {
                failed(&format!("signing a token in the PKCS#11 token failed: {e}"))
            })?,
        };
        // Either of the two valid `s` may come back; the verifier accepts only the low one.
        let mut fixed: [u8; 64] = signature
            .as_slice()
            .try_into()
            .map_err(|_| failed("an ES256 signature that is not 64 bytes came back"))?;
        low_s::normalize(&mut fixed);
        Ok(format!("{signing_input}.{}", jwt::encode(&fixed)))
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("alg", &"ES256")
            .field("key_id", &self.verifier().key_id())
            .field(
                "private_key",
                &match &self.inner {
                    Inner::Software { .. } => format_args!("[redacted]"),
                    Inner::Token(_) => format_args!("[in the PKCS#11 token]"),
                },
            )
            .finish()
    }
}
