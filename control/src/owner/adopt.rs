//! Identities shared through the replicas' database. Every certificate this replica issues is handed
//! out to be recorded; a proxy that connects holding none from this replica is looked up, and the
//! identity another replica issued it is served until this replica issues its own. So a proxy that
//! moves from a dead replica gets its first response at once (the identity it already holds, with the
//! current trust) and the gate counts it from then on, instead of a proxy that receives nothing and
//! is counted by no one.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use super::{Issued, Leaf, Owner, Previous};
use crate::error::NotAdoptable;
use crate::plan::Issuer;
use crate::snapshot::{LeafKey, ProxyIdentity, ProxyKey, SecretPem};
use crate::trust::{BundleKey, CaId, CaTrust};

/// A certificate this replica issued, to be recorded for the other replicas.
#[derive(Clone)]
pub struct IssuedIdentity {
    /// The proxy.
    pub key: ProxyKey,
    /// The issuer as the status names it (`backend ca-2`, `MeshIdentity workloads`).
    pub issuer: String,
    /// The issuing CA's id.
    pub ca_id: String,
    /// The chain, PEM, leaf first.
    pub chain_pem: String,
    /// The private key; `None` when a `meshca agent` holds it (the certificate is over the agent's
    /// key, which never leaves its host, and is recorded without one).
    pub key_pem: Option<SecretPem>,
    /// When the leaf expires.
    pub not_after: SystemTime,
}

impl std::fmt::Debug for IssuedIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedIdentity")
            .field("key", &self.key)
            .field("issuer", &self.issuer)
            .field("ca_id", &self.ca_id)
            .finish_non_exhaustive()
    }
}

/// Where the owner hands issued identities and asks for recorded ones.
#[derive(Debug)]
pub struct RecordLink {
    /// Issued identities, a batch per wave of results.
    pub issued: mpsc::UnboundedSender<Vec<IssuedIdentity>>,
    /// Proxies to look up; the answers come back through [`Owner::adopt`].
    pub lookups: mpsc::UnboundedSender<ProxyKey>,
}

/// How long before its expiry an identity from another replica is no longer worth serving.
const ADOPT_MARGIN: Duration = Duration::from_secs(60);

impl Owner {
    /// Records every certificate issued from now on and looks proxies up through `link`.
    pub fn record_through(&mut self, link: RecordLink) {
        self.links.connect(link);
    }

    /// Asks for the identity another replica issued to `key`, if it connected holding none from
    /// this one.
    pub(super) fn look_up(&mut self, key: &ProxyKey) {
        if !self.issued.contains_key(key) {
            self.links.look_up(key);
        }
    }

    /// Takes in the answer for `key`: the identity another replica issued it (`None` when there is
    /// none, or it could not be read). Served while it is valid, chains to a CA the bundles carry, and
    /// this replica has issued the proxy nothing meanwhile; whether a reconcile must serve it.
    pub fn adopt(&mut self, key: ProxyKey, held: Option<IssuedIdentity>, now: SystemTime) -> bool {
        self.links.answered(&key);
        let Some(held) = held else { return false };
        if self.issued.contains_key(&key) || !self.proxies.streams.is_connected(&key) {
            return false;
        }
        match self.adoptable(&key, held, now) {
            Ok(issued) => {
                tracing::info!(proxy = %key, issuer = %issued.issuer, "serving the identity another replica issued to this proxy until this replica issues its own");
                self.signed
                    .signed(issued.ca_id.as_str(), issued.leaf.not_after);
                self.issued_cas
                    .extend(issued.presentable_cas().map(CaTrust::key));
                self.issued.insert(key.clone(), Box::new(issued));
                let previous = self.issued[&key].previous.clone();
                self.replacing.update(&key, &[], &previous);
                self.agenda.touched.insert(key);
                true
            }
            Err(why) => {
                tracing::debug!(proxy = %key, "not serving the identity another replica issued: {why}");
                false
            }
        }
    }

    fn adoptable(
        &self,
        key: &ProxyKey,
        held: IssuedIdentity,
        now: SystemTime,
    ) -> Result<Issued, NotAdoptable> {
        if held.not_after <= now + ADOPT_MARGIN {
            return Err(NotAdoptable::Expires);
        }
        let ca_trust = self
            .gate
            .published_ca(&BundleKey::mesh(key.mesh.clone()), &held.ca_id)
            .cloned()
            .ok_or(NotAdoptable::CaNotCarried)?;
        let chain: Vec<Vec<u8>> = pem::parse_many(&held.chain_pem)
            .map_err(|e| NotAdoptable::ChainUnreadable(e.to_string()))?
            .into_iter()
            .map(pem::Pem::into_contents)
            .collect();
        let info = meshca_ca::inspect_pem(held.chain_pem.as_bytes())
            .map_err(|e| NotAdoptable::ChainUnreadable(e.to_string()))?;
        let leaf = info.first().ok_or(NotAdoptable::EmptyChain)?;
        let spiffe_id = leaf
            .spiffe_ids
            .first()
            .and_then(|id| meshca_identity::SpiffeId::parse(id).ok())
            .ok_or(NotAdoptable::NoSpiffeId)?;
        let anchors: Vec<Vec<u8>> = ca_trust
            .pems
            .iter()
            .filter_map(|p| pem::parse(p).ok())
            .map(pem::Pem::into_contents)
            .collect();
        meshca_ca::verify_svid(&chain, &anchors, &spiffe_id, now)
            .map_err(|e| NotAdoptable::Unverified(e.to_string()))?;
        // A proxy an agent serves holds a certificate over the agent's key, recorded without it; any
        // other proxy's record carries the key meshca made.
        let leaf_key = match (held.key_pem, self.agent_served(key)) {
            (Some(key_pem), None) => {
                let private = meshca_ca::PrivateKey::from_pem(key_pem.expose().as_bytes())
                    .map_err(|e| NotAdoptable::KeyUnreadable(e.to_string()))?;
                if !meshca_ca::key_matches(&private, &chain[0]) {
                    return Err(NotAdoptable::KeyMismatch);
                }
                LeafKey::Held(key_pem)
            }
            (None, Some(_)) => {
                let public = meshca_ca::certificate_public_key(&chain[0])
                    .map_err(|e| NotAdoptable::KeyUnreadable(e.to_string()))?;
                LeafKey::Agent(Arc::new(public))
            }
            (None, None) => return Err(NotAdoptable::KeylessNotAgentServed),
            (Some(_), Some(agent)) => {
                return Err(NotAdoptable::HeldButAgentServed(agent.to_owned()))
            }
        };
        let issuer = match held.issuer.split_once(' ') {
            Some(("backend", name)) => Issuer::Backend(name.to_owned()),
            Some(("MeshIdentity", name)) => Issuer::MeshIdentity(name.to_owned()),
            _ => return Err(NotAdoptable::UnknownIssuer(held.issuer)),
        };
        let identity_name = match &issuer {
            Issuer::MeshIdentity(name) => Some(name.clone()),
            Issuer::Backend(_) => None,
        };
        // The proxy may still present what it held before this one (it may not have applied this
        // one yet): the CAs the bundles keep only for such proxies stay for it until it ACKs.
        let previous = self
            .gate
            .retained_in(&BundleKey::mesh(key.mesh.clone()))
            .filter(|ca| ca.ca_id != *held.ca_id)
            .map(|ca| Previous {
                ca_trust: ca.clone(),
                spiffe_id: spiffe_id.to_string(),
            })
            .collect();
        Ok(Issued {
            leaf: Leaf {
                spiffe_id: spiffe_id.clone(),
                not_after: held.not_after,
                serial: leaf.serial.clone(),
            },
            issuer,
            ca_id: CaId::new(held.ca_id),
            identity_name: identity_name.clone(),
            // This replica replaces it with its own as soon as the gate lets it.
            renew_at: now,
            regenerations: 0,
            published: Arc::new(ProxyIdentity {
                spiffe_id: spiffe_id.to_string(),
                identity_name,
                chain_pem: held.chain_pem,
                key: leaf_key,
            }),
            ca_trust,
            previous,
            // The proxy holds it already (another replica served it): it counts as presented.
            first_served_in: Some(0),
            issued_at: now,
        })
    }
}
