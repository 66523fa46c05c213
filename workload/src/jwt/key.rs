//! JWT-SVID keys: the private ES256 key a trust domain signs with, and the public key a bundle carries.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use meshca_auth::Es256Key;
use meshca_hsm::TokenKey;
use ring::digest;
use zeroize::Zeroizing;

use super::JwtError;

/// The length of one P-256 coordinate, in bytes.
pub(crate) const COORDINATE_LEN: usize = 32;

/// The public half of a JWT-SVID key (ECDSA P-256), as a JWT bundle lists it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct JwtPublicKey {
    kid: String,
    x: [u8; COORDINATE_LEN],
    y: [u8; COORDINATE_LEN],
    /// Whether a signature with a high `s` is accepted: only for another issuer's key, since meshca
    /// signs the low form alone, so a high one under its key is a token someone rewrote.
    accepts_high_s: bool,
}

impl JwtPublicKey {
    /// A key from its id and affine coordinates (big-endian), of a meshca trust domain: only
    /// low-S signatures verify with it. Whether the point lies on the curve is checked by every
    /// signature verification, which fails for a point that does not.
    pub fn new(kid: String, x: [u8; COORDINATE_LEN], y: [u8; COORDINATE_LEN]) -> JwtPublicKey {
        JwtPublicKey {
            kid,
            x,
            y,
            accepts_high_s: false,
        }
    }

    /// This key as another issuer's (a federated trust domain's): issuers that do not normalize
    /// ECDSA signatures write a high `s` half the time, so both forms verify.
    pub fn of_another_issuer(mut self) -> JwtPublicKey {
        self.accepts_high_s = true;
        self
    }

    /// Whether a signature with a high `s` verifies with this key.
    pub fn accepts_high_s(&self) -> bool {
        self.accepts_high_s
    }

    /// The key id (`kid`) tokens signed by this key carry in their header.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The x coordinate, big-endian.
    pub fn x(&self) -> &[u8; COORDINATE_LEN] {
        &self.x
    }

    /// The y coordinate, big-endian.
    pub fn y(&self) -> &[u8; COORDINATE_LEN] {
        &self.y
    }

    /// The uncompressed point (`0x04 || x || y`), the form ring verifies with.
    pub(crate) fn uncompressed(&self) -> [u8; 1 + 2 * COORDINATE_LEN] {
        let mut point = [0x04; 1 + 2 * COORDINATE_LEN];
        point[1..=COORDINATE_LEN].copy_from_slice(&self.x);
        point[1 + COORDINATE_LEN..].copy_from_slice(&self.y);
        point
    }
}

impl fmt::Debug for JwtPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtPublicKey")
            .field("kid", &self.kid)
            .field("accepts_high_s", &self.accepts_high_s)
            .finish_non_exhaustive()
    }
}

/// The RFC 7638 thumbprint of a P-256 public key: base64url (no padding) of SHA-256 over its required
/// JWK members in lexicographic order, without whitespace. Every JOSE library computes the same value.
pub fn thumbprint(x: &[u8; COORDINATE_LEN], y: &[u8; COORDINATE_LEN]) -> String {
    let canonical = format!(
        r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
        URL_SAFE_NO_PAD.encode(x),
        URL_SAFE_NO_PAD.encode(y)
    );
    URL_SAFE_NO_PAD.encode(digest::digest(&digest::SHA256, canonical.as_bytes()))
}

/// An ES256 (ECDSA P-256) key that signs JWT-SVIDs. Its `kid` is the RFC 7638 thumbprint of its public
/// key, so the same key always carries the same id, wherever it is loaded.
///
/// The PKCS#8 document is kept in zeroize-on-drop memory so the caller can persist it; `Debug` prints
/// only the `kid`. ring holds its own copy of the private scalar, which it does not promise to wipe.
pub struct JwtSigningKey {
    key: Es256Key,
    public: JwtPublicKey,
}

impl JwtSigningKey {
    /// Generates a new key.
    pub fn generate() -> Result<JwtSigningKey, JwtError> {
        JwtSigningKey::of(Es256Key::generate().map_err(|reason| JwtError::Key { reason })?)
    }

    /// Loads a key from a PKCS#8 (DER) document holding an ECDSA P-256 private key, as
    /// [`JwtSigningKey::pkcs8`] returns it.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<JwtSigningKey, JwtError> {
        let key = Es256Key::from_pkcs8(pkcs8).map_err(|rejected| JwtError::Key {
            reason: format!("the stored key is not a PKCS#8 ECDSA P-256 private key ({rejected})"),
        })?;
        JwtSigningKey::of(key)
    }

    /// A key in a PKCS#11 token, which must be ECDSA P-256.
    pub fn from_token_key(key: TokenKey) -> Result<JwtSigningKey, JwtError> {
        JwtSigningKey::of(Es256Key::from_token_key(key).map_err(|reason| JwtError::Key { reason })?)
    }

    fn of(key: Es256Key) -> Result<JwtSigningKey, JwtError> {
        let public = public_of(key.public_key())?;
        Ok(JwtSigningKey { key, public })
    }

    /// The PKCS#8 (DER) document of this key, for persistence (handle as a secret); `None` for a key in
    /// a token, which never leaves it.
    pub fn pkcs8(&self) -> Option<&Zeroizing<Vec<u8>>> {
        self.key.pkcs8()
    }

    /// The key in the token, when it is in one.
    pub fn token_key(&self) -> Option<&TokenKey> {
        self.key.token_key()
    }

    /// The key id: the RFC 7638 thumbprint of the public key.
    pub fn kid(&self) -> &str {
        self.public.kid()
    }

    /// The public key, for the trust domain's JWT bundle.
    pub fn public(&self) -> JwtPublicKey {
        self.public.clone()
    }

    /// Signs `signing_input` (`header.payload`), returning the fixed-size signature (`r || s`) in its
    /// canonical low-S form.
    pub(crate) fn sign(&self, signing_input: &[u8]) -> Result<[u8; 64], JwtError> {
        self.key
            .sign(signing_input)
            .map_err(|reason| JwtError::Key { reason })
    }
}

/// The JWK of a P-256 public key given as its uncompressed point.
fn public_of(point: &[u8]) -> Result<JwtPublicKey, JwtError> {
    let (x, y) = match point {
        [0x04, rest @ ..] if rest.len() == 2 * COORDINATE_LEN => rest.split_at(COORDINATE_LEN),
        _ => {
            return Err(JwtError::Key {
                reason: "a P-256 public key that is not an uncompressed point".to_owned(),
            })
        }
    };
    let coordinate = |half: &[u8]| -> [u8; COORDINATE_LEN] {
        let mut out = [0; COORDINATE_LEN];
        out.copy_from_slice(half);
        out
    };
    let (x, y) = (coordinate(x), coordinate(y));
    Ok(JwtPublicKey::new(thumbprint(&x, &y), x, y))
}

impl fmt::Debug for JwtSigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtSigningKey")
            .field("alg", &"ES256")
            .field("kid", &self.kid())
            .field("private_key", &self.key)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprint_matches_an_independent_computation() {
        // The P-256 key of RFC 7515 appendix A.3; its thumbprint computed independently with
        // `printf '{"crv":"P-256","kty":"EC","x":"…","y":"…"}' | openssl dgst -sha256 -binary | basenc --base64url`.
        let x = URL_SAFE_NO_PAD
            .decode("f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU")
            .expect("vector");
        let y = URL_SAFE_NO_PAD
            .decode("x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0")
            .expect("vector");
        let x: [u8; 32] = x.try_into().expect("32 bytes");
        let y: [u8; 32] = y.try_into().expect("32 bytes");
        assert_eq!(
            thumbprint(&x, &y),
            "oKIywvGUpTVTyxMQ3bwIIeQUudfr_CkLMjCE19ECD-U"
        );
    }

    #[test]
    fn pkcs8_round_trips_with_the_same_kid() {
        let key = JwtSigningKey::generate().expect("generate");
        let again = JwtSigningKey::from_pkcs8(key.pkcs8().expect("software")).expect("reload");
        assert_eq!(key.public(), again.public());
        assert_eq!(key.kid(), thumbprint(key.public().x(), key.public().y()));
        assert_eq!(key.kid().len(), 43, "base64url of 32 bytes, unpadded");
    }

    #[test]
    fn garbage_pkcs8_is_refused() {
        let err = JwtSigningKey::from_pkcs8(b"not a key").expect_err("refused");
        assert!(matches!(err, JwtError::Key { .. }), "{err:?}");
    }

    #[test]
    fn debug_prints_no_key_material() {
        let key = JwtSigningKey::generate().expect("generate");
        let text = format!("{key:?}");
        assert!(text.contains(key.kid()), "{text}");
        assert!(text.contains("[redacted]"), "{text}");
        let pkcs8_hex: String = key
            .pkcs8()
            .expect("software")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert!(!text.contains(&pkcs8_hex[..16]));
        assert!(!text.contains(&URL_SAFE_NO_PAD.encode(key.public().x())));
    }
}
