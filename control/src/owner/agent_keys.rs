//! Keys that `meshca agent`s hold: which proxies an agent serves (their WorkloadRegistrations name
//! it), and the newest key each agent offered for its proxy's next certificate. The owner certifies
//! these keys and never makes one of its own for such a proxy.

use std::sync::Arc;

use meshca_ca::PublicKey;
use meshca_identity::KeyAlgorithm;

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
    /// the key of the certificate it holds (`current`) when an agent holds that one and it is of the
    /// `algorithm` leaves are issued for; `None` when there is neither.
    pub fn next_key(
        &self,
        proxy: &ProxyKey,
        current: Option<&LeafKey>,
        algorithm: KeyAlgorithm,
    ) -> Option<Arc<PublicKey>> {
        if let Some(offered) = self.offered.get(proxy) {
            return Some(offered.key.clone());
        }
        match current {
            Some(LeafKey::Agent(key)) if key.algorithm() == algorithm => Some(key.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(algorithm: KeyAlgorithm) -> Arc<PublicKey> {
        Arc::new(meshca_ca::PrivateKey::generate(algorithm).expect("a key").1)
    }

    #[test]
    fn the_newest_offer_goes_first_then_the_current_key_of_the_leaf_algorithm() {
        let mut keys = AgentKeys::default();
        let proxy = ProxyKey::new("default", "web-1");
        let p256 = KeyAlgorithm::EcdsaP256;
        let (current, older, newer) = (key(p256), key(p256), key(p256));
        let held = LeafKey::Agent(current.clone());
        assert_eq!(keys.next_key(&proxy, None, p256), None);
        assert_eq!(
            keys.next_key(&proxy, Some(&held), p256),
            Some(current.clone())
        );
        // The current key is not reused for leaves of another algorithm: a new key is needed.
        assert_eq!(
            keys.next_key(&proxy, Some(&held), KeyAlgorithm::EcdsaP384),
            None
        );
        let made_here = LeafKey::Held(crate::SecretPem::new("KEY".into()));
        assert_eq!(keys.next_key(&proxy, Some(&made_here), p256), None);

        keys.offer(proxy.clone(), older.clone(), true);
        keys.offer(proxy.clone(), newer.clone(), false);
        assert_eq!(
            keys.next_key(&proxy, Some(&held), p256),
            Some(newer.clone())
        );
        assert!(
            !keys.replace_now(&proxy, &current),
            "the newest offer's flag counts"
        );
        keys.offer(proxy.clone(), newer.clone(), true);
        assert!(keys.replace_now(&proxy, &current));
        assert!(
            !keys.replace_now(&proxy, &newer),
            "the key it holds needs no replacing"
        );

        // Dropping or certifying an older key leaves a newer offer.
        keys.drop_offer(&proxy, &older);
        keys.certified(&proxy, &older);
        assert_eq!(keys.offers(), 1);
        keys.certified(&proxy, &newer);
        assert_eq!(keys.offers(), 0);
        keys.offer(proxy.clone(), older, false);
        keys.forget(&proxy);
        assert_eq!(keys.offers(), 0);
    }
}
