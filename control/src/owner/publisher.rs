//! The publisher: the snapshots the owner sends SDS, the bundles they share, and which MeshServices
//! are TLS-ready.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use tokio::sync::watch;

use super::{Dataplanes, Issued};
use crate::bundles::{self, BundleCache};
use crate::federated::Federated;
use crate::snapshot::{Changed, ProxyEntry, ProxyHashMap, ProxyMap, Snapshot};
use crate::trust::{BundleKey, CaTrust, ServiceIds, ServiceKey};
use crate::world::World;

/// What the owner has published, and the state that outlives one snapshot.
#[derive(Debug)]
pub(super) struct Publisher {
    tx: watch::Sender<Arc<Snapshot>>,
    /// The generation of the last published snapshot.
    generation: u64,
    /// Bundles and contexts of earlier snapshots, reused while unchanged.
    bundles: BundleCache,
    /// MeshServices whose `status.tls` is Ready: set once every selected dataplane holds a trusted
    /// certificate, cleared only when the mesh's mTLS is switched off.
    tls_ready: BTreeSet<ServiceKey>,
}

impl Publisher {
    /// A publisher that sends on `tx`.
    pub fn new(tx: watch::Sender<Arc<Snapshot>>) -> Publisher {
        Publisher {
            tx,
            generation: 0,
            bundles: BundleCache::default(),
            tls_ready: BTreeSet::new(),
        }
    }

    /// The generation of the last published snapshot.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The last published snapshot.
    pub fn last(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    /// Publishes `snapshot`.
    pub fn send(&mut self, snapshot: Snapshot) {
        self.generation = snapshot.generation;
        self.tx.send_replace(Arc::new(snapshot));
    }

    /// A snapshot of `world` with `trust` and `proxies`, reusing the bundles and contexts that did not
    /// change.
    pub fn build(
        &mut self,
        generation: u64,
        world: &World,
        trust: &BTreeMap<BundleKey, Vec<CaTrust>>,
        proxies: ProxyMap<ProxyEntry>,
        service_ids: &ServiceIds,
        federated: &Federated,
    ) -> Snapshot {
        bundles::snapshot(
            generation,
            world,
            trust,
            proxies,
            service_ids,
            federated,
            &mut self.bundles,
        )
    }

    /// The Workload API's registrations of `world`: the last snapshot's `Arc` while they are unchanged.
    pub fn registrations(&mut self, world: &World) -> Arc<crate::workloads::Registrations> {
        self.bundles.registrations(world)
    }

    /// The MeshServices whose `status.tls` is Ready.
    pub fn tls_ready(&self) -> &BTreeSet<ServiceKey> {
        &self.tls_ready
    }

    /// Publishes this reconcile's bundles and contexts at once, with every proxy's entry and claim rule
    /// as last published, when they differ from the last snapshot's and cover the same meshes (a mesh
    /// that comes or goes changes its proxies too, so it waits for the whole snapshot). Nothing the
    /// pass over the proxies decides can change them: they are planned from the certificates proxies
    /// hold and the IDs decided before it. Returns whether it published.
    pub fn publish_trust_first(
        &mut self,
        generation: u64,
        world: &World,
        trust: &BTreeMap<BundleKey, Vec<CaTrust>>,
        service_ids: &ServiceIds,
        federated: &Federated,
    ) -> bool {
        let previous = self.last();
        let mut snapshot = self.build(
            generation,
            world,
            trust,
            previous.proxies.clone(),
            service_ids,
            federated,
        );
        let same_meshes = snapshot.meshes.len() == previous.meshes.len()
            && snapshot
                .meshes
                .keys()
                .all(|m| previous.meshes.contains_key(m))
            && snapshot.egress.is_some() == previous.egress.is_some();
        if !same_meshes || bundles::same_trust(&previous, &snapshot) {
            return false;
        }
        snapshot.claim_rules = previous.claim_rules.clone();
        snapshot.changed = Changed::after(&previous, None);
        self.send(snapshot);
        true
    }

    /// Updates MeshService `status.tls`: Ready once mTLS is on and every dataplane the service selects
    /// holds a certificate from a CA its mesh trusts; then Ready until mTLS is switched off.
    pub fn update_service_tls(
        &mut self,
        world: &World,
        dataplanes: &Dataplanes,
        issued: &ProxyHashMap<Box<Issued>>,
        trust: &BTreeMap<BundleKey, Vec<CaTrust>>,
    ) {
        for service in &world.resources.mesh_services {
            let key = ServiceKey::new(service.mesh.as_str(), service.name.clone());
            let mtls_on = world.meshes.get(&service.mesh).is_some_and(|m| m.mtls_on());
            if !mtls_on {
                self.tls_ready.remove(&key);
                continue;
            }
            let Some(selector) = &service.dataplane_tags else {
                continue;
            };
            if self.tls_ready.contains(&key) {
                continue;
            }
            let trusted = trust
                .get(&key.bundle)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut selected = dataplanes
                .iter()
                .filter(|(_, d)| {
                    d.as_ref()
                        .is_ok_and(|d| d.mesh == service.mesh && d.has_inbound_with(selector))
                })
                .peekable();
            if selected.peek().is_none() {
                continue;
            }
            // Trusted: the bundle of its trust domain carries its CA or the CA's trust anchor.
            let all_hold = selected.all(|(k, _)| {
                issued.get(k).is_some_and(|i| {
                    trusted.iter().any(|t| {
                        t.trust_domain == i.ca_trust.trust_domain
                            && t.covers(i.ca_id.as_str(), &i.ca_trust.pems)
                    })
                })
            });
            if all_hold {
                self.tls_ready.insert(key);
            }
        }
        let services: HashSet<(&str, &str)> = world
            .resources
            .mesh_services
            .iter()
            .map(|s| (s.mesh.as_str(), s.name.as_str()))
            .collect();
        self.tls_ready
            .retain(|k| services.contains(&(k.bundle.as_str(), k.service.as_str())));
    }
}
