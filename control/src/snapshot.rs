//! What SDS serves: an immutable view of the mesh, published by the owner through
//! `tokio::sync::watch` and read by every stream.
//!
//! Encodings derived from a trust bundle (SDS's protos) are built once per bundle and kept in
//! it ([`Derived`]), shared by every stream that serves it; so the owner reuses the same
//! `Arc<TrustBundle>` / `Arc<MeshServiceTrust>` across snapshots while their content does not
//! change.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, OnceLock};

use meshca_ca::WORKLOAD_LABEL;
use meshca_config::SERVICE_TAG;
use zeroize::Zeroizing;

use crate::error::ClaimMismatch;

/// Data consumers derive from an immutable value and keep with it, built on first use. SDS keeps its
/// encoded validation contexts here, the agent server its DER bundles; this crate never looks inside.
#[derive(Default)]
pub struct Derived([OnceLock<Box<dyn Any + Send + Sync>>; Derived::CONSUMERS]);

impl Derived {
    /// How many consumer types one value keeps data for.
    const CONSUMERS: usize = 3;

    /// The consumer's `T`, created with `T::default()` on first use. `None` when every place is
    /// taken by other types (the consumer then works without a cache).
    pub fn get_or_default<T: Any + Send + Sync + Default>(&self) -> Option<&T> {
        self.0
            .iter()
            .find_map(|slot| slot.get_or_init(|| Box::new(T::default())).downcast_ref())
    }
}

impl fmt::Debug for Derived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let built = self.0.iter().filter(|slot| slot.get().is_some()).count();
        write!(f, "Derived({built} built)")
    }
}

pub use crate::proxy_key::{KeyHasher, ProxyHashMap, ProxyHashSet, ProxyKey, ProxyMap};

/// Everything SDS serves, at one point in time. Immutable once published.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Increases with every publish; reported back in ACK events so the owner can tell
    /// which state a proxy holds.
    pub generation: u64,
    /// Every proxy the owner knows, and whether its identity is ready.
    pub proxies: ProxyMap<ProxyEntry>,
    /// Per mesh: the trust it serves and the SAN rules of its MeshServices.
    pub meshes: Arc<HashMap<String, MeshView>>,
    /// The trust of every mesh and trust domain (`ALL`, `mesh_ca:secret:all`).
    pub all: Arc<TrustBundle>,
    /// `system_trust_bundle_egress`: the CAs that validate the zone egress identity and the egress's
    /// SPIFFE IDs as SAN matchers, if an egress identity exists.
    pub egress: Option<Arc<MeshServiceTrust>>,
    /// What a token must not contradict to be served as a proxy (its Dataplane resource, or
    /// the token that registered it). Checked by every stream against its own token, so a
    /// token claiming other labels never receives the proxy's secrets.
    pub claim_rules: ProxyMap<Arc<ClaimRule>>,
    /// The Workload API's registrations: which local callers act as which Dataplane.
    pub registrations: Arc<crate::workloads::Registrations>,
    /// What changed since an earlier generation, so that SDS wakes only the streams it concerns.
    pub changed: Changed,
}

/// What a snapshot changed relative to generation `since`, and what the snapshots before it changed.
///
/// SDS reads snapshots from a `watch` channel, which keeps only the newest: a reader that falls behind
/// (its task waits on a busy runtime while the owner publishes twice) never sees some of them. The
/// snapshots it missed are remembered here, within bounds, so that it still learns which proxies they
/// touched instead of having to assume that anything may have changed.
#[derive(Debug, Clone, Default)]
pub struct Changed {
    /// The generation this snapshot was compared with.
    pub since: u64,
    /// `Some`: only these proxies' entries and claim rules changed, and every bundle and context is the
    /// very object generation `since` served, as is the registration table unless `registrations` says
    /// otherwise. `None`: anything may have changed.
    pub proxies: Option<Arc<[ProxyKey]>>,
    /// With `proxies`: the Workload API's registration table changed too. Only the streams that match
    /// callers against it need to look at it; the proxies whose registrations changed are among
    /// `proxies`.
    pub registrations: bool,
    /// The publishes that led to generation `since`, newest first: as many as [`HISTORY_STEPS`] and
    /// [`HISTORY_KEYS`] allow, and none from before a publish that may have changed anything.
    earlier: Arc<[Step]>,
}

/// How many earlier publishes a snapshot remembers.
const HISTORY_STEPS: usize = 64;
/// How many proxy keys it remembers over all of them. A reader further behind wakes every stream.
const HISTORY_KEYS: usize = 1 << 16;

/// One earlier publish: generation `generation` changed only `proxies` relative to generation `since`.
#[derive(Debug, Clone)]
struct Step {
    generation: u64,
    since: u64,
    proxies: Arc<[ProxyKey]>,
    registrations: bool,
}

impl Changed {
    /// The change of a snapshot published right after `previous`: only `proxies` changed, or (`None`)
    /// anything may have. It remembers what `previous` and the snapshots before it changed.
    pub fn after(previous: &Snapshot, proxies: Option<Arc<[ProxyKey]>>) -> Changed {
        let last = previous.changed.proxies.as_ref().map(|keys| Step {
            generation: previous.generation,
            since: previous.changed.since,
            proxies: keys.clone(),
            registrations: previous.changed.registrations,
        });
        let mut kept_keys = 0;
        let earlier = last
            .into_iter()
            .chain(previous.changed.earlier.iter().cloned())
            .take(HISTORY_STEPS)
            .take_while(|step| {
                kept_keys += step.proxies.len();
                kept_keys <= HISTORY_KEYS
            })
            .collect();
        Changed {
            since: previous.generation,
            proxies,
            registrations: false,
            earlier,
        }
    }

    /// The change of a snapshot published right after `previous` that changed only `proxies` and the
    /// registration table.
    pub fn with_registrations(previous: &Snapshot, proxies: Arc<[ProxyKey]>) -> Changed {
        Changed {
            registrations: true,
            ..Changed::after(previous, Some(proxies))
        }
    }

    /// The proxies whose entries or claim rules may differ between generation `seen` and this
    /// snapshot, when that is known to be only some: this change and the remembered ones before it lead
    /// back to `seen`, and none of them may have changed anything, the registration table included. A
    /// key may come more than once.
    pub fn proxies_since(&self, seen: u64) -> Option<impl Iterator<Item = &ProxyKey>> {
        match self.since(seen)? {
            (keys, false) => Some(keys),
            (_, true) => None,
        }
    }

    /// As [`Changed::proxies_since`], except that a changed registration table is said (true) rather
    /// than counted as anything: for waking streams, only those that match callers against it look.
    pub fn since(&self, seen: u64) -> Option<(impl Iterator<Item = &ProxyKey>, bool)> {
        let newest = self.proxies.as_deref()?;
        let (mut since, mut steps) = (self.since, 0);
        while since != seen {
            let step = self.earlier.get(steps).filter(|s| s.generation == since)?;
            since = step.since;
            steps += 1;
        }
        let earlier = &self.earlier[..steps];
        let registrations = self.registrations || earlier.iter().any(|s| s.registrations);
        let keys = newest
            .iter()
            .chain(earlier.iter().flat_map(|s| s.proxies.iter()));
        Some((keys, registrations))
    }
}

/// The labels and services a proxy was given; a token may claim a subset, never other
/// values.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimRule {
    /// The proxy's labels.
    pub labels: meshca_auth::Labels,
    /// The `kuma.io/service` of each of its inbounds.
    pub services: Vec<String>,
}

impl ClaimRule {
    /// Why `claims` contradict the rule, if they do. The implicit `kuma.io/workload` label
    /// (the proxy name) is not a claim.
    pub fn check(&self, claims: &meshca_auth::Claims) -> Result<(), ClaimMismatch> {
        for (k, v) in claims.labels.iter() {
            if k == WORKLOAD_LABEL && v == &claims.name {
                continue;
            }
            match self.labels.get(k) {
                Some(given) if given == v => {}
                Some(given) => {
                    return Err(ClaimMismatch::LabelValue {
                        label: k.clone(),
                        value: v.clone(),
                        given: given.clone(),
                    })
                }
                None => {
                    return Err(ClaimMismatch::UnknownLabel {
                        label: k.clone(),
                        value: v.clone(),
                    })
                }
            }
        }
        if let Some(service) = claims.tags.get(SERVICE_TAG) {
            if !self.services.iter().any(|s| s == service) {
                return Err(ClaimMismatch::UnknownService {
                    service: service.clone(),
                });
            }
        }
        Ok(())
    }
}

/// The bundles and validation contexts of one snapshot, without its proxy tables: what a stream keeps
/// of the snapshot it last answered from, to answer a new subscription from the same state.
///
/// A stream that kept the whole snapshot would keep that generation's proxy tables alive for as long as
/// it stays idle. Every publish copies the part of the tables it changes, so a fleet whose streams were
/// last answered from a thousand different generations would hold a thousand partial copies: at
/// 100,000 streams, a quarter of the daemon's memory. The parts kept here are small: the bundles are
/// shared by every generation that serves the same trust, and the per-mesh map by every publish
/// between two full reconciles.
#[derive(Debug, Clone)]
pub struct TrustView {
    /// The snapshot's generation.
    pub generation: u64,
    /// Per mesh: the trust it serves and the SAN rules of its MeshServices.
    pub meshes: Arc<HashMap<String, MeshView>>,
    /// The trust of every mesh and trust domain.
    pub all: Arc<TrustBundle>,
    /// The zone egress bundle, if an egress identity exists.
    pub egress: Option<Arc<MeshServiceTrust>>,
}

impl Snapshot {
    /// Its bundles and validation contexts ([`TrustView`]), sharing them.
    pub fn trust_view(&self) -> TrustView {
        TrustView {
            generation: self.generation,
            meshes: self.meshes.clone(),
            all: self.all.clone(),
            egress: self.egress.clone(),
        }
    }

    /// A snapshot with nothing in it (generation 0): streams wait until the owner
    /// publishes something real.
    pub fn empty() -> Self {
        Self {
            generation: 0,
            proxies: ProxyMap::default(),
            meshes: Arc::default(),
            all: Arc::new(TrustBundle::new(BTreeMap::new())),
            egress: None,
            claim_rules: ProxyMap::default(),
            registrations: Arc::default(),
            changed: Changed::default(),
        }
    }
}

/// What one mesh serves.
#[derive(Debug, Clone)]
pub struct MeshView {
    /// Every CA trusted in this mesh (`system_trust_bundle`, `ROOTCA`, ...).
    pub trust: Arc<TrustBundle>,
    /// `meshservice:<name>` validation contexts, by MeshService name.
    pub mesh_services: HashMap<String, Arc<MeshServiceTrust>>,
    /// The bundles of the federated trust domains the mesh trusts (their X.509 authorities are in
    /// `trust`; their JWT authorities go to the Workload API's JWT bundles and validation).
    pub federated: Arc<[Arc<meshca_federation::SpiffeBundle>]>,
}

/// A set of CA certificates grouped by trust domain.
///
/// The content is fixed at construction so that the validation contexts derived from it
/// can be cached inside and shared by every stream.
pub struct TrustBundle {
    by_trust_domain: BTreeMap<String, Vec<String>>,
    derived: Derived,
}

impl TrustBundle {
    /// Builds a bundle: trust domain → PEM certificates, one certificate per string.
    pub fn new(by_trust_domain: BTreeMap<String, Vec<String>>) -> Self {
        Self {
            by_trust_domain,
            derived: Derived::default(),
        }
    }

    /// Trust domain → PEM certificates (one certificate per string).
    pub fn by_trust_domain(&self) -> &BTreeMap<String, Vec<String>> {
        &self.by_trust_domain
    }

    /// True when the bundle holds no certificate at all.
    pub fn is_empty(&self) -> bool {
        self.by_trust_domain.values().all(Vec::is_empty)
    }

    /// What consumers derived from this bundle.
    pub fn derived(&self) -> &Derived {
        &self.derived
    }
}

impl fmt::Debug for TrustBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let counts: BTreeMap<&str, usize> = self
            .by_trust_domain
            .iter()
            .map(|(td, pems)| (td.as_str(), pems.len()))
            .collect();
        f.debug_struct("TrustBundle")
            .field("certificates_by_trust_domain", &counts)
            .finish()
    }
}

/// The validation context of one MeshService: the mesh trust plus the exact SPIFFE IDs
/// its endpoints may present.
pub struct MeshServiceTrust {
    trust: Arc<TrustBundle>,
    spiffe_ids: BTreeSet<String>,
    derived: Derived,
}

impl MeshServiceTrust {
    /// Builds the context from the trust to use and the SPIFFE IDs to accept (each becomes
    /// an exact URI SAN matcher).
    pub fn new(trust: Arc<TrustBundle>, spiffe_ids: BTreeSet<String>) -> Self {
        Self {
            trust,
            spiffe_ids,
            derived: Derived::default(),
        }
    }

    /// The trust bundle of this context.
    pub fn trust(&self) -> &Arc<TrustBundle> {
        &self.trust
    }

    /// The accepted SPIFFE IDs.
    pub fn spiffe_ids(&self) -> &BTreeSet<String> {
        &self.spiffe_ids
    }

    /// What consumers derived from this context.
    pub fn derived(&self) -> &Derived {
        &self.derived
    }
}

impl fmt::Debug for MeshServiceTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MeshServiceTrust")
            .field("trust", &self.trust)
            .field("spiffe_ids", &self.spiffe_ids)
            .finish()
    }
}

/// Where a proxy stands in the owner's view.
#[derive(Debug, Clone)]
pub enum ProxyEntry {
    /// The proxy's identity is ready to serve.
    Ready(Arc<ProxyIdentity>),
    /// The proxy's identity is being prepared (for example a new CA waits for its trust to be
    /// ACKed): streams wait. A proxy absent from the snapshot is pending too.
    Pending,
    /// The proxy gets no identity (for example its SPIFFE ID template did not render):
    /// trust resources are still served, identity resources are not.
    NoIdentity {
        /// Why, for logs and status.
        reason: String,
    },
    /// The proxy's token contradicts what the resource files say about it: its streams
    /// are refused with `PERMISSION_DENIED`.
    Refused {
        /// Why, sent to the proxy and logged.
        reason: String,
    },
}

/// A proxy's X.509-SVID, ready to serve.
#[derive(Debug, Clone)]
pub struct ProxyIdentity {
    /// The SPIFFE ID in the certificate; also a resource name for this identity.
    pub spiffe_id: String,
    /// The name of the MeshIdentity that issued it, if any; also a resource name.
    pub identity_name: Option<String>,
    /// PEM: the leaf followed by any intermediates (not the root).
    pub chain_pem: String,
    /// The leaf's private key, or who holds it.
    pub key: LeafKey,
}

/// A leaf certificate's private key, or who holds it.
#[derive(Debug, Clone)]
pub enum LeafKey {
    /// meshca made the key and serves it with the certificate (PEM, PKCS#8).
    Held(SecretPem),
    /// A `meshca agent` made the key on its host and keeps it there; meshca certified its public half
    /// and can serve the certificate to that agent only.
    Agent(Arc<meshca_ca::PublicKey>),
}

impl LeafKey {
    /// The private key, when meshca holds it.
    pub fn held(&self) -> Option<&SecretPem> {
        match self {
            LeafKey::Held(pem) => Some(pem),
            LeafKey::Agent(_) => None,
        }
    }
}

impl ProxyIdentity {
    /// The trust domain of its SPIFFE ID.
    pub fn trust_domain(&self) -> &str {
        trust_domain_of(&self.spiffe_id)
    }
}

/// The trust domain of a SPIFFE ID meshca issued: what follows `spiffe://`, up to the path.
pub fn trust_domain_of(spiffe_id: &str) -> &str {
    let rest = spiffe_id.strip_prefix("spiffe://").unwrap_or(spiffe_id);
    rest.split('/').next().unwrap_or(rest)
}

/// A PEM-encoded private key: zeroized on drop, never printed, never serialized.
#[derive(Clone)]
pub struct SecretPem(Zeroizing<String>);

impl SecretPem {
    /// Takes ownership of the PEM text.
    pub fn new(pem: String) -> Self {
        Self(Zeroizing::new(pem))
    }

    /// The PEM text. Copy it as little as possible.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trust_domain_is_the_host_of_the_id() {
        assert_eq!(trust_domain_of("spiffe://example.org/w/x"), "example.org");
        assert_eq!(trust_domain_of("spiffe://example.org"), "example.org");
    }

    #[test]
    fn secret_pem_debug_is_redacted() {
        let key = SecretPem::new("-----BEGIN PRIVATE KEY-----\nabc\n".into());
        assert_eq!(format!("{key:?}"), "[redacted]");
        let identity = ProxyIdentity {
            spiffe_id: "spiffe://td/x".into(),
            identity_name: None,
            chain_pem: String::new(),
            key: LeafKey::Held(key),
        };
        assert!(!format!("{identity:?}").contains("abc"));
    }

    /// The snapshot published after `previous`, changing only `keys` (`None`: anything).
    fn next(previous: &Snapshot, keys: Option<Vec<ProxyKey>>) -> Snapshot {
        let mut snapshot = previous.clone();
        snapshot.changed = Changed::after(previous, keys.map(Into::into));
        snapshot.generation = previous.generation + 1;
        snapshot
    }

    fn since(snapshot: &Snapshot, seen: u64) -> Option<BTreeSet<String>> {
        let keys = snapshot.changed.proxies_since(seen)?;
        Some(keys.map(|k| k.to_string()).collect())
    }

    fn names(names: &[&str]) -> Option<BTreeSet<String>> {
        Some(names.iter().map(|n| format!("m.{n}")).collect())
    }

    #[test]
    fn a_changed_registration_table_is_said_apart_from_the_proxies() {
        let (a, b) = (ProxyKey::new("m", "a"), ProxyKey::new("m", "b"));
        let first = next(&Snapshot::empty(), None);
        let mut second = next(&first, None);
        second.changed = Changed::with_registrations(&first, Arc::from(vec![a.clone()]));
        let third = next(&second, Some(vec![b.clone()]));
        // For waking: the keys, and that the table changed, also when read from further back.
        let (keys, registrations) = second.changed.since(first.generation).expect("known");
        assert_eq!(keys.cloned().collect::<Vec<_>>(), std::slice::from_ref(&a));
        assert!(registrations);
        let (keys, registrations) = third.changed.since(first.generation).expect("known");
        assert_eq!(keys.cloned().collect::<Vec<_>>(), [b.clone(), a]);
        assert!(registrations);
        // From after it, only b changed.
        let (_, registrations) = third.changed.since(second.generation).expect("known");
        assert!(!registrations);
        assert_eq!(since(&third, second.generation), names(&["b"]));
        // For anyone reading only the proxies, a changed table is a change of anything.
        assert_eq!(since(&second, first.generation), None);
        assert_eq!(since(&third, first.generation), None);
    }

    #[test]
    fn a_reader_that_missed_snapshots_learns_what_they_changed() {
        let (a, b, c) = (
            ProxyKey::new("m", "a"),
            ProxyKey::new("m", "b"),
            ProxyKey::new("m", "c"),
        );
        let first = next(&Snapshot::empty(), None);
        let second = next(&first, Some(vec![a.clone()]));
        let third = next(&second, Some(vec![b.clone()]));
        let fourth = next(&third, Some(vec![a.clone(), c]));
        assert_eq!(since(&fourth, 3), names(&["a", "c"]));
        assert_eq!(since(&fourth, 2), names(&["a", "b", "c"]));
        assert_eq!(since(&fourth, 1), names(&["a", "b", "c"]));
        // Before the first, anything may have changed; and a generation the chain does not pass
        // through tells nothing.
        assert_eq!(since(&fourth, 0), None);
        assert_eq!(since(&fourth, 7), None);
        // A publish that may have changed anything hides everything before it.
        let fifth = next(&fourth, None);
        let sixth = next(&fifth, Some(vec![b]));
        assert_eq!(since(&sixth, 5), names(&["b"]));
        assert_eq!(since(&sixth, 4), None);
        assert_eq!(since(&fifth, 4), None);
    }

    #[test]
    fn the_memory_of_earlier_publishes_is_bounded() {
        let a = ProxyKey::new("m", "a");
        let mut snapshot = next(&Snapshot::empty(), None);
        let start = snapshot.generation;
        for _ in 0..HISTORY_STEPS + 1 {
            snapshot = next(&snapshot, Some(vec![a.clone()]));
        }
        // The newest change plus HISTORY_STEPS remembered ones reach back exactly to the start.
        assert_eq!(since(&snapshot, start), names(&["a"]));
        snapshot = next(&snapshot, Some(vec![a.clone()]));
        assert_eq!(since(&snapshot, start), None, "one step too many");
        assert_eq!(since(&snapshot, start + 1), names(&["a"]));

        // So is the number of keys: a publish of more than HISTORY_KEYS is not remembered at all.
        let many: Vec<ProxyKey> = (0..=HISTORY_KEYS)
            .map(|i| ProxyKey::new("m", i.to_string()))
            .collect();
        let big = next(&snapshot, Some(many.clone()));
        let after_big = next(&big, Some(vec![a]));
        assert_eq!(
            since(&big, snapshot.generation).map(|k| k.len()),
            Some(many.len())
        );
        assert_eq!(since(&after_big, snapshot.generation), None);
        assert_eq!(since(&after_big, big.generation), names(&["a"]));
    }

    #[test]
    fn derived_keeps_one_value_per_consumer_type_up_to_its_places() {
        #[derive(Default)]
        struct A(std::sync::atomic::AtomicU32);
        #[derive(Default)]
        struct B(u8);
        #[derive(Default)]
        struct C(u16);
        #[derive(Default)]
        struct D;
        let derived = Derived::default();
        let a = derived.get_or_default::<A>().expect("a place for A");
        a.0.store(7, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(derived.get_or_default::<B>().map(|b| b.0), Some(0));
        assert_eq!(derived.get_or_default::<C>().map(|c| c.0), Some(0));
        let again = derived.get_or_default::<A>().expect("A is kept");
        assert_eq!(
            again.0.load(std::sync::atomic::Ordering::Relaxed),
            7,
            "the same A"
        );
        assert!(
            derived.get_or_default::<D>().is_none(),
            "every place is taken"
        );
        assert_eq!(format!("{derived:?}"), "Derived(3 built)");
    }

    #[test]
    fn node_id_joins_mesh_and_name() {
        assert_eq!(ProxyKey::new("default", "web-1").node_id(), "default.web-1");
    }
}
