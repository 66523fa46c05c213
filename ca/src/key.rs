//! Private keys (PKCS#8, zeroized, never printed) and the public keys that go into certificates.

use std::fmt;

use meshca_identity::KeyAlgorithm;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair as _, RsaKeyPair};
use zeroize::Zeroizing;

use crate::der;

/// Why a key could not be generated or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The random generator or the key generator failed.
    #[error("key generation for {algorithm} failed: {reason}")]
    Generation {
        /// The algorithm asked for.
        algorithm: KeyAlgorithm,
        /// What failed.
        reason: String,
    },
    /// The data is not PEM.
    #[error("the key file is not readable PEM: {0}")]
    Pem(String),
    /// The PEM holds no private key.
    #[error("the key file holds no private key (expected a PEM block \"PRIVATE KEY\", \"EC PRIVATE KEY\" or \"RSA PRIVATE KEY\")")]
    NoKey,
    /// The PEM holds more than one private key.
    #[error("the key file holds {0} private keys; give exactly one")]
    MultipleKeys(usize),
    /// A PEM block type meshca cannot use as a key.
    #[error("unsupported key PEM block {label:?}: {hint}")]
    UnsupportedPem {
        /// The PEM label found.
        label: String,
        /// What to do instead.
        hint: &'static str,
    },
    /// A key type meshca does not support.
    #[error(
        "unsupported key type {0}; meshca supports ECDSA P-256, ECDSA P-384 and RSA 2048/3072/4096"
    )]
    UnsupportedAlgorithm(String),
    /// The key's DER encoding is damaged or inconsistent.
    #[error("the private key is malformed: {0}")]
    Malformed(String),
}

/// A private key in PKCS#8 DER. Zeroized on drop; `Debug` prints `PrivateKey([redacted])`; no `Serialize`.
pub struct PrivateKey {
    pkcs8: Zeroizing<Vec<u8>>,
    algorithm: KeyAlgorithm,
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PrivateKey([redacted])")
    }
}

/// Cloning copies the secret into a second zeroizing buffer; done on purpose, never implicitly by a derive.
impl Clone for PrivateKey {
    fn clone(&self) -> Self {
        PrivateKey {
            pkcs8: self.pkcs8.clone(),
            algorithm: self.algorithm,
        }
    }
}

/// The public half of a key, in the form a certificate's SubjectPublicKeyInfo carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    algorithm: KeyAlgorithm,
    /// The subjectPublicKey bits: an uncompressed EC point, or a PKCS#1 RSAPublicKey.
    raw: Vec<u8>,
}

impl PublicKey {
    /// A key of `algorithm` whose subjectPublicKey bits are `raw` (checked by whoever read them).
    pub(crate) fn from_parts(algorithm: KeyAlgorithm, raw: Vec<u8>) -> PublicKey {
        PublicKey { algorithm, raw }
    }

    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The subjectPublicKey bits (EC point or PKCS#1 RSAPublicKey).
    pub fn raw(&self) -> &[u8] {
        &self.raw
    }

    /// The DER SubjectPublicKeyInfo.
    pub fn spki_der(&self) -> Vec<u8> {
        rcgen::PublicKeyData::subject_public_key_info(self)
    }
}

impl rcgen::PublicKeyData for PublicKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        rcgen_algorithm(self.algorithm)
    }
}

/// The rcgen algorithm whose OIDs describe a key of `algorithm` (and with which it signs).
pub(crate) fn rcgen_algorithm(algorithm: KeyAlgorithm) -> &'static rcgen::SignatureAlgorithm {
    match algorithm {
        KeyAlgorithm::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
        KeyAlgorithm::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
        KeyAlgorithm::Rsa2048 | KeyAlgorithm::Rsa3072 | KeyAlgorithm::Rsa4096 => {
            &rcgen::PKCS_RSA_SHA256
        }
    }
}

/// Length of the uncompressed public point ring appends to its generated PKCS#8 documents.
fn ec_point_len(algorithm: KeyAlgorithm) -> Option<usize> {
    match algorithm {
        KeyAlgorithm::EcdsaP256 => Some(65),
        KeyAlgorithm::EcdsaP384 => Some(97),
        _ => None,
    }
}

fn ring_ecdsa(algorithm: KeyAlgorithm) -> Option<&'static signature::EcdsaSigningAlgorithm> {
    match algorithm {
        KeyAlgorithm::EcdsaP256 => Some(&signature::ECDSA_P256_SHA256_ASN1_SIGNING),
        KeyAlgorithm::EcdsaP384 => Some(&signature::ECDSA_P384_SHA384_ASN1_SIGNING),
        _ => None,
    }
}

/// A key pair generated ahead of its certificate ([`crate::CertificateAuthority::issue_with_key`]):
/// its halves belong together, as only [`GeneratedKey::new`] makes one. The private key is zeroized on
/// drop, like every [`PrivateKey`].
#[derive(Debug)]
pub struct GeneratedKey {
    private: PrivateKey,
    public: PublicKey,
}

impl GeneratedKey {
    /// Generates a new key pair of `algorithm`.
    pub fn new(algorithm: KeyAlgorithm) -> Result<GeneratedKey, KeyError> {
        let (private, public) = PrivateKey::generate(algorithm)?;
        Ok(GeneratedKey { private, public })
    }

    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.private.algorithm
    }

    /// Its public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// Its two halves.
    pub(crate) fn into_parts(self) -> (PrivateKey, PublicKey) {
        (self.private, self.public)
    }
}

impl PrivateKey {
    /// Generates a new key pair. ECDSA keys come from ring; RSA keys from the `rsa` crate (used for key
    /// generation only, never to sign).
    ///
    /// For ECDSA the public key is taken from the trailing bytes of ring's PKCS#8 output instead of
    /// re-parsing the document, which would cost a second scalar multiplication per leaf.
    pub fn generate(algorithm: KeyAlgorithm) -> Result<(PrivateKey, PublicKey), KeyError> {
        let failed = |reason: String| KeyError::Generation { algorithm, reason };
        if let (Some(alg), Some(point_len)) = (ring_ecdsa(algorithm), ec_point_len(algorithm)) {
            let rng = SystemRandom::new();
            let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng).map_err(|e| failed(e.to_string()))?;
            let pkcs8 = Zeroizing::new(doc.as_ref().to_vec());
            let start = pkcs8
                .len()
                .checked_sub(point_len)
                .ok_or_else(|| failed("ring returned a short PKCS#8 document".into()))?;
            let raw = pkcs8[start..].to_vec();
            return Ok((
                PrivateKey { pkcs8, algorithm },
                PublicKey { algorithm, raw },
            ));
        }
        let bits = algorithm
            .rsa_bits()
            .ok_or_else(|| failed("not an RSA algorithm".into()))?;
        generate_rsa(algorithm, bits).map_err(|e| failed(e.to_string()))
    }

    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The PKCS#8 DER. Copy it only into buffers that are zeroized too.
    pub fn pkcs8_der(&self) -> &[u8] {
        &self.pkcs8
    }

    /// Computes the public key from the private key (parses the key: not for the issuance hot path).
    pub fn public_key(&self) -> Result<PublicKey, KeyError> {
        let raw = match ring_ecdsa(self.algorithm) {
            Some(alg) => EcdsaKeyPair::from_pkcs8(alg, &self.pkcs8, &SystemRandom::new())
                .map_err(|e| KeyError::Malformed(e.to_string()))?
                .public_key()
                .as_ref()
                .to_vec(),
            None => RsaKeyPair::from_pkcs8(&self.pkcs8)
                .map_err(|e| KeyError::Malformed(e.to_string()))?
                .public_key()
                .as_ref()
                .to_vec(),
        };
        Ok(PublicKey {
            algorithm: self.algorithm,
            raw,
        })
    }

    /// The key as PEM (`-----BEGIN PRIVATE KEY-----`, PKCS#8), in a buffer zeroized on drop.
    pub fn to_pem(&self) -> Zeroizing<String> {
        crate::pem_out::encode_secret("PRIVATE KEY", &self.pkcs8)
    }

    /// Reads a key from PEM: PKCS#8 `PRIVATE KEY`, SEC1 `EC PRIVATE KEY` or PKCS#1 `RSA PRIVATE KEY`
    /// (converted to PKCS#8). `EC PARAMETERS` blocks are skipped; any other type is an error naming it.
    pub fn from_pem(data: &[u8]) -> Result<PrivateKey, KeyError> {
        let blocks = ::pem::parse_many(data).map_err(|e| KeyError::Pem(e.to_string()))?;
        let mut keys = Vec::new();
        let mut unsupported = None;
        for block in blocks {
            let label = block.tag().to_owned();
            let contents = Zeroizing::new(block.into_contents());
            match label.as_str() {
                "PRIVATE KEY" | "EC PRIVATE KEY" | "RSA PRIVATE KEY" => {
                    keys.push((label, contents))
                }
                "EC PARAMETERS" => {}
                _ => unsupported = unsupported.or(Some(label)),
            }
        }
        match keys.len() {
            0 => Err(match unsupported {
                Some(label) => unsupported_pem(label),
                None => KeyError::NoKey,
            }),
            1 => {
                let (label, der) = keys.remove(0);
                let pkcs8 = match label.as_str() {
                    "EC PRIVATE KEY" => sec1_to_pkcs8(&der)?,
                    "RSA PRIVATE KEY" => wrap_pkcs8(der::OID_RSA, None, &der),
                    _ => der,
                };
                PrivateKey::from_pkcs8_der(pkcs8)
            }
            n => Err(KeyError::MultipleKeys(n)),
        }
    }

    /// Takes a PKCS#8 DER key, checking that ring can load it and that its type is supported.
    pub fn from_pkcs8_der(pkcs8: Zeroizing<Vec<u8>>) -> Result<PrivateKey, KeyError> {
        let algorithm = pkcs8_algorithm(&pkcs8)?;
        let key = PrivateKey { pkcs8, algorithm };
        // Parsing proves the key is well formed and consistent (ring checks the public point).
        key.public_key()?;
        Ok(key)
    }
}

fn unsupported_pem(label: String) -> KeyError {
    let hint = match label.as_str() {
        "ENCRYPTED PRIVATE KEY" => "encrypted keys are not supported; decrypt it (openssl pkcs8 -in key.pem -out plain.pem)",
        "OPENSSH PRIVATE KEY" => "OpenSSH keys are not supported; convert it to PKCS#8",
        "CERTIFICATE" => "this is a certificate, not a private key",
        _ => "give a PKCS#8 \"PRIVATE KEY\", SEC1 \"EC PRIVATE KEY\" or PKCS#1 \"RSA PRIVATE KEY\"",
    };
    KeyError::UnsupportedPem { label, hint }
}

/// Why the RSA crate could not make or encode a key.
#[derive(Debug, thiserror::Error)]
enum RsaGenerationError {
    #[error(transparent)]
    Generate(#[from] rsa::Error),
    #[error(transparent)]
    Pkcs8(#[from] rsa::pkcs8::Error),
    #[error(transparent)]
    Pkcs1(#[from] rsa::pkcs1::Error),
}

fn generate_rsa(
    algorithm: KeyAlgorithm,
    bits: usize,
) -> Result<(PrivateKey, PublicKey), RsaGenerationError> {
    use rsa::pkcs1::EncodeRsaPublicKey;
    use rsa::pkcs8::EncodePrivateKey;
    let key = rsa::RsaPrivateKey::new(&mut rand_core::OsRng, bits)?;
    let doc = key.to_pkcs8_der()?;
    let pkcs8 = Zeroizing::new(doc.as_bytes().to_vec());
    let raw = key.to_public_key().to_pkcs1_der()?.into_vec();
    Ok((
        PrivateKey { pkcs8, algorithm },
        PublicKey { algorithm, raw },
    ))
}

/// Reads the algorithm of a PKCS#8 PrivateKeyInfo, naming anything unsupported.
fn pkcs8_algorithm(pkcs8: &[u8]) -> Result<KeyAlgorithm, KeyError> {
    let malformed = || KeyError::Malformed("not a PKCS#8 PrivateKeyInfo".into());
    let (_, info, _) = read(pkcs8, der::SEQUENCE).ok_or_else(malformed)?;
    let (_, _version, rest) = read(info, der::INTEGER).ok_or_else(malformed)?;
    let (_, alg_id, _) = read(rest, der::SEQUENCE).ok_or_else(malformed)?;
    let (_, oid, params) = read(alg_id, der::OID).ok_or_else(malformed)?;
    if oid == der::OID_EC_PUBLIC_KEY {
        let (_, curve, _) = read(params, der::OID).ok_or_else(|| {
            KeyError::UnsupportedAlgorithm("ECDSA with explicit curve parameters".into())
        })?;
        return match curve {
            c if c == der::OID_P256 => Ok(KeyAlgorithm::EcdsaP256),
            c if c == der::OID_P384 => Ok(KeyAlgorithm::EcdsaP384),
            c => Err(KeyError::UnsupportedAlgorithm(format!(
                "ECDSA {}",
                der::oid_name(c)
            ))),
        };
    }
    if oid != der::OID_RSA {
        return Err(KeyError::UnsupportedAlgorithm(der::oid_name(oid)));
    }
    let rsa = RsaKeyPair::from_pkcs8(pkcs8)
        .map_err(|e| KeyError::Malformed(format!("RSA key rejected: {e}")))?;
    let bits = rsa.public().modulus_len() * 8;
    KeyAlgorithm::rsa_from_bits(u32::try_from(bits).unwrap_or(0))
        .ok_or_else(|| KeyError::UnsupportedAlgorithm(format!("RSA {bits}-bit")))
}

/// Reads one TLV with the expected tag.
fn read(input: &[u8], tag: u8) -> Option<(u8, &[u8], &[u8])> {
    der::read_tlv(input).filter(|(t, _, _)| *t == tag)
}

/// Converts a SEC1 ECPrivateKey into PKCS#8, taking the curve from its parameters or its length.
fn sec1_to_pkcs8(sec1: &[u8]) -> Result<Zeroizing<Vec<u8>>, KeyError> {
    let malformed = || KeyError::Malformed("not a SEC1 ECPrivateKey".into());
    let (_, body, _) = read(sec1, der::SEQUENCE).ok_or_else(malformed)?;
    let (_, _version, rest) = read(body, der::INTEGER).ok_or_else(malformed)?;
    let (_, private, rest) = read(rest, der::OCTET_STRING).ok_or_else(malformed)?;
    let named = read(rest, der::CONTEXT_0).and_then(|(_, params, _)| read(params, der::OID));
    let curve = match named {
        Some((_, oid, _)) if oid == der::OID_P256 || oid == der::OID_P384 => oid,
        Some((_, oid, _)) => {
            return Err(KeyError::UnsupportedAlgorithm(format!(
                "ECDSA {}",
                der::oid_name(oid)
            )))
        }
        None => match private.len() {
            32 => der::OID_P256,
            48 => der::OID_P384,
            n => {
                return Err(KeyError::UnsupportedAlgorithm(format!(
                    "ECDSA key of {n} bytes"
                )))
            }
        },
    };
    Ok(wrap_pkcs8(der::OID_EC_PUBLIC_KEY, Some(curve), sec1))
}

/// Builds PrivateKeyInfo { version 0, AlgorithmIdentifier { oid, curve or NULL }, OCTET STRING key }.
fn wrap_pkcs8(oid: &[u8], curve: Option<&[u8]>, key: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut alg_id = Vec::new();
    der::write_tlv(&mut alg_id, der::OID, oid);
    match curve {
        Some(curve) => der::write_tlv(&mut alg_id, der::OID, curve),
        None => alg_id.extend_from_slice(&[0x05, 0x00]),
    }
    let body_len = der::tlv_len(1) + der::tlv_len(alg_id.len()) + der::tlv_len(key.len());
    // Sized up front so the buffer holding key bytes never reallocates (which would leave a copy behind).
    let mut out = Zeroizing::new(Vec::with_capacity(der::tlv_len(body_len)));
    let mut body = Zeroizing::new(Vec::with_capacity(body_len));
    der::write_tlv(&mut body, der::INTEGER, &[0]);
    der::write_tlv(&mut body, der::SEQUENCE, &alg_id);
    der::write_tlv(&mut body, der::OCTET_STRING, key);
    der::write_tlv(&mut out, der::SEQUENCE, &body);
    out
}

#[cfg(test)]
#[path = "key_tests.rs"]
mod tests;
