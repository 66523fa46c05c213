//! The owner's agenda: what the next reconcile must look at, and when it is due.

use std::collections::BTreeSet;
use std::time::SystemTime;

use super::incremental::Renewals;
use crate::snapshot::ProxyKey;

/// What the next reconcile looks at: every proxy, or those an event touched and those due for
/// renewal; the quiet proxies a full reconcile left for later turns; and whether ACKs wake it.
#[derive(Debug)]
pub(super) struct Agenda {
    /// The next reconcile must look at every proxy (the configuration changed, or nothing was
    /// reconciled yet).
    pub full: bool,
    /// The federated bundles changed: the trust the bundles carry must be planned again (no proxy's
    /// certificate depends on it).
    pub trust: bool,
    /// Proxies that connected or left since the last reconcile.
    pub touched: BTreeSet<ProxyKey>,
    /// Quiet proxies the last full reconcile left for later turns, served a chunk at a time by
    /// [`super::Owner::serve_deferred`]; each keeps its published certificate meanwhile.
    pub deferred: Vec<ProxyKey>,
    /// When each served proxy's certificate is renewed.
    pub renewals: Renewals,
    /// The earliest rollout timeout or CA rotation step, as of the last full reconcile.
    pub next_global: Option<SystemTime>,
    /// Something waits on ACKs: ACK events trigger a reconcile.
    pub waiting_on_acks: bool,
    /// A rollout is under way (a wait may hold certificates back, or a replaced certificate awaits
    /// its ACK): every event reconciles the fleet.
    pub rollout: bool,
}

impl Default for Agenda {
    /// Nothing reconciled yet: the first reconcile looks at every proxy.
    fn default() -> Agenda {
        Agenda {
            full: true,
            trust: false,
            touched: BTreeSet::new(),
            deferred: Vec::new(),
            renewals: Renewals::default(),
            next_global: None,
            waiting_on_acks: false,
            rollout: false,
        }
    }
}

impl Agenda {
    /// Whether a global event (a rollout timeout, a CA rotation step) is due at `now`.
    pub fn global_due(&self, now: SystemTime) -> bool {
        self.next_global.is_some_and(|t| now >= t)
    }

    /// The proxies the next reconcile looks at if it need not look at every one: those touched since
    /// the last one, and those due for renewal at `now`. Forgets the touched ones.
    pub fn take_keys(&mut self, now: SystemTime) -> BTreeSet<ProxyKey> {
        let mut keys = std::mem::take(&mut self.touched);
        keys.extend(self.renewals.due(now));
        keys
    }

    /// When the next reconcile is due: the next renewal or the next global event.
    pub fn next_due(&self) -> Option<SystemTime> {
        [self.renewals.next(), self.next_global]
            .into_iter()
            .flatten()
            .min()
    }
}
