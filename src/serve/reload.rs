//! What a file change or SIGHUP reloads: the resources go to the owner loop, the token revocation list
//! is re-read here and published to every SDS stream.

use std::path::PathBuf;
use std::sync::Arc;

use meshca_auth::RevocationList;
use meshca_control::{Reload, ReloadOutcome};
use tokio::sync::{mpsc, oneshot, watch};

use super::metrics::Metrics;
use super::revocations;

/// What changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A file in the resources directory.
    Resources,
    /// The token revocation list.
    Revocations,
    /// Both (SIGHUP, or a burst touching both).
    All,
}

impl Change {
    /// The change covering both.
    pub fn merge(self, other: Change) -> Change {
        if self == other {
            self
        } else {
            Change::All
        }
    }

    fn resources(self) -> bool {
        matches!(self, Change::Resources | Change::All)
    }

    fn revocations(self) -> bool {
        matches!(self, Change::Revocations | Change::All)
    }
}

/// Applies changes: cheap to clone, shared by the file watcher, SIGHUP and [`super::Daemon`].
#[derive(Clone, Debug)]
pub struct Reloader {
    resources: mpsc::Sender<Reload>,
    revocations_path: PathBuf,
    revocations: Arc<watch::Sender<Arc<RevocationList>>>,
    metrics: Arc<Metrics>,
}

impl Reloader {
    pub(super) fn new(
        resources: mpsc::Sender<Reload>,
        revocations_path: PathBuf,
        revocations: watch::Sender<Arc<RevocationList>>,
        metrics: Arc<Metrics>,
    ) -> Reloader {
        Reloader {
            resources,
            revocations_path,
            revocations: Arc::new(revocations),
            metrics,
        }
    }

    /// Reloads what `change` names without waiting for the outcome; false once the daemon stopped.
    pub async fn apply(&self, change: Change) -> bool {
        if change.revocations() {
            self.reload_revocations();
        }
        !change.resources() || self.resources.send(Reload::default()).await.is_ok()
    }

    /// [`Self::apply`] from a context that cannot wait (a signal handler's loop must not block): a
    /// resources reload already queued covers this one. With `default_mesh`, serves it as
    /// `defaults.mesh` from this reload on (that request is queued even when the queue is full, so it is
    /// never lost).
    pub fn try_apply_with(&self, change: Change, default_mesh: Option<Option<String>>) {
        if change.revocations() {
            self.reload_revocations();
        }
        if default_mesh.is_some() {
            let resources = self.resources.clone();
            tokio::spawn(async move {
                let request = Reload {
                    done: None,
                    default_mesh,
                };
                let _ = resources.send(request).await;
            });
        } else if change.resources() {
            let _ = self.resources.try_send(Reload::default());
        }
    }

    /// Reloads the resources and waits until the update is served or rejected; `None` when the daemon
    /// stopped first.
    pub async fn resources(&self) -> Option<ReloadOutcome> {
        let (tx, rx) = oneshot::channel();
        let request = Reload {
            done: Some(tx),
            default_mesh: None,
        };
        self.resources.send(request).await.ok()?;
        rx.await.ok()
    }

    /// Serves `mesh` as `defaults.mesh` from now on and waits until the reload it comes with is served
    /// or rejected; `None` when the daemon stopped first.
    pub async fn default_mesh(&self, mesh: Option<String>) -> Option<ReloadOutcome> {
        let (tx, rx) = oneshot::channel();
        let request = Reload {
            done: Some(tx),
            default_mesh: Some(mesh),
        };
        self.resources.send(request).await.ok()?;
        rx.await.ok()
    }

    /// Re-reads the revocation list. A missing, unreadable or invalid one leaves the previous list in
    /// force (fail closed: deleting the file must not un-revoke anything), logged and counted.
    fn reload_revocations(&self) {
        match revocations::read(&self.revocations_path) {
            Ok(list) => {
                self.revocations.send_replace(Arc::new(list));
            }
            Err(e) => {
                self.metrics.revocation_reload_failed();
                tracing::error!(
                    "revocation list not reloaded, the previous one stays in force: {e:#}"
                );
            }
        }
    }
}
