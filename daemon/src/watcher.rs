//! Watches the resources directory and the token revocation list, and reloads what changed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::reload::{Change, Reloader};

/// Why the resources directory or the token revocation list cannot be watched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    /// The watcher could not be made.
    #[error("cannot start watching files")]
    Start(#[source] notify::Error),
    /// The resources directory cannot be watched.
    #[error("resources: cannot watch {path}")]
    Resources {
        /// The directory.
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
    /// The directory of the token revocation list cannot be watched.
    #[error("cannot watch {path}")]
    Revocations {
        /// The directory.
        path: PathBuf,
        #[source]
        source: notify::Error,
    },
}

/// Editors write a file in several steps; changes closer together than this are applied as one.
const SETTLE: Duration = Duration::from_millis(150);

/// Starts watching; the returned watcher must be kept alive.
pub(crate) fn watch(
    resources: &Path,
    revocations: Option<&Path>,
    reloader: Reloader,
) -> Result<notify::RecommendedWatcher, WatchError> {
    let (raw_tx, mut raw_rx) = mpsc::unbounded_channel::<Change>();
    let resources_dir: PathBuf = resources.to_path_buf();
    let revocations_file: Option<PathBuf> = revocations.map(Path::to_path_buf);
    let (res_dir, rev_file) = (resources_dir.clone(), revocations_file.clone());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else { return };
        if matches!(event.kind, notify::EventKind::Access(_)) {
            return;
        }
        for path in &event.paths {
            let change = if rev_file.as_ref() == Some(path) {
                Change::Revocations
            } else if path.parent() == Some(res_dir.as_path()) || path == &res_dir {
                Change::Resources
            } else {
                continue;
            };
            let _ = raw_tx.send(change);
        }
    })
    .map_err(WatchError::Start)?;
    watcher
        .watch(&resources_dir, RecursiveMode::NonRecursive)
        .map_err(|source| WatchError::Resources {
            path: resources_dir.clone(),
            source,
        })?;
    if let Some(dir) = revocations_file.as_deref().and_then(Path::parent) {
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError::Revocations {
                path: dir.to_owned(),
                source,
            })?;
    }
    tokio::spawn(async move {
        while let Some(mut change) = raw_rx.recv().await {
            // Let a burst of writes settle, then report it once.
            let deadline = tokio::time::Instant::now() + SETTLE;
            while let Ok(Some(more)) = tokio::time::timeout_at(deadline, raw_rx.recv()).await {
                change = change.merge(more);
            }
            if !reloader.apply(change).await {
                return;
            }
        }
    });
    Ok(watcher)
}
