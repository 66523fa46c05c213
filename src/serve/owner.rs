//! The owner: the one task that turns the accepted configuration, the connected proxies and the clock into
//! an immutable [`Snapshot`] for SDS and a [`Status`] for the admin API.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use meshca_auth::{Claims, ProxyType};
use meshca_ca::{Svid, SvidRequest};
use meshca_sds::{
    ClaimRule, ProxyEntry, ProxyIdentity, ProxyKey, SecretPem, Snapshot, StreamEvent, StreamId,
};
use tokio::sync::watch;

use super::bundles;
use super::metrics::Metrics;
use super::plan::{self, DataplaneInfo, Decision, Desired, Issuer, Origin};
use super::rollout::{self, CaTrust, Gate, StreamSource, Wait};
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
    /// The issuing CA as bundles carry it.
    pub ca_trust: CaTrust,
    /// The CA of the certificate this one replaced, until the proxy ACKs this one (break last).
    pub previous: Option<CaTrust>,
    /// The snapshot generation that first served this certificate.
    pub published_generation: u64,
    /// When it was issued.
    pub issued_at: SystemTime,
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
    /// MeshServices whose `status.tls` is Ready: set once every selected dataplane holds a trusted
    /// certificate, cleared only when the mesh's mTLS is switched off.
    tls_ready: std::collections::BTreeSet<(String, String)>,
    /// The last token refused for each proxy, and why.
    refused_tokens: BTreeMap<ProxyKey, String>,
    last_rejected: Option<Rejected>,
    generation: u64,
    bundles: bundles::BundleCache,
    gate: Gate,
    streams_source: Option<Arc<dyn StreamSource>>,
    /// Something waits on ACKs: ACK events trigger a reconcile.
    pending: bool,
    /// The configuration changed since the last reconcile (new CAs may need ACKs).
    world_changed: bool,
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
            refused_tokens: BTreeMap::new(),
            tls_ready: std::collections::BTreeSet::new(),
            last_rejected: None,
            generation: 0,
            bundles: bundles::BundleCache::default(),
            gate: Gate::new(true, settings.rollout.ack_timeout.as_std()),
            streams_source: None,
            pending: false,
            world_changed: true,
            metrics,
            snapshot_tx,
            status_tx,
        }
    }

    /// Turns the ordering gate of DESIGN §8 on or off; `streams` tells which proxies hold what.
    pub fn with_gate(mut self, gate: bool, streams: Arc<dyn StreamSource>) -> Owner {
        self.gate = Gate::new(gate, self.gate.ack_timeout());
        self.streams_source = Some(streams);
        self
    }

    /// The configuration currently serving.
    pub fn world(&self) -> &Arc<World> {
        &self.world
    }

    /// Replaces the serving configuration with an accepted update.
    pub fn accept(&mut self, world: World) {
        self.replace_world(world);
        self.last_rejected = None;
    }

    /// Replaces the serving configuration with the same resources re-evaluated (automatic CA rotation).
    pub fn replace_world(&mut self, world: World) {
        self.world = Arc::new(world);
        self.world_generation += 1;
        self.world_changed = true;
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
                // A token that contradicts what the proxy was given (its Dataplane file, or the token that
                // registered it and is still connected) neither changes the proxy nor counts as it: the
                // stream refuses itself against the snapshot's claim rule.
                if let Some(rule) = self.claim_rule(&key) {
                    if let Err(reason) = rule.check(&claims) {
                        tracing::warn!(proxy = %key, token = %claims.id, "refused a token: {reason}");
                        self.refused_tokens.insert(key, reason);
                        // Only the status changes; the reconcile that publishes it issues nothing.
                        return true;
                    }
                }
                if !self.streams.contains_key(&key) {
                    self.registrations.insert(key.clone(), claims);
                }
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
            // A rollout waiting on ACKs may proceed; NACKs are logged and counted by the SDS server.
            StreamEvent::Acked { .. } => self.pending,
            _ => false,
        }
    }

    /// What a token for `key` must not contradict: the Dataplane file, else the registering token while its
    /// proxy is connected.
    fn claim_rule(&self, key: &ProxyKey) -> Option<ClaimRule> {
        if let Some(dp) = self.world.resources.dataplane(&key.mesh, &key.name) {
            return Some(claim_rule(&DataplaneInfo::from_file(dp)));
        }
        if !self.streams.contains_key(key) {
            return None;
        }
        let claims = self.registrations.get(key)?;
        Some(claim_rule(&DataplaneInfo::from_claims(claims)))
    }

    /// The dataplanes meshca knows: from files, then from tokens of proxies that connected.
    fn dataplanes(&self) -> BTreeMap<ProxyKey, Result<DataplaneInfo, String>> {
        let mut out = BTreeMap::new();
        for dp in &self.world.resources.dataplanes {
            let key = ProxyKey {
                mesh: dp.mesh.clone(),
                name: dp.name.clone(),
            };
            out.insert(key, Ok(DataplaneInfo::from_file(dp)));
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
                    out.insert(key.clone(), Ok(DataplaneInfo::from_claims(claims)));
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

    /// Updates MeshService `status.tls` (DESIGN §8): Ready once mTLS is on and every dataplane the service
    /// selects holds a certificate from a CA its mesh trusts; then Ready until mTLS is switched off.
    fn update_service_tls(
        &mut self,
        dataplanes: &BTreeMap<ProxyKey, Result<DataplaneInfo, String>>,
        trust: &BTreeMap<String, Vec<CaTrust>>,
    ) {
        for service in &self.world.resources.mesh_services {
            let key = (service.mesh.clone(), service.name.clone());
            let mtls_on = self.world.meshes.get(&service.mesh).is_some_and(|m| {
                m.enabled_backend.is_some()
                    || m.identities.iter().any(|i| {
                        matches!(i.provider, super::world::IdentityProvider::Bundled { .. })
                    })
            });
            if !mtls_on {
                self.tls_ready.remove(&key);
                continue;
            }
            if self.tls_ready.contains(&key) {
                continue;
            }
            let Some(selector) = &service.dataplane_tags else {
                continue;
            };
            let trusted: std::collections::HashSet<&str> = trust
                .get(&service.mesh)
                .into_iter()
                .flatten()
                .map(|c| c.ca_id.as_str())
                .collect();
            let mut selected = dataplanes
                .iter()
                .filter_map(|(k, d)| d.as_ref().ok().map(|d| (k, d)))
                .filter(|(_, d)| d.mesh == service.mesh && d.has_inbound_with(selector))
                .peekable();
            if selected.peek().is_none() {
                continue;
            }
            let all_hold = selected.all(|(k, _)| {
                self.issued
                    .get(k)
                    .is_some_and(|i| trusted.contains(i.ca_id.as_str()))
            });
            if all_hold {
                self.tls_ready.insert(key);
            }
        }
        let services: std::collections::BTreeSet<(String, String)> = self
            .world
            .resources
            .mesh_services
            .iter()
            .map(|s| (s.mesh.clone(), s.name.clone()))
            .collect();
        self.tls_ready.retain(|k| services.contains(k));
    }

    /// Brings every connected proxy's certificate up to date at `now`, in the order DESIGN §8 demands, then
    /// publishes a snapshot and status.
    ///
    /// Returns the earliest time something is due: a renewal, or a rollout timeout.
    pub fn reconcile(&mut self, now: SystemTime) -> Option<SystemTime> {
        let dataplanes = self.dataplanes();
        let next_generation = self.generation + 1;
        // The stream list is read only when something may wait on ACKs: it is one copy per open stream.
        let fetched = self.gate.enabled() && (self.pending || self.world_changed);
        let streams = match &self.streams_source {
            Some(source) if fetched => source.list(),
            _ => Vec::new(),
        };
        self.world_changed = false;
        self.gate.begin();
        self.gate.confirm(&streams, now);
        self.settle_previous(&streams, now);

        // Break last: what proxies present now (their certificate, and the one it replaces until they ACK
        // it) stays trusted even when the configuration removed its CA.
        let presented: Vec<(ProxyKey, CaTrust)> = self
            .issued
            .iter()
            .filter(|(k, _)| self.streams.contains_key(*k))
            .flat_map(|(k, i)| {
                std::iter::once(&i.ca_trust)
                    .chain(i.previous.as_ref())
                    .map(|ca| (k.clone(), ca.clone()))
            })
            .collect();
        let desired = self
            .world
            .meshes
            .values()
            .flat_map(bundles::mesh_cas)
            .collect();
        let trust = self
            .gate
            .plan_trust(desired, &presented, next_generation, now);
        if fetched {
            // A CA that no connected stream must carry may issue at once.
            self.gate.confirm(&streams, now);
        }

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
            let desired = match decision {
                Decision::NoIdentity(reason) => {
                    self.decisions.insert(key.clone(), Err(reason.clone()));
                    entries.insert(key.clone(), ProxyEntry::NoIdentity { reason });
                    continue;
                }
                Decision::Issue(desired) => desired,
            };
            // Trust before identity: a CA issues only once every stream that must trust it has ACKed it.
            let gated = !self.gate.may_issue(&key.mesh, desired.ca.id());
            if self.needs_issue(key, &desired, now) && !gated {
                if let Err(reason) = self.issue(key, &desired, next_generation, now) {
                    self.metrics.issue_failed(&key.mesh, &desired.issuer);
                    tracing::error!(proxy = %key, issuer = %desired.issuer, "certificate not issued: {reason}");
                }
            }
            match self.issued.get(key) {
                Some(issued) => {
                    next_renewal =
                        Some(next_renewal.map_or(issued.renew_at, |t| t.min(issued.renew_at)));
                    entries.insert(key.clone(), ProxyEntry::Ready(issued.published.clone()));
                    self.decisions.insert(key.clone(), Ok(()));
                }
                None if gated => {
                    entries.insert(key.clone(), ProxyEntry::Pending);
                    self.decisions.insert(
                        key.clone(),
                        Err(
                            "waiting for connected proxies to ACK the new CA's trust bundle".into(),
                        ),
                    );
                }
                None => {
                    let reason = "issuance failed; see the daemon log".to_owned();
                    self.decisions.insert(key.clone(), Err(reason.clone()));
                    entries.insert(key.clone(), ProxyEntry::NoIdentity { reason });
                }
            }
        }
        // Certificates of dataplanes that no longer exist are dropped; those of disconnected proxies are kept
        // (a reconnect within their lifetime reuses them) but not served.
        self.issued
            .retain(|k, _| dataplanes.get(k).is_some_and(|d| d.is_ok()));

        let service_ids = self.service_identities(&dataplanes);
        self.update_service_tls(&dataplanes, &trust);
        let mut snapshot = bundles::snapshot(
            next_generation,
            &self.world,
            &trust,
            entries,
            &service_ids,
            &mut self.bundles,
        );
        // Every filed dataplane has a rule (a contradicting token is refused at once, connected or not);
        // a token-registered one only while the registering proxy is connected.
        snapshot.claim_rules = dataplanes
            .iter()
            .filter_map(|(k, d)| match d {
                Ok(info) if info.origin == Origin::File || self.streams.contains_key(k) => {
                    Some((k.clone(), Arc::new(claim_rule(info))))
                }
                _ => None,
            })
            .collect();
        // Publish only what changed: every publish wakes every stream, and streams whose content did not change
        // report an ACK of the new generation, which would wake a waiting rollout again.
        if !bundles::same_content(&snapshot, &self.snapshot_tx.borrow()) {
            self.generation = next_generation;
            self.snapshot_tx.send_replace(Arc::new(snapshot));
        }
        for (mesh, event) in self.gate.take_events() {
            self.metrics.gate_event(&mesh, event);
        }
        self.pending = self.gate.pending() || self.issued.values().any(|i| i.previous.is_some());
        self.publish_status(&dataplanes, &service_ids, now);
        let previous_deadline = self
            .issued
            .values()
            .filter(|i| i.previous.is_some())
            .map(|i| i.issued_at + self.gate.ack_timeout())
            .min();
        [
            next_renewal,
            self.gate.next_deadline(),
            previous_deadline,
            self.world.next_rotation_event(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Forgets the previous certificate of every proxy that ACKed its replacement on each stream it
    /// receives its identity on, that disconnected, or whose `ackTimeout` passed.
    fn settle_previous(&mut self, streams: &[meshca_sds::StreamInfo], now: SystemTime) {
        let timeout = self.gate.ack_timeout();
        let mut waiting: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let mut since: HashMap<(String, String), SystemTime> = HashMap::new();
        for (key, issued) in self.issued.iter_mut() {
            let Some(previous) = &issued.previous else {
                continue;
            };
            let connected = self.streams.contains_key(key);
            let unacked = rollout::waiting_for(streams, issued.published_generation, |s| {
                &s.proxy == key && s.resources.iter().any(|r| rollout::is_identity_resource(r))
            });
            if !connected || unacked.is_empty() {
                issued.previous = None;
            } else if now >= issued.issued_at + timeout {
                tracing::warn!(proxy = %key, "rollout.ackTimeout passed: the proxy has not ACKed its new certificate; no longer keeping its old CA trusted for it");
                self.gate.timed_out(&key.mesh, "identity-ack");
                issued.previous = None;
            } else {
                let group = (key.mesh.clone(), previous.subject.clone());
                let t = since.entry(group.clone()).or_insert(issued.issued_at);
                *t = (*t).min(issued.issued_at);
                waiting.entry(group).or_default().push(key.to_string());
            }
        }
        for ((mesh, ca), proxies) in waiting {
            let started = since[&(mesh.clone(), ca.clone())];
            self.gate.wait(
                Wait {
                    mesh,
                    step: "identity-ack",
                    ca,
                    since: status::rfc3339(started),
                    timeout_in_seconds: status::seconds_until(started + timeout, now).max(0),
                    waiting_count: proxies.len(),
                    waiting_for: proxies.into_iter().take(20).collect(),
                },
                false,
            );
        }
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
    fn issue(
        &mut self,
        key: &ProxyKey,
        desired: &Desired,
        generation: u64,
        now: SystemTime,
    ) -> Result<(), String> {
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
        let old = self.issued.get(key);
        let regenerations = old.map_or(0, |i| i.regenerations + 1);
        let ca_trust = bundles::ca_trust(
            &key.mesh,
            svid.spiffe_id.trust_domain().as_str(),
            &desired.ca,
        );
        // Break last: until the proxy ACKs this certificate, peers may still see the one it replaces.
        let previous = match old {
            Some(old) if self.gate.enabled() && old.ca_id != ca_trust.ca_id => {
                Some(old.ca_trust.clone())
            }
            Some(old) => old.previous.clone(),
            None => None,
        };
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
                ca_trust,
                previous,
                published_generation: generation,
                issued_at: now,
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
            waits: self.gate.waits(),
            refused_tokens: &self.refused_tokens,
            tls_ready: &self.tls_ready,
            now,
        });
        self.metrics.observe_status(&status);
        self.metrics.observe_cas(&self.world, now);
        self.status_tx.send_replace(Arc::new(status));
    }
}

/// The claim rule of a dataplane: its labels and services.
fn claim_rule(info: &DataplaneInfo) -> ClaimRule {
    ClaimRule {
        labels: info.labels.clone(),
        services: info.services().map(str::to_owned).collect(),
    }
}

/// Why a token contradicts the dataplane's resource file, if it does: the file wins, and a token that claims
/// other labels or tags is refused. The implicit `kuma.io/workload` (the proxy name) is not a claim.
fn contradiction(file: &DataplaneInfo, claims: &Claims) -> Option<String> {
    claim_rule(file).check(claims).err()
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
