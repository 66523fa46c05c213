//! What an agent is sent: its registrations with their identities, and every bundle, built from one
//! snapshot (pure: no I/O, no events). A stream compares what a state would be built from
//! ([`Fingerprint`]) before building it, and builds again only the registrations whose part changed: a
//! snapshot reaches every agent's stream, and most leave most of an agent's state as it was.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use meshca_ca::PublicKey;
use meshca_control::{LeafKey, ProxyEntry, ProxyIdentity, Registration, Snapshot, TrustBundle};
use meshca_identity::KeyAlgorithm;
use meshca_workload::jwt_keys::KeySet;

use crate::proto::{self, AgentState, Identity, MeshTrust, X509Bundle};

/// What one registration's part of a state is built from. Compared by pointer (the reason by its text,
/// the offered key by its bits):
/// equal sources build equal parts, so a part is built again only when its source changed. It holds what
/// it points at, so that an address it compares cannot be freed and reused by other content.
#[derive(Clone)]
pub(crate) struct Source {
    registration: Arc<Registration>,
    /// The last key the agent offered for the registration.
    offered: Option<Arc<PublicKey>>,
    entry: Entry,
}

#[derive(Clone)]
enum Entry {
    Ready(Arc<ProxyIdentity>),
    NoIdentity(String),
    Pending,
}

impl Source {
    /// The source of `registration`'s part in `snapshot`, with `offered` the key last offered for it.
    pub(crate) fn of(
        snapshot: &Snapshot,
        registration: &Arc<Registration>,
        offered: Option<&Arc<PublicKey>>,
    ) -> Source {
        let entry = match snapshot.proxies.get(&registration.proxy) {
            Some(ProxyEntry::Ready(identity)) => Entry::Ready(identity.clone()),
            Some(ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason }) => {
                Entry::NoIdentity(reason.clone())
            }
            Some(ProxyEntry::Pending) | None => Entry::Pending,
        };
        Source {
            registration: registration.clone(),
            offered: offered.cloned(),
            entry,
        }
    }
}

impl PartialEq for Source {
    fn eq(&self, other: &Source) -> bool {
        let entries = match (&self.entry, &other.entry) {
            (Entry::Ready(a), Entry::Ready(b)) => Arc::ptr_eq(a, b),
            (Entry::NoIdentity(a), Entry::NoIdentity(b)) => a == b,
            (Entry::Pending, Entry::Pending) => true,
            _ => false,
        };
        let offered = match (&self.offered, &other.offered) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || same_key(a, b),
            (None, None) => true,
            _ => false,
        };
        entries && offered && Arc::ptr_eq(&self.registration, &other.registration)
    }
}

/// The bundles of the trust domains a mesh federates with, as the snapshot holds them.
type Federated = Arc<[Arc<meshca_federation::SpiffeBundle>]>;

/// What a whole state is built from, compared by pointer as [`Source`] is: equal fingerprints mean
/// equal content.
#[derive(Clone)]
pub(crate) struct Fingerprint {
    sources: Vec<Source>,
    /// The trust of each mesh the registrations are in, in their order: its bundle, and the bundles of
    /// the trust domains it federates with.
    trust: Vec<(Arc<str>, Arc<TrustBundle>, Federated)>,
    all: Arc<TrustBundle>,
    jwt: Arc<KeySet>,
}

impl PartialEq for Fingerprint {
    fn eq(&self, other: &Fingerprint) -> bool {
        self.sources == other.sources
            && self.trust.len() == other.trust.len()
            && self
                .trust
                .iter()
                .zip(&other.trust)
                .all(|((m, a, f), (n, b, g))| m == n && Arc::ptr_eq(a, b) && Arc::ptr_eq(f, g))
            && Arc::ptr_eq(&self.all, &other.all)
            && Arc::ptr_eq(&self.jwt, &other.jwt)
    }
}

impl Fingerprint {
    /// The fingerprint of a state serving `sources` (in order) from `snapshot` and the JWT keys `jwt`.
    pub(crate) fn new(snapshot: &Snapshot, sources: Vec<Source>, jwt: Arc<KeySet>) -> Fingerprint {
        let mut trust: Vec<(Arc<str>, Arc<TrustBundle>, Federated)> = Vec::new();
        for source in &sources {
            let mesh = &source.registration.proxy.mesh;
            if trust.iter().any(|(m, _, _)| m == mesh) {
                continue;
            }
            if let Some(view) = snapshot.meshes.get(&**mesh) {
                trust.push((mesh.clone(), view.trust.clone(), view.federated.clone()));
            }
        }
        Fingerprint {
            sources,
            trust,
            all: snapshot.all.clone(),
            jwt,
        }
    }

    pub(crate) fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// The state, with version 0 (the stream numbers what it sends), from `registrations`: the parts
    /// of [`Self::sources`], in order, built by [`registration`].
    pub(crate) fn state(&self, registrations: Vec<proto::Registration>) -> AgentState {
        AgentState {
            version: 0,
            registrations,
            all: bundles(&self.all),
            meshes: self
                .trust
                .iter()
                .map(|(mesh, trust, federated)| {
                    let trust = MeshTrust {
                        by_trust_domain: bundles(trust),
                        federated: federated
                            .iter()
                            .map(|b| (b.trust_domain().to_string(), b.to_json()))
                            .collect(),
                    };
                    (mesh.to_string(), trust)
                })
                .collect(),
            jwt_bundles: self
                .jwt
                .by_trust_domain()
                .iter()
                .map(|(td, document)| (td.clone(), document.to_bytes()))
                .collect(),
        }
    }
}

/// A registration's part of the state, from its source.
pub(crate) fn registration(source: &Source, key_algorithm: KeyAlgorithm) -> proto::Registration {
    let r = &source.registration;
    let mut out = proto::Registration {
        mesh: r.proxy.mesh.to_string(),
        name: r.name.clone(),
        dataplane: r.proxy.name.to_string(),
        selectors: r.selectors.iter().map(ToString::to_string).collect(),
        hint: r.hint.clone().unwrap_or_default(),
        jwt_svid_seconds: r.jwt_svid_expiry.as_secs(),
        key_algorithm: key_algorithm.as_str().to_owned(),
        identity: None,
        no_identity: String::new(),
        wants_key: true,
    };
    let mut certified = None;
    match &source.entry {
        Entry::Ready(identity) => match &identity.key {
            LeafKey::Agent(key) => {
                certified = Some(key);
                match certificates_der(&identity.chain_pem) {
                    Ok(chain) => {
                        out.identity = Some(Identity {
                            spiffe_id: identity.spiffe_id.clone(),
                            certificate_chain: chain,
                            key_id: proto::key_id(key.raw()),
                        });
                    }
                    Err(error) => {
                        tracing::error!(mesh = %r.proxy.mesh, registration = %r.name, %error, "a registration's certificate chain does not parse; it is not sent to its agent");
                    }
                }
            }
            LeafKey::Held(_) => {
                // Issued before the registration named an agent: the owner replaces it with one over
                // the agent's key, which needs a key request.
                tracing::debug!(mesh = %r.proxy.mesh, registration = %r.name, "the registration's identity has a key meshca holds; none is sent to its agent until one over the agent's key is issued");
            }
        },
        Entry::NoIdentity(reason) => out.no_identity = reason.clone(),
        Entry::Pending => {}
    }
    // A key offered on this stream and not certified yet (the certificate is over another key, or
    // there is none) is the next certificate's: no other is needed.
    out.wants_key = match (&source.offered, certified) {
        (None, _) => true,
        (Some(offered), Some(key)) => same_key(offered, key),
        (Some(_), None) => false,
    };
    out
}

/// Whether two keys are the same key.
pub(crate) fn same_key(a: &PublicKey, b: &PublicKey) -> bool {
    a.algorithm() == b.algorithm() && a.raw() == b.raw()
}

/// A trust bundle as the protocol carries it: DER certificates by trust domain, decoded once per bundle
/// (kept in it, shared by every agent's stream). A certificate that does not parse is left out
/// (logged): the owner put only parsed certificates in the bundle.
fn bundles(bundle: &TrustBundle) -> HashMap<String, X509Bundle> {
    match bundle.derived().get_or_default::<DerBundles>() {
        Some(cache) => cache.0.get_or_init(|| decode_bundles(bundle)).clone(),
        None => decode_bundles(bundle),
    }
}

/// The DER form of a trust bundle, kept in it.
#[derive(Default)]
struct DerBundles(OnceLock<HashMap<String, X509Bundle>>);

fn decode_bundles(bundle: &TrustBundle) -> HashMap<String, X509Bundle> {
    bundle
        .by_trust_domain()
        .iter()
        .map(|(td, pems)| {
            let mut authorities = Vec::with_capacity(pems.len());
            for pem in pems {
                match certificates_der(pem) {
                    Ok(der) => authorities.extend(der),
                    Err(error) => {
                        tracing::error!(trust_domain = %td, %error, "a CA certificate of the bundle does not parse; it is not sent to agents");
                    }
                }
            }
            (td.clone(), X509Bundle { authorities })
        })
        .collect()
}

/// The DER of each certificate in PEM `text`.
fn certificates_der(text: &str) -> Result<Vec<Vec<u8>>, String> {
    let blocks = ::pem::parse_many(text).map_err(|e| e.to_string())?;
    blocks
        .into_iter()
        .map(|block| match block.tag() {
            "CERTIFICATE" => Ok(block.into_contents()),
            other => Err(format!("a {other} block where certificates belong")),
        })
        .collect()
}
