//! The daemon's files: the store (the data directory's keystore, or the database), and the resources
//! directory (seeded with defaults when empty).

use std::path::{Path, PathBuf};

use meshca_config::Settings;

use super::atomic_file::{replace_path, AtomicFileError};
use super::data_dir::DataDir;
use super::store::{Store, StoreError, Token};

/// Why the resources directory could not be made ready.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResourcesError {
    /// The directory could not be created.
    #[error("resources: cannot create {path}")]
    Create {
        /// The directory.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The directory could not be listed.
    #[error("resources: cannot read {path}")]
    Read {
        /// The directory.
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The default resources could not be written into it.
    #[error(transparent)]
    WriteDefaults(#[from] AtomicFileError),
}

/// The store the settings name (see [`Store::open`]), for commands that run beside the daemon and load
/// CAs (`meshca issue --mesh`): with `keystore.pkcs11`, the token is opened.
pub fn open_store(settings: &Settings) -> crate::Result<(DataDir, Store)> {
    open_store_with(settings, Token::Open)
}

/// The store, for commands that use no CA key (`meshca token`): the token is opened only when the
/// database's key-encryption key is in it, so that tokens can be minted while the HSM is away.
pub fn open_store_without_ca_keys(settings: &Settings) -> crate::Result<(DataDir, Store)> {
    open_store_with(settings, Token::OnlyForTheDatabase)
}

/// The store, for minting tokens (`meshca token`): with `keystore.pkcs11`, the token signing key is in
/// the token (made there the first time), so the token is opened, unless the keystore holds a signing
/// key persisted before the token was configured; then tokens can be minted while the HSM is away.
pub fn open_store_to_mint(settings: &Settings) -> crate::Result<(DataDir, Store)> {
    let (data_dir, store) = open_store_without_ca_keys(settings)?;
    if settings.keystore.pkcs11.is_none()
        || store.keystore.token().is_some()
        || super::daemon_keys::has_software_token_signing_key(&*store.keystore)?
    {
        return Ok((data_dir, store));
    }
    drop(store);
    open_store(settings)
}

fn open_store_with(settings: &Settings, token: Token) -> crate::Result<(DataDir, Store)> {
    let data_dir = DataDir::open(&settings.data_dir).map_err(StoreError::from)?;
    let store = Store::open(settings, &data_dir, token)?;
    Ok((data_dir, store))
}

/// Creates the resources directory with the default Mesh and MeshIdentity when it holds no resource
/// file.
pub(crate) fn ensure_resources(dir: &Path) -> Result<(), ResourcesError> {
    std::fs::create_dir_all(dir).map_err(|source| ResourcesError::Create {
        path: dir.to_owned(),
        source,
    })?;
    let has_yaml = std::fs::read_dir(dir)
        .map_err(|source| ResourcesError::Read {
            path: dir.to_owned(),
            source,
        })?
        .filter_map(Result::ok)
        .any(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml")
        });
    if !has_yaml {
        let path = dir.join("default.yaml");
        // Atomically: a kill mid-write must not leave a cut file, which the next start would take as
        // the operator's resources.
        replace_path(
            &path,
            meshca_config::default_resources_yaml().as_bytes(),
            0o644,
        )?;
        tracing::info!(file = %path.display(), "resources directory was empty: wrote the default Mesh and MeshIdentity");
    }
    Ok(())
}
