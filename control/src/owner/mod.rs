//! The owner: the one place that turns the accepted configuration, the connected proxies and the clock
//! into an immutable [`Snapshot`] for SDS and a [`Status`] for operators.
//!
//! Only the owner changes its state (stream events, accepted or rejected updates, reconciles, issued
//! certificates). Certificates are issued on other threads ([`Owner::issue_in_background`]) and taken in
//! by [`Owner::on_issued`]. The snapshot is published whole through a `watch` channel, saying which proxies it changed; the status is
//! built from the owner's state when someone asks for it ([`Owner::status`]).

mod adopt;
mod agenda;
mod agent_keys;
mod identities;
mod incremental;
mod issue;
mod links;
mod proxies;
mod publisher;
mod reconcile;
mod reconciled;
mod replacing;
mod served;
mod signed;
pub(crate) mod status;
#[cfg(test)]
mod tests;
mod trusted;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use meshca_auth::Claims;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::egress::{EgressPlan, NoEgressIdentity};
use crate::error::{ClaimMismatch, UpdateError};
use crate::events::StreamEvent;
use crate::federated::Federated;
use crate::gate::{Gate, GateEvent, RolloutStep, StepChange};
use crate::peers::{GateView, PeerView};
use crate::plan::{DataplaneInfo, Issuer};
use crate::snapshot::{LeafKey, ProxyHashMap, ProxyIdentity, ProxyKey, Snapshot};

use crate::timefmt::rfc3339;
use crate::trust::{CaId, CaTrust, TrustKey};
use crate::world::World;
pub use adopt::{IssuedIdentity, RecordLink};
use agenda::Agenda;
use agent_keys::AgentKeys;
use issue::Issuing;
pub use issue::{run_job, Completed, Job};
use links::RecordLinks;
pub(crate) use proxies::ProxyRecord;
use proxies::ProxyTable;
use publisher::Publisher;
use reconciled::Reconciled;
use replacing::Replacing;
pub use signed::SignedUntil;
use status::{Detail, Status};

/// How long a proxy whose issuance failed waits before it is tried again.
const ISSUE_RETRY: Duration = Duration::from_secs(10);

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
    /// A rollout step began or stopped waiting (reported after the reconcile that saw it).
    fn rollout_step(&self, _change: &StepChange) {}
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
    /// No proxy: a federated trust domain's bundle changed, and only the bundles carry it.
    Trust,
}

impl Scope {
    /// Its metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Full => "full",
            Scope::Proxies => "proxies",
            Scope::Acks => "acks",
            Scope::Deferred => "deferred",
            Scope::Trust => "trust",
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

impl Issued {
    /// The CAs of the certificates its proxy may present: this one's and each replaced one's.
    pub fn presentable_cas(&self) -> impl Iterator<Item = &CaTrust> {
        std::iter::once(&self.ca_trust).chain(self.previous.iter().map(|p| &p.ca_trust))
    }
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
    /// The trust domains of `federation.endpoints`: a new CA of one waits for their peers.
    pub exported: BTreeSet<meshca_identity::TrustDomain>,
    /// `federation.refreshHint` plus `federation.fetchMargin`: how long that wait lasts.
    pub federation_wait: Duration,
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
            exported: settings
                .federation
                .endpoints
                .iter()
                .map(|e| e.trust_domain.clone())
                .collect(),
            federation_wait: settings.federation.refresh_hint.as_std()
                + settings.federation.fetch_margin.as_std(),
        }
    }
}

/// The owner's state: the serving configuration, connected proxies and their certificates. What it
/// publishes changes only in [`Owner::reconcile`] and [`Owner::on_issued`].
#[derive(Debug)]
pub struct Owner {
    config: OwnerConfig,
    world: Arc<World>,
    /// The connected proxies, their streams and registrations.
    proxies: ProxyTable,
    /// Every record boxed: a hash table keeps free slots (7/8 full at most, 61% at 10,000 entries),
    /// and a slot holding a box costs 40 bytes where one holding the record would cost 392.
    issued: ProxyHashMap<Box<Issued>>,
    /// The CAs of every certificate `issued` holds, current or replaced, and perhaps some it no longer
    /// holds (each full reconcile counts them again).
    issued_cas: HashSet<TrustKey>,
    /// Why each connected proxy without a certificate has none.
    reasons: ProxyHashMap<String>,
    last_rejected: Option<Rejected>,
    gate: Gate,
    /// The proxies whose certificate replaced ones peers may still see, until they ACK it.
    replacing: Replacing,
    /// Where the zone egress identity comes from, as of the last reconcile (logged when it changes).
    egress: Option<Result<EgressPlan, NoEgressIdentity>>,
    /// Certificates issued in the wave under way, per (mesh, issuer).
    wave: BTreeMap<(String, String), u64>,
    /// What is being issued, and where.
    issuing: Issuing,
    /// What the next reconcile looks at, and when it is due.
    agenda: Agenda,
    /// What the last reconcile found.
    last: Reconciled,
    telemetry: Arc<dyn Telemetry>,
    /// The snapshots sent to SDS, their bundles, and which MeshServices are TLS-ready.
    publisher: Publisher,
    /// Where issued identities are recorded and recorded ones looked up (replicas on a database).
    links: RecordLinks,
    /// Which proxies `meshca agent`s serve, and the keys they offered.
    agent_keys: AgentKeys,
    /// The rollout steps that waited after the last reconcile: (mesh, step, CA subject).
    steps_waiting: BTreeSet<(String, RolloutStep, String)>,
    /// The bundles of federated trust domains, as the importer holds them.
    federated: Federated,
    /// When the last certificate each CA signed expires.
    signed: signed::Signed,
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
        let mut agent_keys = AgentKeys::default();
        agent_keys.set_world(&world);
        let mut gate = Gate::new(config.gate, config.ack_timeout);
        gate.export(config.exported.clone(), config.federation_wait);
        Owner {
            gate,
            config,
            world: Arc::new(world),
            proxies: ProxyTable::default(),
            issued: ProxyHashMap::default(),
            issued_cas: HashSet::new(),
            reasons: ProxyHashMap::default(),
            last_rejected: None,
            replacing: Replacing::default(),
            egress: None,
            wave: BTreeMap::new(),
            issuing: Issuing::default(),
            agenda: Agenda::default(),
            last: Reconciled::default(),
            telemetry,
            publisher: Publisher::new(snapshot_tx),
            links: RecordLinks::default(),
            agent_keys,
            steps_waiting: BTreeSet::new(),
            federated: Federated::default(),
            signed: signed::Signed::default(),
        }
    }

    /// When the last certificate each CA signed expires, if that changed since the last call.
    pub fn take_signed(&mut self, now: SystemTime) -> Option<Arc<SignedUntil>> {
        self.signed.take(now)
    }

    /// The status at `now`, as of the last reconcile: built when asked for, never on a reconcile.
    /// [`Detail::Summary`] leaves out the per-dataplane list, whose size is the fleet's.
    pub fn status(&self, now: SystemTime, detail: Detail) -> Status {
        let mut waits = self.identity_ack_waits(now);
        waits.extend(self.gate.waits_now(&self.proxies.streams));
        status::build(
            &status::Inputs {
                generation: self.publisher.generation(),
                world: &self.world,
                dataplanes: &self.last.dataplanes,
                service_ids: &self.last.service_ids,
                streams: &self.proxies.streams,
                issued: &self.issued,
                reasons: &self.reasons,
                records: self.proxies.records(),
                last_rejected: self.last_rejected.as_ref(),
                waits: &waits,
                tls_ready: self.publisher.tls_ready(),
                egress: self.egress.as_ref(),
                now,
            },
            detail,
        )
    }

    /// This replica is one of several on a database: its rollouts count the other replicas, as
    /// read after each step began (see [`Owner::set_peers`]).
    pub fn expect_peers(&mut self) {
        self.gate.expect_peers();
    }

    /// Takes in what one read of the database found the other live replicas report (their
    /// rollouts); whether a reconcile must look at every wait again (it changed anything, or a wait
    /// waited for a read).
    pub fn set_peers(&mut self, peers: &[PeerView]) -> bool {
        if !self.gate.set_peers(peers) {
            return false;
        }
        self.agenda.full = true;
        self.gate.enabled()
    }

    /// What this replica reports to its peers: the trust and SPIFFE IDs its streams have ACKed, as
    /// of now, and what its connected proxies present.
    pub fn gate_view(&self) -> GateView {
        GateView {
            trust_acked: self.gate.trust_acked(),
            sans_acked: self.gate.sans_acked(),
            presented: trusted::Presenting {
                issued: &self.issued,
                streams: &self.proxies.streams,
            }
            .presented_cas(),
            presented_ids: self.last.presented_ids.clone(),
        }
    }

    /// The time of the last reconcile.
    #[cfg(test)]
    pub(crate) fn reconciled_at(&self) -> SystemTime {
        self.last.at
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
        // A change of Dataplanes and registrations only is the event of the proxies it names: they are
        // looked at like proxies that connected, and everything shared they might change sends the
        // reconcile to the full path (see `Owner::stays_within`).
        match self.world.dataplane_changes(&world) {
            Some(touched) => self.agenda.touched.extend(touched),
            None => self.agenda.full = true,
        }
        self.agent_keys.set_world(&world);
        self.world = Arc::new(world);
    }

    /// Takes in the bundles the federation importer holds now; whether a reconcile is needed (a
    /// federated trust domain's authorities changed: they reach the bundles through the gate's trust
    /// step like any new CA, and since no proxy's certificate depends on them the reconcile costs the
    /// bundles, not the fleet: [`Owner::reconcile_trust`]).
    pub fn set_federated(&mut self, held: &meshca_federation::HeldBundles) -> bool {
        let changed = self.federated.update(held);
        self.agenda.trust |= changed;
        changed
    }

    /// Takes in when the bundle endpoints first served each authority; whether a reconcile is needed
    /// (a CA waiting for its trust domain's peers may issue sooner or later).
    pub fn set_served(&mut self, served: Arc<crate::gate::ServedSince>) -> bool {
        let changed = self.gate.set_served(served);
        self.agenda.full |= changed;
        changed
    }

    /// Changes `defaults.mesh` (the mesh whose identity the zone egress uses) while serving; the next
    /// reconcile moves the egress to it, in the order the rollout gate allows.
    pub fn set_default_mesh(&mut self, mesh: Option<String>) {
        if self.config.default_mesh != mesh {
            self.config.default_mesh = mesh;
            self.agenda.full = true;
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
                self.proxies.streams.subscribe(stream, resources) && self.agenda.waiting_on_acks
            }
            StreamEvent::Acked {
                stream,
                generation,
                version,
            } => {
                // A rollout waiting on ACKs may proceed.
                self.stir(stream);
                self.proxies.streams.ack(stream, generation, version) && self.agenda.waiting_on_acks
            }
            StreamEvent::Nacked {
                stream, message, ..
            } => {
                self.proxies.note_nack(stream, message);
                // Only the status changes, and it is built when asked for.
                false
            }
            StreamEvent::KeyOffered {
                stream,
                key,
                replace_now,
            } => self.on_key_offered(stream, key, replace_now),
            // When its last stream leaves, the proxy stops being served; its registration and
            // certificate are kept so that a reconnect within the certificate's life reuses them.
            // Another stream of the proxy leaving matters only to a rollout that may wait on it.
            StreamEvent::Disconnected { stream } => {
                self.stir(stream);
                match self.proxies.streams.disconnect(stream) {
                    Some(proxy) => {
                        self.agenda.touched.insert(proxy);
                        true
                    }
                    None => self.agenda.waiting_on_acks,
                }
            }
        }
    }

    /// Notes that `stream`'s proxy may have settled the certificates its new one replaced.
    fn stir(&mut self, stream: crate::StreamId) {
        if let Some(proxy) = self.proxies.streams.proxy_of(stream) {
            self.replacing.stir(proxy);
        }
    }

    fn on_connected(&mut self, stream: crate::StreamId, claims: Arc<Claims>) -> bool {
        let key = ProxyKey::new(claims.mesh.clone(), claims.name.clone());
        // A token that contradicts what the proxy was given (its Dataplane file, or the token that
        // registered it and is still connected) neither changes the proxy nor counts as it: the stream
        // refuses itself against the snapshot's claim rule.
        if let Some(rule) = self.proxies.claim_rule(&self.world, &key) {
            if let Err(reason) = rule.check(&claims) {
                tracing::warn!(proxy = %key, token = %claims.id, "refused a token: {reason}");
                self.proxies.refuse_token(key, reason);
                // Only the status changes, and it is built when asked for.
                return false;
            }
        }
        let first = self.proxies.connect(stream, key.clone(), claims);
        // Any stream, not only the first: Envoy may open its streams to several replicas, and the
        // one that carries its identity may move here last.
        self.look_up(&key);
        if first {
            self.agenda.touched.insert(key);
            return true;
        }
        // Another stream of a connected proxy matters only to a rollout that may wait on it.
        self.agenda.waiting_on_acks
    }

    /// Keeps the key an agent offered on `stream` for its proxy's next certificate; whether a
    /// reconcile must look at the proxy now: it has no certificate an agent holds the key of, or the
    /// agent asks for the key to be certified at once.
    fn on_key_offered(
        &mut self,
        stream: crate::StreamId,
        key: Arc<meshca_ca::PublicKey>,
        replace_now: bool,
    ) -> bool {
        let Some(proxy) = self.proxies.streams.proxy_of(stream).cloned() else {
            tracing::warn!(stream = %stream, "ignored a key offered on a stream of no connected proxy");
            return false;
        };
        if self.agent_served(&proxy).is_none() {
            tracing::warn!(proxy = %proxy, stream = %stream, "ignored a key offered for a proxy that no meshca agent serves: meshca makes its keys");
            return false;
        }
        let urgent = match self.issued.get(&proxy).map(|i| &i.published.key) {
            // A key the agent holds: a new one waits for the renewal, unless the agent lost that
            // one, or leaves are no longer issued for its algorithm (no renewal could reuse it).
            Some(LeafKey::Agent(current)) => {
                (replace_now && **current != *key)
                    || current.algorithm() != self.config.key_algorithm
            }
            // None yet, or one whose key meshca made (it was not agent-served then).
            Some(LeafKey::Held(_)) | None => true,
        };
        self.agent_keys.offer(proxy.clone(), key, replace_now);
        if urgent {
            self.agenda.touched.insert(proxy);
        }
        urgent
    }

    /// Every dataplane, described anew only where something changed: all of them under a new
    /// configuration, else the proxies in `touched` (whose registration may have changed).
    fn refresh_dataplanes(&mut self, touched: &BTreeSet<ProxyKey>) -> Dataplanes {
        if !self.last.descriptions_current(&self.world) {
            self.last.described_from = Some(self.world.resources.clone());
            return self.proxies.known_dataplanes(&self.world);
        }
        self.last.described_from = Some(self.world.resources.clone());
        let mut dataplanes = std::mem::take(&mut self.last.dataplanes);
        for key in touched {
            match self.proxies.describe(&self.world, key) {
                Some(described) => dataplanes.insert(key.clone(), described),
                None => dataplanes.remove(key),
            };
        }
        dataplanes
    }
}
