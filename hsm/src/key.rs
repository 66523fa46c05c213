//! A private key inside the token: made there (non-extractable), or found by its label or id, and
//! proven to match a certificate by a signature.

use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};

use cryptoki::error::Error as CkError;
use cryptoki::mechanism::Mechanism;
use cryptoki::object::{
    Attribute, AttributeInfo, AttributeType, KeyType, ObjectClass, ObjectHandle,
};
use cryptoki::session::Session;
use meshca_identity::KeyAlgorithm;
use ring::rand::{SecureRandom, SystemRandom};
use ring::{digest, signature};

use crate::der;
use crate::error::HsmError;
use crate::pending::Maker;
use crate::token::{Context, Token};

/// How long a key's id (`CKA_ID`) is when meshca makes the key.
const ID_LEN: usize = 16;

/// A private key in the token. Signing happens in the token; the key never leaves it. `Debug` shows
/// where the key is, which is no secret.
pub struct TokenKey {
    token: Token,
    algorithm: KeyAlgorithm,
    /// `CKA_LABEL`, as found or given.
    label: String,
    /// `CKA_ID`.
    id: Vec<u8>,
    /// The public key as a certificate's subjectPublicKey holds it: the uncompressed point for ECDSA,
    /// an `RSAPublicKey` for RSA.
    public_key: Vec<u8>,
    /// The private key object's handle in the context it was found in (by generation).
    handle: Mutex<Option<(u64, ObjectHandle)>>,
}

/// Which key of the token: by label, by id, or both (RFC 7512's `object` and `id`).
#[derive(Clone, Copy, Debug)]
pub struct KeySelector<'a> {
    /// `CKA_LABEL`.
    pub label: Option<&'a str>,
    /// `CKA_ID`.
    pub id: Option<&'a [u8]>,
}

impl Token {
    /// Makes a key pair of `algorithm` in the token: the private key sensitive, never extractable,
    /// able to sign only; both objects labelled `label`, with a random id.
    pub fn generate_key(&self, algorithm: KeyAlgorithm, label: &str) -> Result<TokenKey, HsmError> {
        self.make_key(algorithm, label)
    }

    /// Makes a key pair as [`Token::generate_key`] does, labelled as pending by this process (see the
    /// `pending` module): until [`TokenKey::record_as`] labels it, a start finds it, and destroys it when
    /// this process is gone and no record names its id.
    pub fn generate_pending_key(&self, algorithm: KeyAlgorithm) -> Result<TokenKey, HsmError> {
        self.make_key(algorithm, &Maker::this_process().label())
    }

    fn make_key(&self, algorithm: KeyAlgorithm, label: &str) -> Result<TokenKey, HsmError> {
        let (mechanism, mut public_template) = match der::curve_params(algorithm) {
            Some(curve) => (
                Mechanism::EccKeyPairGen,
                vec![Attribute::EcParams(curve.to_vec())],
            ),
            None => (
                Mechanism::RsaPkcsKeyPairGen,
                vec![
                    Attribute::ModulusBits((algorithm.rsa_bits().unwrap_or(2048) as u64).into()),
                    Attribute::PublicExponent(vec![0x01, 0x00, 0x01]),
                ],
            ),
        };
        public_template.push(Attribute::Verify(true));
        public_template.push(Attribute::Private(false));
        let private_template = vec![
            Attribute::Private(true),
            Attribute::Sensitive(true),
            Attribute::Extractable(false),
            Attribute::Sign(true),
            Attribute::Decrypt(false),
            Attribute::Derive(false),
        ];
        let mut base_id = vec![0u8; ID_LEN];
        SystemRandom::new()
            .fill(&mut base_id)
            .map_err(|_| HsmError::Random)?;
        let attempts = AtomicU8::new(0);
        let (generation, id, private, public_key) =
            self.run("generating a key", |context, session| {
                // Another id on each attempt: an attempt that failed half way (and is retried) can never
                // give its objects to the key this one makes.
                let mut id = base_id.clone();
                id[0] ^= attempts.fetch_add(1, Ordering::Relaxed);
                let common = [
                    Attribute::Token(true),
                    Attribute::Label(label.as_bytes().to_vec()),
                    Attribute::Id(id.clone()),
                ];
                let mut public_template = public_template.clone();
                public_template.extend(common.iter().cloned());
                let mut private_template = private_template.clone();
                private_template.extend(common.iter().cloned());
                let (public, private) =
                    session.generate_key_pair(&mechanism, &public_template, &private_template)?;
                match read_public_key(session, public, algorithm) {
                    Ok(public_key) => Ok((context.generation, id, private, public_key)),
                    Err(error) => {
                        // Not kept: a retry makes another pair.
                        let _ = session.destroy_object(private);
                        let _ = session.destroy_object(public);
                        Err(error)
                    }
                }
            })?;
        let Some(public_key) = public_key else {
            let _ = self.destroy_keys(&id);
            return Err(HsmError::PublicKey {
                label: label.to_owned(),
            });
        };
        Ok(TokenKey {
            token: self.clone(),
            algorithm,
            label: label.to_owned(),
            id,
            public_key,
            handle: Mutex::new(Some((generation, private))),
        })
    }

    /// Finds the private key `selector` names, which must be the key of a certificate whose public key is
    /// `public_key` (its subjectPublicKey bits) with `algorithm`: a signature made with the key in the
    /// token is verified against it, so a key that does not match is refused here rather than after
    /// leaves were signed with it.
    pub fn find_key(
        &self,
        selector: KeySelector<'_>,
        algorithm: KeyAlgorithm,
        public_key: &[u8],
    ) -> Result<TokenKey, HsmError> {
        let not_found = || HsmError::KeyNotFound {
            what: "private key",
            label: self.label().to_owned(),
            object: selector.label.map(str::to_owned),
            id: selector.id.map(hex::encode),
        };
        let template = selector_template(selector);
        let (generation, mut found) = self.run("finding a key", |context, session| {
            Ok((context.generation, session.find_objects(&template)?))
        })?;
        if let (true, Some(label), Some(id)) = (found.is_empty(), selector.label, selector.id) {
            // Recorded under `label`, but its maker stopped before labelling it: it is still pending.
            found = self.finish_pending(label, id)?;
        }
        let handle = match found.as_slice() {
            [one] => *one,
            [] => return Err(not_found()),
            _ => {
                return Err(HsmError::AmbiguousKey {
                    label: self.label().to_owned(),
                    matches: found.len(),
                })
            }
        };
        let (label, id, key_type, curve) =
            self.run("reading a key's attributes", |_, session| {
                let attributes = session.get_attributes(
                    handle,
                    &[
                        AttributeType::Label,
                        AttributeType::Id,
                        AttributeType::KeyType,
                        AttributeType::EcParams,
                    ],
                )?;
                let mut out = (String::new(), Vec::new(), None, None);
                for attribute in attributes {
                    match attribute {
                        Attribute::Label(l) => out.0 = String::from_utf8_lossy(&l).into_owned(),
                        Attribute::Id(i) => out.1 = i,
                        Attribute::KeyType(t) => out.2 = Some(t),
                        Attribute::EcParams(p) => out.3 = Some(p),
                        _ => {}
                    }
                }
                Ok(out)
            })?;
        let found_algorithm = match key_type {
            Some(KeyType::EC) => curve.as_deref().and_then(der::curve_of),
            Some(KeyType::RSA) if algorithm.rsa_bits().is_some() => Some(algorithm),
            _ => None,
        };
        if found_algorithm != Some(algorithm) {
            return Err(HsmError::KeyMismatch {
                label: self.label().to_owned(),
                object: label,
                reason: format!(
                    "the key in the token is not {algorithm}, the certificate's key type"
                ),
            });
        }
        let key = TokenKey {
            token: self.clone(),
            algorithm,
            label,
            id,
            public_key: public_key.to_vec(),
            handle: Mutex::new(Some((generation, handle))),
        };
        key.prove()?;
        Ok(key)
    }
}

impl Token {
    /// The private key with the id `id` when it is still labelled as pending, labelled `label` now; none
    /// otherwise.
    fn finish_pending(&self, label: &str, id: &[u8]) -> Result<Vec<ObjectHandle>, HsmError> {
        let pending = self.run("finding a key", |_, session| {
            let found = session.find_objects(&[
                Attribute::Class(ObjectClass::PRIVATE_KEY),
                Attribute::Id(id.to_vec()),
            ])?;
            let [one] = found.as_slice() else {
                return Ok(false);
            };
            let attributes = session.get_attributes(*one, &[AttributeType::Label])?;
            Ok(attributes.iter().any(|a| {
                matches!(a, Attribute::Label(l) if Maker::parse(&String::from_utf8_lossy(l)).is_some())
            }))
        })?;
        if !pending {
            return Ok(Vec::new());
        }
        self.label_objects(id, label)?;
        tracing::info!(token = %self.label(), id = %hex::encode(id), label,
            "a recorded key in the PKCS#11 token still had its pending label (its maker stopped before labelling it): labelled now");
        let template = selector_template(KeySelector {
            label: Some(label),
            id: Some(id),
        });
        self.run("finding a key", |_, session| {
            session.find_objects(&template)
        })
    }

    /// Destroys every object with the id `id` (a key pair meshca made, found by the id its `pkcs11:`
    /// URI names).
    pub fn destroy_keys(&self, id: &[u8]) -> Result<(), HsmError> {
        self.run("destroying a key", |_, session| {
            for object in session.find_objects(&[Attribute::Id(id.to_vec())])? {
                session.destroy_object(object)?;
            }
            Ok(())
        })
    }
}

impl TokenKey {
    /// Signs `message` as an X.509 signature of the key's algorithm: ECDSA with SHA-256 (P-256) or
    /// SHA-384 (P-384), DER-encoded; RSA PKCS#1 v1.5 with SHA-256.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, HsmError> {
        let raw = self.sign_raw(message)?;
        match self.algorithm {
            KeyAlgorithm::EcdsaP256 | KeyAlgorithm::EcdsaP384 => {
                der::ecdsa_signature(&raw).ok_or(HsmError::BadSignature {
                    label: self.label.clone(),
                })
            }
            _ => Ok(raw),
        }
    }

    /// Signs `message` as [`TokenKey::sign`] does, an ECDSA signature left as the token gives it: `r`
    /// and `s` side by side, each the curve's size (what JWS's ES256 and ES384 carry).
    pub fn sign_raw(&self, message: &[u8]) -> Result<Vec<u8>, HsmError> {
        let (mechanism, input) = match self.algorithm {
            KeyAlgorithm::EcdsaP256 => (
                Mechanism::Ecdsa,
                digest::digest(&digest::SHA256, message).as_ref().to_vec(),
            ),
            KeyAlgorithm::EcdsaP384 => (
                Mechanism::Ecdsa,
                digest::digest(&digest::SHA384, message).as_ref().to_vec(),
            ),
            _ => (Mechanism::Sha256RsaPkcs, message.to_vec()),
        };
        self.token.run("signing", |context, session| {
            let handle = self.handle(context, session)?;
            session.sign(&mechanism, handle, &input).inspect_err(|_| {
                // The handle may be stale (the token was reset): find the key again next time.
                *self.handle.lock().unwrap_or_else(PoisonError::into_inner) = None;
            })
        })
    }

    /// The key's algorithm.
    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The public key, as a certificate's subjectPublicKey holds it.
    pub fn public_key(&self) -> &[u8] {
        &self.public_key
    }

    /// The public key of a P-256 key as PEM (`PUBLIC KEY`, a SubjectPublicKeyInfo), what the keystore
    /// keeps beside the `pkcs11:` URI of a key that has no certificate; `None` for other algorithms.
    pub fn public_key_pem(&self) -> Option<String> {
        (self.algorithm == KeyAlgorithm::EcdsaP256 && self.public_key.len() == 65).then(|| {
            let mut spki = P256_SPKI_PREFIX.to_vec();
            spki.extend_from_slice(&self.public_key);
            pem::encode(&pem::Pem::new("PUBLIC KEY", spki))
        })
    }

    /// The token holding the key.
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The key's `CKA_LABEL`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The key's `CKA_ID`.
    pub fn id(&self) -> &[u8] {
        &self.id
    }

    /// Gives the key (and its public half) a new label, e.g. the id of the CA it became.
    pub fn relabel(&mut self, label: &str) -> Result<(), HsmError> {
        self.token.label_objects(&self.id, label)?;
        self.label = label.to_owned();
        Ok(())
    }

    /// Labels a pending key (made by [`Token::generate_pending_key`]) `label`, once the keystore records
    /// it under that label: from now on no start takes it for a leftover. The key is used by its id, so
    /// this value's own label is left as made.
    pub fn record_as(&self, label: &str) -> Result<(), HsmError> {
        self.token.label_objects(&self.id, label)
    }

    /// Destroys the key pair in the token (a key made for a CA that another replica made first).
    pub fn destroy(self) -> Result<(), HsmError> {
        self.token.destroy_keys(&self.id)
    }

    /// Whether the token would hand out the private key's value: `false` for a sensitive,
    /// non-extractable key (PKCS#11 refuses `CKA_VALUE`).
    pub fn value_is_readable(&self) -> Result<bool, HsmError> {
        self.token
            .run("reading a key's attributes", |context, session| {
                let handle = self.handle(context, session)?;
                let info = session.get_attribute_info(handle, &[AttributeType::Value])?;
                Ok(matches!(info.first(), Some(AttributeInfo::Available(_))))
            })
    }

    /// Signs a random message in the token and verifies it with the public key.
    fn prove(&self) -> Result<(), HsmError> {
        let mut challenge = [0u8; 32];
        SystemRandom::new()
            .fill(&mut challenge)
            .map_err(|_| HsmError::Random)?;
        let signed = self.sign(&challenge)?;
        let verifier: &dyn signature::VerificationAlgorithm = match self.algorithm {
            KeyAlgorithm::EcdsaP256 => &signature::ECDSA_P256_SHA256_ASN1,
            KeyAlgorithm::EcdsaP384 => &signature::ECDSA_P384_SHA384_ASN1,
            _ => &signature::RSA_PKCS1_2048_8192_SHA256,
        };
        signature::UnparsedPublicKey::new(verifier, &self.public_key)
            .verify(&challenge, &signed)
            .map_err(|_| HsmError::KeyMismatch {
                label: self.token.label().to_owned(),
                object: self.label.clone(),
                reason:
                    "a signature made with it does not verify with the certificate's public key"
                        .into(),
            })
    }

    /// The private key's handle in `context`, found again by id when the context changed.
    fn handle(&self, context: &Context, session: &Session) -> Result<ObjectHandle, CkError> {
        let mut cached = self.handle.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((generation, handle)) = *cached {
            if generation == context.generation {
                return Ok(handle);
            }
        }
        let found = session.find_objects(&[
            Attribute::Class(ObjectClass::PRIVATE_KEY),
            Attribute::Id(self.id.clone()),
        ])?;
        let handle = found.first().copied().ok_or(CkError::Pkcs11(
            cryptoki::error::RvError::KeyHandleInvalid,
            cryptoki::context::Function::FindObjects,
        ))?;
        *cached = Some((context.generation, handle));
        Ok(handle)
    }
}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenKey")
            .field("token", &self.token.label())
            .field("label", &self.label)
            .field("id", &hex::encode(&self.id))
            .field("algorithm", &self.algorithm)
            .finish()
    }
}

/// The DER of a P-256 SubjectPublicKeyInfo before its 65-byte uncompressed point: id-ecPublicKey,
/// prime256v1, and the BIT STRING's header.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

/// The uncompressed point of a P-256 public key in PEM, as [`TokenKey::public_key_pem`] writes it;
/// `None` for anything else.
pub fn p256_public_key_from_pem(text: &[u8]) -> Option<Vec<u8>> {
    let block = pem::parse(text).ok()?;
    if block.tag() != "PUBLIC KEY" {
        return None;
    }
    let point = block.contents().strip_prefix(&P256_SPKI_PREFIX[..])?;
    (point.len() == 65 && point[0] == 0x04).then(|| point.to_vec())
}

/// The search template for the private key `selector` names.
fn selector_template(selector: KeySelector<'_>) -> Vec<Attribute> {
    let mut template = vec![Attribute::Class(ObjectClass::PRIVATE_KEY)];
    if let Some(label) = selector.label {
        template.push(Attribute::Label(label.as_bytes().to_vec()));
    }
    if let Some(id) = selector.id {
        template.push(Attribute::Id(id.to_vec()));
    }
    template
}

/// The public key object's key as a certificate holds it; `None` when the module gives none usable.
fn read_public_key(
    session: &Session,
    public: ObjectHandle,
    algorithm: KeyAlgorithm,
) -> Result<Option<Vec<u8>>, CkError> {
    if der::curve_params(algorithm).is_some() {
        let point_len = if algorithm == KeyAlgorithm::EcdsaP256 {
            65
        } else {
            97
        };
        let attributes = session.get_attributes(public, &[AttributeType::EcPoint])?;
        return Ok(attributes.into_iter().find_map(|a| match a {
            Attribute::EcPoint(p) => der::ec_point(&p, point_len).map(<[u8]>::to_vec),
            _ => None,
        }));
    }
    let attributes = session.get_attributes(
        public,
        &[AttributeType::Modulus, AttributeType::PublicExponent],
    )?;
    let (mut modulus, mut exponent) = (None, None);
    for attribute in attributes {
        match attribute {
            Attribute::Modulus(m) => modulus = Some(m),
            Attribute::PublicExponent(e) => exponent = Some(e),
            _ => {}
        }
    }
    Ok(modulus
        .zip(exponent)
        .map(|(m, e)| der::rsa_public_key(&m, &e)))
}
