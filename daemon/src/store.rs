//! Where the daemon keeps its keys and revoked tokens: files in the data directory (`keystore.type:
//! file`), or the PostgreSQL database that replicas share (`keystore.type: postgres`).

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use meshca_auth::SigningKey;
use meshca_config::{
    Pkcs11Settings, PostgresSettings, Settings, MAX_PKCS11_PIN_FILE, PKCS11_PIN_ENV,
    POSTGRES_PASSWORD_ENV,
};
use meshca_db::{
    Database, DbError, DbOptions, KeyEncryptionKey, PostgresKeystore, ProxyRecords,
    TokenRevocations,
};
use meshca_hsm::{HsmError, Token as Pkcs11Token, UriError};
use meshca_keystore::{Keystore, KeystoreError, WithToken};
use meshca_serve::ErrorChain;
use zeroize::Zeroizing;

use super::daemon_keys::{self, KeyError};
use super::data_dir::{DataDir, DataDirError};
use super::revocations::{self, RevocationsError};

/// Why the store could not be opened, or its token signing key had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// The data directory, or the keystore in it, could not be opened.
    #[error(transparent)]
    DataDir(#[from] DataDirError),
    /// No PIN for the PKCS#11 token.
    #[error(transparent)]
    Pin(#[from] PinError),
    /// The PKCS#11 token could not be opened.
    #[error(transparent)]
    Token(#[from] HsmError),
    /// The database did not connect, or its keystore did not open. Said without its sources: only
    /// this error is retried, while the database does not answer.
    #[error("{0}")]
    Database(DbError),
    /// The key-encryption key file could not be read.
    #[error("keystore.postgres.keyEncryptionKeyFile")]
    KeyEncryptionKeyFile(#[source] DbError),
    /// Neither a key-encryption key file nor a token to seal the database's secrets.
    #[error("keystore.postgres.keyEncryptionKeyFile: required unless keystore.pkcs11 is set")]
    NoKeyEncryptionKey,
    /// The database's password file could not be opened or read.
    #[error("keystore.postgres.passwordFile: {path}")]
    PasswordFile {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Others than its owner can read the database's password file.
    #[error(
        "keystore.postgres.passwordFile: {path} has mode {mode:04o}, but a password file must be readable by \
         its owner only: `chmod 600` it"
    )]
    PasswordFileExposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The database's password file is not text.
    #[error("keystore.postgres.passwordFile: {path} is not UTF-8 text")]
    PasswordFileNotText {
        /// The file.
        path: PathBuf,
    },
    /// The task opening the store failed.
    #[error(transparent)]
    OpenTask(tokio::task::JoinError),
    /// Whether the keystore holds a token signing key could not be found out.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// The token revocation list could not be created.
    #[error(transparent)]
    Revocations(#[from] RevocationsError),
    /// The token signing key could not be loaded or made.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// Why there is no PIN for the PKCS#11 token; it never says the PIN.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PinError {
    /// Neither a PIN file nor the variable.
    #[error(
        "keystore.pkcs11: no PIN for token {token:?}: set keystore.pkcs11.pinFile (a file readable by \
         its owner only) or {PKCS11_PIN_ENV}"
    )]
    NotGiven {
        /// The token's label.
        token: String,
    },
    /// The variable is not text.
    #[error("{PKCS11_PIN_ENV} is not UTF-8 text")]
    VariableNotText,
    /// The variable is set, but empty.
    #[error(
        "{PKCS11_PIN_ENV} is empty: set it to the token's user PIN, or unset it and set \
         keystore.pkcs11.pinFile"
    )]
    VariableEmpty,
    /// The PIN file could not be opened or read.
    #[error("keystore.pkcs11.pinFile: {path}")]
    File {
        /// The file.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Others than its owner can read the PIN file.
    #[error(
        "keystore.pkcs11.pinFile: {path} has mode {mode:04o}, but a PIN file must be readable by its \
         owner only: `chmod 600` it"
    )]
    FileExposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The PIN file is not text.
    #[error("keystore.pkcs11.pinFile: {path} is not UTF-8 text")]
    FileNotText {
        /// The file.
        path: PathBuf,
    },
    /// The PIN file holds no PIN.
    #[error("keystore.pkcs11.pinFile: {path} is empty: it must hold the token's user PIN")]
    FileEmpty {
        /// The file.
        path: PathBuf,
    },
}

/// Why the key pairs a kill left in the PKCS#11 token could not be settled.
#[derive(Debug, thiserror::Error)]
enum SettleError {
    /// The keystore's entries could not be listed or read.
    #[error(transparent)]
    Keystore(#[from] KeystoreError),
    /// An entry does not hold a `pkcs11:` URI.
    #[error("the keystore entry {name}")]
    Entry {
        /// The entry.
        name: String,
        #[source]
        source: UriError,
    },
    /// The token could not look for, finish or destroy the key pairs.
    #[error(transparent)]
    Token(#[from] HsmError),
}

/// The largest password file read.
const MAX_PASSWORD_FILE: u64 = 4096;

/// The keystore, and the revoked tokens when a database keeps them (else the data directory's
/// `revoked-tokens` file does).
#[derive(Debug, Clone)]
pub struct Store {
    /// Every CA key, the token signing key and generated state.
    pub keystore: Arc<dyn Keystore>,
    /// The database, with `keystore.type: postgres`.
    pub database: Option<Arc<Database>>,
    /// The proxies' identities in the database, with `keystore.type: postgres`.
    pub proxy_records: Option<ProxyRecords>,
    /// The revoked tokens in the database, with `keystore.type: postgres`.
    revocations: Option<TokenRevocations>,
    /// The PKCS#11 token CA keys are made in (`keystore.pkcs11`).
    pub token: Option<Pkcs11Token>,
}

impl Store {
    /// Opens the store the settings name. With `postgres`, connects, migrates the schema and checks
    /// the key-encryption key first: any problem stops here, naming the setting.
    pub(crate) fn open(
        settings: &Settings,
        data_dir: &DataDir,
        token: Token,
    ) -> Result<Store, StoreError> {
        let needed = match token {
            Token::Open => true,
            Token::OnlyForTheDatabase => settings
                .keystore
                .postgres
                .as_ref()
                .is_some_and(|p| p.key_encryption_key_file.is_none()),
        };
        let token = match needed {
            true => open_settings_token(settings)?,
            false => None,
        };
        let Some(postgres) = &settings.keystore.postgres else {
            let files = data_dir.keystore()?;
            let keystore = with_token(files, token.clone());
            settle_token_keys(&*keystore);
            return Ok(Store {
                keystore,
                token,
                database: None,
                proxy_records: None,
                revocations: None,
            });
        };
        let db = Arc::new(connect(postgres)?);
        let key = key_encryption_key(&db, postgres, token.as_ref())?;
        let keystore = PostgresKeystore::open(db.clone(), key).map_err(StoreError::Database)?;
        tracing::info!(url = %db.url(), replica = %settings.replica.name, "keystore in PostgreSQL");
        let proxy_records = Some(keystore.proxy_records());
        let revocations = Some(keystore.revocations());
        let keystore = with_token(keystore, token.clone());
        settle_token_keys(&*keystore);
        Ok(Store {
            proxy_records,
            revocations,
            keystore,
            token,
            database: Some(db),
        })
    }

    /// [`Store::open`] for the daemon: while the database does not answer, tries again with a growing
    /// pause (logged each time), so that a replica started before its database comes up when the
    /// database does. Anything else wrong stops the start at once.
    pub(crate) async fn open_waiting(
        settings: &Settings,
        data_dir: &DataDir,
    ) -> Result<Store, StoreError> {
        let mut pause = RETRY_FIRST;
        loop {
            let (settings, data_dir) = (settings.clone(), data_dir.clone());
            let opened =
                tokio::task::spawn_blocking(move || Store::open(&settings, &data_dir, Token::Open))
                    .await
                    .map_err(StoreError::OpenTask)?;
            match opened {
                Ok(store) => return Ok(store),
                Err(StoreError::Database(e)) if e.is_unavailable() => {
                    tracing::warn!(
                        retry_in_seconds = pause.as_secs(),
                        "not ready: the database does not answer, and this replica needs it to load its CAs: {e}"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(RETRY_MAX);
                }
                Err(other) => return Err(other),
            }
        }
    }

    /// The database's revoked tokens, with `keystore.type: postgres`.
    pub fn revocations(&self) -> Option<TokenRevocations> {
        self.revocations.clone()
    }

    /// The token signing key, created the first time. With files, the revocation list is created
    /// first, so that a data directory with a key always has one; a database always has its table.
    pub fn token_signing_key(&self, data_dir: &DataDir) -> crate::Result<SigningKey> {
        Ok(self.signing_key(data_dir)?)
    }

    /// [`Store::token_signing_key`], inside the library.
    pub(crate) fn signing_key(&self, data_dir: &DataDir) -> Result<SigningKey, StoreError> {
        if self.database.is_none() && !daemon_keys::holds_token_signing_key(&*self.keystore)? {
            revocations::create_if_missing(&data_dir.revocation_list())?;
        }
        Ok(daemon_keys::token_signing_key(&*self.keystore)?)
    }
}

/// Whether [`Store::open`] opens the PKCS#11 token of `keystore.pkcs11`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    /// Yes: CAs are loaded or made.
    Open,
    /// Only when the database's key-encryption key is in it: no CA key is used.
    OnlyForTheDatabase,
}

/// Opens the token of `keystore.pkcs11`, if set: loads the module, finds the token, logs in. Every
/// failure names the setting to fix; none shows the PIN.
pub fn open_token(settings: &Settings) -> crate::Result<Option<Pkcs11Token>> {
    Ok(open_settings_token(settings)?)
}

/// [`open_token`], inside the library.
pub(crate) fn open_settings_token(settings: &Settings) -> Result<Option<Pkcs11Token>, StoreError> {
    let Some(pkcs11) = &settings.keystore.pkcs11 else {
        return Ok(None);
    };
    let pin = pkcs11_pin(pkcs11, std::env::var_os(PKCS11_PIN_ENV))?;
    let token = Pkcs11Token::open(&pkcs11.module, &pkcs11.token, pin)?;
    tracing::info!(module = %pkcs11.module.display(), token = %pkcs11.token, "CA keys in the PKCS#11 token");
    Ok(Some(token))
}

/// Finishes or destroys the key pairs a kill left in the token between making them and recording them in
/// the keystore (see [`Pkcs11Token::settle_pending_keys`]): a pair a `*.pkcs11` entry names is labelled as
/// the entry says, one none names is destroyed once its maker is gone. A failure leaves them for the next
/// start (nothing uses an unrecorded key) and is logged.
fn settle_token_keys(keystore: &dyn Keystore) {
    let Some(token) = keystore.token() else {
        return;
    };
    let settled = recorded_token_keys(keystore)
        .and_then(|recorded| Ok(token.settle_pending_keys(&recorded)?));
    match settled {
        Ok(settled) if settled != meshca_hsm::Settled::default() => {
            tracing::info!(finished = settled.finished, destroyed = settled.destroyed,
                in_progress = settled.in_progress, token = %token.label(),
                "settled the key pairs in the PKCS#11 token that were made but not yet recorded");
        }
        Ok(_) => {}
        Err(error) => tracing::warn!(token = %token.label(),
            "could not look for key pairs a kill left unrecorded in the PKCS#11 token (they are never used; the next start looks again): {}",
            ErrorChain(&error)),
    }
}

/// The `CKA_ID` of every key the keystore records by a `pkcs11:` URI (its `*.pkcs11` entries), with the
/// label the URI names.
fn recorded_token_keys(keystore: &dyn Keystore) -> Result<HashMap<Vec<u8>, String>, SettleError> {
    let mut recorded = HashMap::new();
    for name in keystore.list("")? {
        if !name.ends_with(".pkcs11") {
            continue;
        }
        let Some(text) = keystore.get_public(&name)? else {
            continue;
        };
        let text = String::from_utf8_lossy(&text);
        let uri = match meshca_hsm::Pkcs11Uri::parse(text.trim()) {
            Ok(uri) => uri,
            Err(source) => return Err(SettleError::Entry { name, source }),
        };
        if let (Some(id), Some(label)) = (uri.id(), uri.object()) {
            recorded.insert(id.to_vec(), label.to_owned());
        }
    }
    Ok(recorded)
}

/// `keystore`, paired with the token when there is one.
fn with_token<K: Keystore + 'static>(keystore: K, token: Option<Pkcs11Token>) -> Arc<dyn Keystore> {
    match token {
        Some(token) => Arc::new(WithToken::new(keystore, token)),
        None => Arc::new(keystore),
    }
}

/// The key that seals the database's secrets: from `keyEncryptionKeyFile`, or kept sealed by the
/// token (with both set, the file's key is handed to the token once, to move the database to it).
fn key_encryption_key(
    db: &Database,
    postgres: &PostgresSettings,
    token: Option<&Pkcs11Token>,
) -> Result<KeyEncryptionKey, StoreError> {
    let file = postgres.key_encryption_key_file.as_deref();
    match (token, file) {
        (None, Some(file)) => {
            KeyEncryptionKey::read(file).map_err(StoreError::KeyEncryptionKeyFile)
        }
        (Some(token), file) => {
            let import = file
                .map(meshca_db::read_key_encryption_key_file)
                .transpose()
                .map_err(StoreError::KeyEncryptionKeyFile)?;
            KeyEncryptionKey::from_token(db, token, import).map_err(StoreError::Database)
        }
        // The settings refuse postgres with neither.
        (None, None) => Err(StoreError::NoKeyEncryptionKey),
    }
}

/// The first pause before connecting again to a database that did not answer at start.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest pause between two attempts.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Connects to the database of `keystore.postgres`.
fn connect(settings: &PostgresSettings) -> Result<Database, StoreError> {
    let password = match &settings.password_file {
        Some(file) => Some(read_password(file)?),
        None => std::env::var(POSTGRES_PASSWORD_ENV)
            .ok()
            .map(Zeroizing::new),
    };
    let options = DbOptions {
        url: settings.url.clone(),
        password,
        ca_file: settings.ca_file.clone(),
        timeout: settings.timeout.as_std(),
        max_connections: settings.max_connections,
    };
    Database::connect(&options).map_err(StoreError::Database)
}

/// The password in `file` (a trailing newline is not part of it); the file must be private.
fn read_password(file: &Path) -> Result<Zeroizing<String>, StoreError> {
    let unreadable = |source| StoreError::PasswordFile {
        path: file.to_owned(),
        source,
    };
    let opened = meshca_files::open(file).map_err(unreadable)?;
    let mode = opened.metadata().permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(StoreError::PasswordFileExposed {
            path: file.to_owned(),
            mode,
        });
    }
    let bytes = opened
        .read_secret(MAX_PASSWORD_FILE, "the largest password file")
        .map_err(unreadable)?;
    let text = std::str::from_utf8(&bytes).map_err(|_| StoreError::PasswordFileNotText {
        path: file.to_owned(),
    })?;
    let password = text.strip_suffix('\n').unwrap_or(text);
    let password = password.strip_suffix('\r').unwrap_or(password);
    Ok(Zeroizing::new(password.to_owned()))
}

/// The token's user PIN: the content of `keystore.pkcs11.pinFile` when set, else
/// `MESHCA_KEYSTORE_PKCS11_PIN` from this process's environment. Errors name the file or the
/// variable, never the PIN.
pub fn read_pkcs11_pin(settings: &Pkcs11Settings) -> crate::Result<Zeroizing<String>> {
    Ok(pkcs11_pin(settings, std::env::var_os(PKCS11_PIN_ENV))?)
}

/// [`read_pkcs11_pin`] with the variable's value given (`None`: unset).
fn pkcs11_pin(
    settings: &Pkcs11Settings,
    from_env: Option<OsString>,
) -> Result<Zeroizing<String>, PinError> {
    let Some(file) = &settings.pin_file else {
        let Some(value) = from_env else {
            return Err(PinError::NotGiven {
                token: settings.token.clone(),
            });
        };
        let pin = Zeroizing::new(value.into_string().map_err(|_| PinError::VariableNotText)?);
        if pin.is_empty() {
            return Err(PinError::VariableEmpty);
        }
        return Ok(pin);
    };
    let unreadable = |source| PinError::File {
        path: file.clone(),
        source,
    };
    let opened = meshca_files::open(file).map_err(unreadable)?;
    let mode = opened.metadata().permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(PinError::FileExposed {
            path: file.clone(),
            mode,
        });
    }
    let bytes = opened
        .read_secret(MAX_PKCS11_PIN_FILE, "the largest PIN file")
        .map_err(unreadable)?;
    let text =
        std::str::from_utf8(&bytes).map_err(|_| PinError::FileNotText { path: file.clone() })?;
    let pin = text.strip_suffix('\n').unwrap_or(text);
    let pin = pin.strip_suffix('\r').unwrap_or(pin);
    if pin.is_empty() {
        return Err(PinError::FileEmpty { path: file.clone() });
    }
    Ok(Zeroizing::new(pin.to_owned()))
}

impl From<StoreError> for crate::Error {
    fn from(error: StoreError) -> crate::Error {
        crate::Error::failed(error)
    }
}
impl From<PinError> for crate::Error {
    fn from(error: PinError) -> crate::Error {
        crate::Error::failed(error)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    use super::*;

    fn token(pin_file: Option<PathBuf>) -> Pkcs11Settings {
        Pkcs11Settings {
            module: PathBuf::from("/usr/lib/softhsm/libsofthsm2.so"),
            token: "meshca".to_owned(),
            pin_file,
        }
    }

    fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        path
    }

    fn error(settings: &Pkcs11Settings, env: Option<&str>) -> String {
        match pkcs11_pin(settings, env.map(OsString::from)) {
            Ok(_) => panic!("expected an error for {settings:?}"),
            Err(e) => ErrorChain(&e).to_string(),
        }
    }

    #[test]
    fn the_pin_comes_from_a_private_file_before_the_environment() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = write(dir.path(), "pin", b"1234\n", 0o600);
        let pin = pkcs11_pin(&token(Some(file.clone())), Some("from-env".into())).expect("read");
        assert_eq!(pin.as_str(), "1234");
        let crlf = write(dir.path(), "crlf", b"12 34\r\n", 0o400);
        assert_eq!(
            pkcs11_pin(&token(Some(crlf)), None).expect("read").as_str(),
            "12 34"
        );
        let two = write(dir.path(), "two", b"1234\n\n", 0o600);
        assert_eq!(
            pkcs11_pin(&token(Some(two)), None).expect("read").as_str(),
            "1234\n",
            "only one trailing newline is not part of the PIN"
        );
        let longest = write(dir.path(), "longest", &[b'7'; 256], 0o600);
        assert_eq!(
            pkcs11_pin(&token(Some(longest)), None).expect("read").len(),
            256
        );
        let from_env = pkcs11_pin(&token(None), Some("5678".into())).expect("from the variable");
        assert_eq!(from_env.as_str(), "5678");
    }

    #[test]
    fn a_pin_that_cannot_be_used_is_refused_naming_the_file_or_variable_never_the_pin() {
        let dir = tempfile::tempdir().expect("temp dir");
        let exposed = write(dir.path(), "exposed", b"secret-pin-1\n", 0o640);
        let e = error(&token(Some(exposed.clone())), None);
        assert!(
            e.contains("keystore.pkcs11.pinFile")
                && e.contains(&exposed.display().to_string())
                && e.contains("0640")
                && e.contains("chmod 600"),
            "{e}"
        );
        let large = write(dir.path(), "large", &[b'7'; 257], 0o600);
        let e = error(&token(Some(large.clone())), None);
        assert!(
            e.contains(&large.display().to_string()) && e.contains("larger than 256 bytes"),
            "{e}"
        );
        let empty = write(dir.path(), "empty", b"\n", 0o600);
        let e = error(&token(Some(empty.clone())), Some("unused"));
        assert!(
            e.contains(&empty.display().to_string()) && e.contains("is empty"),
            "{e}"
        );
        let e = error(&token(Some(dir.path().to_owned())), None);
        assert!(
            e.contains("keystore.pkcs11.pinFile") && e.contains("not a regular file"),
            "{e}"
        );
        let missing = dir.path().join("missing");
        let e = error(&token(Some(missing.clone())), Some("secret-pin-2"));
        assert!(e.contains(&missing.display().to_string()), "{e}");

        let e = error(&token(None), None);
        assert!(
            e.contains("keystore.pkcs11.pinFile") && e.contains(PKCS11_PIN_ENV),
            "names both: {e}"
        );
        let e = error(&token(None), Some(""));
        assert!(e.contains(PKCS11_PIN_ENV) && e.contains("is empty"), "{e}");
        for e in [e, error(&token(Some(exposed)), Some("secret-pin-3"))] {
            assert!(!e.contains("secret-pin"), "{e}");
        }
    }
}
