//! What an agent is sent: its registrations with their identities, and every bundle, built from one
//! snapshot (pure: no I/O, no events).

use std::collections::HashMap;
use std::sync::Arc;

use meshca_ca::PublicKey;
use meshca_control::{LeafKey, ProxyEntry, Registration, Snapshot, TrustBundle};
use meshca_identity::KeyAlgorithm;
use meshca_workload::jwt_keys::KeySet;

use crate::proto::{self, AgentState, Identity, MeshTrust, X509Bundle};

/// One registration as the stream holds it: the registration, and the key it last offered for it.
pub(crate) struct Served<'a> {
    pub registration: &'a Registration,
    pub offered: Option<&'a Arc<PublicKey>>,
}

/// The state of an agent serving `served` (in order), from `snapshot` and the JWT keys `jwt`, with
/// version 0 (the stream numbers what it sends).
pub(crate) fn build(
    snapshot: &Snapshot,
    served: &[Served<'_>],
    jwt: &KeySet,
    key_algorithm: KeyAlgorithm,
) -> AgentState {
    let registrations = served
        .iter()
        .map(|s| registration(snapshot, s, key_algorithm))
        .collect();
    let mut meshes = HashMap::new();
    for s in served {
        let mesh = &*s.registration.proxy.mesh;
        if meshes.contains_key(mesh) {
            continue;
        }
        if let Some(view) = snapshot.meshes.get(mesh) {
            meshes.insert(
                mesh.to_owned(),
                MeshTrust {
                    by_trust_domain: bundles(&view.trust),
                },
            );
        }
    }
    AgentState {
        version: 0,
        registrations,
        all: bundles(&snapshot.all),
        meshes,
        jwt_bundles: jwt
            .by_trust_domain()
            .iter()
            .map(|(td, document)| (td.clone(), document.to_bytes()))
            .collect(),
    }
}

fn registration(
    snapshot: &Snapshot,
    served: &Served<'_>,
    key_algorithm: KeyAlgorithm,
) -> proto::Registration {
    let r = served.registration;
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
    match snapshot.proxies.get(&r.proxy) {
        Some(ProxyEntry::Ready(identity)) => match &identity.key {
            LeafKey::Agent(key) => match certificates_der(&identity.chain_pem) {
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
            },
            LeafKey::Held(_) => {
                // Issued before the registration named an agent: the owner replaces it with one over
                // the agent's key, which needs a key request.
                tracing::debug!(mesh = %r.proxy.mesh, registration = %r.name, "the registration's identity has a key meshca holds; none is sent to its agent until one over the agent's key is issued");
            }
        },
        Some(ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason }) => {
            out.no_identity = reason.clone();
        }
        Some(ProxyEntry::Pending) | None => {}
    }
    // A key offered on this stream and not certified yet (the certificate is over another key, or
    // there is none) is the next certificate's: no other is needed.
    out.wants_key = served.offered.is_none_or(|offered| {
        matches!(
            snapshot.proxies.get(&r.proxy),
            Some(ProxyEntry::Ready(identity))
                if matches!(&identity.key, LeafKey::Agent(key) if same_key(offered, key))
        )
    });
    out
}

/// Whether two keys are the same key.
pub(crate) fn same_key(a: &PublicKey, b: &PublicKey) -> bool {
    a.algorithm() == b.algorithm() && a.raw() == b.raw()
}

/// A trust bundle as the protocol carries it: DER certificates by trust domain. A certificate that
/// does not parse is left out (logged): the owner put only parsed certificates in the bundle.
fn bundles(bundle: &TrustBundle) -> HashMap<String, X509Bundle> {
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
