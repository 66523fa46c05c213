//! The owner: the one place that turns the accepted configuration, the connected proxies and the clock
//! into an immutable [`Snapshot`] for SDS and a [`Status`] for operators.
//!
//! Only the owner changes its state (stream events, accepted or rejected updates, reconciles, issued
//! certificates). Certificates are issued on other threads ([`Owner::issue_in_background`]) and taken in
//! by [`Owner::on_issued`]. The snapshot is published whole through a `watch` channel, saying which proxies it changed; the status is
//! built from the owner's state when someone asks for it ([`Owner::status`]).

mod adopt;
mod incremental;
mod issue;
mod reconcile;
mod replacing;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_auth::{Claims, ProxyType};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::bundles::BundleCache;
use crate::egress::{EgressPlan, NoEgressIdentity};
use crate::error::{ClaimMismatch, UpdateError};
use crate::events::StreamEvent;
use crate::gate::{Gate, GateEvent};
use crate::peers::{GateView, PeerView, PresentedCa, PresentedIds};
use crate::plan::{DataplaneInfo, Issuer};
use crate::snapshot::{ClaimRule, ProxyHashMap, ProxyHashSet, ProxyIdentity, ProxyKey, Snapshot};
use crate::status::{self, Detail, Status};
use crate::streams::StreamTable;
use crate::timefmt::rfc3339;
use crate::trust::{CaId, CaTrust, ServiceIds, ServiceKey, TrustKey, TrustKeys};
use crate::world::World;
pub use adopt::{IssuedIdentity, RecordLink};
use incremental::Renewals;
use issue::Issuing;
pub use issue::{run_job, Completed, Job};
use replacing::Replacing;

/// How many proxies a replica names per CA its proxies present (its view says how many there are).
const NAMED_PRESENTERS: usize = 20;

/// Where the owner reports what is worth a metric. The binary exports them to Prometheus; every method
/// does nothing by default.
pub trait Telemetry: Send + Sync + std::fmt::Debug {
    /// A certificate was issued and verified in `took`.
    fn issued(&self, _mesh: &str, _issuer: &Issuer, _took: Duration) {}
    /// Issuing a certificate failed.
    fn issue_failed(&self, _mesh: &str, _issuer: &Issuer) {}
    /// A resource update was rejected.
    fn rejected_update(&self) {}
    /// The rollout gate started waiting, timed out, or kept a removed CA.
    fn gate_event(&self, _mesh: &str, _event: GateEvent) {}
    /// A reconcile looked at `proxies` proxies in `took`.
    fn reconciled(&self, _scope: Scope, _proxies: usize, _took: Duration) {}
}

/// How much of the fleet a reconcile looked at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every connected proxy: the configuration changed, a rollout is under way, or a change reached
    /// beyond the proxies it touched.
    Full,
    /// Only the proxies an event touched (connected, left, due for renewal).
    Proxies,
    /// No proxy: ACKs while a rollout waits (is a wait over? which replaced certificates are ACKed?).
    Acks,
    /// Quiet proxies a full reconcile left for the loop's next turns (see [`Owner::serve_deferred`]).
    Deferred,
}

impl Scope {
    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Full => "full",
            Scope::Proxies => "proxies",
            Scope::Acks => "acks",
            Scope::Deferred => "deferred",
        }
    }
}

/// Telemetry that goes nowhere.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTelemetry;

impl Telemetry for NoTelemetry {}

/// A certificate the owner issued and keeps for a proxy.
#[derive(Debug)]
pub(crate) struct Issued {
    /// What the owner needs of the certificate; the PEMs SDS serves (and the key) are in `published`
    /// only, so that an idle proxy costs one copy of them.
    pub leaf: Leaf,
    /// Who issued it.
    pub issuer: Issuer,
    /// The issuing CA's id.
    pub ca_id: CaId,
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
    /// The certificates this one replaced since the proxy last ACKed one (their CAs and SPIFFE IDs),
    /// until the proxy ACKs this one: peers may still see any of them (a slow proxy that was issued two
    /// certificates in a row still presents the first one's predecessor), so their CAs stay in the
    /// bundles and their IDs in the contexts with SAN matchers (break last).
    pub previous: Vec<Previous>,
    /// The snapshot generation that first carried this certificate; `None` until one is published.
    /// Set when the snapshot goes out, never guessed ahead: a snapshot with only new trust may take
    /// the next generation first, and an ACK of that one says nothing about this certificate.
    pub first_served_in: Option<u64>,
    /// When it was issued.
    pub issued_at: SystemTime,
}

/// The facts of an issued certificate the owner decides with.
#[derive(Debug)]
pub(crate) struct Leaf {
    /// The SPIFFE ID in its URI SAN.
    pub spiffe_id: meshca_identity::SpiffeId,
    /// NotAfter.
    pub not_after: SystemTime,
    /// The serial number, lowercase hex.
    pub serial: String,
}

/// A replaced certificate a proxy may still present.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Previous {
    /// Its CA, as bundles carry it.
    pub ca_trust: CaTrust,
    /// Its SPIFFE ID.
    pub spiffe_id: String,
}

/// What the owner remembers of a proxy beyond its certificate, for operators.
#[derive(Debug, Default)]
pub(crate) struct ProxyRecord {
    /// Why the last token presented for this proxy was refused, if one was.
    pub refused_token: Option<String>,
    /// Responses it rejected.
    pub nacks: u64,
    /// Its last rejection message.
    pub last_nack: Option<String>,
}

/// A rejected resource update, kept for the admin API and `meshca status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Rejected {
    /// When it was rejected (RFC 3339).
    pub at: String,
    /// Every error found.
    pub errors: Vec<UpdateError>,
}

/// How an owner issues and rolls out.
#[derive(Clone, Debug)]
pub struct OwnerConfig {
    /// `zone`, for `{{ .Zone }}` and for telling local MeshServices from others.
    pub zone: String,
    /// `issuance.keyAlgorithm`.
    pub key_algorithm: meshca_identity::KeyAlgorithm,
    /// `issuance.renewAt`.
    pub renew_at: f64,
    /// `rollout.ackTimeout`.
    pub ack_timeout: Duration,
    /// The rollout gate; only drills turn it off, to show what it prevents.
    pub gate: bool,
    /// `defaults.mesh`: the mesh whose identity the zone egress uses (`None`: meshca chooses).
    pub default_mesh: Option<String>,
    /// How many threads issue a wave of certificates (`issuance.workers`, resolved: at least 1).
    pub workers: usize,
    /// `issuance.keysAhead`: RSA leaf keys the issuance threads keep generated ahead.
    pub keys_ahead: usize,
}

impl OwnerConfig {
    /// The configuration the settings describe, with the gate on.
    pub fn from_settings(settings: &meshca_config::Settings) -> OwnerConfig {
        OwnerConfig {
            zone: settings.zone.clone(),
            key_algorithm: settings.issuance.key_algorithm,
            renew_at: settings.issuance.renew_at,
            ack_timeout: settings.rollout.ack_timeout.as_std(),
            gate: true,
            default_mesh: settings.defaults.mesh.clone(),
            workers: crate::pool::worker_count(settings.issuance.workers),
            keys_ahead: settings.issuance.keys_ahead,
        }
    }
}

/// The owner's state: the serving configuration, connected proxies and their certificates. What it
/// publishes changes only in [`Owner::reconcile`] and [`Owner::on_issued`].
#[derive(Debug)]
pub struct Owner {
    config: OwnerConfig,
    world: Arc<World>,
    /// The claims each token-registered proxy presented when it first connected.
    registrations: ProxyHashMap<Arc<Claims>>,
    /// The registered proxies whose token is a zone egress token: a handful, looked at by every
    /// reconcile without a pass over the fleet.
    egress_keys: BTreeSet<ProxyKey>,
    streams: StreamTable,
    issued: ProxyHashMap<Issued>,
    /// Why each connected proxy without a certificate has none.
    reasons: ProxyHashMap<String>,
    records: BTreeMap<ProxyKey, ProxyRecord>,
    /// MeshServices whose `status.tls` is Ready: set once every selected dataplane holds a trusted
    /// certificate, cleared only when the mesh's mTLS is switched off.
    tls_ready: BTreeSet<ServiceKey>,
    last_rejected: Option<Rejected>,
    /// The generation of the last published snapshot.
    snapshot_generation: u64,
    bundles: BundleCache,
    gate: Gate,
    /// Something waits on ACKs: ACK events trigger a reconcile.
    waiting_on_acks: bool,
    /// The proxies whose certificate replaced ones peers may still see, until they ACK it.
    replacing: Replacing,
    /// Where the zone egress identity comes from, as of the last reconcile (logged when it changes).
    egress: Option<Result<EgressPlan, NoEgressIdentity>>,
    /// Certificates issued in the wave under way, per (mesh, issuer).
    wave: BTreeMap<(String, String), u64>,
    /// What is being issued, and where.
    issuing: Issuing,
    /// The next reconcile must look at every proxy (the configuration changed, or nothing was
    /// reconciled yet).
    full: bool,
    /// Proxies that connected or left since the last reconcile.
    touched: BTreeSet<ProxyKey>,
    /// Quiet proxies the last full reconcile left for later turns, served a chunk at a time by
    /// [`Owner::serve_deferred`]; each keeps its published certificate meanwhile.
    deferred: Vec<ProxyKey>,
    /// When each served proxy's certificate is renewed.
    renewals: Renewals,
    /// The earliest rollout timeout or CA rotation step, as of the last full reconcile.
    next_global: Option<SystemTime>,
    /// The CAs the configuration publishes, as of the last full reconcile (not those kept only because a
    /// proxy still presents them).
    configured: TrustKeys,
    /// The time of the last reconcile.
    reconciled_at: SystemTime,
    /// Every dataplane as of the last reconcile.
    dataplanes: Dataplanes,
    /// The resources `dataplanes` was described from.
    described_from: Option<Arc<meshca_config::Resources>>,
    /// Every MeshService's SPIFFE IDs as of the last reconcile.
    service_ids: ServiceIds,
    /// The SPIFFE IDs this replica's proxies present, per computed service, as of the last full
    /// reconcile (for the peers).
    presented_ids: PresentedIds,
    telemetry: Arc<dyn Telemetry>,
    snapshot_tx: watch::Sender<Arc<Snapshot>>,
    /// Where issued identities are recorded and recorded ones looked up (replicas on a database).
    record_link: Option<RecordLink>,
    /// Identities issued since the last batch was sent.
    to_record: Vec<IssuedIdentity>,
    /// Proxies whose recorded identity was asked for and has not come back.
    looking_up: ProxyHashSet,
}

/// What is known of every dataplane: its description, or why its token was refused.
pub(crate) type Dataplanes = BTreeMap<ProxyKey, Result<DataplaneInfo, ClaimMismatch>>;

impl Owner {
    /// An owner serving `world`, publishing on the given channels.
    pub fn new(
        config: OwnerConfig,
        world: World,
        telemetry: Arc<dyn Telemetry>,
        snapshot_tx: watch::Sender<Arc<Snapshot>>,
    ) -> Owner {
        Owner {
            gate: Gate::new(config.gate, config.ack_timeout),
            config,
            world: Arc::new(world),
            registrations: ProxyHashMap::default(),
            egress_keys: BTreeSet::new(),
            streams: StreamTable::default(),
            issued: ProxyHashMap::default(),
            reasons: ProxyHashMap::default(),
            records: BTreeMap::new(),
            tls_ready: BTreeSet::new(),
            last_rejected: None,
            snapshot_generation: 0,
            bundles: BundleCache::default(),
            waiting_on_acks: false,
            replacing: Replacing::default(),
            egress: None,
            wave: BTreeMap::new(),
            issuing: Issuing::default(),
            full: true,
            touched: BTreeSet::new(),
            deferred: Vec::new(),
            renewals: Renewals::default(),
            next_global: None,
            configured: TrustKeys::default(),
            reconciled_at: SystemTime::UNIX_EPOCH,
            dataplanes: Dataplanes::new(),
            described_from: None,
            service_ids: ServiceIds::new(),
            presented_ids: PresentedIds::new(),
            telemetry,
            snapshot_tx,
            record_link: None,
            to_record: Vec::new(),
            looking_up: ProxyHashSet::default(),
        }
    }

    /// The status at `now`, as of the last reconcile: built when asked for, never on a reconcile.
    /// [`Detail::Summary`] leaves out the per-dataplane list, whose size is the fleet's.
    pub fn status(&self, now: SystemTime, detail: Detail) -> Status {
        let mut waits = self.identity_ack_waits(now);
        waits.extend(self.gate.waits_now(&self.streams));
        status::build(
            &status::Inputs {
                generation: self.snapshot_generation,
                world: &self.world,
                dataplanes: &self.dataplanes,
                service_ids: &self.service_ids,
                streams: &self.streams,
                issued: &self.issued,
                reasons: &self.reasons,
                records: &self.records,
                last_rejected: self.last_rejected.as_ref(),
                waits: &waits,
                tls_ready: &self.tls_ready,
                egress: self.egress.as_ref(),
                now,
            },
            detail,
        )
    }

    /// Takes in what the other live replicas on the database report (their rollouts); whether it
    /// changed anything, when a reconcile must look at every wait again.
    pub fn set_peers(&mut self, peers: Vec<PeerView>) -> bool {
        if !self.gate.set_peers(peers) {
            return false;
        }
        self.full = true;
        self.gate.enabled()
    }

    /// What this replica reports to its peers: the trust and SPIFFE IDs its streams have ACKed, as
    /// of now, and what its connected proxies present.
    pub fn gate_view(&self) -> GateView {
        GateView {
            trust_acked: self.gate.trust_acked(),
            sans_acked: self.gate.sans_acked(),
            presented: self.presented_cas(),
            presented_ids: self.presented_ids.clone(),
        }
    }

    /// The CAs connected proxies present certificates from (current, and replaced but not ACKed),
    /// each with the first proxies by name.
    fn presented_cas(&self) -> Vec<PresentedCa> {
        let mut grouped: HashMap<TrustKey, (&CaTrust, Vec<&ProxyKey>)> = HashMap::new();
        for (key, issued) in &self.issued {
            if !self.streams.is_connected(key) {
                continue;
            }
            let cas = std::iter::once(&issued.ca_trust)
                .chain(issued.previous.iter().map(|p| &p.ca_trust));
            for ca in cas {
                grouped
                    .entry(ca.key())
                    .or_insert((ca, Vec::new()))
                    .1
                    .push(key);
            }
        }
        let mut out: Vec<PresentedCa> = grouped
            .into_values()
            .map(|(ca, mut proxies)| {
                proxies.sort_unstable();
                proxies.dedup();
                PresentedCa {
                    mesh: ca.bundle.to_string(),
                    trust_domain: ca.trust_domain.clone(),
                    ca: ca.ca_id.to_string(),
                    anchors: ca.pems.to_vec(),
                    proxies: proxies.len(),
                    named: proxies
                        .iter()
                        .take(NAMED_PRESENTERS)
                        .map(ToString::to_string)
                        .collect(),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.mesh, &a.trust_domain, &a.ca).cmp(&(&b.mesh, &b.trust_domain, &b.ca))
        });
        out
    }

    /// The time of the last reconcile.
    #[cfg(test)]
    pub(crate) fn reconciled_at(&self) -> SystemTime {
        self.reconciled_at
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

    /// Replaces the serving configuration with the same resources re-evaluated (automatic CA
    /// rotation).
    pub fn replace_world(&mut self, world: World) {
        // A reload that changed nothing is no event: the serving world stays, nobody is re-planned.
        if world.same_content(&self.world) {
            return;
        }
        self.world = Arc::new(world);
        self.full = true;
    }

    /// Changes `defaults.mesh` (the mesh whose identity the zone egress uses) while serving; the next
    /// reconcile moves the egress to it, in the order the rollout gate allows.
    pub fn set_default_mesh(&mut self, mesh: Option<String>) {
        if self.config.default_mesh != mesh {
            self.config.default_mesh = mesh;
            self.full = true;
        }
    }

    /// Records a rejected update; the current configuration keeps serving.
    pub fn reject(&mut self, errors: Vec<UpdateError>, now: SystemTime) {
        for e in &errors {
            tracing::error!(file = %e.file, resource = %e.resource, field = %e.field, "rejected resource update: {}", e.message);
        }
        self.telemetry.rejected_update();
        self.last_rejected = Some(Rejected {
            at: rfc3339(now),
            errors,
        });
    }

    /// Applies one SDS stream event; returns whether the snapshot must be recomputed.
    pub fn on_event(&mut self, event: StreamEvent) -> bool {
        match event {
            StreamEvent::Connected { stream, claims } => self.on_connected(stream, claims),
            StreamEvent::Subscribed { stream, resources } => {
                self.stir(stream);
                self.streams.subscribe(stream, resources) && self.waiting_on_acks
            }
            StreamEvent::Acked {
                stream, generation, ..
            } => {
                // A rollout waiting on ACKs may proceed.
                self.stir(stream);
                self.streams.ack(stream, generation) && self.waiting_on_acks
            }
            StreamEvent::Nacked {
                stream, message, ..
            } => {
                if let Some(proxy) = self.streams.proxy_of(stream) {
                    let record = self.records.entry(proxy.clone()).or_default();
                    record.nacks += 1;
                    record.last_nack = Some(message);
                }
                // Only the status changes, and it is built when asked for.
                false
            }
            // When its last stream leaves, the proxy stops being served; its registration and
            // certificate are kept so that a reconnect within the certificate's life reuses them.
            // Another stream of the proxy leaving matters only to a rollout that may wait on it.
            StreamEvent::Disconnected { stream } => {
                self.stir(stream);
                match self.streams.disconnect(stream) {
                    Some(proxy) => {
                        self.touched.insert(proxy);
                        true
                    }
                    None => self.waiting_on_acks,
                }
            }
        }
    }

    /// Notes that `stream`'s proxy may have settled the certificates its new one replaced.
    fn stir(&mut self, stream: crate::StreamId) {
        if let Some(proxy) = self.streams.proxy_of(stream) {
            self.replacing.stir(proxy);
        }
    }

    fn on_connected(&mut self, stream: crate::StreamId, claims: Arc<Claims>) -> bool {
        let key = ProxyKey::new(claims.mesh.clone(), claims.name.clone());
        // A token that contradicts what the proxy was given (its Dataplane file, or the token that
        // registered it and is still connected) neither changes the proxy nor counts as it: the stream
        // refuses itself against the snapshot's claim rule.
        if let Some(rule) = self.claim_rule(&key) {
            if let Err(reason) = rule.check(&claims) {
                tracing::warn!(proxy = %key, token = %claims.id, "refused a token: {reason}");
                self.records.entry(key).or_default().refused_token = Some(reason.to_string());
                // Only the status changes, and it is built when asked for.
                return false;
            }
        }
        let zone_egress = claims.proxy_type == ProxyType::ZoneEgress;
        if !self.streams.is_connected(&key) {
            if zone_egress {
                self.egress_keys.insert(key.clone());
            } else {
                self.egress_keys.remove(&key);
            }
            self.registrations.insert(key.clone(), claims);
        }
        let first = self.streams.connect(stream, key.clone(), zone_egress);
        // Any stream, not only the first: Envoy may open its streams to several replicas, and the
        // one that carries its identity may move here last.
        self.look_up(&key);
        if first {
            self.touched.insert(key);
            return true;
        }
        // Another stream of a connected proxy matters only to a rollout that may wait on it.
        self.waiting_on_acks
    }

    /// What a token for `key` must not contradict: the Dataplane file, else the registering token while
    /// its proxy is connected.
    fn claim_rule(&self, key: &ProxyKey) -> Option<ClaimRule> {
        if let Some(dp) = self.world.resources.dataplane(&key.mesh, &key.name) {
            return Some(DataplaneInfo::from_file(dp).claim_rule());
        }
        if !self.streams.is_connected(key) {
            return None;
        }
        let claims = self.registrations.get(key)?;
        Some(DataplaneInfo::from_claims(claims).claim_rule())
    }

    /// The dataplanes meshca knows: from files, and from tokens of proxies that connected.
    fn known_dataplanes(&self) -> Dataplanes {
        let filed = self
            .world
            .resources
            .dataplanes
            .iter()
            .map(|dp| ProxyKey::new(dp.mesh.clone(), dp.name.clone()));
        let keys: BTreeSet<ProxyKey> = filed.chain(self.registrations.keys().cloned()).collect();
        keys.into_iter()
            .filter_map(|key| Some((key.clone(), self.describe(&key)?)))
            .collect()
    }

    /// Every dataplane, described anew only where something changed: all of them under a new
    /// configuration, else the proxies in `touched` (whose registration may have changed).
    fn refresh_dataplanes(&mut self, touched: &BTreeSet<ProxyKey>) -> Dataplanes {
        if !self.descriptions_current() {
            self.described_from = Some(self.world.resources.clone());
            return self.known_dataplanes();
        }
        self.described_from = Some(self.world.resources.clone());
        let mut dataplanes = std::mem::take(&mut self.dataplanes);
        for key in touched {
            match self.describe(key) {
                Some(described) => dataplanes.insert(key.clone(), described),
                None => dataplanes.remove(key),
            };
        }
        dataplanes
    }

    /// Whether the dataplanes were described from files that describe them as the serving ones do: the
    /// same Dataplane and ZoneEgress resources (an edit of a Mesh or a MeshIdentity changes no
    /// description).
    pub(super) fn descriptions_current(&self) -> bool {
        self.described_from.as_ref().is_some_and(|from| {
            let now = &self.world.resources;
            Arc::ptr_eq(from, now)
                || (from.dataplanes == now.dataplanes && from.zone_egresses == now.zone_egresses)
        })
    }

    /// What meshca knows of one dataplane: its Dataplane file, else (for a zone egress) its ZoneEgress
    /// file, else the token that registered it. A token that contradicts a file makes it an error naming
    /// the contradiction. `None` for a proxy nobody described.
    fn describe(&self, key: &ProxyKey) -> Option<Result<DataplaneInfo, ClaimMismatch>> {
        let resources = &self.world.resources;
        let filed = resources
            .dataplane(&key.mesh, &key.name)
            .map(DataplaneInfo::from_file);
        let Some(claims) = self.registrations.get(key) else {
            return filed.map(Ok);
        };
        let egress_file = (claims.proxy_type == ProxyType::ZoneEgress)
            .then(|| resources.zone_egress(&key.name))
            .flatten();
        let info = match (filed, egress_file) {
            (Some(info), _) => info,
            (None, Some(egress)) => DataplaneInfo::from_zone_egress(&key.mesh, egress),
            (None, None) => return Some(Ok(DataplaneInfo::from_claims(claims))),
        };
        Some(info.claim_rule().check(claims).map(|()| info))
    }

    /// Whether `key` is a zone egress (its token says so).
    fn is_zone_egress(&self, key: &ProxyKey) -> bool {
        self.egress_keys.contains(key)
    }
}
