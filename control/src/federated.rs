//! The bundles of federated trust domains as the mesh trusts them: what the importer holds for each
//! peer, with its X.509 authorities read once as trust anchors; before a peer's first bundle is held,
//! its relationship's initial bundle.

use std::collections::BTreeMap;
use std::sync::Arc;

use meshca_ca::TrustAnchor;
use meshca_federation::{HeldBundles, SpiffeBundle};
use meshca_identity::TrustDomain;

use crate::world::{anchors_of, World};

/// A held bundle and its X.509 authorities as trust anchors.
#[derive(Clone, Debug)]
struct Held {
    bundle: Arc<SpiffeBundle>,
    anchors: Arc<[TrustAnchor]>,
}

/// The bundles the importer holds, by trust domain.
#[derive(Clone, Debug, Default)]
pub struct Federated {
    held: BTreeMap<TrustDomain, Held>,
}

impl Federated {
    /// Takes in what the importer holds now (reading only the bundles that changed); whether anything
    /// changed.
    pub fn update(&mut self, held: &HeldBundles) -> bool {
        let same = self.held.len() == held.len()
            && held
                .iter()
                .all(|(td, b)| self.held.get(td).is_some_and(|h| h.bundle == *b));
        if same {
            return false;
        }
        let mut next = BTreeMap::new();
        for (td, bundle) in held {
            let entry = match self.held.get(td) {
                Some(h) if h.bundle == *bundle => h.clone(),
                _ => Held {
                    bundle: bundle.clone(),
                    anchors: Arc::from(anchors_of(bundle)),
                },
            };
            next.insert(td.clone(), entry);
        }
        self.held = next;
        true
    }

    /// The X.509 authorities `mesh` trusts from the federated trust domains of `world`: each the held
    /// bundle's, else the initial bundle's.
    pub fn anchors<'a>(
        &'a self,
        world: &'a World,
        mesh: &'a str,
    ) -> impl Iterator<Item = (&'a TrustDomain, &'a TrustAnchor)> + 'a {
        world
            .federation
            .iter()
            .filter(move |(_, d)| d.applies_to(mesh))
            .flat_map(move |(td, d)| {
                let anchors: &[TrustAnchor] = match self.held.get(td) {
                    Some(h) => &h.anchors,
                    None => &d.initial_anchors,
                };
                anchors.iter().map(move |a| (td, a))
            })
    }

    /// The bundles `mesh` trusts from the federated trust domains of `world` (their JWT authorities
    /// are what the Workload API gives for those trust domains): each the held one, else the initial
    /// one, if any.
    pub fn bundles<'a>(
        &'a self,
        world: &'a World,
        mesh: &'a str,
    ) -> impl Iterator<Item = &'a Arc<SpiffeBundle>> + 'a {
        world
            .federation
            .iter()
            .filter(move |(_, d)| d.applies_to(mesh))
            .filter_map(move |(td, d)| {
                self.held
                    .get(td)
                    .map(|h| &h.bundle)
                    .or(d.peer.initial.as_ref())
            })
    }
}
