//! What a file change or SIGHUP reloads: the resources go to the owner loop, the token revocation list
//! is re-read here and published to every SDS stream.

use std::sync::Arc;

use meshca_auth::RevocationList;
use meshca_control::{Reload, ReloadOutcome};
use meshca_serve::ErrorChain;
use tokio::sync::{mpsc, oneshot, watch};

use super::metrics::Metrics;
use super::revocations::{self, RevocationsError};

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
    revocations_source: revocations::Source,
    revocations: Arc<watch::Sender<Arc<RevocationList>>>,
    metrics: Arc<Metrics>,
}

impl Reloader {
    pub(super) fn new(
        resources: mpsc::Sender<Reload>,
        revocations_source: revocations::Source,
        revocations: watch::Sender<Arc<RevocationList>>,
        metrics: Arc<Metrics>,
    ) -> Reloader {
        Reloader {
            resources,
            revocations_source,
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

    /// Re-reads the revocation list in a task of its own. A missing, unreadable or invalid one leaves
    /// the previous list in force (fail closed: deleting the file must not un-revoke anything), logged
    /// and counted.
    fn reload_revocations(&self) {
        let reloader = self.clone();
        tokio::spawn(async move {
            if let Err(e) = reloader.revocations_now().await {
                tracing::error!(
                    "revocation list not reloaded, the previous one stays in force: {}",
                    ErrorChain(&e)
                );
            }
        });
    }

    /// Re-reads the revocation list and publishes it when it changed. On failure the previous list
    /// stays in force and the failure is counted; the caller logs it.
    pub(crate) async fn revocations_now(&self) -> Result<(), RevocationsError> {
        let list = self.revocations_source.read().await.inspect_err(|_| {
            self.metrics.revocation_reload_failed();
        })?;
        self.revocations.send_if_modified(|current| {
            let changed = **current != list;
            if changed {
                *current = Arc::new(list);
            }
            changed
        });
        Ok(())
    }

    /// Reads the database's revoked tokens every [`revocations::DATABASE_POLL`] until `shutdown`. A
    /// failure is logged when it starts and when it ends, not once per read.
    pub(crate) async fn poll_revocations(self, shutdown: tokio_util::sync::CancellationToken) {
        let mut failing = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(revocations::DATABASE_POLL) => {}
            }
            match self.revocations_now().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("the revoked tokens are read from the database again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::error!(
                        "cannot read the revoked tokens; the list read last stays in force until the database answers: {}",
                        ErrorChain(&e)
                    );
                }
                Err(_) => {}
            }
        }
    }
}
