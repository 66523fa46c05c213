//! What replicas on one database tell each other about their rollouts, so that the gate's rules hold
//! over every replica's proxies, not only this one's.
//!
//! Each replica publishes a [`GateView`]: which new trust its streams have all ACKed, which CAs and
//! SPIFFE IDs its connected proxies present. Every other replica reads the views of the live ones
//! ([`PeerView`]) and lets a rollout step proceed only when they agree:
//!
//! - a CA issues only when every peer that publishes the mesh's trust reports it ACKed (a peer that
//!   has not loaded the CA yet reports trust without it, and so holds it back);
//! - a new SPIFFE ID is presented only when every peer that publishes the service's context reports it
//!   ACKed;
//! - a removed CA, or a SPIFFE ID that left a context, stays while a peer's proxies present it.
//!
//! A peer whose view is missing or unreadable holds every step back. A peer whose lease expired keeps
//! holding what its last view held for another `replica.leaseTimeout`: its proxies keep serving with
//! the trust they had until they reconnect to another replica, which then counts them.
//! `rollout.ackTimeout` bounds every wait, as it does for this replica's own proxies.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// Per mesh, per MeshService: SPIFFE IDs.
pub type PresentedIds = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// One trust-bundle entry of a mesh, as replicas name it to each other.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TrustEntry {
    /// The trust domain the entry is published for.
    pub trust_domain: String,
    /// The CA's id (SHA-256 of its signing certificate).
    pub ca: String,
}

/// A CA that a replica's connected proxies present certificates from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PresentedCa {
    /// The mesh whose bundles carry it.
    pub mesh: String,
    /// The trust domain of the certificates.
    pub trust_domain: String,
    /// The CA's id.
    pub ca: String,
    /// Its trust anchors, PEM: a peer keeps any entry that carries one of them.
    pub anchors: Vec<String>,
    /// How many proxies present it.
    pub proxies: usize,
    /// The first of them by name, for operators.
    pub named: Vec<String>,
}

/// What one replica reports to the others about its rollouts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateView {
    /// Per mesh whose trust the replica publishes: the entries every stream of it that carries that
    /// trust has ACKed. A mesh it publishes with no entry ACKed is present with an empty set.
    pub trust_acked: BTreeMap<String, BTreeSet<TrustEntry>>,
    /// Per mesh, per `meshservice:` context the replica publishes: the SPIFFE IDs every stream
    /// subscribed to it has ACKed.
    pub sans_acked: PresentedIds,
    /// The CAs its connected proxies present, including those of certificates replaced but not
    /// yet ACKed.
    pub presented: Vec<PresentedCa>,
    /// Per mesh, per local MeshService: the SPIFFE IDs its connected proxies present.
    pub presented_ids: PresentedIds,
}

/// Another live replica, as its last view says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerView {
    /// Its `replica.name`.
    pub replica: String,
    /// Its view; `None` when it has not written one yet or it cannot be read: then it holds every
    /// step back.
    pub view: Option<GateView>,
    /// Its lease expired: this is its last view, which still holds what it held (its proxies keep
    /// the trust they had until they reconnect to another replica) for another `replica.leaseTimeout`.
    pub gone: bool,
}

impl PeerView {
    /// How the peer is named in a wait's list.
    pub(crate) fn label(&self) -> String {
        match self.view {
            Some(_) if self.gone => {
                format!("replica {} (gone: as its last state said)", self.replica)
            }
            Some(_) => format!("replica {}", self.replica),
            None => format!("replica {} (rollout state not readable)", self.replica),
        }
    }

    /// Whether the peer holds back issuing from the CA of `entry` in `mesh`: it publishes the mesh's
    /// trust and its streams have not all ACKed that entry.
    pub(crate) fn holds_trust(&self, mesh: &str, entry: &TrustEntry) -> bool {
        let Some(view) = &self.view else { return true };
        view.trust_acked
            .get(mesh)
            .is_some_and(|acked| !acked.contains(entry))
    }

    /// Whether the peer holds back presenting `spiffe_id` for `service` of `mesh`: it publishes the
    /// service's context and its subscribers have not all ACKed the ID.
    pub(crate) fn holds_san(&self, mesh: &str, service: &str, spiffe_id: &str) -> bool {
        let Some(view) = &self.view else { return true };
        view.sans_acked
            .get(mesh)
            .and_then(|services| services.get(service))
            .is_some_and(|acked| !acked.contains(spiffe_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ca: &str) -> TrustEntry {
        TrustEntry {
            trust_domain: "default".into(),
            ca: ca.into(),
        }
    }

    #[test]
    fn a_peer_holds_trust_only_for_meshes_it_publishes() {
        let mut view = GateView::default();
        view.trust_acked
            .insert("default".into(), BTreeSet::from([entry("ca-1")]));
        let peer = PeerView {
            replica: "b".into(),
            view: Some(view),
            gone: false,
        };
        assert!(!peer.holds_trust("default", &entry("ca-1")));
        assert!(peer.holds_trust("default", &entry("ca-2")), "not ACKed");
        assert!(!peer.holds_trust("other", &entry("ca-2")), "not its mesh");
        let unreadable = PeerView {
            replica: "c".into(),
            view: None,
            gone: false,
        };
        assert!(unreadable.holds_trust("other", &entry("ca-2")));
        assert!(unreadable.holds_san("other", "web", "spiffe://other/web"));
    }

    #[test]
    fn a_peer_holds_an_id_only_for_contexts_it_publishes() {
        let mut view = GateView::default();
        view.sans_acked.entry("default".into()).or_default().insert(
            "web".into(),
            BTreeSet::from(["spiffe://default/web".to_owned()]),
        );
        let peer = PeerView {
            replica: "b".into(),
            view: Some(view),
            gone: false,
        };
        assert!(!peer.holds_san("default", "web", "spiffe://default/web"));
        assert!(peer.holds_san("default", "web", "spiffe://default/ns/web"));
        assert!(!peer.holds_san("default", "api", "spiffe://default/api"));
    }
}
