//! What the admin API and `meshca status` show: a serialisable picture of the owner's state.
//!
//! The same types serialise the document (`GET /api/status`) and deserialise it in the CLI, so the two
//! cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use super::{Issued, ProxyRecord, Rejected};
use crate::egress::{EgressPlan, MeshChoice, NoEgressIdentity};
use crate::error::ClaimMismatch;
use crate::gate::Wait;
use crate::plan::{DataplaneInfo, Origin};
use crate::snapshot::{ProxyHashMap, ProxyKey};
use crate::streams::StreamTable;
use crate::timefmt::{rfc3339, seconds_until};
use crate::trust::{ServiceIds, ServiceKey};
use crate::world::{BackendKind, IdentityProvider, LoadedCa, MeshIdentityState, MeshState, World};

/// How much of the status to build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Everything, with one entry per dataplane (the admin API, `meshca status`).
    Full,
    /// Everything but the per-dataplane list (metrics).
    Summary,
    /// Everything but the per-dataplane list, which holds this dataplane only (if known), with its
    /// streams (the console's page of one proxy).
    Dataplane(ProxyKey),
}

/// The whole status document (`GET /api/status`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Status {
    /// Snapshot generation this status describes.
    pub generation: u64,
    /// Meshes with backends, identities, trusts and services.
    pub meshes: Vec<MeshStatus>,
    /// Every known dataplane.
    pub dataplanes: Vec<DataplaneStatus>,
    /// What the rollout gate waits for: whom, since when.
    pub rollout: Vec<Wait>,
    /// The last rejected resource update, until an update is accepted.
    pub last_rejected_update: Option<Rejected>,
    /// Seconds until the earliest served certificate expires.
    pub earliest_cert_expiry_seconds: Option<i64>,
    /// Seconds until the earliest CA expires.
    pub earliest_ca_expiry_seconds: Option<i64>,
    /// The zone egress identity: where it comes from, or why there is none.
    #[serde(default)]
    pub egress: EgressStatus,
}

/// The zone egress identity (one for every mesh).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EgressStatus {
    /// The mesh whose identity the egress uses.
    pub mesh: Option<String>,
    /// How that mesh was chosen.
    pub chosen_by: Option<MeshChoice>,
    /// Who issues it in that mesh (`MeshIdentity <name>` or `backend <name>`).
    pub issuer: Option<String>,
    /// Why there is no egress identity, when there is none.
    pub reason: Option<String>,
    /// The SPIFFE IDs `system_trust_bundle_egress` accepts, sorted.
    pub spiffe_ids: Vec<String>,
}

/// One mesh.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MeshStatus {
    /// Mesh name.
    pub name: String,
    /// Legacy mTLS, if the Mesh resource has an `mtls` section.
    pub mtls: Option<MtlsStatus>,
    /// MeshIdentities, sorted by name.
    pub mesh_identities: Vec<IdentityStatus>,
    /// MeshTrusts, from resources and created by meshca.
    pub mesh_trusts: Vec<TrustStatus>,
    /// MeshServices with their identities.
    pub mesh_services: Vec<ServiceStatus>,
    /// How many connected proxies hold a certificate from each issuer (rotation progress).
    pub proxies_by_issuer: BTreeMap<String, usize>,
    /// Connected proxies of the mesh.
    pub connected_proxies: usize,
}

/// Legacy mTLS of a mesh.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MtlsStatus {
    /// `mtls.enabledBackend`.
    pub enabled_backend: Option<String>,
    /// Every `mtls.backends[]` entry.
    pub backends: Vec<BackendStatus>,
}

/// What a legacy backend does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendRole {
    /// It issues.
    Enabled,
    /// It is trusted but no longer issues.
    Secondary,
    /// Defined but neither.
    Unused,
}

impl BackendRole {
    /// The spelling in the status document.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendRole::Enabled => "enabled",
            BackendRole::Secondary => "secondary",
            BackendRole::Unused => "unused",
        }
    }
}

/// One legacy backend.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BackendStatus {
    /// Backend name.
    pub name: String,
    /// Builtin or provided.
    #[serde(rename = "type")]
    pub kind: BackendKind,
    /// What it does.
    pub role: BackendRole,
    /// Its issuing CA, when enabled or secondary.
    pub ca: Option<CaStatus>,
}

/// A CA.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaStatus {
    /// SHA-256 of its certificate.
    pub id: String,
    /// Its subject.
    pub subject: String,
    /// The trust domain of its SPIFFE URI SAN, if it has one.
    pub trust_domain: Option<String>,
    /// Whether meshca generated it.
    pub generated: bool,
    /// NotAfter, RFC 3339.
    pub not_after: String,
    /// Seconds until NotAfter.
    pub expires_in_seconds: i64,
}

/// A Kuma-style status condition.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Condition {
    /// The condition, e.g. `Ready`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `True` or `False`.
    pub status: String,
    /// A CamelCase reason.
    pub reason: String,
    /// For humans.
    pub message: String,
}

impl Condition {
    fn new(kind: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            kind: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// One MeshIdentity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IdentityStatus {
    /// Resource name.
    pub name: String,
    /// Its rendered trust domain.
    pub trust_domain: String,
    /// `none`, `Spire`, `Extension` or `Bundled`.
    pub provider: String,
    /// Its CA, when meshca issues for it.
    pub ca: Option<CaStatus>,
    /// Kuma-style conditions.
    pub conditions: Vec<Condition>,
}

/// Where a MeshTrust comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrustOrigin {
    /// A MeshTrust resource file.
    Resource,
    /// Created by meshca for a MeshIdentity with `meshTrustCreation: Enabled`.
    Meshca,
}

impl TrustOrigin {
    /// The spelling in the status document.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustOrigin::Resource => "resource",
            TrustOrigin::Meshca => "meshca",
        }
    }
}

/// One MeshTrust, from a resource or created by meshca for a MeshIdentity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrustStatus {
    /// Resource name (the MeshIdentity's, for created ones).
    pub name: String,
    /// The trust domain it trusts.
    pub trust_domain: String,
    /// Where it comes from.
    pub origin: TrustOrigin,
    /// How many CA certificates it holds.
    pub certificates: usize,
    /// For the ones meshca created: the keystore entry that holds it, in Kuma's universal format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keystore_path: Option<String>,
}

/// MeshService `status.tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServiceTls {
    /// mTLS is on and every selected dataplane held a trusted certificate.
    Ready,
    /// Not yet, or mTLS is off.
    NotReady,
}

/// One MeshService.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// Resource name.
    pub name: String,
    /// The exact SPIFFE IDs its proxies present.
    pub spiffe_ids: Vec<String>,
    /// `Ready` once mTLS is on and every selected dataplane holds a trusted certificate.
    pub tls: ServiceTls,
}

/// One dataplane.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DataplaneStatus {
    /// Mesh name.
    pub mesh: String,
    /// Dataplane name.
    pub name: String,
    /// Where it is described (`None` when its token contradicts its file).
    pub origin: Option<Origin>,
    /// The `kuma.io/service` of its inbounds, without repeats, in order.
    #[serde(default)]
    pub services: Vec<String>,
    /// Whether a stream or fetch is open.
    pub connected: bool,
    /// How many.
    pub streams: usize,
    /// The SPIFFE ID of its certificate.
    pub spiffe_id: Option<String>,
    /// Who issued it.
    pub issuer: Option<String>,
    /// Its serial, hex.
    pub serial: Option<String>,
    /// Its NotAfter, RFC 3339.
    pub not_after: Option<String>,
    /// Seconds until NotAfter.
    pub expires_in_seconds: Option<i64>,
    /// How many times it was replaced.
    pub regenerations: u64,
    /// Why the dataplane has no certificate, when it has none.
    pub reason: Option<String>,
    /// Why the last token presented for this dataplane was refused, if one was.
    pub refused_token: Option<String>,
    /// Responses its proxy rejected.
    #[serde(default)]
    pub nacks: u64,
    /// Its last rejection message.
    #[serde(default)]
    pub last_nack: Option<String>,
    /// Its open streams, when one dataplane was asked for ([`Detail::Dataplane`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stream_details: Vec<StreamStatus>,
}

/// One open stream (or fetch) of a dataplane.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StreamStatus {
    /// The resource names it subscribes to (none for a fetch).
    pub resources: Vec<String>,
    /// The newest snapshot generation whose content it ACKed.
    pub acked_generation: Option<u64>,
    /// The version of the response it ACKed last: one version for all its resources.
    pub acked_version: Option<String>,
    /// Whether its token is a zone egress token.
    pub zone_egress: bool,
}

/// What [`build`] reads.
#[derive(Debug)]
pub(crate) struct Inputs<'a> {
    pub generation: u64,
    pub world: &'a World,
    pub dataplanes: &'a BTreeMap<ProxyKey, Result<DataplaneInfo, ClaimMismatch>>,
    pub service_ids: &'a ServiceIds,
    pub streams: &'a StreamTable,
    pub issued: &'a ProxyHashMap<Box<Issued>>,
    pub reasons: &'a ProxyHashMap<String>,
    pub records: &'a BTreeMap<ProxyKey, ProxyRecord>,
    pub last_rejected: Option<&'a Rejected>,
    pub waits: &'a [Wait],
    pub tls_ready: &'a BTreeSet<ServiceKey>,
    pub egress: Option<&'a Result<EgressPlan, NoEgressIdentity>>,
    pub now: SystemTime,
}

/// Builds the status document.
pub(crate) fn build(i: &Inputs<'_>, detail: Detail) -> Status {
    let dataplanes: Vec<DataplaneStatus> = match detail {
        Detail::Full => i
            .dataplanes
            .iter()
            .map(|(key, info)| dataplane_status(i, key, info))
            .collect(),
        Detail::Summary => Vec::new(),
        Detail::Dataplane(key) => i
            .dataplanes
            .get_key_value(&key)
            .map(|(key, info)| {
                let mut status = dataplane_status(i, key, info);
                status.stream_details = stream_details(i.streams, key);
                status
            })
            .into_iter()
            .collect(),
    };
    // Served certificates: of connected proxies that are described and have no reason against them.
    let served = i.streams.proxies().filter(|key| {
        matches!(i.dataplanes.get(*key), Some(Ok(_))) && !i.reasons.contains_key(*key)
    });
    Status {
        generation: i.generation,
        meshes: i.world.meshes.values().map(|m| mesh_status(i, m)).collect(),
        earliest_cert_expiry_seconds: served
            .filter_map(|key| i.issued.get(key))
            .map(|issued| seconds_until(issued.leaf.not_after, i.now))
            .min(),
        dataplanes,
        rollout: i.waits.to_vec(),
        last_rejected_update: i.last_rejected.cloned(),
        earliest_ca_expiry_seconds: i
            .world
            .authorities()
            .map(|(_, _, ca)| seconds_until(ca.ca.not_after(), i.now))
            .min(),
        egress: egress_status(i),
    }
}

fn egress_status(i: &Inputs<'_>) -> EgressStatus {
    let spiffe_ids = i
        .service_ids
        .get(&ServiceKey::egress())
        .map(|ids| ids.iter().cloned().collect())
        .unwrap_or_default();
    match i.egress {
        Some(Ok(plan)) => EgressStatus {
            mesh: Some(plan.mesh.clone()),
            chosen_by: Some(plan.chosen_by),
            issuer: Some(plan.issuer.to_string()),
            reason: None,
            spiffe_ids,
        },
        Some(Err(reason)) => EgressStatus {
            reason: Some(reason.to_string()),
            spiffe_ids,
            ..EgressStatus::default()
        },
        None => EgressStatus::default(),
    }
}

fn ca_status(ca: &LoadedCa, now: SystemTime) -> CaStatus {
    CaStatus {
        id: ca.ca.id().to_owned(),
        subject: ca.ca.subject().to_owned(),
        trust_domain: ca.ca.trust_domain().map(ToString::to_string),
        generated: ca.generated,
        not_after: rfc3339(ca.ca.not_after()),
        expires_in_seconds: seconds_until(ca.ca.not_after(), now),
    }
}

fn mesh_status(i: &Inputs<'_>, mesh: &MeshState) -> MeshStatus {
    let mut proxies_by_issuer = BTreeMap::new();
    let mut connected_proxies = 0;
    for key in i.streams.proxies().filter(|k| *k.mesh == *mesh.name) {
        connected_proxies += 1;
        if let Some(issued) = i.issued.get(key) {
            *proxies_by_issuer
                .entry(issued.issuer.to_string())
                .or_insert(0) += 1;
        }
    }
    MeshStatus {
        name: mesh.name.clone(),
        mtls: mtls_status(i, mesh),
        mesh_identities: identity_statuses(mesh, i.now),
        mesh_trusts: trust_statuses(mesh),
        mesh_services: service_statuses(i, &mesh.name),
        proxies_by_issuer,
        connected_proxies,
    }
}

fn mtls_status(i: &Inputs<'_>, mesh: &MeshState) -> Option<MtlsStatus> {
    let mtls = i.world.resources.meshes.get(&mesh.name)?.mtls.as_ref()?;
    let backends = mtls
        .backends
        .iter()
        .map(|b| {
            let enabled = mesh.enabled_backend.iter().find(|s| s.name == b.name);
            let secondary = mesh.secondary_backends.iter().find(|s| s.name == b.name);
            BackendStatus {
                name: b.name.clone(),
                kind: match b.kind {
                    meshca_config::BackendKind::Builtin { .. } => BackendKind::Builtin,
                    meshca_config::BackendKind::Provided { .. } => BackendKind::Provided,
                },
                role: match (enabled, secondary) {
                    (Some(_), _) => BackendRole::Enabled,
                    (None, Some(_)) => BackendRole::Secondary,
                    (None, None) => BackendRole::Unused,
                },
                ca: enabled.or(secondary).map(|s| ca_status(&s.ca, i.now)),
            }
        })
        .collect();
    Some(MtlsStatus {
        enabled_backend: mtls.enabled_backend.clone(),
        backends,
    })
}

/// The mesh's MeshIdentities, applied or not, sorted by name.
fn identity_statuses(mesh: &MeshState, now: SystemTime) -> Vec<IdentityStatus> {
    let inactive = mesh.inactive_identities.iter().map(|id| IdentityStatus {
        name: id.name.clone(),
        trust_domain: id.trust_domain.to_string(),
        provider: id.provider.into(),
        ca: None,
        conditions: vec![
            Condition::new(
                "DependenciesReady",
                "False",
                "MeshServicesDisabled",
                "MeshIdentity requires MeshServices to be enabled on the mesh. To enable, set \
                 `spec.meshServices.mode: Exclusive` on the mesh.",
            ),
            Condition::new(
                "Ready",
                "False",
                "Failure",
                "One of initialization steps failed",
            ),
        ],
    });
    let mut all: Vec<IdentityStatus> = mesh
        .identities
        .iter()
        .map(|id| identity_status(id, now))
        .chain(inactive)
        .collect();
    all.sort_by(|a, b| a.name.cmp(&b.name));
    all
}

/// Kuma's condition of a provider it initialized.
fn provider_initialized() -> Condition {
    Condition::new(
        "Provider",
        "True",
        "ProviderInitialized",
        "Provider successfully initialized",
    )
}

fn identity_status(id: &MeshIdentityState, now: SystemTime) -> IdentityStatus {
    let (provider, ca, conditions) = match &id.provider {
        IdentityProvider::None => (
            "none",
            None,
            vec![
                Condition::new(
                    "SpiffeIDProvider",
                    "True",
                    "SpiffeIDProvided",
                    "Providing only SpiffeIDs for services.",
                ),
                Condition::new(
                    "Ready",
                    "False",
                    "PartiallyReady",
                    "Running in SpiffeID providing only mode.",
                ),
            ],
        ),
        IdentityProvider::Spire => (
            "Spire",
            None,
            vec![
                provider_initialized(),
                Condition::new(
                    "Ready",
                    "True",
                    "ManagedExternally",
                    "certificates are issued by SPIRE",
                ),
            ],
        ),
        IdentityProvider::Extension { name } => (
            "Extension",
            None,
            vec![
                provider_initialized(),
                Condition::new(
                    "Ready",
                    "True",
                    "ManagedExternally",
                    &format!("certificates are issued by extension {name}"),
                ),
            ],
        ),
        IdentityProvider::Bundled {
            ca,
            mesh_trust_creation,
            ..
        } => {
            let mut conditions = vec![provider_initialized()];
            if *mesh_trust_creation {
                conditions.push(Condition::new(
                    "MeshTrustCreated",
                    "True",
                    "MeshTrustCreated",
                    "MeshTrust has been successfully created",
                ));
            }
            conditions.push(Condition::new(
                "Ready",
                "True",
                "Ready",
                "Successfully initialized",
            ));
            ("Bundled", Some(ca_status(ca, now)), conditions)
        }
    };
    IdentityStatus {
        name: id.name.clone(),
        trust_domain: id.trust_domain.to_string(),
        provider: provider.into(),
        ca,
        conditions,
    }
}

/// The mesh's MeshTrust resources, then the MeshTrusts meshca keeps for its MeshIdentities.
fn trust_statuses(mesh: &MeshState) -> Vec<TrustStatus> {
    let resources = mesh.trusts.iter().map(|t| TrustStatus {
        name: t.name.clone(),
        trust_domain: t.trust_domain.to_string(),
        origin: TrustOrigin::Resource,
        certificates: t.certificates.len(),
        keystore_path: None,
    });
    let created = mesh.created_trusts.iter().map(|t| TrustStatus {
        name: t.name.clone(),
        trust_domain: t.trust_domain.to_string(),
        origin: TrustOrigin::Meshca,
        certificates: t.certificates.len(),
        keystore_path: Some(t.keystore_path.clone()),
    });
    resources.chain(created).collect()
}

fn service_statuses(i: &Inputs<'_>, mesh: &str) -> Vec<ServiceStatus> {
    i.world
        .resources
        .mesh_services
        .iter()
        .filter(|s| s.mesh == mesh)
        .map(|s| {
            let key = ServiceKey::new(mesh, s.name.clone());
            ServiceStatus {
                name: s.name.clone(),
                spiffe_ids: i
                    .service_ids
                    .get(&key)
                    .map(|ids| ids.iter().cloned().collect())
                    .unwrap_or_default(),
                tls: if i.tls_ready.contains(&key) {
                    ServiceTls::Ready
                } else {
                    ServiceTls::NotReady
                },
            }
        })
        .collect()
}

fn dataplane_status(
    i: &Inputs<'_>,
    key: &ProxyKey,
    info: &Result<DataplaneInfo, ClaimMismatch>,
) -> DataplaneStatus {
    let streams = i.streams.count(key);
    let issued = i.issued.get(key);
    let record = i.records.get(key);
    // A Dataplane file Kuma would refuse says so before its proxy ever connects.
    let reason = match info {
        Err(r) => Some(r.to_string()),
        Ok(info) => i.reasons.get(key).cloned().or_else(|| {
            let mesh = i.world.meshes.get(&*key.mesh)?;
            crate::plan::missing_workload_label(mesh, info)
        }),
    };
    DataplaneStatus {
        mesh: key.mesh.to_string(),
        name: key.name.to_string(),
        origin: info.as_ref().ok().map(|d| d.origin),
        services: info.as_ref().map_or_else(
            |_| Vec::new(),
            |d| {
                let mut services: Vec<String> = Vec::new();
                for service in d.services() {
                    if !services.iter().any(|s| s == service) {
                        services.push(service.to_owned());
                    }
                }
                services
            },
        ),
        connected: streams > 0,
        streams,
        spiffe_id: issued.map(|x| x.leaf.spiffe_id.to_string()),
        issuer: issued.map(|x| x.issuer.to_string()),
        serial: issued.map(|x| x.leaf.serial.clone()),
        not_after: issued.map(|x| rfc3339(x.leaf.not_after)),
        expires_in_seconds: issued.map(|x| seconds_until(x.leaf.not_after, i.now)),
        regenerations: issued.map_or(0, |x| x.regenerations),
        reason,
        refused_token: record.and_then(|r| r.refused_token.clone()),
        nacks: record.map_or(0, |r| r.nacks),
        last_nack: record.and_then(|r| r.last_nack.clone()),
        stream_details: Vec::new(),
    }
}

fn stream_details(streams: &StreamTable, key: &ProxyKey) -> Vec<StreamStatus> {
    let mut details: Vec<StreamStatus> = streams
        .of(key)
        .map(|s| StreamStatus {
            resources: s.resources.iter().map(|r| r.as_str().to_owned()).collect(),
            acked_generation: s.acked,
            acked_version: s.acked_version.clone(),
            zone_egress: s.zone_egress,
        })
        .collect();
    details.sort_by(|a, b| a.resources.cmp(&b.resources));
    details
}
