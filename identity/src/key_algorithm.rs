use std::fmt;
use std::str::FromStr;

/// The key algorithm of certificates meshca generates: what Envoy can load.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum KeyAlgorithm {
    /// ECDSA on NIST P-256 with SHA-256 (the default).
    #[default]
    #[serde(rename = "ecdsa-p256")]
    EcdsaP256,
    /// ECDSA on NIST P-384 with SHA-384.
    #[serde(rename = "ecdsa-p384")]
    EcdsaP384,
    /// RSA, 2048-bit modulus.
    #[serde(rename = "rsa-2048")]
    Rsa2048,
    /// RSA, 3072-bit modulus.
    #[serde(rename = "rsa-3072")]
    Rsa3072,
    /// RSA, 4096-bit modulus.
    #[serde(rename = "rsa-4096")]
    Rsa4096,
}

impl KeyAlgorithm {
    /// Every algorithm, in the order the settings documentation lists them.
    pub const ALL: [KeyAlgorithm; 5] = [
        KeyAlgorithm::EcdsaP256,
        KeyAlgorithm::EcdsaP384,
        KeyAlgorithm::Rsa2048,
        KeyAlgorithm::Rsa3072,
        KeyAlgorithm::Rsa4096,
    ];

    /// The settings-file spelling, e.g. `ecdsa-p256`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyAlgorithm::EcdsaP256 => "ecdsa-p256",
            KeyAlgorithm::EcdsaP384 => "ecdsa-p384",
            KeyAlgorithm::Rsa2048 => "rsa-2048",
            KeyAlgorithm::Rsa3072 => "rsa-3072",
            KeyAlgorithm::Rsa4096 => "rsa-4096",
        }
    }

    /// The RSA modulus size in bits, or `None` for ECDSA.
    pub fn rsa_bits(self) -> Option<usize> {
        match self {
            KeyAlgorithm::Rsa2048 => Some(2048),
            KeyAlgorithm::Rsa3072 => Some(3072),
            KeyAlgorithm::Rsa4096 => Some(4096),
            KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => None,
        }
    }

    /// The RSA algorithm for a `RSAbits` value of a builtin backend.
    pub fn rsa_from_bits(bits: u32) -> Option<KeyAlgorithm> {
        match bits {
            2048 => Some(KeyAlgorithm::Rsa2048),
            3072 => Some(KeyAlgorithm::Rsa3072),
            4096 => Some(KeyAlgorithm::Rsa4096),
            _ => None,
        }
    }
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a key algorithm meshca does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownKeyAlgorithm(pub String);

impl fmt::Display for UnknownKeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown key algorithm {:?}; expected one of ecdsa-p256, ecdsa-p384, rsa-2048, rsa-3072, rsa-4096",
            self.0
        )
    }
}

impl std::error::Error for UnknownKeyAlgorithm {}

impl FromStr for KeyAlgorithm {
    type Err = UnknownKeyAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyAlgorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownKeyAlgorithm(s.to_owned()))
    }
}
