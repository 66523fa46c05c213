//! The trust vocabulary shared by the bundles, the rollout gate, the zone egress and the status: whose
//! bundles carry a CA ([`BundleKey`]), a CA as they carry it ([`CaTrust`]), how the gate tells CAs and
//! `meshservice:` contexts apart ([`TrustKey`], [`ServiceKey`]).
//!
//! A leaf: it names things, and decides nothing.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use meshca_ca::{CertificateAuthority, TrustAnchor};
use meshca_identity::TrustDomain;
use serde::{Deserialize, Serialize};

use crate::snapshot::KeyHasher;

/// How the zone egress bundle is named wherever a mesh name could stand (status documents, `meshca
/// status`, metric labels, logs, what replicas tell each other): not a valid mesh name, so it never
/// collides with one.
const EGRESS_BUNDLE_NAME: &str = "(zone egress)";

/// The service name under which the egress's SPIFFE IDs are gated (SANs before identity), and the
/// service of a legacy egress certificate (`spiffe://<mesh>/zone-egress`).
pub const EGRESS_SERVICE: &str = "zone-egress";

/// A mesh's name, as the accepted configuration defines it (validated when its files were read).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MeshName(Arc<str>);

impl MeshName {
    /// The name of a mesh the configuration (or a proxy's verified token) names.
    pub fn new(name: impl Into<Arc<str>>) -> MeshName {
        MeshName(name.into())
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MeshName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<&str> for MeshName {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl std::borrow::Borrow<str> for MeshName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// A CA's id: the SHA-256 of its signing certificate (or, for a MeshTrust certificate, of that
/// certificate), lowercase hex, as `meshca-ca` computes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CaId(String);

impl CaId {
    /// An id `meshca-ca` computed (or a replica recorded from one).
    pub fn new(id: impl Into<String>) -> CaId {
        CaId(id.into())
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for CaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for CaId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

/// Whose bundles carry a CA: one mesh's (`system_trust_bundle_<mesh>` and the contexts built on it), or
/// the zone egress bundle (`system_trust_bundle_egress`), which carries the egress identity's CAs only.
///
/// Displayed, serialised and ordered as its name: the mesh's, or `(zone egress)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BundleKey {
    /// A mesh's bundles.
    Mesh(MeshName),
    /// The zone egress bundle.
    Egress,
}

impl BundleKey {
    /// The bundles of the mesh named `name`.
    pub fn mesh(name: impl Into<Arc<str>>) -> BundleKey {
        BundleKey::Mesh(MeshName::new(name))
    }

    /// Reads a name written by [`Self::as_str`] (in what a replica tells the others).
    pub fn from_name(name: &str) -> BundleKey {
        match name {
            EGRESS_BUNDLE_NAME => BundleKey::Egress,
            _ => BundleKey::mesh(name),
        }
    }

    /// Its name: the mesh's, or `(zone egress)`.
    pub fn as_str(&self) -> &str {
        match self {
            BundleKey::Mesh(mesh) => mesh.as_str(),
            BundleKey::Egress => EGRESS_BUNDLE_NAME,
        }
    }

    /// The mesh, unless it is the egress bundle.
    pub fn mesh_name(&self) -> Option<&MeshName> {
        match self {
            BundleKey::Mesh(mesh) => Some(mesh),
            BundleKey::Egress => None,
        }
    }

    /// Whether it is the bundle of the mesh named `name`.
    pub fn is_mesh(&self, name: &str) -> bool {
        self.mesh_name().is_some_and(|m| m.as_str() == name)
    }
}

impl fmt::Display for BundleKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Ord for BundleKey {
    /// By name, as the plain mesh names were ordered before the egress bundle had a type of its own.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for BundleKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for BundleKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for BundleKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<BundleKey, D::Error> {
        let name = String::deserialize(deserializer)?;
        Ok(BundleKey::from_name(&name))
    }
}

/// A CA as it appears in a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaTrust {
    /// Whose bundles carry it.
    pub bundle: BundleKey,
    /// The CA's id (SHA-256 of its signing certificate).
    pub ca_id: CaId,
    /// The trust domain it signs for.
    pub trust_domain: TrustDomain,
    /// Its trust anchors, PEM (shared with the CA, not copied per proxy).
    pub pems: Arc<[String]>,
    /// Its subject, for operators.
    pub subject: String,
}

impl CaTrust {
    /// A CA as `bundle` carries it for `trust_domain`.
    pub fn of_ca(
        bundle: BundleKey,
        trust_domain: &TrustDomain,
        ca: &CertificateAuthority,
    ) -> CaTrust {
        CaTrust {
            bundle,
            ca_id: CaId::new(ca.id()),
            trust_domain: trust_domain.clone(),
            pems: ca.bundle_pems(),
            subject: ca.subject().to_owned(),
        }
    }

    /// A MeshTrust certificate as `bundle` carries it for `trust_domain`.
    pub fn of_anchor(
        bundle: BundleKey,
        trust_domain: &TrustDomain,
        anchor: &TrustAnchor,
    ) -> CaTrust {
        CaTrust {
            bundle,
            ca_id: CaId::new(anchor.id.clone()),
            trust_domain: trust_domain.clone(),
            pems: Arc::from(vec![anchor.pem.clone()]),
            subject: anchor.subject.clone(),
        }
    }

    /// Its key in the gate.
    pub(crate) fn key(&self) -> TrustKey {
        TrustKey {
            bundle: self.bundle.clone(),
            trust_domain: self.trust_domain.clone(),
            ca: self.ca_id.clone(),
        }
    }

    /// Whether certificates of the CA with id `ca_id` and trust anchors `anchors` chain to this entry:
    /// it is that CA, or it carries one of those anchors.
    pub(crate) fn covers(&self, ca_id: &str, anchors: &[String]) -> bool {
        self.ca_id == *ca_id || self.pems.iter().any(|p| anchors.contains(p))
    }
}

/// What the gate tells CAs apart by: one CA published for two trust domains, or in two bundles, is two
/// entries, each ordered on its own. Ordered by bundle, then trust domain, then id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct TrustKey {
    /// Whose bundles carry it.
    pub bundle: BundleKey,
    /// The trust domain it is published for.
    pub trust_domain: TrustDomain,
    /// The CA's id.
    pub ca: CaId,
}

/// A set of CAs told apart as the gate does, looked up without allocating (once per certificate taken
/// in during a wave).
#[derive(Debug, Default)]
pub(crate) struct TrustKeys(HashMap<CaId, Vec<(BundleKey, TrustDomain)>, KeyHasher>);

impl TrustKeys {
    /// Whether `ca` (by bundle, trust domain and id) is in the set.
    pub(crate) fn contains(&self, ca: &CaTrust) -> bool {
        self.0.get(&ca.ca_id).is_some_and(|entries| {
            entries
                .iter()
                .any(|(bundle, td)| *bundle == ca.bundle && *td == ca.trust_domain)
        })
    }
}

impl<'a> FromIterator<&'a CaTrust> for TrustKeys {
    fn from_iter<I: IntoIterator<Item = &'a CaTrust>>(cas: I) -> TrustKeys {
        let mut set = TrustKeys::default();
        for ca in cas {
            if !set.contains(ca) {
                set.0
                    .entry(ca.ca_id.clone())
                    .or_default()
                    .push((ca.bundle.clone(), ca.trust_domain.clone()));
            }
        }
        set
    }
}

/// The trust domain a mesh's legacy backends issue in: the mesh's name. A mesh name is a DNS-1123
/// name (checked when its file was read), which is always a valid trust domain; were it not, the
/// backends could issue nothing either (their SPIFFE IDs would not parse), and their CAs are published
/// for no trust domain.
pub(crate) fn legacy_trust_domain(mesh: &str) -> Option<TrustDomain> {
    TrustDomain::parse(mesh).ok()
}

/// A `meshservice:` context: a MeshService of a mesh, or the SAN matchers of the zone egress bundle
/// ([`ServiceKey::egress`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// The mesh (or the egress bundle).
    pub bundle: BundleKey,
    /// The MeshService name ([`EGRESS_SERVICE`] for the egress).
    pub service: String,
}

impl ServiceKey {
    /// The MeshService `service` of `mesh`.
    pub fn new(mesh: impl Into<Arc<str>>, service: impl Into<String>) -> ServiceKey {
        ServiceKey {
            bundle: BundleKey::mesh(mesh),
            service: service.into(),
        }
    }

    /// The zone egress's SPIFFE IDs, as the egress bundle's SAN matchers carry them.
    pub fn egress() -> ServiceKey {
        ServiceKey {
            bundle: BundleKey::Egress,
            service: EGRESS_SERVICE.to_owned(),
        }
    }
}

/// Every `meshservice:` context → the exact SPIFFE IDs its proxies present.
pub type ServiceIds = HashMap<ServiceKey, BTreeSet<String>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(mesh: &str, trust_domain: &str, ca_id: &str) -> CaTrust {
        CaTrust {
            bundle: BundleKey::mesh(mesh),
            ca_id: CaId::new(ca_id),
            trust_domain: TrustDomain::parse(trust_domain).unwrap(),
            pems: Vec::new().into(),
            subject: format!("CN={ca_id}"),
        }
    }

    #[test]
    fn trust_keys_tell_cas_apart_by_mesh_trust_domain_and_id() {
        let set: TrustKeys = [ca("a", "a", "1"), ca("a", "x", "1"), ca("b", "b", "2")]
            .iter()
            .collect();
        assert!(set.contains(&ca("a", "a", "1")));
        assert!(set.contains(&ca("a", "x", "1")));
        assert!(set.contains(&ca("b", "b", "2")));
        assert!(!set.contains(&ca("b", "b", "1")), "another mesh");
        assert!(!set.contains(&ca("a", "y", "1")), "another trust domain");
        assert!(!set.contains(&ca("a", "a", "2")), "another CA");
        assert!(!TrustKeys::default().contains(&ca("a", "a", "1")));
    }

    #[test]
    fn the_egress_bundle_reads_as_before_and_round_trips() {
        assert_eq!(BundleKey::Egress.to_string(), "(zone egress)");
        assert_eq!(BundleKey::mesh("default").to_string(), "default");
        let json = serde_json::to_string(&[BundleKey::Egress, BundleKey::mesh("a")]).unwrap();
        assert_eq!(json, r#"["(zone egress)","a"]"#);
        let back: Vec<BundleKey> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [BundleKey::Egress, BundleKey::mesh("a")]);
        assert!(BundleKey::Egress < BundleKey::mesh("a"), "ordered by name");
    }
}
