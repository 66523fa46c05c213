//! The daemon's files: the keystore in the data directory, the token signing key with its revocation
//! list, and the resources directory (seeded with defaults when empty).

use std::path::Path;

use anyhow::Context;
use meshca_auth::SigningKey;
use meshca_config::Settings;
use meshca_keystore::{FileKeystore, Keystore};

use super::data_dir::DataDir;
use super::{daemon_keys, revocations};

/// The keystore of the data directory (created private, or checked: see [`DataDir::open`]).
pub fn open_keystore(settings: &Settings) -> anyhow::Result<FileKeystore> {
    DataDir::open(&settings.data_dir)?.keystore()
}

/// The token signing key, created on first use together with the revocation list (the list first: a data
/// directory with a key always has a list, so a missing list is a loss to report, never a fresh start).
pub fn token_signing_key(
    data_dir: &DataDir,
    keystore: &dyn Keystore,
) -> anyhow::Result<SigningKey> {
    if !daemon_keys::has_token_signing_key(keystore)? {
        revocations::create_if_missing(&data_dir.revocation_list())?;
    }
    daemon_keys::token_signing_key(keystore)
}

/// Creates the resources directory with the default Mesh and MeshIdentity when it holds no resource
/// file.
pub fn ensure_resources(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("resources: cannot create {}", dir.display()))?;
    let has_yaml = std::fs::read_dir(dir)
        .with_context(|| format!("resources: cannot read {}", dir.display()))?
        .filter_map(Result::ok)
        .any(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x == "yaml" || x == "yml")
        });
    if !has_yaml {
        let path = dir.join("default.yaml");
        std::fs::write(&path, meshca_config::default_resources_yaml())
            .with_context(|| format!("cannot write {}", path.display()))?;
        tracing::info!(file = %path.display(), "resources directory was empty: wrote the default Mesh and MeshIdentity");
    }
    Ok(())
}
