//! What the agent serves on its host: the servers' state, with the keys it holds, as the
//! [`Snapshot`] its local Workload API server reads.
//!
//! Per registration the agent holds the key of the certificate it serves and at most one key
//! requested for the next certificate. Each state from a server says which key the registration's
//! certificate certifies ([`crate::proto::Identity::key_id`]); the agent serves a certificate only
//! with the key it names, asks for a certificate at once when it holds no such key, and keeps one
//! key ahead so that a renewal never waits for a round trip.
//!
//! Bundles and identities whose content did not change keep the very `Arc` of the snapshot before:
//! the Workload API streams compare them by pointer to decide whether to send anything.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use meshca_ca::KeyAlgorithm;
use meshca_config::Selector;
use meshca_control::{
    Changed, LeafKey, MeshView, ProxyEntry, ProxyIdentity, ProxyKey, ProxyMap, Registration,
    Registrations, Snapshot, TrustBundle,
};

use crate::keys::{hex, WorkloadKey};
use crate::proto::{self, AgentState, KeyRequest};

/// A registration, as the protocol names it: its mesh and name.
pub(crate) type RegistrationId = (String, String);

/// A Dataplane: its mesh and name. Keys are held per Dataplane, since its registrations share one
/// identity: two registrations of one Dataplane (matching different processes) serve the same
/// certificate, and the same key.
type DataplaneId = (String, String);

fn dataplane_of(registration: &proto::Registration) -> DataplaneId {
    (registration.mesh.clone(), registration.dataplane.clone())
}

/// The identity a registration serves, with the key its certificate certifies.
struct Installed {
    key: WorkloadKey,
    identity: Arc<ProxyIdentity>,
    chain: Vec<Vec<u8>>,
}

/// A key sent for a certificate that has not come yet.
struct Pending {
    key: WorkloadKey,
    replace_now: bool,
    /// Sent on the current stream.
    sent: bool,
}

/// The keys of one Dataplane, which all its registrations serve.
#[derive(Default)]
struct Held {
    installed: Option<Installed>,
    pending: Option<Pending>,
}

/// What one registration looks like to an operator (`/api/status`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationStatus {
    /// Its mesh.
    pub mesh: String,
    /// Its name.
    pub name: String,
    /// The SPIFFE ID served, if any.
    pub spiffe_id: Option<String>,
    /// When the served certificate expires (RFC 3339), if any.
    pub expires: Option<String>,
    /// Why there is no identity, when the server says there will be none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_identity: Option<String>,
    /// Whether a key request waits for its certificate.
    pub key_request_outstanding: bool,
}

/// The agent's keys and the snapshots it built from them.
pub(crate) struct Local {
    /// The agent's name: the registrations it serves name it.
    agent: String,
    held: HashMap<DataplaneId, Held>,
    /// The registrations of the last state, for the snapshot and the open-stream counts.
    registrations: Vec<proto::Registration>,
    published: Arc<Snapshot>,
}

impl Local {
    /// Nothing held yet; `agent` is the name registrations give this agent.
    pub(crate) fn new(agent: String) -> Local {
        Local {
            agent,
            held: HashMap::new(),
            registrations: Vec::new(),
            published: Arc::new(Snapshot::empty()),
        }
    }

    /// The last snapshot built.
    pub(crate) fn published(&self) -> &Arc<Snapshot> {
        &self.published
    }

    /// The registrations of the last state received.
    pub(crate) fn registrations(&self) -> &[proto::Registration] {
        &self.registrations
    }

    /// A new stream to a server: every request held is to be sent on it again.
    pub(crate) fn new_stream(&mut self) -> Vec<KeyRequest> {
        let mut requests = Vec::new();
        for registration in &self.registrations {
            let held = self.held.get_mut(&dataplane_of(registration));
            if let Some(pending) = held.and_then(|h| h.pending.as_mut()) {
                pending.sent = true;
                let id = (registration.mesh.clone(), registration.name.clone());
                requests.push(request(&id, pending));
            }
        }
        requests
    }

    /// Takes a state: installs the identities over keys it holds, and returns the key requests to
    /// send. Then [`Local::build`] makes the snapshot to serve.
    pub(crate) fn apply(&mut self, state: &AgentState) -> Vec<KeyRequest> {
        let mut requests = Vec::new();
        let present: HashSet<DataplaneId> = state.registrations.iter().map(dataplane_of).collect();
        // A Dataplane no registration serves any more: its keys go with it.
        self.held.retain(|id, _| present.contains(id));
        for registration in &state.registrations {
            let id = (registration.mesh.clone(), registration.name.clone());
            let algorithm = match registration.key_algorithm.parse::<KeyAlgorithm>() {
                Ok(algorithm) => algorithm,
                Err(_) => {
                    tracing::warn!(mesh = %id.0, registration = %id.1, algorithm = %registration.key_algorithm, "the server asks for a key algorithm this agent does not know; no key is requested for this registration");
                    continue;
                }
            };
            let held = self.held.entry(dataplane_of(registration)).or_default();
            if let Some(request) = step(&id, held, registration, algorithm) {
                requests.push(request);
            }
        }
        self.registrations = state.registrations.clone();
        requests
    }

    /// The snapshot that serves `state` (after [`Local::apply`]), or `None` when it would serve
    /// exactly what the last one does.
    pub(crate) fn build(&mut self, state: &AgentState) -> Option<Arc<Snapshot>> {
        let previous = self.published.clone();
        let registrations = self.local_registrations(state);
        let registrations = if *registrations == *previous.registrations {
            previous.registrations.clone()
        } else {
            registrations
        };
        let all = reuse(&previous.all, bundle_of(&state.all));
        let mut meshes = HashMap::new();
        for (mesh, trust) in &state.meshes {
            let bundle = bundle_of(&trust.by_trust_domain);
            let federated = federated_of(mesh, &trust.federated);
            let before = previous.meshes.get(mesh);
            let view = MeshView {
                trust: match before {
                    Some(view) => reuse(&view.trust, bundle),
                    None => Arc::new(TrustBundle::new(bundle)),
                },
                mesh_services: HashMap::new(),
                federated: match before {
                    Some(view) if *view.federated == *federated => view.federated.clone(),
                    _ => federated,
                },
            };
            meshes.insert(mesh.clone(), view);
        }
        let mut proxies: ProxyMap<ProxyEntry> = ProxyMap::default();
        for registration in &state.registrations {
            let entry = match self
                .held
                .get(&dataplane_of(registration))
                .and_then(|h| h.installed.as_ref())
            {
                Some(installed) => ProxyEntry::Ready(installed.identity.clone()),
                None if !registration.no_identity.is_empty() => ProxyEntry::NoIdentity {
                    reason: registration.no_identity.clone(),
                },
                None => ProxyEntry::Pending,
            };
            proxies.insert(
                ProxyKey::new(registration.mesh.as_str(), registration.dataplane.as_str()),
                entry,
            );
        }
        let shared = Arc::ptr_eq(&registrations, &previous.registrations)
            && Arc::ptr_eq(&all, &previous.all)
            && meshes.len() == previous.meshes.len()
            && meshes.iter().all(|(mesh, view)| {
                previous.meshes.get(mesh).is_some_and(|before| {
                    Arc::ptr_eq(&before.trust, &view.trust)
                        && Arc::ptr_eq(&before.federated, &view.federated)
                })
            });
        let mut changed: Vec<ProxyKey> = proxies
            .iter()
            .filter(|(key, entry)| !same_entry(previous.proxies.get(*key), entry))
            .map(|(key, _)| key.clone())
            .collect();
        changed.extend(
            previous
                .proxies
                .keys()
                .filter(|key| !proxies.contains_key(*key))
                .cloned(),
        );
        if shared && changed.is_empty() && previous.generation > 0 {
            return None;
        }
        let snapshot = Arc::new(Snapshot {
            generation: previous.generation + 1,
            proxies,
            meshes: Arc::new(meshes),
            all,
            egress: None,
            claim_rules: ProxyMap::default(),
            registrations,
            changed: Changed::after(&previous, shared.then(|| Arc::from(changed))),
        });
        self.published = snapshot.clone();
        Some(snapshot)
    }

    /// The registrations of `state` as the Workload API server reads them; those whose selectors
    /// this build cannot read are left out, with a warning.
    fn local_registrations(&self, state: &AgentState) -> Arc<Registrations> {
        let mut list = Vec::with_capacity(state.registrations.len());
        for r in &state.registrations {
            let selectors: Result<Vec<Selector>, _> =
                r.selectors.iter().map(|s| s.parse::<Selector>()).collect();
            let selectors = match selectors {
                Ok(selectors) => selectors,
                Err(error) => {
                    tracing::warn!(mesh = %r.mesh, registration = %r.name, %error, "a registration's selector is not one this agent reads; it is not served");
                    continue;
                }
            };
            list.push(Registration {
                name: r.name.clone(),
                proxy: ProxyKey::new(r.mesh.as_str(), r.dataplane.as_str()),
                selectors,
                agent: Some(self.agent.clone()),
                hint: (!r.hint.is_empty()).then(|| r.hint.clone()),
                jwt_svid_expiry: Duration::from_secs(r.jwt_svid_seconds),
                labels: Default::default(),
            });
        }
        Arc::new(Registrations::new(list))
    }

    /// Each registration of the last state, for operators.
    pub(crate) fn status(&self) -> Vec<RegistrationStatus> {
        self.registrations
            .iter()
            .map(|r| {
                let held = self.held.get(&dataplane_of(r));
                let installed = held.and_then(|h| h.installed.as_ref());
                RegistrationStatus {
                    mesh: r.mesh.clone(),
                    name: r.name.clone(),
                    spiffe_id: installed.map(|i| i.identity.spiffe_id.clone()),
                    expires: installed.and_then(|i| expiry(&i.identity.chain_pem)),
                    no_identity: (!r.no_identity.is_empty()).then(|| r.no_identity.clone()),
                    key_request_outstanding: held.is_some_and(|h| h.pending.is_some()),
                }
            })
            .collect()
    }
}

/// The leaf's NotAfter, as the certificate inspector prints it.
fn expiry(chain_pem: &str) -> Option<String> {
    meshca_ca::inspect_pem(chain_pem.as_bytes())
        .ok()
        .and_then(|certs| certs.into_iter().next())
        .map(|leaf| leaf.not_after)
}

/// The request for `pending`.
fn request(id: &RegistrationId, pending: &Pending) -> KeyRequest {
    KeyRequest {
        mesh: id.0.clone(),
        registration: id.1.clone(),
        csr: pending.key.csr().to_vec(),
        replace_now: pending.replace_now,
    }
}

/// A fresh key for `id`, to be requested.
fn fresh(id: &RegistrationId, algorithm: KeyAlgorithm, replace_now: bool) -> Option<Pending> {
    match WorkloadKey::generate(algorithm) {
        Ok(key) => Some(Pending {
            key,
            replace_now,
            sent: false,
        }),
        Err(error) => {
            tracing::error!(mesh = %id.0, registration = %id.1, %error, "cannot make a workload key");
            None
        }
    }
}

/// One registration's keys after a state: which identity is served and which request is sent.
fn step(
    id: &RegistrationId,
    held: &mut Held,
    registration: &proto::Registration,
    algorithm: KeyAlgorithm,
) -> Option<KeyRequest> {
    if held
        .pending
        .as_ref()
        .is_some_and(|p| p.key.public().algorithm() != algorithm)
    {
        // The registration's algorithm changed: the key requested is of no use any more.
        let replace_now = held.pending.as_ref().is_some_and(|p| p.replace_now);
        held.pending = fresh(id, algorithm, replace_now);
    }
    match &registration.identity {
        Some(identity) => {
            let installed_key = held
                .installed
                .as_ref()
                .is_some_and(|i| i.key.id() == identity.key_id.as_slice());
            let pending_key = held
                .pending
                .as_ref()
                .is_some_and(|p| p.key.id() == identity.key_id.as_slice());
            if installed_key {
                if let Some(installed) = held.installed.as_mut() {
                    if installed.chain != identity.certificate_chain
                        || installed.identity.spiffe_id != identity.spiffe_id
                    {
                        installed.identity = Arc::new(proxy_identity(identity, &installed.key));
                        installed.chain = identity.certificate_chain.clone();
                    }
                }
            } else if pending_key {
                // The key requested is certified: the older key goes, and the next one is made.
                if let Some(pending) = held.pending.take() {
                    tracing::debug!(mesh = %id.0, registration = %id.1, key = %hex(pending.key.id()), "installed a certificate over a key this agent made");
                    held.installed = Some(Installed {
                        identity: Arc::new(proxy_identity(identity, &pending.key)),
                        chain: identity.certificate_chain.clone(),
                        key: pending.key,
                    });
                }
                held.pending = fresh(id, algorithm, false);
            } else if !held.pending.as_ref().is_some_and(|p| p.replace_now) {
                // A certificate over a key this agent does not hold (it restarted, or another
                // agent process had its name): ask for one over a new key, now.
                tracing::info!(mesh = %id.0, registration = %id.1, key = %hex(&identity.key_id), "the server's certificate certifies a key this agent does not hold; requesting a new one now");
                held.pending = fresh(id, algorithm, true);
            }
            if registration.wants_key && held.pending.is_none() {
                held.pending = fresh(id, algorithm, false);
            }
        }
        None => {
            if held.pending.is_none() {
                held.pending = fresh(id, algorithm, true);
            }
        }
    }
    let pending = held.pending.as_mut()?;
    // Sent already on this stream: again only when the server says it holds no key.
    if pending.sent && !registration.wants_key {
        return None;
    }
    pending.sent = true;
    Some(request(id, pending))
}

/// The identity to serve: the certificate, with the key it certifies.
fn proxy_identity(identity: &proto::Identity, key: &WorkloadKey) -> ProxyIdentity {
    ProxyIdentity {
        spiffe_id: identity.spiffe_id.clone(),
        identity_name: None,
        chain_pem: identity
            .certificate_chain
            .iter()
            .map(|der| pem_of(der))
            .collect(),
        key: LeafKey::Held(key.secret_pem()),
    }
}

/// A certificate as PEM.
fn pem_of(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Trust domain → PEM certificates.
/// The bounds of a federated bundle the server sends: wider than a fetch's defaults, since the server
/// accepted it under its own `limits.federationBundle*`, which an operator may have raised; a bound all
/// the same, as everything an agent reads.
const FEDERATED_LIMITS: meshca_federation::BundleLimits = meshca_federation::BundleLimits {
    max_bytes: 4 << 20,
    max_keys: 4096,
};

/// The federated bundles of `mesh` (SPIFFE bundles, JSON, by trust domain), in trust domain order; a
/// bundle that does not read is left out, with a warning (the server sends only bundles it accepted).
fn federated_of(
    mesh: &str,
    federated: &HashMap<String, Vec<u8>>,
) -> Arc<[Arc<meshca_federation::SpiffeBundle>]> {
    let mut by_td: Vec<(&String, &Vec<u8>)> = federated.iter().collect();
    by_td.sort();
    by_td
        .into_iter()
        .filter_map(|(td, json)| {
            let parsed = meshca_identity::TrustDomain::parse(td)
                .map_err(|e| e.to_string())
                .and_then(|td| {
                    meshca_federation::SpiffeBundle::parse(&td, json, FEDERATED_LIMITS)
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok(bundle) => Some(Arc::new(bundle)),
                Err(error) => {
                    tracing::warn!(mesh, trust_domain = %meshca_files::shown(td), %error, "a federated bundle of the state does not read; its JWT keys are not trusted");
                    None
                }
            }
        })
        .collect()
}

fn bundle_of(
    by_trust_domain: &HashMap<String, proto::X509Bundle>,
) -> BTreeMap<String, Vec<String>> {
    by_trust_domain
        .iter()
        .map(|(td, bundle)| {
            (
                td.clone(),
                bundle.authorities.iter().map(|der| pem_of(der)).collect(),
            )
        })
        .collect()
}

/// `previous` when it holds exactly `content`, else a new bundle of it.
fn reuse(previous: &Arc<TrustBundle>, content: BTreeMap<String, Vec<String>>) -> Arc<TrustBundle> {
    if *previous.by_trust_domain() == content {
        previous.clone()
    } else {
        Arc::new(TrustBundle::new(content))
    }
}

/// Whether `entry` serves what `before` served.
fn same_entry(before: Option<&ProxyEntry>, entry: &ProxyEntry) -> bool {
    match (before, entry) {
        (Some(ProxyEntry::Ready(a)), ProxyEntry::Ready(b)) => Arc::ptr_eq(a, b),
        (Some(ProxyEntry::Pending), ProxyEntry::Pending) => true,
        (Some(ProxyEntry::NoIdentity { reason: a }), ProxyEntry::NoIdentity { reason: b }) => {
            a == b
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use meshca_ca::{CaParams, CertificateAuthority, SvidRequest};
    use meshca_identity::{SpiffeId, TrustDomain};

    use super::*;
    use crate::proto::{Identity, MeshTrust, X509Bundle};

    fn ca() -> CertificateAuthority {
        CertificateAuthority::generate(
            &CaParams {
                trust_domain: TrustDomain::parse("example.org").expect("td"),
                key_algorithm: KeyAlgorithm::EcdsaP256,
                validity: Duration::from_secs(3600),
                name: "default/test".into(),
            },
            SystemTime::now(),
        )
        .expect("a CA")
    }

    fn state(version: u64, ca: &CertificateAuthority, identity: Option<Identity>) -> AgentState {
        let bundle = X509Bundle {
            authorities: vec![ca.cert_der().to_vec()],
        };
        AgentState {
            version,
            registrations: vec![proto::Registration {
                mesh: "default".into(),
                name: "r".into(),
                dataplane: "d".into(),
                selectors: vec!["unix:uid:1".into()],
                key_algorithm: "ecdsa-p256".into(),
                identity,
                ..Default::default()
            }],
            all: HashMap::from([("example.org".to_owned(), bundle.clone())]),
            meshes: HashMap::from([(
                "default".to_owned(),
                MeshTrust {
                    by_trust_domain: HashMap::from([("example.org".to_owned(), bundle)]),
                    federated: HashMap::new(),
                },
            )]),
            jwt_bundles: HashMap::new(),
        }
    }

    fn identity(ca: &CertificateAuthority, csr: &[u8]) -> Identity {
        let public = meshca_ca::csr_public_key(csr).expect("a request");
        let leaf = ca
            .issue_for_key(
                &SvidRequest {
                    spiffe_id: SpiffeId::parse("spiffe://example.org/w").expect("id"),
                    key_algorithm: KeyAlgorithm::EcdsaP256,
                    lifetime: Duration::from_secs(600),
                },
                &public,
                SystemTime::now(),
            )
            .expect("a leaf");
        Identity {
            spiffe_id: "spiffe://example.org/w".into(),
            certificate_chain: leaf.chain_der,
            key_id: key_id(public.raw()),
        }
    }

    fn key_id(raw: &[u8]) -> Vec<u8> {
        proto::key_id(raw)
    }

    /// `state` with a second registration, `r2`, of the same Dataplane.
    fn two_registrations(mut state: AgentState) -> AgentState {
        let second = proto::Registration {
            name: "r2".into(),
            selectors: vec!["unix:uid:2".into()],
            ..state.registrations[0].clone()
        };
        state.registrations.push(second);
        state
    }

    #[test]
    fn two_registrations_of_one_dataplane_share_its_key_and_its_identity() {
        let ca = ca();
        let mut local = Local::new("host-1".into());
        let requests = local.apply(&two_registrations(state(1, &ca, None)));
        let named: Vec<&str> = requests.iter().map(|r| r.registration.as_str()).collect();
        assert_eq!(named, ["r"], "one key for the Dataplane");

        // The identity over that key serves both, and neither asks for a replacement: the agent
        // holds the key it certifies.
        let certified = two_registrations(state(2, &ca, Some(identity(&ca, &requests[0].csr))));
        let ahead = local.apply(&certified);
        assert!(
            ahead
                .iter()
                .all(|r| !r.replace_now && r.csr == ahead[0].csr),
            "one key ahead, for both"
        );
        let snapshot = local.build(&certified).expect("a snapshot");
        assert!(matches!(
            snapshot.proxies.get(&ProxyKey::new("default", "d")),
            Some(ProxyEntry::Ready(_))
        ));
        let status = local.status();
        assert_eq!(status.len(), 2);
        assert!(status
            .iter()
            .all(|r| r.spiffe_id.as_deref() == Some("spiffe://example.org/w")));

        // Again: stable, nothing more to ask.
        let again = two_registrations(state(3, &ca, Some(identity(&ca, &requests[0].csr))));
        assert!(local.apply(&again).iter().all(|r| !r.replace_now));
    }

    #[test]
    fn unchanged_content_keeps_its_objects_and_an_identity_change_names_its_proxy() {
        let ca = ca();
        let mut local = Local::new("host-1".into());
        let requests = local.apply(&state(1, &ca, None));
        assert_eq!(requests.len(), 1);
        assert!(requests[0].replace_now);
        let first = local.build(&state(1, &ca, None)).expect("a first snapshot");
        assert_eq!(first.generation, 1);
        let registration = first.registrations.iter().next().expect("one registration");
        assert_eq!(registration.agent.as_deref(), Some("host-1"));
        assert!(matches!(
            first.proxies.get(&ProxyKey::new("default", "d")),
            Some(ProxyEntry::Pending)
        ));

        // The same state again: nothing to publish, nothing to request.
        assert!(local.apply(&state(2, &ca, None)).is_empty());
        assert!(local.build(&state(2, &ca, None)).is_none());

        // The identity over the key requested: only that proxy changed.
        let certified = state(3, &ca, Some(identity(&ca, &requests[0].csr)));
        let ahead = local.apply(&certified);
        assert_eq!(ahead.len(), 1, "the key ahead");
        assert!(!ahead[0].replace_now);
        let second = local.build(&certified).expect("a new snapshot");
        assert_eq!(second.generation, 2);
        assert!(Arc::ptr_eq(&first.all, &second.all));
        assert!(Arc::ptr_eq(&first.registrations, &second.registrations));
        assert!(Arc::ptr_eq(
            &first.meshes["default"].trust,
            &second.meshes["default"].trust
        ));
        assert_eq!(
            second.changed.proxies.as_deref(),
            Some(&[ProxyKey::new("default", "d")][..])
        );
        let Some(ProxyEntry::Ready(served)) = second.proxies.get(&ProxyKey::new("default", "d"))
        else {
            panic!("the identity is served");
        };
        let key = served.key.held().expect("the agent holds the key");
        let private = meshca_ca::PrivateKey::from_pem(key.expose().as_bytes()).expect("PKCS#8");
        assert_eq!(
            key_id(private.public_key().expect("public").raw()),
            certified.registrations[0]
                .identity
                .as_ref()
                .expect("identity")
                .key_id
        );

        // The same certificate again: the very same identity object.
        assert!(local.apply(&certified).is_empty());
        assert!(local.build(&certified).is_none());
        assert!(local.status()[0].key_request_outstanding);
        assert_eq!(
            local.status()[0].spiffe_id.as_deref(),
            Some("spiffe://example.org/w")
        );
    }

    #[test]
    fn a_registration_gone_takes_its_keys_and_its_proxy() {
        let ca = ca();
        let mut local = Local::new("host-1".into());
        local.apply(&state(1, &ca, None));
        local.build(&state(1, &ca, None)).expect("a snapshot");
        let mut empty = state(2, &ca, None);
        empty.registrations.clear();
        assert!(local.apply(&empty).is_empty());
        let snapshot = local.build(&empty).expect("a snapshot");
        assert!(snapshot.proxies.is_empty());
        assert!(
            snapshot.changed.proxies.is_none(),
            "the registrations changed"
        );
        assert!(local.new_stream().is_empty(), "no request is held any more");
    }
}
