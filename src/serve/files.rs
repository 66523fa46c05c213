//! The daemon's files: the keystore in the data directory, the token revocation list, and the
//! resources directory (seeded with defaults when empty).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use meshca_auth::RevocationList;
use meshca_config::Settings;
use meshca_keystore::FileKeystore;

use super::data_dir::DataDir;

/// The keystore of the data directory (created private, or checked: see [`DataDir::open`]).
pub fn open_keystore(settings: &Settings) -> anyhow::Result<FileKeystore> {
    DataDir::open(&settings.data_dir)?.keystore()
}

/// The revocation list file: one revoked token id per line.
pub fn revocations_file(settings: &Settings) -> PathBuf {
    settings.data_dir.join("revoked-tokens")
}

/// Reads the revocation list; a missing file is an empty list.
pub fn read_revocations(path: &Path) -> anyhow::Result<RevocationList> {
    match std::fs::read_to_string(path) {
        Ok(text) => RevocationList::parse(&text).map_err(|e| {
            anyhow!(
                "the token revocation list {} is invalid: {e}",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RevocationList::default()),
        Err(e) => Err(anyhow!(
            "cannot read the token revocation list {}: {e}",
            path.display()
        )),
    }
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
