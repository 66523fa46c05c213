//! An ES256 (ECDSA P-256 with SHA-256) signing key, held in memory or in a PKCS#11 token: what proxy
//! tokens and JWT-SVIDs are signed with. Its signatures are JWS's fixed `r || s`, always in the low-S
//! form verifiers here require.

use std::sync::Arc;

use meshca_hsm::TokenKey;
use meshca_identity::KeyAlgorithm;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
use zeroize::Zeroizing;

use crate::low_s;

/// A P-256 signing key. The PKCS#8 document of a software key is kept in zeroize-on-drop memory so the
/// caller can persist it; ring holds its own copy of the private scalar, which it does not promise to
/// wipe: keep one per key and process, not many short-lived ones. A key in a token never leaves it.
pub struct Es256Key {
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

impl Es256Key {
    /// A new software key; the reason when the system's random source fails.
    pub fn generate() -> Result<Es256Key, String> {
        let rng = SystemRandom::new();
        let document = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| {
                "generating a P-256 key failed (system random source unavailable?)".to_owned()
            })?;
        Es256Key::from_pkcs8(document.as_ref())
    }

    /// A software key from a PKCS#8 (DER) document holding an ECDSA P-256 private key; what ring
    /// refused it for otherwise.
    pub fn from_pkcs8(pkcs8: &[u8]) -> Result<Es256Key, String> {
        let rng = SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8, &rng)
            .map_err(|rejected| rejected.to_string())?;
        Ok(Es256Key {
            public_key: pair.public_key().as_ref().to_vec(),
            inner: Inner::Software {
                pair,
                pkcs8: Zeroizing::new(pkcs8.to_vec()),
                rng,
            },
        })
    }

    /// A key in a PKCS#11 token, which must be ECDSA P-256.
    pub fn from_token_key(key: TokenKey) -> Result<Es256Key, String> {
        if key.algorithm() != KeyAlgorithm::EcdsaP256 {
            return Err(format!(
                "the key {:?} in the PKCS#11 token is {}, not ECDSA P-256",
                key.label(),
                key.algorithm()
            ));
        }
        Ok(Es256Key {
            public_key: key.public_key().to_vec(),
            inner: Inner::Token(Arc::new(key)),
        })
    }

    /// The PKCS#8 (DER) document of a software key, for persistence (handle as a secret); `None` for a
    /// key in a token.
    pub fn pkcs8(&self) -> Option<&Zeroizing<Vec<u8>>> {
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

    /// The public key: its uncompressed point.
    pub fn public_key(&self) -> &[u8] {
        &self.public_key
    }

    /// The ES256 signature of `message`: `r || s`, low-S; the reason when it cannot be made (the
    /// token is away, the random source failed).
    pub fn sign(&self, message: &[u8]) -> Result<[u8; 64], String> {
        let signature = match &self.inner {
            Inner::Software { pair, rng, .. } => pair
                .sign(rng, message)
                .map_err(|_| "signing failed (system random source unavailable?)".to_owned())?
                .as_ref()
                .to_vec(),
            Inner::Token(key) => key
                .sign_raw(message)
                .map_err(|e| format!("signing in the PKCS#11 token failed: {e}"))?,
        };
        // Either of the two valid `s` may come back; verifiers accept only the low one.
        let mut fixed: [u8; 64] = signature
            .as_slice()
            .try_into()
            .map_err(|_| "an ES256 signature that is not 64 bytes came back".to_owned())?;
        low_s::normalize(&mut fixed);
        Ok(fixed)
    }

    /// Where the private key is, for `Debug`: never the key.
    pub(crate) fn whereabouts(&self) -> &'static str {
        match self.inner {
            Inner::Software { .. } => "[redacted]",
            Inner::Token(_) => "[in the PKCS#11 token]",
        }
    }
}

impl std::fmt::Debug for Es256Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Es256Key")
            .field("private_key", &self.whereabouts())
            .finish_non_exhaustive()
    }
}
