//! The owner: the one task that turns the accepted configuration, the connected proxies and the clock into
//! an immutable [`Snapshot`] for SDS and a [`Status`] for the admin API.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use meshca_auth::{Claims, ProxyType};
use meshca_ca::{Svid, SvidRequest};
use meshca_sds::{ProxyEntry, ProxyIdentity, ProxyKey, SecretPem, Snapshot, StreamEvent, StreamId};
use tokio::sync::watch;

use super::bundles;
use super::metrics::Metrics;
use super::plan::{self, DataplaneInfo, Decision, Desired, Issuer, Origin};
use super::status::{self, Status};
use super::world::{UpdateError, World};

/// A certificate the owner issued and keeps for a proxy.
#[derive(Debug)]
pub struct Issued {
    /// The certificate and its key.
    pub svid: Svid,
    /// Who issued it.
    pub issuer: Issuer,
    /// The issuing CA's id.
    pub ca_id: String,
    /// The MeshIdentity name, when one issued it.
    pub identity_name: Option<String>,
    /// When it is renewed.
    pub renew_at: SystemTime,
    /// How many times it was replaced.
    pub regenerations: u64,
    /// What SDS serves.
    pub published: Arc<ProxyIdentity>,
}

/// A rejected resource update, kept for the admin API and `meshca status`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Rejected {
    /// When it was rejected (RFC 3339).
    pub at: String,
    /// Every error found.
    pub errors: Vec<UpdateError>,
}

/// The owner's state. Only [`Owner::reconcile`] and the event handlers change it.
#[derive(Debug)]
pub struct Owner {
    zone: String,
    key_algorithm: meshca_config::KeyAlgorithm,
    renew_at: f64,
    world: Arc<World>,
    world_generation: u64,
    registrations: HashMap<ProxyKey, Claims>,
    streams: HashMap<ProxyKey, HashSet<StreamId>>,
    issued: HashMap<ProxyKey, Issued>,
    decisions: HashMap<ProxyKey, Result<(), String>>,
    last_rejected: Option<Rejected>,
    generation: u64,
    bundles: bundles::BundleCache,
    metrics: Arc<Metrics>,
    snapshot_tx: watch::Sender<Arc<Snapshot>>,
    status_tx: watch::Sender<Arc<Status>>,
}

impl Owner {
    /// An owner serving `world`, publishing on the given channels.
    pub fn new(
        settings: &meshca_config::Settings,
        world: World,
        metrics: Arc<Metrics>,
        snapshot_tx: watch::Sender<Arc<Snapshot>>,
        status_tx: watch::Sender<Arc<Status>>,
    ) -> Owner {
        Owner {
            zone: settings.zone.clone(),
            key_algorithm: settings.issuance.key_algorithm,
            renew_at: settings.issuance.renew_at,
            world: Arc::new(world),
            world_generation: 1,
            registrations: HashMap::new(),
            streams: HashMap::new(),
            issued: HashMap::new(),
            decisions: HashMap::new(),
            last_rejected: None,
            generation: 0,
            bundles: bundles::BundleCache::default(),
            metrics,
            snapshot_tx,
            status_tx,
        }
    }

    /// The configuration currently serving.
    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// Replaces the serving configuration with an accepted update.
    pub fn accept(&mut self, world: World) {
        self.world = Arc::new(world);
        self.world_generation += 1;
        self.last_rejected = None;
    }

    /// Records a rejected update; the current configuration keeps serving.
    pub fn reject(&mut self, errors: Vec<UpdateError>, now: SystemTime) {
        for e in &errors {
            tracing::error!(file = %e.file, resource = %e.resource, field = %e.field, "rejected resource update: {}", e.message);
        }
        self.metrics.rejected_updates.inc();
        self.last_rejected = Some(Rejected {
            at: status::rfc3339(now),
            errors,
        });
    }

    /// Applies one SDS stream event; returns whether the snapshot must be recomputed.
    pub fn on_event(&mut self, event: StreamEvent) -> bool {
        match event {
            StreamEvent::Connected { stream, claims } => {
                let key = ProxyKey {
                    mesh: claims.mesh.clone(),
                    name: claims.name.clone(),
                };
                self.registrations.insert(key.clone(), claims);
                self.streams.entry(key).or_default().insert(stream)
            }
            StreamEvent::Disconnected { stream, proxy } => {
                let Some(set) = self.streams.get_mut(&proxy) else {
                    return false;
                };
                set.remove(&stream);
                if set.is_empty() {
                    self.streams.remove(&proxy);
                    return true;
                }
                false
            }
            // NACKs are logged and counted by the SDS server; ACKs matter once rollouts are gated on them.
            _ => false,
        }
    }

    /// The dataplanes meshca knows: from files, then from tokens of proxies that connected.
    fn dataplanes(&self) -> BTreeMap<ProxyKey, Result<DataplaneInfo, String>> {
        let mut out = BTreeMap::new();
        for dp in &self.world.resources.dataplanes {
            let key = ProxyKey {
                mesh: dp.mesh.clone(),
                name: dp.name.clone(),
            };
            let services = dp.inbounds.iter().map(|i| i.tags.clone()).collect();
            out.insert(
                key,
                Ok(DataplaneInfo::new(
                    &dp.mesh,
                    &dp.name,
                    dp.labels.clone(),
                    services,
                    Origin::File,
                )),
            );
        }
        for (key, claims) in &self.registrations {
            match out.get(key) {
                Some(Ok(file)) => {
                    if let Some(reason) = contradiction(file, claims) {
                        out.insert(key.clone(), Err(reason));
                    }
                }
                Some(Err(_)) => {}
                None => {
                    // The token's tags describe the proxy's one inbound.
                    let services = if claims.tags.is_empty() {
                        Vec::new()
                    } else {
                        vec![claims.tags.clone()]
                    };
                    let info = DataplaneInfo::new(
                        &claims.mesh,
                        &claims.name,
                        claims.labels.clone(),
                        services,
                        Origin::Token,
                    );
                    out.insert(key.clone(), Ok(info));
                }
            }
        }
        out
    }

    /// The SPIFFE IDs each MeshService's proxies present: `spec.identities` as given, plus, for services of
    /// this zone, the identity meshca decides for every dataplane the service selects.
    fn service_identities(
        &self,
        dataplanes: &BTreeMap<ProxyKey, Result<DataplaneInfo, String>>,
    ) -> bundles::ServiceIds {
        let mut out = bundles::ServiceIds::new();
        for service in &self.world.resources.mesh_services {
            let mut ids = bundles::service_spiffe_ids(&service.mesh, service);
            let local = service.zone().is_none_or(|z| z == self.zone);
            if let (true, Some(selector)) = (local, &service.dataplane_tags) {
                let mesh = self.world.meshes.get(&service.mesh);
                for dp in dataplanes.values().flatten() {
                    if dp.mesh != service.mesh || !dp.has_inbound_with(selector) {
                        continue;
                    }
                    if let Decision::Issue(d) =
                        plan::decide(mesh, dp, &self.zone, self.key_algorithm)
                    {
                        ids.insert(d.spiffe_id.to_string());
                    }
                }
            }
            out.insert((service.mesh.clone(), service.name.clone()), ids);
        }
        out
    }

    /// Brings every connected proxy's certificate up to date at `now`, then publishes a snapshot and status.
    ///
    /// Returns the earliest time a certificate is due for renewal.
    pub fn reconcile(&mut self, now: SystemTime) -> Option<SystemTime> {
        let dataplanes = self.dataplanes();
        let mut entries: HashMap<ProxyKey, ProxyEntry> = HashMap::new();
        self.decisions.clear();
        let mut next_renewal: Option<SystemTime> = None;

        let connected: Vec<ProxyKey> = self.streams.keys().cloned().collect();
        for key in &connected {
            let proxy_type = self.registrations.get(key).map(|c| c.proxy_type);
            let info = match dataplanes.get(key) {
                Some(Ok(info)) => info,
                Some(Err(reason)) => {
                    entries.insert(
                        key.clone(),
                        ProxyEntry::Refused {
                            reason: reason.clone(),
                        },
                    );
                    self.decisions.insert(key.clone(), Err(reason.clone()));
                    continue;
                }
                None => continue,
            };
            let decision = if proxy_type == Some(ProxyType::ZoneEgress) {
                Decision::NoIdentity(
                    "zone egress identities are not issued yet (DESIGN §9 is a later milestone)"
                        .into(),
                )
            } else {
                plan::decide(
                    self.world.meshes.get(&key.mesh),
                    info,
                    &self.zone,
                    self.key_algorithm,
                )
            };
            match decision {
                Decision::NoIdentity(reason) => {
                    self.decisions.insert(key.clone(), Err(reason.clone()));
                    entries.insert(key.clone(), ProxyEntry::NoIdentity { reason });
                }
                Decision::Issue(desired) => {
                    if self.needs_issue(key, &desired, now) {
                        if let Err(reason) = self.issue(key, &desired, now) {
                            self.metrics.issue_failed(&key.mesh, &desired.issuer);
                            tracing::error!(proxy = %key, issuer = %desired.issuer, "certificate not issued: {reason}");
                        }
                    }
                    match self.issued.get(key) {
                        Some(issued) => {
                            next_renewal = Some(
                                next_renewal.map_or(issued.renew_at, |t| t.min(issued.renew_at)),
                            );
                            entries
                                .insert(key.clone(), ProxyEntry::Ready(issued.published.clone()));
                            self.decisions.insert(key.clone(), Ok(()));
                        }
                        None => {
                            let reason = "issuance failed; see the daemon log".to_owned();
                            self.decisions.insert(key.clone(), Err(reason.clone()));
                            entries.insert(key.clone(), ProxyEntry::NoIdentity { reason });
                        }
                    }
                }
            }
        }
        // Certificates of dataplanes that no longer exist are dropped; those of disconnected proxies are kept
        // (a reconnect within their lifetime reuses them) but not served.
        self.issued
            .retain(|k, _| dataplanes.get(k).is_some_and(|d| d.is_ok()));

        let service_ids = self.service_identities(&dataplanes);
        self.generation += 1;
        let snapshot = bundles::snapshot(
            self.generation,
            &self.world,
            entries,
            &service_ids,
            &mut self.bundles,
        );
        self.snapshot_tx.send_replace(Arc::new(snapshot));
        self.publish_status(&dataplanes, &service_ids, now);
        next_renewal
    }

    fn needs_issue(&self, key: &ProxyKey, desired: &Desired, now: SystemTime) -> bool {
        match self.issued.get(key) {
            None => true,
            Some(issued) => {
                issued.ca_id != desired.ca.id()
                    || issued.svid.spiffe_id != desired.spiffe_id
                    || issued.identity_name != desired.identity_name
                    || now >= issued.renew_at
                    || now >= issued.svid.not_after
            }
        }
    }

    /// Issues, verifies against the issuing CA's bundle and the expected SPIFFE ID, then keeps the certificate.
    fn issue(&mut self, key: &ProxyKey, desired: &Desired, now: SystemTime) -> Result<(), String> {
        let started = std::time::Instant::now();
        let req = SvidRequest {
            spiffe_id: desired.spiffe_id.clone(),
            key_algorithm: desired.key_algorithm,
            lifetime: desired.lifetime,
        };
        let svid = desired.ca.issue(&req, now).map_err(|e| e.to_string())?;
        meshca_ca::verify_svid(
            &svid.chain_der,
            &desired.ca.bundle_der(),
            &desired.spiffe_id,
            now,
        )
        .map_err(|e| {
            format!("the new certificate failed verification and was not published: {e}")
        })?;
        self.metrics
            .issued(&key.mesh, &desired.issuer, started.elapsed());
        let renew_at = plan::renewal_time(svid.not_before, svid.not_after, self.renew_at, jitter());
        let regenerations = self.issued.get(key).map_or(0, |i| i.regenerations + 1);
        let published = Arc::new(ProxyIdentity {
            spiffe_id: svid.spiffe_id.to_string(),
            identity_name: desired.identity_name.clone(),
            chain_pem: svid.chain_pem.clone(),
            key_pem: SecretPem::new(svid.key.to_pem().to_string()),
        });
        tracing::info!(proxy = %key, spiffe_id = %svid.spiffe_id, issuer = %desired.issuer, serial = %svid.serial, "issued certificate");
        self.issued.insert(
            key.clone(),
            Issued {
                svid,
                issuer: desired.issuer.clone(),
                ca_id: desired.ca.id().to_owned(),
                identity_name: desired.identity_name.clone(),
                renew_at,
                regenerations,
                published,
            },
        );
        Ok(())
    }

    fn publish_status(
        &self,
        dataplanes: &BTreeMap<ProxyKey, Result<DataplaneInfo, String>>,
        service_ids: &bundles::ServiceIds,
        now: SystemTime,
    ) {
        let status = status::build(status::Inputs {
            generation: self.generation,
            world: &self.world,
            dataplanes,
            service_ids,
            connected: &self.streams,
            issued: &self.issued,
            decisions: &self.decisions,
            last_rejected: self.last_rejected.as_ref(),
            now,
        });
        self.metrics.observe_status(&status);
        self.status_tx.send_replace(Arc::new(status));
    }
}

/// Why a token contradicts the dataplane's resource file, if it does: the file wins, and a token that claims
/// other labels or tags is refused. The implicit `kuma.io/workload` (the proxy name) is not a claim.
fn contradiction(file: &DataplaneInfo, claims: &Claims) -> Option<String> {
    for (k, v) in &claims.labels {
        if k == plan::WORKLOAD_LABEL && v == &claims.name {
            continue;
        }
        match file.labels.get(k) {
            Some(fv) if fv == v => {}
            Some(fv) => {
                return Some(format!(
                    "the token claims label {k}={v}, but the Dataplane resource says {k}={fv}"
                ))
            }
            None => {
                return Some(format!(
                    "the token claims label {k}={v}, which the Dataplane resource does not have"
                ))
            }
        }
    }
    if let Some(service) = claims.tags.get(plan::SERVICE_TAG) {
        if !file.services().any(|s| s == service) {
            return Some(format!(
                "the token claims {}={service}, but the Dataplane resource's inbounds do not",
                plan::SERVICE_TAG
            ));
        }
    }
    None
}

/// A uniform number in `[0, 1)` from the system's secure random source.
fn jitter() -> f64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}
