//! Checking proxy tokens.

use std::fmt;
use std::sync::Arc;

use ring::digest;
use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};

use crate::claims::Claims;
use crate::error::AuthError;
use crate::jwt;
use crate::low_s;
use crate::revocation::RevocationList;

/// Clock skew tolerated between the minting and the verifying host, on `exp` and on an `iat` or `nbf` in the
/// future.
pub const CLOCK_SKEW_LEEWAY_SECS: u64 = 30;

/// The longest token accepted (bytes). Longer input is refused before any decoding.
pub const MAX_TOKEN_LEN: usize = 8192;

/// Length of an uncompressed P-256 public key (`0x04 || X || Y`).
const P256_PUBLIC_KEY_LEN: usize = 65;

/// Length of an ES256 signature (`r || s`).
const ES256_SIGNATURE_LEN: usize = 64;

/// Checks tokens minted by one [`crate::SigningKey`]; holds only the public key. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Verifier {
    public_key: Arc<[u8]>,
}

impl Verifier {
    /// A verifier for an uncompressed P-256 public key (65 bytes, `0x04 || X || Y`), e.g. one shared with a
    /// replica. Whether the point lies on the curve is checked by every verification.
    pub fn from_public_key(public_key: &[u8]) -> Result<Verifier, AuthError> {
        if public_key.len() != P256_PUBLIC_KEY_LEN || public_key.first() != Some(&0x04) {
            return Err(AuthError::Key {
                reason: "a token public key must be an uncompressed P-256 point (65 bytes starting with 0x04)"
                    .to_owned(),
            });
        }
        Ok(Verifier::from_validated_public_key(public_key))
    }

    pub(crate) fn from_validated_public_key(public_key: &[u8]) -> Verifier {
        Verifier {
            public_key: Arc::from(public_key),
        }
    }

    /// The uncompressed P-256 public key.
    pub fn public_key(&self) -> &[u8] {
        &self.public_key
    }

    /// A short, stable name for the key, for logs and status: the first 8 bytes of SHA-256 of the public key,
    /// in hex.
    pub fn key_id(&self) -> String {
        digest::digest(&digest::SHA256, &self.public_key).as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Reads the claims of a token *without checking its signature or times*: for a tool that only needs
    /// to know which proxy its own token names (`meshca bootstrap`). Never use the result to decide what
    /// a peer may have. The format is checked as strictly as by [`Verifier::verify`].
    pub fn read_unverified(token: &str) -> Result<Claims, AuthError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::Malformed {
                reason: format!("longer than {MAX_TOKEN_LEN} bytes"),
            });
        }
        let parts = jwt::split(token)?;
        jwt::check_header(parts.header)?;
        jwt::decode_claims(parts.payload)?.into_claims()
    }

    /// Checks a token and returns its claims.
    ///
    /// Accepts only the header `{"alg":"ES256","typ":"JWT"}`, a valid low-S signature by this key (`s <= n/2`,
    /// so a token cannot be re-spelled), `iss` = `meshca`, `sub` = `<mesh>.<name>`, well-formed fields,
    /// `now_unix < exp + 30 s`, `iat <= now_unix + 30 s` and, when the token has one, `nbf <= now_unix + 30 s`
    /// ([`CLOCK_SKEW_LEEWAY_SECS`]). The signature is checked before the claims are parsed. Never panics.
    pub fn verify(&self, token: &str, now_unix: u64) -> Result<Claims, AuthError> {
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::Malformed {
                reason: format!("longer than {MAX_TOKEN_LEN} bytes"),
            });
        }
        let parts = jwt::split(token)?;
        jwt::check_header(parts.header)?;
        let signature = jwt::decode(parts.signature, "signature")?;
        if signature.len() != ES256_SIGNATURE_LEN {
            return Err(AuthError::BadSignature);
        }
        if !low_s::is_low_s(&signature) {
            return Err(AuthError::HighS);
        }
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &*self.public_key)
            .verify(parts.signing_input.as_bytes(), &signature)
            .map_err(|_| AuthError::BadSignature)?;
        let claims = jwt::decode_claims(parts.payload)?.into_claims()?;
        if now_unix >= claims.expires_at.saturating_add(CLOCK_SKEW_LEEWAY_SECS) {
            return Err(AuthError::Expired {
                expires_at: claims.expires_at,
                now: now_unix,
            });
        }
        if claims.issued_at > now_unix.saturating_add(CLOCK_SKEW_LEEWAY_SECS) {
            return Err(AuthError::NotYetValid {
                issued_at: claims.issued_at,
                now: now_unix,
            });
        }
        if let Some(not_before) = claims.not_before {
            if not_before > now_unix.saturating_add(CLOCK_SKEW_LEEWAY_SECS) {
                return Err(AuthError::NotBefore {
                    not_before,
                    now: now_unix,
                });
            }
        }
        Ok(claims)
    }

    /// [`Verifier::verify`], then refuses a token whose id is on `revoked` with [`AuthError::Revoked`].
    pub fn verify_with(
        &self,
        token: &str,
        now_unix: u64,
        revoked: &RevocationList,
    ) -> Result<Claims, AuthError> {
        let claims = self.verify(token, now_unix)?;
        if revoked.contains(&claims.id) {
            return Err(AuthError::Revoked { id: claims.id });
        }
        Ok(claims)
    }
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("alg", &"ES256")
            .field("key_id", &self.key_id())
            .finish()
    }
}

#[cfg(test)]
mod tests;
