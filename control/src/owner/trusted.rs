//! Trust: who presents which CA, and which CAs the configuration publishes. The grouping by CA is
//! written once, here: the gate's break last and the view the peers read both take it, and look at
//! each CA once however many proxies present it.

use std::collections::{HashMap, HashSet};

use super::Issued;
use crate::bundles;
use crate::egress::{self, EgressPlan, NoEgressIdentity};
use crate::federated::Federated;
use crate::gate::ForeignDomains;
use crate::peers::PresentedCa;
use crate::snapshot::{ProxyHashMap, ProxyKey};
use crate::streams::StreamTable;
use crate::trust::{BundleKey, CaTrust, TrustKey};
use crate::world::World;

/// How many proxies a replica names per CA its proxies present (its view says how many there are).
const NAMED_PRESENTERS: usize = 20;

/// The proxies connected to `streams` and the certificates `issued` holds for them.
pub(super) struct Presenting<'a> {
    pub issued: &'a ProxyHashMap<Box<Issued>>,
    pub streams: &'a StreamTable,
}

impl<'a> Presenting<'a> {
    /// Who presents which CA, grouped by CA: each connected proxy under the CA of its certificate and
    /// of every certificate it had before and has not ACKed the replacement of (a proxy may be listed
    /// twice under one CA).
    fn by_ca(&self) -> HashMap<TrustKey, (&'a CaTrust, Vec<&'a ProxyKey>)> {
        let mut grouped: HashMap<TrustKey, (&CaTrust, Vec<&ProxyKey>)> = HashMap::new();
        for (key, issued) in self.issued {
            if !self.streams.is_connected(key) {
                continue;
            }
            for ca in issued.presentable_cas() {
                grouped
                    .entry(ca.key())
                    .or_insert((ca, Vec::new()))
                    .1
                    .push(key);
            }
        }
        grouped
    }

    /// The meshes with a connected proxy this replica has issued nothing to yet: it may present a
    /// certificate from any CA its mesh still trusts (it moved here from another replica, or from
    /// before a restart).
    pub fn newcomers_meshes(&self) -> HashSet<BundleKey> {
        self.streams
            .proxies()
            .filter(|key| !self.issued.contains_key(*key))
            .map(|key| BundleKey::mesh(key.mesh.clone()))
            .collect()
    }

    /// Who presents which CA, for the gate's break last: the grouping, and every newcomer (see
    /// [`Presenting::newcomers_meshes`]) under each of `retained`, the CAs its mesh's bundles keep
    /// only because proxies may present them, which stay for it too.
    pub fn presented(&self, retained: &'a [CaTrust]) -> Vec<(&'a CaTrust, Vec<&'a ProxyKey>)> {
        let mut grouped = self.by_ca();
        for ca in retained {
            let newcomers = self
                .streams
                .proxies()
                .filter(|key| ca.bundle.is_mesh(&key.mesh) && !self.issued.contains_key(*key));
            grouped
                .entry(ca.key())
                .or_insert((ca, Vec::new()))
                .1
                .extend(newcomers);
        }
        grouped.into_values().collect()
    }

    /// The CAs connected proxies present certificates from (current, and replaced but not ACKed),
    /// each with the first proxies by name, as the peers read them.
    pub fn presented_cas(&self) -> Vec<PresentedCa> {
        let mut out: Vec<PresentedCa> = self
            .by_ca()
            .into_values()
            .map(|(ca, mut proxies)| {
                proxies.sort_unstable();
                proxies.dedup();
                PresentedCa {
                    mesh: ca.bundle.to_string(),
                    trust_domain: ca.trust_domain.to_string(),
                    ca: ca.ca_id.to_string(),
                    anchors: ca.pems.to_vec(),
                    proxies: proxies.len(),
                    named: proxies
                        .iter()
                        .take(NAMED_PRESENTERS)
                        .map(ToString::to_string)
                        .collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.mesh, &a.trust_domain, &a.ca).cmp(&(&b.mesh, &b.trust_domain, &b.ca))
        });
        out
    }
}

/// The CAs the configuration publishes: each mesh's (the federated trust domains' as `federated` holds
/// them), and the zone egress bundle's under `egress`; and the trust domains of each bundle that only
/// federation brings.
pub(super) fn configured_cas(
    world: &World,
    federated: &Federated,
    egress: &Option<Result<EgressPlan, NoEgressIdentity>>,
) -> (Vec<CaTrust>, ForeignDomains) {
    let mut desired: Vec<CaTrust> = world.meshes.values().flat_map(bundles::own_cas).collect();
    if let Some(Ok(plan)) = egress {
        desired.extend(egress::egress_cas(world, plan));
    }
    let own = desired.len();
    desired.extend(
        world
            .meshes
            .values()
            .flat_map(|m| bundles::federated_cas(m, world, federated)),
    );
    let foreign = ForeignDomains::of(&desired[..own], &desired[own..]);
    (desired, foreign)
}
