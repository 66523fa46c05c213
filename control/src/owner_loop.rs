//! The owner's task: stream events, resource reloads, renewals and CA rotation steps, each followed by
//! one reconcile.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_config::Settings;
use meshca_keystore::Keystore;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::UpdateError;
use crate::events::StreamEvent;
use crate::owner::Owner;
use crate::world::{load_world, CaSource, World};

/// How long the loop sleeps when nothing is due (it wakes earlier for any event).
const IDLE_WAKE: Duration = Duration::from_secs(3600);

/// The outcome of a reload: accepted, or every error that rejected it.
pub type ReloadOutcome = Result<(), Vec<UpdateError>>;

/// A request to reload the resources directory; `done` hears the outcome once the update is served
/// (or rejected).
#[derive(Debug, Default)]
pub struct Reload {
    /// Told the outcome, if someone waits.
    pub done: Option<oneshot::Sender<ReloadOutcome>>,
}

/// The owner and everything it listens to. [`OwnerLoop::run`] is the daemon's reconciler task.
#[derive(Debug)]
pub struct OwnerLoop {
    owner: Owner,
    settings: Settings,
    keystore: Arc<dyn Keystore>,
    events: mpsc::Receiver<StreamEvent>,
    reloads: mpsc::Receiver<Reload>,
    shutdown: CancellationToken,
}

impl OwnerLoop {
    /// A loop for `owner`, reloading the resources of `settings` with CAs from `keystore`.
    pub fn new(
        owner: Owner,
        settings: Settings,
        keystore: Arc<dyn Keystore>,
        events: mpsc::Receiver<StreamEvent>,
        reloads: mpsc::Receiver<Reload>,
        shutdown: CancellationToken,
    ) -> OwnerLoop {
        OwnerLoop {
            owner,
            settings,
            keystore,
            events,
            reloads,
            shutdown,
        }
    }

    /// Runs until `shutdown` fires or the event or reload channel closes.
    pub async fn run(mut self) {
        let mut next_due = self.reconcile();
        loop {
            let wait = next_due
                .map(|t| t.duration_since(SystemTime::now()).unwrap_or_default())
                .unwrap_or(IDLE_WAKE);
            let dirty = tokio::select! {
                () = self.shutdown.cancelled() => return,
                event = self.events.recv() => {
                    let Some(event) = event else { return };
                    self.on_events(event)
                }
                request = self.reloads.recv() => {
                    let Some(first) = request else { return };
                    next_due = self.on_reloads(first);
                    false
                }
                () = tokio::time::sleep(wait) => {
                    self.rotate_if_due();
                    true
                }
            };
            if dirty {
                next_due = self.reconcile();
            }
        }
    }

    /// Applies `first` and every event already queued behind it; whether a reconcile is needed.
    fn on_events(&mut self, first: StreamEvent) -> bool {
        let mut dirty = self.owner.on_event(first);
        while let Ok(event) = self.events.try_recv() {
            dirty |= self.owner.on_event(event);
        }
        dirty
    }

    /// Reloads the resources once for `first` and every request queued behind it, reconciles, then
    /// tells each requester the outcome (so a caller that waited sees the update served). Returns when
    /// something is next due.
    fn on_reloads(&mut self, first: Reload) -> Option<SystemTime> {
        let mut waiting: Vec<_> = first.done.into_iter().collect();
        while let Ok(more) = self.reloads.try_recv() {
            waiting.extend(more.done);
        }
        let now = SystemTime::now();
        let loaded = tokio::task::block_in_place(|| {
            load_world(
                &self.settings,
                self.keystore.as_ref(),
                Some(self.owner.world()),
                now,
            )
        });
        let outcome = match loaded {
            Ok(world) => {
                tracing::info!("resource update applied");
                self.owner.accept(world);
                Ok(())
            }
            Err(errors) => {
                self.owner.reject(errors.clone(), now);
                Err(errors)
            }
        };
        let next_due = self.reconcile();
        for done in waiting {
            // The requester may have stopped waiting.
            let _ = done.send(outcome.clone());
        }
        next_due
    }

    /// Re-evaluates the serving resources when an automatic CA rotation step is due.
    fn rotate_if_due(&mut self) {
        let now = SystemTime::now();
        if self
            .owner
            .world()
            .next_rotation_event()
            .is_some_and(|t| t <= now)
        {
            tokio::task::block_in_place(|| {
                rotate_cas(&mut self.owner, &self.settings, self.keystore.as_ref(), now)
            });
        }
    }

    fn reconcile(&mut self) -> Option<SystemTime> {
        tokio::task::block_in_place(|| self.owner.reconcile(SystemTime::now()))
    }
}

/// Re-evaluates the serving resources at `now`: builtin CAs whose successor is due get it (the gate
/// orders its rollout like any new CA). On failure the current CAs keep serving.
pub fn rotate_cas(
    owner: &mut Owner,
    settings: &Settings,
    keystore: &dyn Keystore,
    now: SystemTime,
) {
    let resources = (*owner.world().resources).clone();
    let src = CaSource {
        keystore,
        settings,
        previous: Some(owner.world()),
        now,
    };
    match World::load(resources, &src) {
        Ok(world) => owner.replace_world(world),
        Err(errors) => {
            for e in errors {
                tracing::error!("automatic CA rotation failed; the current CAs keep serving: {e}");
            }
        }
    }
}
