//! The daemon's own keys: the token signing key and the TLS identity of the SDS TCP listener.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use meshca_auth::{AuthError, SigningKey};
use meshca_ca::{SdsCa, SdsTlsError};
use meshca_hsm::{HsmError, KeySelector, Pkcs11Uri};
use meshca_identity::KeyAlgorithm;
use meshca_keystore::{
    record_token_key, recorded_key, Creation, Keystore, KeystoreError, NewEntry, RecordedKeyError,
};

use crate::atomic_file::{replace_path, AtomicFileError};

/// Keystore name of the ES256 key that signs proxy tokens.
const TOKEN_KEY: &str = "daemon/token-signing-key.p8";
/// With `keystore.pkcs11`: the `pkcs11:` URI of the token signing key, made in the token...
const TOKEN_KEY_URI: &str = "daemon/token-signing-key.pkcs11";
/// ...and its public key (PEM), which the key found in the token is proven against.
const TOKEN_KEY_PUBLIC: &str = "daemon/token-signing-key.pub.pem";
/// The token signing key's label in the PKCS#11 token.
const TOKEN_KEY_LABEL: &str = "meshca token signing key";
const SDS_CA_CERT: &str = "daemon/sds-ca/cert.pem";
const SDS_CA_KEY: &str = "daemon/sds-ca/key.pem";
/// With `keystore.pkcs11`: the `pkcs11:` URI of the SDS CA's key, made in the token.
const SDS_CA_KEY_URI: &str = "daemon/sds-ca/key.pkcs11";

/// Why the token signing key or the SDS CA could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    /// The keystore could not be read or written.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// A `*.pkcs11` entry does not name a key of the keystore's token.
    #[error(transparent)]
    RecordedKey(#[from] RecordedKeyError),
    /// Only part of a key's entries are in the keystore, and no creation of it was interrupted.
    #[error(
        "the keystore holds only part of {what} ({entries}), and no creation of it was interrupted: a file \
         was removed or lost; restore it",
        entries = .entries.join(", ")
    )]
    PartlyPresent {
        /// The key.
        what: &'static str,
        /// Its entries.
        entries: &'static [&'static str],
    },
    /// The PKCS#11 token could not make the token signing key.
    #[error("cannot make the token signing key in the PKCS#11 token")]
    MakeInToken(#[source] HsmError),
    /// The key the PKCS#11 token made has no P-256 public key.
    #[error("the PKCS#11 token made no usable P-256 key")]
    NoP256Key,
    /// The token signing key could not be generated.
    #[error("cannot generate the token signing key: {0}")]
    Generate(AuthError),
    /// The token signing key, in the keystore or the token, cannot sign.
    #[error(transparent)]
    Unusable(#[from] AuthError),
    /// Another process created the token signing key, which was gone when read.
    #[error("the token signing key ({entry}) was created by another process, then removed")]
    TokenSigningKeyRemoved {
        /// Its keystore entry.
        entry: &'static str,
    },
    /// The token signing key in the keystore does not load.
    #[error(
        "the token signing key in the keystore ({TOKEN_KEY}) cannot be loaded: {0}; it is not replaced \
         automatically (that would invalidate every token)"
    )]
    TokenSigningKeyUnloadable(AuthError),
    /// The keystore names the token signing key in the token, but not its public key.
    #[error("the keystore holds {TOKEN_KEY_URI} without {TOKEN_KEY_PUBLIC}: restore it")]
    NoTokenSigningPublicKey,
    /// The public key of the token signing key is not a P-256 one.
    #[error("{TOKEN_KEY_PUBLIC} in the keystore is not a P-256 public key")]
    TokenSigningPublicKeyInvalid,
    /// The key a keystore entry names is not in the token, or not the one recorded.
    #[error("the key {entry} names")]
    NotInToken {
        /// The keystore entry naming the key.
        entry: &'static str,
        #[source]
        source: HsmError,
    },
    /// The SDS CA could not be made, or a server certificate issued from it.
    #[error(transparent)]
    SdsCa(#[from] SdsTlsError),
    /// The SDS CA made in the token has no key there.
    #[error("the SDS CA made in the token has no key there")]
    SdsCaNotInToken,
    /// The SDS CA made in software has no key.
    #[error("a software SDS CA without its key")]
    SdsCaWithoutKey,
    /// Another process created the SDS CA, which was gone when read.
    #[error("the SDS CA (daemon/sds-ca) was created by another process, then removed")]
    SdsCaRemoved,
    /// The SDS CA's certificate in the keystore is not text.
    #[error("{SDS_CA_CERT} in the keystore is not text")]
    SdsCaCertNotText,
    /// The SDS CA's key in the keystore is not text.
    #[error("{SDS_CA_KEY} in the keystore is not text")]
    SdsCaKeyNotText,
    /// The SDS CA's key in the keystore does not load.
    #[error("{SDS_CA_KEY} in the keystore cannot be loaded: {0}")]
    SdsCaKeyUnloadable(SdsTlsError),
    /// The SDS CA's key in the token could not be found or used.
    #[error("the SDS CA's key, which {SDS_CA_KEY_URI} names")]
    SdsCaKeyInToken(#[source] SdsTlsError),
    /// The SDS CA's certificate could not be written for clients.
    #[error(transparent)]
    SdsCaFile(#[from] AtomicFileError),
}

/// Why the TLS identity of the SDS TCP listeners could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsIdentityError {
    /// A file of `sds.tls` could not be read.
    #[error("{setting}: cannot read {path}")]
    ReadFile {
        /// `sds.tls.certFile` or `sds.tls.keyFile`.
        setting: &'static str,
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `sds.tls.certFile` is not PEM.
    #[error("sds.tls.certFile: {path} is not valid PEM")]
    CertNotPem {
        /// The file.
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// `sds.tls.certFile` holds no certificate.
    #[error("sds.tls.certFile: {path} holds no certificate")]
    NoCert {
        /// The file.
        path: PathBuf,
    },
    /// `sds.tls.keyFile` holds no private key that can be read.
    #[error("sds.tls.keyFile: cannot read a private key from {path}")]
    NoKey {
        /// The file.
        path: PathBuf,
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// The daemon's own SDS CA could not give a certificate.
    #[error(transparent)]
    Generated(#[from] KeyError),
    /// rustls has no safe protocol versions for the provider.
    #[error("TLS protocol versions")]
    ProtocolVersions(#[source] rustls::Error),
    /// The certificate and key do not go together.
    #[error("the SDS TLS certificate and key do not form a usable pair")]
    UnusablePair(#[source] rustls::Error),
}

/// The file, beside the data directory's keystore, that clients (Envoy, `meshca sds fetch`) use to verify the
/// SDS listener's certificate.
pub fn sds_ca_file(data_dir: &Path) -> PathBuf {
    data_dir.join("sds-ca.pem")
}

/// Loads the token signing key, generating and persisting it the first time: in the PKCS#11 token when
/// `keystore.pkcs11` is set (a key persisted before the token was configured stays where it is: tokens
/// were minted with it). Of concurrent first callers (the daemon, `meshca token`), one creates the key
/// and every other loads that one.
pub(crate) fn token_signing_key(keystore: &dyn Keystore) -> Result<SigningKey, KeyError> {
    if let Some(key) = load_token_signing_key(keystore)? {
        return Ok(key);
    }
    if let Some(token) = keystore.token() {
        let key = token
            .generate_pending_key(KeyAlgorithm::EcdsaP256)
            .map_err(KeyError::MakeInToken)?;
        let uri = Pkcs11Uri::key(token.label(), TOKEN_KEY_LABEL, key.id()).to_string();
        let public = key.public_key_pem().ok_or(KeyError::NoP256Key)?;
        let recorded = record_token_key(
            keystore,
            &key,
            TOKEN_KEY_LABEL,
            &[
                NewEntry::public(TOKEN_KEY_URI, uri.as_bytes()),
                NewEntry::public(TOKEN_KEY_PUBLIC, public.as_bytes()),
            ],
        )
        .map_err(|e| {
            half_present(
                e,
                "the token signing key",
                &[TOKEN_KEY_URI, TOKEN_KEY_PUBLIC],
            )
        })?;
        return match recorded {
            true => {
                tracing::info!(key = %uri, "generated the token signing key in the PKCS#11 token");
                Ok(SigningKey::from_token_key(key)?)
            }
            false => load_token_signing_key(keystore)?.ok_or(KeyError::TokenSigningKeyRemoved {
                entry: TOKEN_KEY_URI,
            }),
        };
    }
    let (key, pkcs8) = SigningKey::generate().map_err(KeyError::Generate)?;
    match keystore.create_if_absent(&[NewEntry::secret(TOKEN_KEY, &pkcs8)])? {
        Creation::Created => {
            tracing::info!("generated the token signing key");
            Ok(key)
        }
        Creation::Existing => load_token_signing_key(keystore)?
            .ok_or(KeyError::TokenSigningKeyRemoved { entry: TOKEN_KEY }),
    }
}

/// `error`, said of `what` when it is [`KeystoreError::PartlyPresent`]: a file of it was removed.
fn half_present(
    error: KeystoreError,
    what: &'static str,
    entries: &'static [&'static str],
) -> KeyError {
    match error {
        KeystoreError::PartlyPresent { .. } => KeyError::PartlyPresent { what, entries },
        other => other.into(),
    }
}

/// Whether the keystore holds a token signing key (tokens may have been minted with it).
pub fn has_token_signing_key(keystore: &dyn Keystore) -> crate::Result<bool> {
    Ok(holds_token_signing_key(keystore).map_err(KeyError::from)?)
}

/// [`has_token_signing_key`], inside the library.
pub(crate) fn holds_token_signing_key(keystore: &dyn Keystore) -> Result<bool, KeystoreError> {
    Ok(keystore.get_secret(TOKEN_KEY)?.is_some() || keystore.get_public(TOKEN_KEY_URI)?.is_some())
}

/// Whether the keystore holds a token signing key of its own (persisted before `keystore.pkcs11` was set).
pub fn has_software_token_signing_key(keystore: &dyn Keystore) -> crate::Result<bool> {
    Ok(keystore
        .get_secret(TOKEN_KEY)
        .map(|key| key.is_some())
        .map_err(KeyError::from)?)
}

fn load_token_signing_key(keystore: &dyn Keystore) -> Result<Option<SigningKey>, KeyError> {
    if let Some(pkcs8) = keystore.get_secret(TOKEN_KEY)? {
        return SigningKey::from_pkcs8(pkcs8.expose())
            .map(Some)
            .map_err(KeyError::TokenSigningKeyUnloadable);
    }
    let Some(uri) = keystore.get_public(TOKEN_KEY_URI)? else {
        return Ok(None);
    };
    let public = keystore
        .get_public(TOKEN_KEY_PUBLIC)?
        .ok_or(KeyError::NoTokenSigningPublicKey)?;
    let public = meshca_hsm::p256_public_key_from_pem(&public)
        .ok_or(KeyError::TokenSigningPublicKeyInvalid)?;
    let key = find_in_token(keystore, TOKEN_KEY_URI, &uri, &public)?;
    Ok(Some(SigningKey::from_token_key(key)?))
}

/// The key the `pkcs11:` URI `uri` (the keystore entry `entry`) names in the keystore's token, proven
/// to be the one whose public key is `public` (an uncompressed P-256 point).
fn find_in_token(
    keystore: &dyn Keystore,
    entry: &'static str,
    uri: &[u8],
    public: &[u8],
) -> Result<meshca_hsm::TokenKey, KeyError> {
    let (token, uri) = recorded_key(keystore, entry, uri)?;
    token
        .find_key(
            KeySelector {
                label: uri.object(),
                id: uri.id(),
            },
            KeyAlgorithm::EcdsaP256,
            public,
        )
        .map_err(|source| KeyError::NotInToken { entry, source })
}

/// A certificate chain and key for the SDS TLS listener.
pub(crate) struct ServerIdentity {
    /// Leaf first.
    pub chain: Vec<rustls_pki_types::CertificateDer<'static>>,
    /// The leaf's key.
    pub key: rustls_pki_types::PrivateKeyDer<'static>,
}

impl std::fmt::Debug for ServerIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerIdentity")
            .field("chain", &self.chain.len())
            .field("key", &"[redacted]")
            .finish()
    }
}

/// Reads the operator's certificate and key for the SDS listener (`sds.tls`).
pub(crate) fn server_identity_from_files(
    cert_file: &Path,
    key_file: &Path,
) -> Result<ServerIdentity, TlsIdentityError> {
    use rustls_pki_types::pem::PemObject;
    let read = |setting: &'static str, file: &Path| {
        meshca_files::read(
            file,
            meshca_files::PEM_FILE_BYTES,
            meshca_files::PEM_FILE_BOUND,
        )
        .map_err(|source| TlsIdentityError::ReadFile {
            setting,
            path: file.to_owned(),
            source,
        })
    };
    let chain =
        rustls_pki_types::CertificateDer::pem_slice_iter(&read("sds.tls.certFile", cert_file)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| TlsIdentityError::CertNotPem {
                path: cert_file.to_owned(),
                source,
            })?;
    if chain.is_empty() {
        return Err(TlsIdentityError::NoCert {
            path: cert_file.to_owned(),
        });
    }
    let key_pem = zeroize::Zeroizing::new(read("sds.tls.keyFile", key_file)?);
    let key = rustls_pki_types::PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| {
        TlsIdentityError::NoKey {
            path: key_file.to_owned(),
            source,
        }
    })?;
    Ok(ServerIdentity { chain, key })
}

/// A server certificate for the SDS listener from the daemon's own SDS CA (created on first start and kept in
/// the keystore; its certificate is also written to `<dataDir>/sds-ca.pem` for clients).
pub(crate) fn server_identity_generated(
    keystore: &dyn Keystore,
    data_dir: &Path,
    now: SystemTime,
) -> Result<ServerIdentity, KeyError> {
    let ca = sds_ca(keystore, now)?;
    replace_path(&sds_ca_file(data_dir), ca.cert_pem().as_bytes(), 0o644)?;
    let mut names = vec!["localhost".to_owned(), "meshca".to_owned()];
    if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
        let host = host.trim();
        if !host.is_empty() && !names.iter().any(|n| n == host) {
            names.push(host.to_owned());
        }
    }
    let server = ca.issue_server_cert(&names, now)?;
    Ok(ServerIdentity {
        chain: vec![server.cert_der.into()],
        key: rustls_pki_types::PrivateKeyDer::Pkcs8(server.key_pkcs8.to_vec().into()),
    })
}

/// The SDS CA from the keystore, created the first time: its key in the PKCS#11 token when
/// `keystore.pkcs11` is set (an SDS CA persisted before keeps its key file: clients trust it). Of
/// concurrent creators, one persists its CA and every other loads that one.
fn sds_ca(keystore: &dyn Keystore, now: SystemTime) -> Result<SdsCa, KeyError> {
    if let Some(ca) = load_sds_ca(keystore)? {
        return Ok(ca);
    }
    let half = |e| half_present(e, "the SDS CA (daemon/sds-ca)", &[SDS_CA_CERT, "its key"]);
    let created = match keystore.token() {
        Some(token) => {
            let ca = SdsCa::generate_in_token(now, token)?;
            let id = ca.id();
            let key = ca.token_key().ok_or(KeyError::SdsCaNotInToken)?;
            let uri = Pkcs11Uri::key(token.label(), &id, key.id()).to_string();
            let recorded = record_token_key(
                keystore,
                key,
                &id,
                &[
                    NewEntry::public(SDS_CA_KEY_URI, uri.as_bytes()),
                    NewEntry::public(SDS_CA_CERT, ca.cert_pem().as_bytes()),
                ],
            )
            .map_err(half)?;
            if recorded {
                tracing::info!(key = %uri, "generated the SDS CA, its key in the PKCS#11 token");
                return Ok(ca);
            }
            Creation::Existing
        }
        None => {
            let ca = SdsCa::generate(now)?;
            let key_pem = ca.key_pem().ok_or(KeyError::SdsCaWithoutKey)?;
            let created = keystore
                .create_if_absent(&[
                    NewEntry::secret(SDS_CA_KEY, key_pem.as_bytes()),
                    NewEntry::public(SDS_CA_CERT, ca.cert_pem().as_bytes()),
                ])
                .map_err(half)?;
            if created == Creation::Created {
                return Ok(ca);
            }
            created
        }
    };
    debug_assert_eq!(created, Creation::Existing);
    load_sds_ca(keystore)?.ok_or(KeyError::SdsCaRemoved)
}

/// The persisted SDS CA; `None` when it is missing or only half of it is there (a creator may be between
/// its two writes: [`sds_ca`] decides under the keystore's lock).
fn load_sds_ca(keystore: &dyn Keystore) -> Result<Option<SdsCa>, KeyError> {
    let Some(cert) = keystore.get_public(SDS_CA_CERT)? else {
        return Ok(None);
    };
    let cert = String::from_utf8(cert).map_err(|_| KeyError::SdsCaCertNotText)?;
    if let Some(key) = keystore.get_secret(SDS_CA_KEY)? {
        let key_text = std::str::from_utf8(key.expose()).map_err(|_| KeyError::SdsCaKeyNotText)?;
        let ca = SdsCa::from_pem(cert, key_text).map_err(KeyError::SdsCaKeyUnloadable)?;
        return Ok(Some(ca));
    }
    let Some(uri) = keystore.get_public(SDS_CA_KEY_URI)? else {
        return Ok(None);
    };
    let (token, uri) = recorded_key(keystore, SDS_CA_KEY_URI, &uri)?;
    let selector = KeySelector {
        label: uri.object(),
        id: uri.id(),
    };
    let ca = SdsCa::from_pem_in_token(cert, token, selector).map_err(KeyError::SdsCaKeyInToken)?;
    Ok(Some(ca))
}

/// The rustls server configuration of the SDS TCP listener (ring provider, ALPN h2).
pub(crate) fn server_tls_config(
    identity: ServerIdentity,
) -> Result<Arc<rustls::ServerConfig>, TlsIdentityError> {
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(TlsIdentityError::ProtocolVersions)?
    .with_no_client_auth()
    .with_single_cert(identity.chain, identity.key)
    .map_err(TlsIdentityError::UnusablePair)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

impl From<KeyError> for crate::Error {
    fn from(error: KeyError) -> crate::Error {
        crate::Error::failed(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use meshca_keystore::MemoryKeystore;
    use std::sync::Barrier;

    /// Runs `f` on 8 threads released together against one keystore; returns each result.
    fn concurrently<T: Send>(keystore: &MemoryKeystore, f: fn(&dyn Keystore) -> T) -> Vec<T> {
        const THREADS: usize = 8;
        let start = Barrier::new(THREADS);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    let start = &start;
                    scope.spawn(move || {
                        start.wait();
                        f(keystore)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("creator thread"))
                .collect()
        })
    }

    #[test]
    fn concurrent_first_uses_share_one_token_signing_key() {
        // `meshca token` and a starting daemon once each generated a key: tokens minted by the loser were
        // refused by the daemon.
        // Generating a key takes microseconds: several rounds make a lost race likely to show.
        for _ in 0..10 {
            let keystore = MemoryKeystore::new();
            let keys = concurrently(&keystore, |ks| {
                token_signing_key(ks)
                    .expect("the key loads or is created")
                    .verifier()
            });
            let stored = token_signing_key(&keystore)
                .expect("the key loads")
                .verifier();
            for key in &keys {
                assert_eq!(key, &stored, "every caller uses the persisted key");
            }
        }
    }

    #[test]
    fn concurrent_first_uses_share_one_sds_ca() {
        let keystore = MemoryKeystore::new();
        let cas = concurrently(&keystore, |ks| {
            sds_ca(ks, SystemTime::now())
                .expect("the SDS CA loads or is created")
                .cert_pem()
                .to_owned()
        });
        let stored = load_sds_ca(&keystore)
            .expect("the SDS CA loads")
            .expect("the SDS CA was persisted")
            .cert_pem()
            .to_owned();
        for ca in &cas {
            assert_eq!(ca, &stored, "every caller uses the persisted SDS CA");
        }
    }
}
