//! Trust bundles and SAN sets: what each mesh trusts, computed from an accepted [`World`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use meshca_config::{MeshService, ServiceIdentity};

use crate::federated::Federated;
use crate::snapshot::{
    Changed, MeshServiceTrust, MeshView, ProxyEntry, ProxyMap, Snapshot, TrustBundle,
};
use crate::trust::{legacy_trust_domain, BundleKey, CaTrust, ServiceIds, ServiceKey};
use crate::workloads::Registrations;
use crate::world::{MeshState, World};
use meshca_federation::SpiffeBundle;

/// Trust domain → PEM certificates, deduplicated and in a stable order.
type Anchors = BTreeMap<String, BTreeSet<String>>;

/// Everything `mesh`'s bundles publish, as the rollout gate orders it: its enabled and secondary backends
/// (trust domain: the mesh name), every certificate of the MeshTrusts meshca keeps for its MeshIdentities
/// with `meshTrustCreation: Enabled` (their current CAs among them), every certificate of its
/// MeshTrust resources, and the X.509 authorities of the federated trust domains `world` names for it,
/// as `federated` holds them.
pub fn mesh_cas(mesh: &MeshState, world: &World, federated: &Federated) -> Vec<CaTrust> {
    let mut cas = own_cas(mesh);
    cas.extend(federated_cas(mesh, world, federated));
    cas
}

/// The part of [`mesh_cas`] the configuration itself holds: everything but the federated authorities.
pub fn own_cas(mesh: &MeshState) -> Vec<CaTrust> {
    let bundle = BundleKey::mesh(mesh.name.as_str());
    let legacy = legacy_trust_domain(&mesh.name);
    let backends = legacy.iter().flat_map(|td| {
        mesh.backends()
            .flat_map(|b| &b.trusted)
            .map(|g| CaTrust::of_ca(bundle.clone(), td, &g.ca))
    });
    let created = mesh.created_trusts.iter().flat_map(|t| {
        t.certificates
            .iter()
            .map(|c| CaTrust::of_anchor(bundle.clone(), &t.trust_domain, c))
    });
    let trusts = mesh.trusts.iter().flat_map(|t| {
        t.certificates
            .iter()
            .map(|c| CaTrust::of_anchor(bundle.clone(), &t.trust_domain, c))
    });
    backends.chain(created).chain(trusts).collect()
}

/// The part of [`mesh_cas`] that federation brings: the X.509 authorities of the federated trust
/// domains `world` names for `mesh`, as `federated` holds them.
pub fn federated_cas<'a>(
    mesh: &'a MeshState,
    world: &'a World,
    federated: &'a Federated,
) -> impl Iterator<Item = CaTrust> + 'a {
    let bundle = BundleKey::mesh(mesh.name.as_str());
    federated
        .anchors(world, &mesh.name)
        .map(move |(td, anchor)| CaTrust::of_anchor(bundle.clone(), td, anchor))
}

/// Everything a mesh trusts, by trust domain: the CAs `cas` (what [`mesh_cas`] gives, as the rollout gate
/// publishes it).
pub fn mesh_anchors(cas: &[CaTrust]) -> Anchors {
    let mut anchors = Anchors::new();
    for ca in cas {
        anchors
            .entry(ca.trust_domain.to_string())
            .or_default()
            .extend(ca.pems.iter().cloned());
    }
    anchors
}

/// A MeshService context and what it was built from.
type CachedService = (Arc<TrustBundle>, BTreeSet<String>, Arc<MeshServiceTrust>);

/// Which bundle of a snapshot a cached one is: a mesh's or the egress bundle, or the trust of every mesh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum CachedBundle {
    /// `system_trust_bundle_<mesh>` or `system_trust_bundle_egress`.
    Of(BundleKey),
    /// `ALL`.
    All,
}

/// Bundles of earlier snapshots, reused while their content is unchanged: SDS builds each bundle's protos once
/// per `Arc`, so reusing it spares every stream that work when something else changed.
#[derive(Debug, Default)]
pub struct BundleCache {
    bundles: HashMap<CachedBundle, (Anchors, Arc<TrustBundle>)>,
    federated: HashMap<String, Arc<[Arc<SpiffeBundle>]>>,
    services: HashMap<ServiceKey, CachedService>,
    registrations: Arc<Registrations>,
    /// The resources `registrations` was made from: made again only from others.
    registrations_from: Option<Arc<meshca_config::Resources>>,
}

impl BundleCache {
    /// The registrations of `world`, as the last snapshot's `Arc` while they are unchanged.
    pub fn registrations(&mut self, world: &World) -> Arc<Registrations> {
        if self
            .registrations_from
            .as_ref()
            .is_some_and(|from| Arc::ptr_eq(from, &world.resources))
        {
            return self.registrations.clone();
        }
        let registrations = Registrations::from_resources(&world.resources);
        if *self.registrations != registrations {
            self.registrations = Arc::new(registrations);
        }
        self.registrations_from = Some(world.resources.clone());
        self.registrations.clone()
    }

    fn bundle(&mut self, key: CachedBundle, anchors: &Anchors) -> Arc<TrustBundle> {
        if let Some((cached, bundle)) = self.bundles.get(&key) {
            if cached == anchors {
                return bundle.clone();
            }
        }
        let bundle = Arc::new(TrustBundle::new(
            anchors
                .iter()
                .map(|(td, pems)| (td.clone(), pems.iter().cloned().collect()))
                .collect(),
        ));
        self.bundles.insert(key, (anchors.clone(), bundle.clone()));
        bundle
    }

    /// The federated bundles of `mesh`, as the last snapshot's `Arc` while they are the same.
    fn federated(
        &mut self,
        mesh: &str,
        bundles: Vec<Arc<SpiffeBundle>>,
    ) -> Arc<[Arc<SpiffeBundle>]> {
        if let Some(cached) = self.federated.get(mesh) {
            if cached.len() == bundles.len()
                && cached
                    .iter()
                    .zip(&bundles)
                    .all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
            {
                return cached.clone();
            }
        }
        let bundles: Arc<[Arc<SpiffeBundle>]> = Arc::from(bundles);
        self.federated.insert(mesh.to_owned(), bundles.clone());
        bundles
    }

    fn service(
        &mut self,
        key: ServiceKey,
        trust: &Arc<TrustBundle>,
        ids: BTreeSet<String>,
    ) -> Arc<MeshServiceTrust> {
        if let Some((t, cached_ids, s)) = self.services.get(&key) {
            if Arc::ptr_eq(t, trust) && cached_ids == &ids {
                return s.clone();
            }
        }
        let s = Arc::new(MeshServiceTrust::new(trust.clone(), ids.clone()));
        self.services.insert(key, (trust.clone(), ids, s.clone()));
        s
    }
}

/// The SPIFFE IDs of a MeshService's `spec.identities` (ServiceTag `t` is `spiffe://<mesh>/t`).
pub fn service_spiffe_ids(mesh: &str, service: &MeshService) -> BTreeSet<String> {
    service
        .identities
        .iter()
        .map(|identity| match identity {
            ServiceIdentity::ServiceTag(tag) => format!("spiffe://{mesh}/{tag}"),
            ServiceIdentity::SpiffeId(id) => id.clone(),
        })
        .collect()
}

/// Builds the snapshot SDS serves.
pub fn snapshot(
    generation: u64,
    world: &World,
    trust: &BTreeMap<BundleKey, Vec<CaTrust>>,
    proxies: ProxyMap<ProxyEntry>,
    service_ids: &ServiceIds,
    federated: &Federated,
    cache: &mut BundleCache,
) -> Snapshot {
    let mut all = Anchors::new();
    let mut meshes = HashMap::new();
    for mesh in world.meshes.values() {
        let bundle = BundleKey::mesh(mesh.name.as_str());
        let cas = trust.get(&bundle).map(Vec::as_slice).unwrap_or_default();
        let anchors = mesh_anchors(cas);
        for (td, pems) in &anchors {
            all.entry(td.clone())
                .or_default()
                .extend(pems.iter().cloned());
        }
        let trust = cache.bundle(CachedBundle::Of(bundle), &anchors);
        let mesh_services = world
            .resources
            .mesh_services
            .iter()
            .filter(|s| s.mesh == mesh.name)
            .map(|s| {
                let key = ServiceKey::new(mesh.name.as_str(), s.name.clone());
                let ids = service_ids
                    .get(&key)
                    .cloned()
                    .unwrap_or_else(|| service_spiffe_ids(&mesh.name, s));
                (s.name.clone(), cache.service(key, &trust, ids))
            })
            .collect();
        let held = federated.bundles(world, &mesh.name).cloned().collect();
        meshes.insert(
            mesh.name.clone(),
            MeshView {
                trust,
                mesh_services,
                federated: cache.federated(&mesh.name, held),
            },
        );
    }
    let all = cache.bundle(CachedBundle::All, &all);
    // The zone egress bundle: the CAs of the egress identity, as the gate publishes them, and the egress
    // SPIFFE IDs as SAN matchers, so that a sidecar's egress context accepts the egress and nothing else.
    let egress = trust.get(&BundleKey::Egress).map(|cas| {
        let bundle = cache.bundle(CachedBundle::Of(BundleKey::Egress), &mesh_anchors(cas));
        let key = ServiceKey::egress();
        let ids = service_ids.get(&key).cloned().unwrap_or_default();
        cache.service(key, &bundle, ids)
    });
    Snapshot {
        claim_rules: ProxyMap::default(),
        registrations: cache.registrations(world),
        changed: Changed::default(),
        generation,
        proxies,
        meshes: Arc::new(meshes),
        all,
        egress,
    }
}

/// Whether two entries serve the same: identities are compared by pointer (the owner reuses the `Arc`
/// while a certificate is unchanged).
pub fn same_entry(x: &ProxyEntry, y: &ProxyEntry) -> bool {
    match (x, y) {
        (ProxyEntry::Ready(x), ProxyEntry::Ready(y)) => Arc::ptr_eq(x, y),
        (ProxyEntry::Pending, ProxyEntry::Pending) => true,
        (ProxyEntry::NoIdentity { reason: x }, ProxyEntry::NoIdentity { reason: y })
        | (ProxyEntry::Refused { reason: x }, ProxyEntry::Refused { reason: y }) => x == y,
        _ => false,
    }
}

/// Whether two snapshots serve the same bundles, contexts and Workload API registrations (compared by
/// pointer: the owner reuses the same `Arc` while one is unchanged).
pub fn same_trust(a: &Snapshot, b: &Snapshot) -> bool {
    let same_mesh = |x: &MeshView, y: &MeshView| {
        Arc::ptr_eq(&x.trust, &y.trust)
            && Arc::ptr_eq(&x.federated, &y.federated)
            && x.mesh_services.len() == y.mesh_services.len()
            && x.mesh_services
                .iter()
                .all(|(name, s)| y.mesh_services.get(name).is_some_and(|t| Arc::ptr_eq(s, t)))
    };
    a.meshes.len() == b.meshes.len()
        && a.meshes
            .iter()
            .all(|(k, m)| b.meshes.get(k).is_some_and(|n| same_mesh(m, n)))
        && Arc::ptr_eq(&a.all, &b.all)
        && Arc::ptr_eq(&a.registrations, &b.registrations)
        && match (&a.egress, &b.egress) {
            (None, None) => true,
            (Some(x), Some(y)) => Arc::ptr_eq(x, y),
            _ => false,
        }
}
