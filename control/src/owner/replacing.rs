//! Break last, per proxy: which proxies hold a certificate that replaced others their peers may still
//! see, until they ACK it. Kept beside the issued certificates so that a batch of ACKs looks only at
//! the proxies it is about, never at every certificate of the fleet.

use std::collections::HashMap;

use super::Previous;
use crate::snapshot::{KeyHasher, ProxyHashSet, ProxyKey};
use crate::trust::MeshName;

/// The proxies whose `Issued::previous` is not empty, and what a batch of stream events may settle.
#[derive(Debug, Default)]
pub(super) struct Replacing {
    /// Every proxy that keeps replaced certificates.
    proxies: ProxyHashSet,
    /// Of those, the ones with a stream event (an ACK, a new subscription, a stream gone) since they
    /// were last looked at.
    stirred: ProxyHashSet,
    /// How many replaced certificates are kept, per mesh and replaced CA subject: the groups the
    /// status shows as identity-ACK waits. (Nested, so that a lookup allocates nothing.)
    groups: HashMap<MeshName, HashMap<String, usize, KeyHasher>, KeyHasher>,
    /// Meshes where a group was entered while empty (a wait started), since last taken.
    started: Vec<MeshName>,
}

impl Replacing {
    /// Records that the replaced certificates `key` keeps changed from `old` to `new`.
    pub fn update(&mut self, key: &ProxyKey, old: &[Previous], new: &[Previous]) {
        // New ones first: a group the proxy stays in never passes through empty.
        for previous in new {
            let subject = &previous.ca_trust.subject;
            if !self.groups.contains_key(&*key.mesh) {
                self.groups
                    .insert(MeshName::new(key.mesh.clone()), HashMap::default());
            }
            let Some(mesh) = self.groups.get_mut(&*key.mesh) else {
                continue;
            };
            match mesh.get_mut(subject) {
                Some(count) => *count += 1,
                None => {
                    mesh.insert(subject.clone(), 1);
                    self.started.push(MeshName::new(key.mesh.clone()));
                }
            }
        }
        for previous in old {
            let Some(mesh) = self.groups.get_mut(&*key.mesh) else {
                continue;
            };
            let subject = previous.ca_trust.subject.as_str();
            if let Some(count) = mesh.get_mut(subject) {
                *count -= 1;
                if *count == 0 {
                    mesh.remove(subject);
                    if mesh.is_empty() {
                        self.groups.remove(&*key.mesh);
                    }
                }
            }
        }
        if new.is_empty() {
            self.proxies.remove(key);
            self.stirred.remove(key);
        } else if !self.proxies.contains(key) {
            self.proxies.insert(key.clone());
        }
    }

    /// Notes a stream event of `key`'s, which may let it settle.
    pub fn stir(&mut self, key: &ProxyKey) {
        if self.proxies.contains(key) && !self.stirred.contains(key) {
            self.stirred.insert(key.clone());
        }
    }

    /// Whether any proxy keeps replaced certificates.
    pub fn is_empty(&self) -> bool {
        self.proxies.is_empty()
    }

    /// How many proxies keep replaced certificates: those that have not ACKed their new one yet.
    pub fn len(&self) -> usize {
        self.proxies.len()
    }

    /// Every proxy that keeps replaced certificates.
    pub fn proxies(&self) -> impl Iterator<Item = &ProxyKey> {
        self.proxies.iter()
    }

    /// The proxies stirred since the last call.
    pub fn take_stirred(&mut self) -> Vec<ProxyKey> {
        self.stirred.drain().collect()
    }

    /// Per mesh and replaced CA subject, how many proxies keep a certificate from it.
    pub fn groups(&self) -> impl Iterator<Item = (&MeshName, &str, usize)> {
        self.groups.iter().flat_map(|(mesh, subjects)| {
            subjects
                .iter()
                .map(move |(subject, count)| (mesh, subject.as_str(), *count))
        })
    }

    /// The meshes where an identity-ACK wait started since the last call, one entry per wait.
    pub fn take_started(&mut self) -> Vec<MeshName> {
        std::mem::take(&mut self.started)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::trust::{BundleKey, CaId, CaTrust};

    fn key(name: &str) -> ProxyKey {
        ProxyKey::new(Arc::from("default"), Arc::from(name))
    }

    fn replaced(subject: &str) -> Previous {
        Previous {
            ca_trust: CaTrust {
                bundle: BundleKey::mesh("default"),
                trust_domain: meshca_identity::TrustDomain::parse("default").unwrap(),
                ca_id: CaId::new(subject),
                pems: Arc::from(Vec::new()),
                subject: subject.into(),
            },
            spiffe_id: "spiffe://default/web".into(),
        }
    }

    #[test]
    fn a_wait_starts_once_per_group_until_the_group_empties() {
        let mut replacing = Replacing::default();
        let old = [replaced("ca-1")];
        replacing.update(&key("a"), &[], &old);
        replacing.update(&key("b"), &[], &old);
        assert_eq!(replacing.take_started(), ["default"]);
        // A proxy issued again keeps its group: no new wait.
        let both = [replaced("ca-1"), replaced("ca-2")];
        replacing.update(&key("a"), &old, &both);
        assert_eq!(replacing.take_started(), ["default"], "ca-2's group is new");
        replacing.update(&key("a"), &both, &[]);
        replacing.update(&key("b"), &old, &[]);
        assert!(replacing.is_empty());
        replacing.update(&key("c"), &[], &old);
        assert_eq!(
            replacing.take_started(),
            ["default"],
            "the emptied group starts again"
        );
    }

    #[test]
    fn only_proxies_that_keep_replaced_certificates_are_stirred() {
        let mut replacing = Replacing::default();
        replacing.update(&key("a"), &[], &[replaced("ca-1")]);
        replacing.stir(&key("a"));
        replacing.stir(&key("a"));
        replacing.stir(&key("b"));
        assert_eq!(replacing.take_stirred(), [key("a")]);
        assert!(replacing.take_stirred().is_empty());
        // Settled between the event and the batch: nothing left to look at.
        replacing.stir(&key("a"));
        replacing.update(&key("a"), &[replaced("ca-1")], &[]);
        assert!(replacing.take_stirred().is_empty());
        assert_eq!(replacing.proxies().count(), 0);
    }
}
