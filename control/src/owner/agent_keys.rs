//! Keys that `meshca agent`s hold: which proxies an agent serves (their WorkloadRegistrations name
//! it), and the newest key each agent offered for its proxy's next certificate. The owner certifies
//! these keys and never makes one of its own for such a proxy.

use std::sync::Arc;

use meshca_ca::PublicKey;

use crate::snapshot::{LeafKey, ProxyHashMap, ProxyKey};
use crate::workloads::Registrations;
use crate::world::World;

/// A key an agent offered for a proxy's next certificate.
#[derive(Debug, Clone)]
pub(super) struct Offered {
    /// The public key to certify.
    pub key: Arc<PublicKey>,
    /// The agent holds no key for the proxy's current certificate: certify this one at once.
    pub replace_now: bool,
}

/// Who serves which proxy, and the keys offered and not certified yet: at most one per agent-served
/// proxy.
#[derive(Debug, Default)]
pub(super) struct AgentKeys {
    /// The registrations of the serving configuration.
    registrations: Registrations,
    /// The newest key offered for each agent-served proxy, until a certificate certifies it.
    offered: ProxyHashMap<Offered>,
}

impl AgentKeys {
    /// Who serves what in `world` from now on; offers for proxies no agent serves any longer are
    /// dropped.
    pub fn set_world(&mut self, world: &World) {
        self.registrations = Registrations::from_resources(&world.resources);
        let registrations = &self.registrations;
        self.offered
            .retain(|proxy, _| registrations.agent_of(proxy).is_some());
    }

    /// The agent that serves `proxy`, if one does.
    pub fn agent_of(&self, proxy: &ProxyKey) -> Option<&str> {
        self.registrations.agent_of(proxy)
    }

    /// Keeps `key` as `proxy`'s newest offered key (it replaces any older offer); `proxy` is
    /// agent-served.
    pub fn offer(&mut self, proxy: ProxyKey, key: Arc<PublicKey>, replace_now: bool) {
        self.offered.insert(proxy, Offered { key, replace_now });
    }

    /// The key `proxy`'s next certificate certifies: the newest offered one not certified yet, else
    /// the key of the certificate it holds (`current`) when an agent holds that one; `None` when
    /// there is neither.
    pub fn next_key(&self, proxy: &ProxyKey, current: Option<&LeafKey>) -> Option<Arc<PublicKey>> {
        if let Some(offered) = self.offered.get(proxy) {
            return Some(offered.key.clone());
        }
        match current {
            Some(LeafKey::Agent(key)) => Some(key.clone()),
            _ => None,
        }
    }

    /// Whether `proxy`'s certificate over `current` must be replaced at once: its agent offered
    /// another key saying that it holds no key for the current certificate.
    pub fn replace_now(&self, proxy: &ProxyKey, current: &PublicKey) -> bool {
        self.offered
            .get(proxy)
            .is_some_and(|o| o.replace_now && *o.key != *current)
    }

    /// Notes that a certificate over `key` was taken for `proxy`: that offer is used.
    pub fn certified(&mut self, proxy: &ProxyKey, key: &PublicKey) {
        self.drop_offer(proxy, key);
    }

    /// Drops `proxy`'s offer of `key` (a key no certificate can be issued over), so that the agent's
    /// next offer is used; a newer offer stays.
    pub fn drop_offer(&mut self, proxy: &ProxyKey, key: &PublicKey) {
        if self.offered.get(proxy).is_some_and(|o| *o.key == *key) {
            self.offered.remove(proxy);
        }
    }

    /// Forgets what was offered for `proxy` (it is forgotten).
    pub fn forget(&mut self, proxy: &ProxyKey) {
        self.offered.remove(proxy);
    }

    /// Forgets the offers of every proxy `keep` says no to.
    pub fn retain(&mut self, keep: impl Fn(&ProxyKey) -> bool) {
        self.offered.retain(|proxy, _| keep(proxy));
    }

    /// How many offers are kept.
    #[cfg(test)]
    pub fn offers(&self) -> usize {
        self.offered.len()
    }
}
