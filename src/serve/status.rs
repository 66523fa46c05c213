//! What the admin API and `meshca status` show: a serialisable picture of the owner's state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::SystemTime;

use meshca_ca::CertificateAuthority;
use meshca_sds::{ProxyKey, StreamId};
use serde::Serialize;

use super::owner::{Issued, Rejected};
use super::plan::{DataplaneInfo, Origin};
use super::world::{IdentityProvider, LoadedCa, World};

/// The whole status document (`GET /api/status`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    /// Snapshot generation this status describes.
    pub generation: u64,
    /// Meshes with backends, identities, trusts and services.
    pub meshes: Vec<MeshStatus>,
    /// Every known dataplane.
    pub dataplanes: Vec<DataplaneStatus>,
    /// What the rollout gate waits for (DESIGN §8): whom, since when.
    pub rollout: Vec<super::rollout::Wait>,
    /// The last rejected resource update, until an update is accepted.
    pub last_rejected_update: Option<Rejected>,
    /// Seconds until the earliest served certificate expires.
    pub earliest_cert_expiry_seconds: Option<i64>,
    /// Seconds until the earliest CA expires.
    pub earliest_ca_expiry_seconds: Option<i64>,
}

/// One mesh.
#[derive(Clone, Debug, Serialize)]
pub struct MeshStatus {
    pub name: String,
    pub mtls: Option<MtlsStatus>,
    pub mesh_identities: Vec<IdentityStatus>,
    pub mesh_trusts: Vec<TrustStatus>,
    pub mesh_services: Vec<ServiceStatus>,
    /// How many connected proxies hold a certificate from each issuer (rotation progress).
    pub proxies_by_issuer: BTreeMap<String, usize>,
    pub connected_proxies: usize,
}

/// Legacy mTLS of a mesh.
#[derive(Clone, Debug, Serialize)]
pub struct MtlsStatus {
    pub enabled_backend: Option<String>,
    pub backends: Vec<BackendStatus>,
}

/// One legacy backend.
#[derive(Clone, Debug, Serialize)]
pub struct BackendStatus {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// `enabled`, `secondary` or `unused`.
    pub role: &'static str,
    pub ca: Option<CaStatus>,
}

/// A CA.
#[derive(Clone, Debug, Serialize)]
pub struct CaStatus {
    pub id: String,
    pub subject: String,
    pub trust_domain: Option<String>,
    pub generated: bool,
    pub not_after: String,
    pub expires_in_seconds: i64,
}

/// A Kuma-style status condition.
#[derive(Clone, Debug, Serialize)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub status: &'static str,
    pub reason: &'static str,
    pub message: String,
}

/// One MeshIdentity.
#[derive(Clone, Debug, Serialize)]
pub struct IdentityStatus {
    pub name: String,
    pub trust_domain: String,
    pub provider: &'static str,
    pub ca: Option<CaStatus>,
    pub conditions: Vec<Condition>,
}

/// One MeshTrust, from a resource or created by meshca for a MeshIdentity.
#[derive(Clone, Debug, Serialize)]
pub struct TrustStatus {
    pub name: String,
    pub trust_domain: String,
    /// `resource` or `meshca` (created for a MeshIdentity with `meshTrustCreation: Enabled`).
    pub origin: &'static str,
    pub certificates: usize,
}

/// One MeshService.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceStatus {
    pub name: String,
    pub spiffe_ids: Vec<String>,
    /// `Ready` once mTLS is on and every selected dataplane holds a trusted certificate (DESIGN §8).
    pub tls: &'static str,
}

/// One dataplane.
#[derive(Clone, Debug, Serialize)]
pub struct DataplaneStatus {
    pub mesh: String,
    pub name: String,
    pub origin: Option<Origin>,
    pub connected: bool,
    pub streams: usize,
    pub spiffe_id: Option<String>,
    pub issuer: Option<String>,
    pub serial: Option<String>,
    pub not_after: Option<String>,
    pub expires_in_seconds: Option<i64>,
    pub regenerations: u64,
    /// Why the dataplane has no certificate, when it has none.
    pub reason: Option<String>,
    /// Why the last token presented for this dataplane was refused, if one was.
    pub refused_token: Option<String>,
}

/// What [`build`] reads.
#[derive(Debug)]
pub struct Inputs<'a> {
    pub generation: u64,
    pub world: &'a World,
    pub dataplanes: &'a BTreeMap<ProxyKey, Result<DataplaneInfo, String>>,
    pub service_ids: &'a super::bundles::ServiceIds,
    pub connected: &'a HashMap<ProxyKey, HashSet<StreamId>>,
    pub issued: &'a HashMap<ProxyKey, Issued>,
    pub decisions: &'a HashMap<ProxyKey, Result<(), String>>,
    pub last_rejected: Option<&'a Rejected>,
    pub waits: &'a [super::rollout::Wait],
    pub refused_tokens: &'a BTreeMap<ProxyKey, String>,
    pub tls_ready: &'a std::collections::BTreeSet<(String, String)>,
    pub now: SystemTime,
}

/// Formats a time as RFC 3339 (UTC, seconds).
pub fn rfc3339(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t);
    dt.replace_nanosecond(0)
        .unwrap_or(dt)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{dt}"))
}

/// Seconds from `now` until `t` (negative once past).
pub fn seconds_until(t: SystemTime, now: SystemTime) -> i64 {
    match t.duration_since(now) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

fn ca_status(ca: &LoadedCa, now: SystemTime) -> CaStatus {
    let c: &CertificateAuthority = &ca.ca;
    CaStatus {
        id: c.id().to_owned(),
        subject: c.subject().to_owned(),
        trust_domain: c.trust_domain().map(|t| t.to_string()),
        generated: ca.generated,
        not_after: rfc3339(c.not_after()),
        expires_in_seconds: seconds_until(c.not_after(), now),
    }
}

/// Builds the status document.
pub fn build(i: Inputs<'_>) -> Status {
    let mut meshes = Vec::new();
    let mut earliest_ca: Option<i64> = None;
    for (_, _, ca) in i.world.authorities() {
        let s = seconds_until(ca.ca.not_after(), i.now);
        earliest_ca = Some(earliest_ca.map_or(s, |e| e.min(s)));
    }
    for (name, mesh) in &i.world.meshes {
        let resource = i.world.resources.meshes.get(name);
        let mtls = resource.and_then(|r| r.mtls.as_ref()).map(|m| MtlsStatus {
            enabled_backend: m.enabled_backend.clone(),
            backends: m
                .backends
                .iter()
                .map(|b| {
                    let enabled = mesh.enabled_backend.iter().find(|s| s.name == b.name);
                    let secondary = mesh.secondary_backends.iter().find(|s| s.name == b.name);
                    BackendStatus {
                        name: b.name.clone(),
                        kind: match b.kind {
                            meshca_config::BackendKind::Builtin { .. } => "builtin",
                            meshca_config::BackendKind::Provided { .. } => "provided",
                        }
                        .to_owned(),
                        role: if enabled.is_some() {
                            "enabled"
                        } else if secondary.is_some() {
                            "secondary"
                        } else {
                            "unused"
                        },
                        ca: enabled.or(secondary).map(|s| ca_status(&s.ca, i.now)),
                    }
                })
                .collect(),
        });
        let mut mesh_trusts: Vec<TrustStatus> = mesh
            .trusts
            .iter()
            .map(|t| TrustStatus {
                name: t.name.clone(),
                trust_domain: t.trust_domain.clone(),
                origin: "resource",
                certificates: t.pems.len(),
            })
            .collect();
        let mesh_identities = mesh
            .identities
            .iter()
            .map(|id| {
                let (provider, ca, conditions) = match &id.provider {
                    IdentityProvider::None => (
                        "none",
                        None,
                        vec![
                            Condition {
                                kind: "SpiffeIDProvider",
                                status: "True",
                                reason: "SpiffeIDProvided",
                                message: "SPIFFE IDs are published for SAN matching; no certificates are issued".into(),
                            },
                            Condition {
                                kind: "Ready",
                                status: "False",
                                reason: "PartiallyReady",
                                message: "no provider: this identity issues no certificates".into(),
                            },
                        ],
                    ),
                    IdentityProvider::Spire => (
                        "Spire",
                        None,
                        vec![Condition {
                            kind: "Ready",
                            status: "True",
                            reason: "ManagedExternally",
                            message: "certificates are issued by SPIRE".into(),
                        }],
                    ),
                    IdentityProvider::Bundled { ca, mesh_trust_creation, .. } => {
                        if *mesh_trust_creation {
                            mesh_trusts.push(TrustStatus {
                                name: id.name.clone(),
                                trust_domain: id.trust_domain.to_string(),
                                origin: "meshca",
                                certificates: ca.ca.bundle_pems().len(),
                            });
                        }
                        (
                            "Bundled",
                            Some(ca_status(ca, i.now)),
                            vec![Condition {
                                kind: "Ready",
                                status: "True",
                                reason: "Ready",
                                message: "the CA is loaded and issuing".into(),
                            }],
                        )
                    }
                };
                IdentityStatus { name: id.name.clone(), trust_domain: id.trust_domain.to_string(), provider, ca, conditions }
            })
            .collect();
        let mesh_services = i
            .world
            .resources
            .mesh_services
            .iter()
            .filter(|s| &s.mesh == name)
            .map(|s| ServiceStatus {
                name: s.name.clone(),
                spiffe_ids: i
                    .service_ids
                    .get(&(name.clone(), s.name.clone()))
                    .map(|ids| ids.iter().cloned().collect())
                    .unwrap_or_default(),
                tls: if i.tls_ready.contains(&(name.clone(), s.name.clone())) {
                    "Ready"
                } else {
                    "NotReady"
                },
            })
            .collect();
        let mut proxies_by_issuer = BTreeMap::new();
        let mut connected_proxies = 0;
        for key in i.connected.keys().filter(|k| &k.mesh == name) {
            connected_proxies += 1;
            if let Some(issued) = i.issued.get(key) {
                *proxies_by_issuer
                    .entry(issued.issuer.to_string())
                    .or_insert(0) += 1;
            }
        }
        meshes.push(MeshStatus {
            name: name.clone(),
            mtls,
            mesh_identities,
            mesh_trusts,
            mesh_services,
            proxies_by_issuer,
            connected_proxies,
        });
    }

    let mut earliest_cert: Option<i64> = None;
    let dataplanes = i
        .dataplanes
        .iter()
        .map(|(key, info)| {
            let streams = i.connected.get(key).map_or(0, |s| s.len());
            let issued = i.issued.get(key);
            let served = streams > 0 && matches!(i.decisions.get(key), Some(Ok(())));
            let expires = issued.map(|x| seconds_until(x.svid.not_after, i.now));
            if served {
                if let Some(e) = expires {
                    earliest_cert = Some(earliest_cert.map_or(e, |c| c.min(e)));
                }
            }
            let reason = match (info, i.decisions.get(key)) {
                (Err(r), _) | (_, Some(Err(r))) => Some(r.clone()),
                _ => None,
            };
            DataplaneStatus {
                mesh: key.mesh.clone(),
                name: key.name.clone(),
                origin: info.as_ref().ok().map(|d| d.origin),
                connected: streams > 0,
                streams,
                spiffe_id: issued.map(|x| x.svid.spiffe_id.to_string()),
                issuer: issued.map(|x| x.issuer.to_string()),
                serial: issued.map(|x| x.svid.serial.clone()),
                not_after: issued.map(|x| rfc3339(x.svid.not_after)),
                expires_in_seconds: expires,
                regenerations: issued.map_or(0, |x| x.regenerations),
                reason,
                refused_token: i.refused_tokens.get(key).cloned(),
            }
        })
        .collect();

    Status {
        generation: i.generation,
        meshes,
        dataplanes,
        rollout: i.waits.to_vec(),
        last_rejected_update: i.last_rejected.cloned(),
        earliest_cert_expiry_seconds: earliest_cert,
        earliest_ca_expiry_seconds: earliest_ca,
    }
}
