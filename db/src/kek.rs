//! The key-encryption key. Every secret the database keeps is sealed with it (AES-256-GCM, a fresh
//! random nonce per write, the entry's name as associated data), so a dump of the database alone
//! reveals no private key, and a sealed value moved to another entry's row does not open. A second key
//! derived from it (HKDF-SHA256) tags the rows (HMAC-SHA256), so that one edited in the database is
//! refused instead of trusted.

use std::fmt;
use std::path::Path;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{hkdf, hmac};
use zeroize::Zeroizing;

use crate::error::DbError;

/// The first byte of every sealed value: the format, so that a later one can be told apart.
const FORMAT: u8 = 1;

/// What the associated data starts with, before the entry's name.
const AAD_PREFIX: &[u8] = b"meshca keystore entry\0";

/// What the key that tags rows is derived for (HKDF's info): no other use of the key-encryption key
/// yields it.
const ROW_TAG_INFO: &[u8] = b"meshca database row tags v1";

/// The largest key file read (a key is 32 bytes, or 64 hex digits and a newline).
const MAX_FILE: u64 = 4096;

/// The key that seals secrets in the database; the same on every replica.
pub struct KeyEncryptionKey {
    key: LessSafeKey,
    tags: hmac::Key,
    rng: SystemRandom,
}

impl KeyEncryptionKey {
    /// Reads the key from `path`: 32 bytes, or 64 hexadecimal digits (as `openssl rand -hex 32`
    /// writes them) with an optional trailing newline. The file must be readable by its owner only.
    pub fn read(path: &Path) -> Result<KeyEncryptionKey, DbError> {
        Ok(KeyEncryptionKey::from_bytes(&*read_bytes(path)?))
    }

    /// A key from its 32 bytes.
    pub fn from_bytes(key: &[u8; 32]) -> KeyEncryptionKey {
        // AES-256-GCM takes any 32 bytes: the unbound key cannot be refused.
        let unbound = UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte AES-256-GCM key");
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(key);
        let tags = prk
            .expand(&[ROW_TAG_INFO], hmac::HMAC_SHA256)
            .expect("32 bytes are within what HKDF-SHA256 can expand to");
        KeyEncryptionKey {
            key: LessSafeKey::new(unbound),
            tags: hmac::Key::from(tags),
            rng: SystemRandom::new(),
        }
    }

    /// A tag for a row of kind `label` (each kind has its own, so a tag of one kind is never valid for
    /// another); the row's fields follow with [`RowTag::field`].
    pub(crate) fn row_tag(&self, label: &str) -> RowTag<'_> {
        let mut tag = RowTag {
            key: &self.tags,
            context: hmac::Context::with_key(&self.tags),
        };
        tag.field(label.as_bytes());
        tag
    }

    /// Seals `plaintext` as the value of entry `name`.
    pub fn seal(&self, name: &str, plaintext: &[u8]) -> Result<Vec<u8>, DbError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng
            .fill(&mut nonce)
            .map_err(|_| DbError::Crypto("the system's random source failed".into()))?;
        // The plaintext is copied into a buffer wiped on drop, then encrypted in place.
        let mut body = Zeroizing::new(plaintext.to_vec());
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(name)),
                &mut *body,
            )
            .map_err(|_| DbError::Crypto("sealing failed".into()))?;
        let mut sealed = Vec::with_capacity(1 + NONCE_LEN + body.len());
        sealed.push(FORMAT);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&body);
        Ok(sealed)
    }

    /// Opens the sealed value of entry `name`; `None` when it does not open (another key sealed it,
    /// it was sealed for another entry, or it was changed).
    pub fn open(&self, name: &str, sealed: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        let (&format, rest) = sealed.split_first()?;
        if format != FORMAT || rest.len() < NONCE_LEN {
            return None;
        }
        let (nonce, body) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buffer = Zeroizing::new(body.to_vec());
        let plaintext_len = self
            .key
            .open_in_place(nonce, Aad::from(aad(name)), &mut buffer)
            .ok()?
            .len();
        buffer.truncate(plaintext_len);
        Some(buffer)
    }
}

/// An HMAC-SHA256 over a row's fields, each length-prefixed so that no two rows' fields run together
/// into the same bytes.
pub(crate) struct RowTag<'k> {
    key: &'k hmac::Key,
    context: hmac::Context,
}

impl RowTag<'_> {
    /// Adds the next field.
    pub(crate) fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.context.update(&(bytes.len() as u64).to_be_bytes());
        self.context.update(bytes);
        self
    }

    /// The tag, to store with the row.
    pub(crate) fn sign(self) -> Vec<u8> {
        self.context.sign().as_ref().to_vec()
    }

    /// Whether `stored` is this row's tag. Compared in constant time: both are tagged again and
    /// `hmac::verify` compares them, so a wrong guess tells nothing of where it went wrong.
    pub(crate) fn matches(self, stored: &[u8]) -> bool {
        let key = self.key;
        let computed = self.context.sign();
        hmac::verify(key, stored, hmac::sign(key, computed.as_ref()).as_ref()).is_ok()
    }
}

impl fmt::Debug for KeyEncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyEncryptionKey([redacted])")
    }
}

fn aad(name: &str) -> Vec<u8> {
    let mut aad = AAD_PREFIX.to_vec();
    aad.extend_from_slice(name.as_bytes());
    aad
}

/// The key's 32 bytes from `path` (see [`KeyEncryptionKey::read`]).
pub fn read_bytes(path: &Path) -> Result<Zeroizing<[u8; 32]>, DbError> {
    let file_error = |message: String| DbError::File {
        file: path.to_owned(),
        message,
    };
    let file = meshca_files::open(path).map_err(|e| file_error(format!("cannot read: {e}")))?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&file.metadata().permissions()) & 0o777;
    if mode & 0o077 != 0 {
        return Err(file_error(format!(
            "has mode {mode:04o}, but the key-encryption key must be readable by its owner only: \
             check who read it, then `chmod 600` it"
        )));
    }
    let bytes = file
        .read_secret(
            MAX_FILE,
            "a key-encryption key is 32 bytes or 64 hex digits",
        )
        .map_err(|e| file_error(format!("cannot read: {e}")))?;
    parse(&bytes).map_err(file_error)
}

/// The key in a file's bytes: exactly 32 bytes, or 64 hex digits with an optional newline.
fn parse(bytes: &[u8]) -> Result<Zeroizing<[u8; 32]>, String> {
    let mut key = Zeroizing::new([0u8; 32]);
    if bytes.len() == 32 {
        key.copy_from_slice(bytes);
        return Ok(key);
    }
    let text = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let text = text.strip_suffix(b"\r").unwrap_or(text);
    if text.len() == 64 && hex::decode_to_slice(text, &mut key[..]).is_ok() {
        return Ok(key);
    }
    Err(format!(
        "holds {} bytes; a key-encryption key is 32 random bytes (`head -c 32 /dev/urandom`) or 64 hex \
         digits (`openssl rand -hex 32`)",
        bytes.len()
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use proptest::prelude::*;

    use super::*;

    fn key(byte: u8) -> KeyEncryptionKey {
        KeyEncryptionKey::from_bytes(&[byte; 32])
    }

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_for_its_entry() {
        let sealed = key(1)
            .seal("ca/default/ca-1/key.pem", b"private")
            .expect("seals");
        assert!(!sealed.windows(7).any(|w| w == b"private"));
        let opened = key(1)
            .open("ca/default/ca-1/key.pem", &sealed)
            .expect("opens");
        assert_eq!(&opened[..], b"private");
        assert!(key(2).open("ca/default/ca-1/key.pem", &sealed).is_none());
        assert!(key(1).open("ca/default/ca-2/key.pem", &sealed).is_none());
        let mut changed = sealed.clone();
        *changed.last_mut().expect("not empty") ^= 1;
        assert!(key(1).open("ca/default/ca-1/key.pem", &changed).is_none());
    }

    #[test]
    fn two_seals_of_one_value_differ() {
        let k = key(1);
        assert_ne!(
            k.seal("a", b"x").expect("seals"),
            k.seal("a", b"x").expect("seals")
        );
    }

    #[test]
    fn a_key_file_is_raw_bytes_or_hex_and_private() {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, bytes: &[u8], mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, bytes).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            path
        };
        let raw = write("raw", &[7u8; 32], 0o600);
        let hex = write("hex", format!("{}\n", "07".repeat(32)).as_bytes(), 0o400);
        let sealed = KeyEncryptionKey::read(&raw)
            .expect("raw key")
            .seal("e", b"v")
            .expect("seals");
        let opened = KeyEncryptionKey::read(&hex)
            .expect("hex key")
            .open("e", &sealed);
        assert_eq!(opened.as_deref().map(|v| &v[..]), Some(&b"v"[..]));

        let exposed = write("exposed", &[7u8; 32], 0o640);
        let err = KeyEncryptionKey::read(&exposed).expect_err("group-readable");
        assert!(
            err.to_string().contains("exposed") && err.to_string().contains("0640"),
            "{err}"
        );
        let short = write("short", b"0123", 0o600);
        let err = KeyEncryptionKey::read(&short).expect_err("too short");
        assert!(err.to_string().contains("32 random bytes"), "{err}");
        let missing = dir.path().join("missing");
        assert!(KeyEncryptionKey::read(&missing).is_err());
    }

    #[test]
    fn a_row_tag_depends_on_the_key_the_kind_and_every_field() {
        fn tag<'k>(k: &'k KeyEncryptionKey, label: &str, fields: &[&[u8]]) -> RowTag<'k> {
            let mut tag = k.row_tag(label);
            for f in fields {
                tag.field(f);
            }
            tag
        }
        let stored = tag(&key(1), "entry", &[b"a", b"bc"]).sign();
        assert!(tag(&key(1), "entry", &[b"a", b"bc"]).matches(&stored));
        assert!(!tag(&key(2), "entry", &[b"a", b"bc"]).matches(&stored));
        assert!(!tag(&key(1), "proxy", &[b"a", b"bc"]).matches(&stored));
        assert!(!tag(&key(1), "entry", &[b"ab", b"c"]).matches(&stored));
        assert!(!tag(&key(1), "entry", &[b"a", b"bc", b""]).matches(&stored));
        assert!(!tag(&key(1), "entry", &[b"a", b"bc"]).matches(&stored[..31]));
        assert!(!tag(&key(1), "entry", &[b"a", b"bc"]).matches(b""));
    }

    #[test]
    fn debug_shows_no_key() {
        assert_eq!(format!("{:?}", key(9)), "KeyEncryptionKey([redacted])");
    }

    proptest! {
        /// Whatever bytes a row holds, opening them fails or returns what was sealed: never a panic.
        #[test]
        fn opening_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = key(3).open("entry", &bytes);
        }

        #[test]
        fn any_value_round_trips(name in "[a-z/.-]{1,40}", value in proptest::collection::vec(any::<u8>(), 0..300)) {
            let k = key(4);
            let sealed = k.seal(&name, &value).expect("seals");
            prop_assert_eq!(k.open(&name, &sealed).map(|v| v.to_vec()), Some(value));
        }
    }
}
