//! Identities: the SPIFFE ID each proxy is decided, whether it may present it yet (SANs before
//! identity), and the SPIFFE IDs each `meshservice:` context and the zone egress bundle carry. It
//! decides from the configuration, the proxies, their certificates and the gate, and changes none of
//! them.

use std::collections::{BTreeMap, BTreeSet};

use meshca_config::SERVICE_TAG;
use meshca_identity::KeyAlgorithm;

use super::proxies::ProxyTable;
use super::{Dataplanes, Issued, Owner};
use crate::bundles;
use crate::egress::{self, EgressPlan, NoEgressIdentity};
use crate::gate::Gate;
use crate::peers::PresentedIds;
use crate::plan::{self, DataplaneInfo, Decision};
use crate::snapshot::{ProxyHashMap, ProxyKey};
use crate::trust::{BundleKey, ServiceIds, ServiceKey, EGRESS_SERVICE};
use crate::world::{MeshState, World};

/// What deciding identities reads: the owner's state, borrowed for one decision or one pass.
pub(super) struct Identities<'a> {
    pub world: &'a World,
    /// `zone`.
    pub zone: &'a str,
    /// `issuance.keyAlgorithm`.
    pub key_algorithm: KeyAlgorithm,
    /// Where the zone egress identity comes from, as the last reconcile chose.
    pub egress: &'a Option<Result<EgressPlan, NoEgressIdentity>>,
    pub proxies: &'a ProxyTable,
    pub issued: &'a ProxyHashMap<Box<Issued>>,
    pub gate: &'a Gate,
    /// The contexts the last snapshot carried (kept whole while a peer's view cannot be read).
    pub carried: &'a ServiceIds,
}

impl Owner {
    /// What deciding identities reads, from the owner's state now.
    pub(super) fn identities(&self) -> Identities<'_> {
        Identities {
            world: &self.world,
            zone: &self.config.zone,
            key_algorithm: self.config.key_algorithm,
            egress: &self.egress,
            proxies: &self.proxies,
            issued: &self.issued,
            gate: &self.gate,
            carried: &self.last.service_ids,
        }
    }
}

impl Identities<'_> {
    /// The certificate `key` should hold: the zone egress identity for an egress, else its dataplane
    /// identity.
    pub fn decide(&self, key: &ProxyKey, info: &DataplaneInfo) -> Decision {
        if !self.proxies.is_zone_egress(key) {
            let mesh = self.world.meshes.get(&*key.mesh);
            return plan::decide(mesh, info, self.zone, self.key_algorithm);
        }
        match &self.egress {
            Some(Ok(plan)) => egress::decide(self.world, plan, info, self.zone, self.key_algorithm),
            Some(Err(reason)) => Decision::NoIdentity(format!("no zone egress identity: {reason}")),
            None => Decision::NoIdentity("the zone egress identity is not chosen yet".into()),
        }
    }

    /// Whether the proxy may present `spiffe_id`: it already does, or every local MeshService that
    /// selects it (for the zone egress: the egress bundle's SAN matchers) has had the ID confirmed in its
    /// context.
    pub fn may_present_id(&self, key: &ProxyKey, info: &DataplaneInfo, spiffe_id: &str) -> bool {
        let presents = self
            .issued
            .get(key)
            .is_none_or(|issued| issued.published.spiffe_id == spiffe_id);
        if self.proxies.is_zone_egress(key) {
            return presents || self.gate.may_present(&ServiceKey::egress(), spiffe_id);
        }
        presents
            || self
                .world
                .resources
                .mesh_services
                .iter()
                .filter(|s| s.mesh == info.mesh && s.zone().is_none_or(|z| z == self.zone))
                .filter(|s| {
                    s.dataplane_tags
                        .as_ref()
                        .is_some_and(|t| info.has_inbound_with(t))
                })
                .all(|s| {
                    let service = ServiceKey::new(s.mesh.as_str(), s.name.clone());
                    self.gate.may_present(&service, spiffe_id)
                })
    }

    /// The SPIFFE IDs each MeshService's proxies present. For a service of another zone (or one without
    /// a dataplane selector), `spec.identities` as given. For a local service, computed whatever its file
    /// says: for every dataplane the service selects, the ServiceTag of its matching inbounds, the ID
    /// meshca decides for it, the IDs of every MeshIdentity selecting it (staged migrations), and (break
    /// last), while its proxy is connected, the ID of the certificate served now and of the one it
    /// replaced, until the proxy has ACKed its replacement; and what the peers' proxies present.
    ///
    /// Also returns what this replica's proxies present, per computed service, for the peers.
    pub fn service_identities(&self, dataplanes: &Dataplanes) -> (ServiceIds, PresentedIds) {
        let mut out = ServiceIds::new();
        let mut presented = PresentedIds::new();
        for service in &self.world.resources.mesh_services {
            let local = service.zone().is_none_or(|z| z == self.zone);
            let computed = local.then_some(service.dataplane_tags.as_ref()).flatten();
            let Some(selector) = computed else {
                // Another zone's service (or one that selects nothing): its identities as given.
                let ids = bundles::service_spiffe_ids(&service.mesh, service);
                out.insert(
                    ServiceKey::new(service.mesh.as_str(), service.name.clone()),
                    ids,
                );
                continue;
            };
            // A local service's identities are computed, whatever its file lists: the ServiceTag of
            // each selected inbound, the ID each selected dataplane is issued, the IDs of every
            // MeshIdentity that selects it, and what its connected proxies still present.
            let mut ids = BTreeSet::new();
            let mut theirs = BTreeSet::new();
            let mesh = self.world.meshes.get(&service.mesh);
            let selected = dataplanes.iter().filter_map(|(key, dp)| {
                let dp = dp.as_ref().ok()?;
                (dp.mesh == service.mesh && dp.has_inbound_with(selector)).then_some((key, dp))
            });
            for (key, dp) in selected {
                ids.extend(self.given_ids(mesh, dp, selector));
                theirs.extend(self.presented_ids(key));
            }
            ids.extend(theirs.iter().cloned());
            let key = ServiceKey::new(service.mesh.as_str(), service.name.clone());
            self.add_peers_ids(&key, &mut ids);
            out.insert(key, ids);
            presented
                .entry(service.mesh.clone())
                .or_default()
                .insert(service.name.clone(), theirs);
        }
        let (mut ids, theirs) = self.egress_identities(dataplanes);
        let egress = ServiceKey::egress();
        self.add_peers_ids(&egress, &mut ids);
        out.insert(egress, ids);
        presented
            .entry(BundleKey::Egress.to_string())
            .or_default()
            .insert(EGRESS_SERVICE.to_owned(), theirs);
        (out, presented)
    }

    /// Adds to a computed context's `ids` what the peers' proxies of `service` present (break last
    /// across replicas); while a peer's view cannot be read, every ID the context carried.
    fn add_peers_ids(&self, service: &ServiceKey, ids: &mut BTreeSet<String>) {
        for peer in self.gate.peers() {
            match &peer.view {
                Some(view) => {
                    let theirs = view
                        .presented_ids
                        .get(service.bundle.as_str())
                        .and_then(|s| s.get(&service.service));
                    ids.extend(theirs.into_iter().flatten().cloned());
                }
                None => {
                    let carried = self.carried.get(service);
                    ids.extend(carried.into_iter().flatten().cloned());
                }
            }
        }
    }

    /// What a dataplane gives a local MeshService that selects it (with `selector`), connected or not:
    /// the ServiceTag of each selected inbound, the ID meshca decides for it, and (staged migrations)
    /// the ID of every MeshIdentity selecting it, provider-less ones included.
    pub fn given_ids(
        &self,
        mesh: Option<&MeshState>,
        dp: &DataplaneInfo,
        selector: &BTreeMap<String, String>,
    ) -> BTreeSet<String> {
        let mut ids: BTreeSet<String> = dp
            .inbounds_with(selector)
            .filter_map(|tags| tags.get(SERVICE_TAG))
            .map(|tag| format!("spiffe://{}/{tag}", dp.mesh))
            .collect();
        if let Decision::Issue(d) = plan::decide(mesh, dp, self.zone, self.key_algorithm) {
            ids.insert(d.spiffe_id.to_string());
        }
        ids.extend(
            plan::selected_identity_ids(mesh, dp, self.zone)
                .iter()
                .map(ToString::to_string),
        );
        ids
    }

    /// The SPIFFE IDs a proxy may present while it is connected (break last): its served certificate's,
    /// and those of the certificates it replaced and has not ACKed the replacement of.
    fn presented_ids(&self, key: &ProxyKey) -> Vec<String> {
        match self.issued.get(key) {
            Some(issued) if self.proxies.streams.is_connected(key) => {
                std::iter::once(issued.published.spiffe_id.clone())
                    .chain(issued.previous.iter().map(|p| p.spiffe_id.clone()))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// The SPIFFE IDs the zone egress bundle accepts: the egress identity of every known egress (each
    /// ZoneEgress file, each egress token that connected) and, while an egress is connected, the IDs it
    /// may still present (break last).
    /// Also returns the IDs this replica's egresses present.
    fn egress_identities(&self, dataplanes: &Dataplanes) -> (BTreeSet<String>, BTreeSet<String>) {
        let plan = self.egress.as_ref().and_then(|p| p.as_ref().ok());
        let (zone, algorithm) = (&self.zone, self.key_algorithm);
        let decided =
            |info: &DataplaneInfo| match egress::decide(self.world, plan?, info, zone, algorithm) {
                Decision::Issue(d) => Some(d.spiffe_id.to_string()),
                Decision::NoIdentity(_) | Decision::Refused(_) => None,
            };
        let mesh = plan.map_or("", |p| p.mesh.as_str());
        let mut ids: BTreeSet<String> = self
            .world
            .resources
            .zone_egresses
            .iter()
            .filter_map(|egress| decided(&DataplaneInfo::from_zone_egress(mesh, egress)))
            .collect();
        let mut presented = BTreeSet::new();
        for key in self.proxies.egresses() {
            let Some(info) = dataplanes.get(key) else {
                continue;
            };
            ids.extend(info.as_ref().ok().and_then(decided));
            presented.extend(self.presented_ids(key));
        }
        ids.extend(presented.iter().cloned());
        (ids, presented)
    }
}
