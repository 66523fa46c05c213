//! Sealing a small secret (the database's data key) with an AES-256 key that never leaves the token:
//! AES-GCM inside the token, so that what is stored beside the data opens only through the token.
//!
//! A sealed value is `1 | id length | id | 12-byte IV | ciphertext and 16-byte tag`; the id names the
//! token key that sealed it, so that every replica opens it with that key even if two replicas each
//! made one when they first started at once.

use cryptoki::mechanism::aead::GcmParams;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{Attribute, ObjectClass, ObjectHandle};
use cryptoki::session::Session;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::error::HsmError;
use crate::token::Token;

/// The label of the sealing key meshca makes in the token.
pub const SEALING_KEY_LABEL: &str = "meshca-key-encryption-key";

/// The first byte of a sealed value.
const FORMAT: u8 = 1;
/// What every sealed value is bound to (GCM's additional data).
const AAD: &[u8] = b"meshca data key sealed by a PKCS#11 token v1";
const IV_LEN: usize = 12;
const TAG_BITS: u64 = 128;
/// The longest key id read back.
const MAX_ID: usize = 64;

impl Token {
    /// Seals `secret` with the token's sealing key, made (AES-256, sensitive, never extractable, for
    /// encryption only) if the token has none.
    pub fn seal(&self, secret: &[u8]) -> Result<Vec<u8>, HsmError> {
        let mut iv = [0u8; IV_LEN];
        SystemRandom::new()
            .fill(&mut iv)
            .map_err(|_| HsmError::Random)?;
        let (id, ciphertext) = self.run("sealing with the token's key", |_, session| {
            let (handle, id) = sealing_key(session)?;
            let mut iv = iv;
            let params = GcmParams::new(&mut iv, AAD, TAG_BITS.into())?;
            let ciphertext = session.encrypt(&Mechanism::AesGcm(params), handle, secret)?;
            Ok((id, ciphertext))
        })?;
        let mut sealed = Vec::with_capacity(2 + id.len() + IV_LEN + ciphertext.len());
        sealed.push(FORMAT);
        sealed
            .push(u8::try_from(id.len()).map_err(|_| HsmError::Sealed("the key id is too long"))?);
        sealed.extend_from_slice(&id);
        sealed.extend_from_slice(&iv);
        sealed.extend_from_slice(&ciphertext);
        Ok(sealed)
    }

    /// Opens what [`Token::seal`] sealed, with the token key that sealed it.
    pub fn open_sealed(&self, sealed: &[u8]) -> Result<Zeroizing<Vec<u8>>, HsmError> {
        let (id, iv, ciphertext) = split(sealed)?;
        let plaintext = self.run("opening with the token's key", |_, session| {
            let found = session.find_objects(&[
                Attribute::Class(ObjectClass::SECRET_KEY),
                Attribute::Id(id.to_vec()),
            ])?;
            let Some(handle) = found.first().copied() else {
                return Ok(None);
            };
            let mut iv = iv;
            let params = GcmParams::new(&mut iv, AAD, TAG_BITS.into())?;
            session
                .decrypt(&Mechanism::AesGcm(params), handle, ciphertext)
                .map(|p| Some(Zeroizing::new(p)))
        });
        match plaintext {
            Ok(Some(plaintext)) => Ok(plaintext),
            Ok(None) => Err(HsmError::KeyNotFound {
                what: "AES key",
                label: self.label().to_owned(),
                object: Some(SEALING_KEY_LABEL.to_owned()),
                id: Some(hex::encode(id)),
            }),
            Err(HsmError::Pkcs11 { error, .. }) => Err(HsmError::Unseal {
                label: self.label().to_owned(),
                reason: error.to_string(),
            }),
            Err(other) => Err(other),
        }
    }
}

/// The token's sealing key and its id: the one with the lowest id when there are several (two
/// processes made one each at once), made when there is none.
fn sealing_key(session: &Session) -> Result<(ObjectHandle, Vec<u8>), cryptoki::error::Error> {
    let template = [
        Attribute::Class(ObjectClass::SECRET_KEY),
        Attribute::Label(SEALING_KEY_LABEL.as_bytes().to_vec()),
    ];
    let mut found = Vec::new();
    for handle in session.find_objects(&template)? {
        for attribute in session.get_attributes(handle, &[cryptoki::object::AttributeType::Id])? {
            if let Attribute::Id(id) = attribute {
                found.push((id, handle));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    if let Some((id, handle)) = found.into_iter().next() {
        return Ok((handle, id));
    }
    let mut id = vec![0u8; 16];
    SystemRandom::new().fill(&mut id).map_err(|_| {
        cryptoki::error::Error::Pkcs11(
            cryptoki::error::RvError::GeneralError,
            cryptoki::context::Function::GenerateRandom,
        )
    })?;
    let handle = session.generate_key(
        &Mechanism::AesKeyGen,
        &[
            Attribute::Token(true),
            Attribute::Private(true),
            Attribute::Sensitive(true),
            Attribute::Extractable(false),
            Attribute::Encrypt(true),
            Attribute::Decrypt(true),
            Attribute::Sign(false),
            Attribute::Wrap(false),
            Attribute::Unwrap(false),
            Attribute::Derive(false),
            Attribute::ValueLen(32.into()),
            Attribute::Label(SEALING_KEY_LABEL.as_bytes().to_vec()),
            Attribute::Id(id.clone()),
        ],
    )?;
    tracing::info!(id = %hex::encode(&id), "made the key-encryption key in the PKCS#11 token");
    Ok((handle, id))
}

/// The parts of a sealed value: the sealing key's id, the IV, the ciphertext with its tag.
type Parts<'a> = (&'a [u8], [u8; IV_LEN], &'a [u8]);

/// Splits a sealed value into its [`Parts`].
fn split(sealed: &[u8]) -> Result<Parts<'_>, HsmError> {
    let bad = || HsmError::Sealed("it is not a value sealed by meshca with a token key");
    let [format, id_len, rest @ ..] = sealed else {
        return Err(bad());
    };
    let id_len = usize::from(*id_len);
    if *format != FORMAT || id_len == 0 || id_len > MAX_ID || rest.len() < id_len + IV_LEN + 16 {
        return Err(bad());
    }
    let (id, rest) = rest.split_at(id_len);
    let (iv, ciphertext) = rest.split_at(IV_LEN);
    let iv: [u8; IV_LEN] = iv.try_into().map_err(|_| bad())?;
    Ok((id, iv, ciphertext))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn split_reads_what_seal_writes() {
        let mut sealed = vec![FORMAT, 3, 1, 2, 3];
        sealed.extend([9u8; IV_LEN]);
        sealed.extend([7u8; 48]);
        let (id, iv, ciphertext) = split(&sealed).expect("well formed");
        assert_eq!(id, [1, 2, 3]);
        assert_eq!(iv, [9u8; IV_LEN]);
        assert_eq!(ciphertext, [7u8; 48]);
        assert!(
            split(&sealed[..sealed.len() - 40]).is_err(),
            "too short for a tag"
        );
        sealed[0] = 2;
        assert!(split(&sealed).is_err(), "another format");
    }

    proptest! {
        #[test]
        fn split_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = split(&bytes);
        }
    }
}
