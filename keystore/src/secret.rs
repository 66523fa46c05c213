//! Secret bytes.

use std::fmt;

use zeroize::Zeroizing;

/// Secret bytes (a private key, usually PKCS#8 or PEM): wiped from memory on drop, printed by `Debug` as
/// `Secret([redacted])`, with no `Display`, no `Serialize` and no `Clone`, so copies are made on purpose only.
pub struct Secret(Zeroizing<Vec<u8>>);

impl Secret {
    /// The secret bytes. Copy them as little as possible: only this buffer is wiped.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the secret is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Zeroizing<Vec<u8>>> for Secret {
    fn from(bytes: Zeroizing<Vec<u8>>) -> Self {
        Secret(bytes)
    }
}

impl From<Vec<u8>> for Secret {
    fn from(bytes: Vec<u8>) -> Self {
        Secret(Zeroizing::new(bytes))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_redacted() {
        let secret = Secret::from(b"-----BEGIN PRIVATE KEY----- hunter2".to_vec());
        assert_eq!(format!("{secret:?}"), "Secret([redacted])");
        assert_eq!(format!("{secret:#?}"), "Secret([redacted])");
        assert_eq!(secret.expose(), b"-----BEGIN PRIVATE KEY----- hunter2");
        assert_eq!(secret.len(), 35);
        assert!(!secret.is_empty());
    }
}
