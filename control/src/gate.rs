//! The rollout gate (docs/rotation.md): trust before identity, break last, bounded by
//! `rollout.ackTimeout`.
//!
//! The gate decides, from what connected streams have ACKed, which CAs a mesh's bundles publish and
//! which CAs may issue. It holds no certificates: the owner asks it and acts.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::{Duration, SystemTime};

use meshca_ca::CertificateAuthority;
use meshca_identity::TrustDomain;
use serde::{Deserialize, Serialize};

use crate::peers::{PeerView, TrustEntry};

mod exported;

use crate::resource_name::{Target, TrustScope};
use crate::snapshot::{KeyHasher, ProxyKey};
use crate::streams::{Stream, StreamTable};
use crate::timefmt::{rfc3339, seconds_until};
use crate::trust::{BundleKey, CaId, CaTrust, MeshName, ServiceIds, ServiceKey, TrustKey};
pub use exported::ServedSince;
use exported::{Exported, PeersHold};

/// A step of a rollout that can wait on ACKs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RolloutStep {
    /// A new CA's bundle must be ACKed by every stream that carries it before the CA issues.
    TrustBeforeIdentity,
    /// A removed CA stays trusted until no connected proxy presents its certificates.
    BreakLast,
    /// A proxy must ACK its replacement certificate before its old CA stops being kept for it.
    IdentityAck,
    /// A new SPIFFE ID must be ACKed in every `meshservice:` context that must accept it before a proxy
    /// presents it.
    SansBeforeIdentity,
    /// A new CA of a trust domain meshca serves a bundle endpoint for issues only once its bundle has
    /// been served for one refresh hint plus `federation.fetchMargin` (peers polling as told hold it).
    Federation,
}

impl RolloutStep {
    /// The spelling in status, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutStep::TrustBeforeIdentity => "trust-before-identity",
            RolloutStep::BreakLast => "break-last",
            RolloutStep::IdentityAck => "identity-ack",
            RolloutStep::SansBeforeIdentity => "sans-before-identity",
            RolloutStep::Federation => "federation",
        }
    }
}

impl fmt::Display for RolloutStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a rollout step waits for, shown by `/api/` and `meshca status`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Wait {
    /// The mesh, or the zone egress bundle (shown as `(zone egress)`).
    pub mesh: BundleKey,
    /// The step that waits.
    pub step: RolloutStep,
    /// The CA concerned.
    pub ca: String,
    /// Since when (RFC 3339).
    pub since: String,
    /// Seconds left before `rollout.ackTimeout` lets the rollout proceed.
    pub timeout_in_seconds: i64,
    /// Proxies it waits for (at most 20 named).
    pub waiting_for: Vec<String>,
    /// How many proxies it waits for.
    pub waiting_count: usize,
}

#[derive(Clone, Debug)]
struct Published {
    /// The first snapshot generation that carried the CA.
    since_generation: u64,
    since: SystemTime,
    /// Every subscriber, on this replica and its peers, ACKed a version carrying it, or the timeout
    /// passed.
    confirmed: bool,
    /// Every subscriber on this replica ACKed a version carrying it (what the peers are told; counted
    /// on after a timeout confirmed it).
    acked: bool,
    /// Some subscriber had to be waited for (counted once).
    waited: bool,
    /// The federation step had to be waited for (counted once).
    federation_waited: bool,
    /// In the federation step since the last confirmation: until when (`None` until its trust
    /// domain's endpoint reports it served).
    federation_until: Option<Option<SystemTime>>,
    /// The CA's subject, for operators.
    subject: String,
    /// How many reads of the peers had completed when it was published.
    peer_reads: u64,
}

/// A removed CA that proxies still present: the first of them by name, and how many more on peers.
#[derive(Debug)]
struct Presenters {
    ca: CaTrust,
    named: BTreeSet<String>,
    more: usize,
    /// Replicas not read since its removal may have proxies presenting it too.
    unread: bool,
}

/// A CA the bundles carry, and where its rollout stands.
#[derive(Clone, Debug)]
struct PublishedCa {
    ca: CaTrust,
    state: Published,
}

/// Events worth a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateEvent {
    /// A rollout step began waiting.
    WaitStarted(RolloutStep),
    /// `rollout.ackTimeout` passed and the rollout proceeded without some proxies.
    TimedOut(RolloutStep),
    /// The configuration removed a CA that connected proxies still present.
    RemovedWhilePresented,
}

/// A rollout step that began or stopped waiting in a mesh, for a timeline of rollouts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepChange {
    /// The mesh, or `(zone egress)`.
    pub mesh: String,
    /// The step.
    pub step: RolloutStep,
    /// The CA concerned (its subject).
    pub ca: String,
    /// Whether it began or ended.
    pub phase: StepPhase,
}

/// Whether a step began or ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepPhase {
    /// It began waiting, for this many proxies.
    Began {
        /// How many proxies it waited for when it began.
        waiting: usize,
    },
    /// It no longer waits: everyone ACKed, or `rollout.ackTimeout` passed.
    Ended,
}

/// The gate's memory between reconciles.
#[derive(Debug)]
pub struct Gate {
    enabled: bool,
    ack_timeout: Duration,
    /// Every CA the last plan published, by bundle, trust domain and CA id.
    published: BTreeMap<TrustKey, PublishedCa>,
    /// When each SPIFFE ID entered its `meshservice:` context.
    sans: HashMap<SanKey, Published>,
    retained_since: HashMap<TrustKey, SystemTime>,
    /// Published CAs the configuration no longer publishes: when they left it, and after how many
    /// reads of the peers (on replicas, a removed CA stays until the peers were read since).
    removed_at: HashMap<TrustKey, (SystemTime, u64)>,
    /// Meshes whose bundles a previous snapshot published: a CA new to an unpublished mesh needs no ACKs
    /// (no proxy can hold a bundle without it).
    known_meshes: HashSet<BundleKey>,
    /// Removed CAs whose retention timed out: no longer retained, not reported again.
    given_up: HashSet<TrustKey>,
    waits: Vec<Waiting>,
    events: Vec<(BundleKey, GateEvent)>,
    /// The other live replicas on the same database, as their last views say.
    peers: Vec<PeerView>,
    /// Whether the peers' views are read, and how often they were.
    reads: PeerReads,
    /// The trust domains meshca serves bundle endpoints for, and what they served.
    exported: Exported,
    /// The trust domains of each bundle that only federation brings.
    foreign: ForeignDomains,
}

/// The trust domains of each bundle that only federation brings: no CA of the configuration issues
/// in them or is trusted for them, so a new or removed authority of one holds no issuance back. Its
/// trust step still waits for the streams' ACKs, for the status and the peers, but a proxy's
/// certificate never waits for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForeignDomains(HashMap<BundleKey, HashSet<TrustDomain>>);

impl ForeignDomains {
    /// The trust domains `federated` brings to each bundle that `own` (every other CA the bundles
    /// carry) does not.
    pub fn of<'a>(
        own: impl IntoIterator<Item = &'a CaTrust>,
        federated: impl IntoIterator<Item = &'a CaTrust>,
    ) -> ForeignDomains {
        let own: HashSet<(&BundleKey, &TrustDomain)> = own
            .into_iter()
            .map(|ca| (&ca.bundle, &ca.trust_domain))
            .collect();
        let mut foreign: HashMap<BundleKey, HashSet<TrustDomain>> = HashMap::new();
        for ca in federated {
            if !own.contains(&(&ca.bundle, &ca.trust_domain)) {
                foreign
                    .entry(ca.bundle.clone())
                    .or_default()
                    .insert(ca.trust_domain.clone());
            }
        }
        ForeignDomains(foreign)
    }

    /// Whether `trust_domain` of `bundle` is one only federation brings.
    pub fn contains(&self, bundle: &BundleKey, trust_domain: &TrustDomain) -> bool {
        self.0
            .get(bundle)
            .is_some_and(|domains| domains.contains(trust_domain))
    }
}

/// Which waits a batch of ACKs ended (see [`Gate::waits_over`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitsOver {
    /// None.
    None,
    /// Only trust steps of federated authorities, which hold no certificate back: confirming them
    /// ([`Gate::confirm`]) is all there is to do.
    Foreign,
    /// A wait that holds certificates back: every proxy must be decided again.
    Holding,
}

const NAMED_WAITERS: usize = 20;

/// How many reads of the replicas table must complete after an entry is published before the gate
/// may count on its list of peers for it: the first may have been under way already, and miss a
/// replica that joined just before; the second began after the entry was published.
const READS_AFTER_PUBLISHING: u64 = 2;

/// Who holds an entry back while the replicas that exist are not known yet (see [`PeerReads`]).
const UNREAD_PEERS: &str = "the replicas on the database (not read since this step began)";

/// The reads of the other replicas' views. A replica learns of another only by reading the
/// database: one that joined since the last read holds proxies this replica's gate does not count.
/// So, on replicas, an entry is confirmed only with a list of peers read after it was published.
#[derive(Clone, Copy, Debug, Default)]
struct PeerReads {
    /// Whether this replica has peers at all (it is one of the replicas of a database).
    expected: bool,
    /// Reads completed so far.
    done: u64,
}

impl PeerReads {
    /// Whether the peers of an entry published after `at` reads are still unknown.
    fn unknown_since(self, at: u64) -> bool {
        self.expected && self.done < at + READS_AFTER_PUBLISHING
    }
}

/// A SPIFFE ID in a `meshservice:` context, as the gate orders it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SanKey {
    service: ServiceKey,
    spiffe_id: String,
}

/// Which streams a trust or SAN wait waits for (those that have not ACKed its generation yet).
#[derive(Clone, Debug)]
enum Selection {
    /// Streams that carry the trust of a bundle.
    MeshTrust(BundleKey),
    /// Streams subscribed to a `meshservice:` context (the egress bundle's SAN matchers, for
    /// [`ServiceKey::egress`]).
    Service(ServiceKey),
}

impl Selection {
    fn selects(&self, s: &Stream) -> bool {
        match self {
            Selection::MeshTrust(mesh) => s
                .resources
                .iter()
                .any(|r| r.carries_mesh_trust(s.asker(), mesh)),
            Selection::Service(key) => {
                s.resources.iter().any(|r| match r.target(s.asker(), None) {
                    Target::MeshService {
                        mesh: m,
                        service: n,
                    } => key.bundle.is_mesh(m) && n == key.service,
                    // The zone egress's IDs are gated in the egress bundle's SAN matchers.
                    Target::Trust {
                        scope: TrustScope::Egress,
                        ..
                    } => key.bundle == BundleKey::Egress,
                    _ => false,
                })
            }
        }
    }
}

/// A wait as the status shows it, and (for trust and SAN waits) how to count who it waits for now:
/// the streams of `recount` that have not ACKed its generation, after the peers that hold it back.
#[derive(Debug)]
struct Waiting {
    wait: Wait,
    recount: Option<(u64, Selection)>,
    peers: Vec<String>,
}

/// Who a trust or SAN wait waits for: the peers that hold it back, then this replica's proxies.
fn waiting_list(peers: &[String], local: crate::streams::Waiting) -> (usize, Vec<String>) {
    let count = peers.len() + local.count;
    let first = peers
        .iter()
        .cloned()
        .chain(local.first)
        .take(NAMED_WAITERS)
        .collect();
    (count, first)
}

impl Gate {
    /// A gate; `enabled: false` publishes and issues at once (drills use it to show what it prevents).
    pub fn new(enabled: bool, ack_timeout: Duration) -> Gate {
        Gate {
            enabled,
            ack_timeout,
            published: BTreeMap::new(),
            sans: HashMap::new(),
            retained_since: HashMap::new(),
            removed_at: HashMap::new(),
            known_meshes: HashSet::new(),
            given_up: HashSet::new(),
            waits: Vec::new(),
            events: Vec::new(),
            peers: Vec::new(),
            reads: PeerReads::default(),
            exported: Exported::default(),
            foreign: ForeignDomains::default(),
        }
    }

    /// Which trust domains of each bundle only federation brings (see [`ForeignDomains`]), as of the
    /// configuration the next [`Gate::plan_trust`] plans.
    pub fn set_foreign(&mut self, foreign: ForeignDomains) {
        self.foreign = foreign;
    }

    /// Whether the published entry `key` may hold issuance back: it is not of a trust domain only
    /// federation brings.
    fn holds(&self, key: &TrustKey) -> bool {
        !self.foreign.contains(&key.bundle, &key.trust_domain)
    }

    /// Trust domains `domains` are served on bundle endpoints: a new CA of one issues only once its
    /// anchors were served for `wait` (one refresh hint plus the fetch margin).
    pub fn export(&mut self, domains: BTreeSet<TrustDomain>, wait: Duration) {
        self.exported = Exported::new(domains, wait);
    }

    /// Takes in when the bundle endpoints first served each authority; whether it changed (a waiting
    /// CA may have been served).
    pub fn set_served(&mut self, served: std::sync::Arc<ServedSince>) -> bool {
        self.exported.set_served(served)
    }

    /// This replica is one of several on a database: from now on an entry is confirmed only once
    /// the peers were read after it was published (see [`Gate::set_peers`]).
    pub fn expect_peers(&mut self) {
        self.reads.expected = true;
    }

    /// Takes in the other live replicas' views, as one read of the database found them; whether
    /// every wait must be looked at again: they differ from the last ones, or an entry waited for
    /// this read to know its peers.
    pub fn set_peers(&mut self, peers: &[PeerView]) -> bool {
        let before = self.reads;
        self.reads.done += 1;
        let after = self.reads;
        // An entry whose peers this read makes known (the first read after publishing may not).
        let known_now = |at: u64| before.unknown_since(at) && !after.unknown_since(at);
        let waited = self
            .published
            .values()
            .map(|p| &p.state)
            .chain(self.sans.values())
            .any(|p| !p.confirmed && known_now(p.peer_reads))
            || self.removed_at.values().any(|(_, at)| known_now(*at));
        if peers == self.peers.as_slice() {
            return waited;
        }
        self.peers = peers.to_vec();
        true
    }

    /// The other live replicas, as their last views say.
    pub fn peers(&self) -> &[PeerView] {
        &self.peers
    }

    /// Per mesh whose trust this replica publishes, the entries all its subscribers ACKed (for the
    /// peers).
    pub fn trust_acked(&self) -> BTreeMap<String, BTreeSet<TrustEntry>> {
        let mut out: BTreeMap<String, BTreeSet<TrustEntry>> = self
            .known_meshes
            .iter()
            .map(|mesh| (mesh.to_string(), BTreeSet::new()))
            .collect();
        for (key, p) in &self.published {
            if p.state.acked {
                out.entry(key.bundle.to_string())
                    .or_default()
                    .insert(TrustEntry {
                        trust_domain: key.trust_domain.to_string(),
                        ca: key.ca.to_string(),
                    });
            }
        }
        out
    }

    /// Per mesh and `meshservice:` context this replica publishes, the SPIFFE IDs all its
    /// subscribers ACKed (for the peers).
    pub fn sans_acked(&self) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
        let mut out: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
        for (key, p) in &self.sans {
            let ids = out
                .entry(key.service.bundle.to_string())
                .or_default()
                .entry(key.service.service.clone())
                .or_default();
            if p.acked {
                ids.insert(key.spiffe_id.clone());
            }
        }
        out
    }

    /// The entry of `mesh`'s bundles for the CA with id `ca_id`, if they carry it.
    pub fn published_ca(&self, mesh: &BundleKey, ca_id: &str) -> Option<&CaTrust> {
        self.published
            .iter()
            .find(|(key, _)| key.bundle == *mesh && key.ca == *ca_id)
            .map(|(_, p)| &p.ca)
    }

    /// The CAs `mesh`'s bundles carry only because proxies may still present them (break last).
    pub fn retained_in<'a>(
        &'a self,
        mesh: &'a BundleKey,
    ) -> impl Iterator<Item = &'a CaTrust> + 'a {
        self.published
            .iter()
            .filter(move |(key, _)| {
                key.bundle == *mesh
                    && self.retained_since.contains_key(*key)
                    && !self.given_up.contains(*key)
            })
            .map(|(_, p)| &p.ca)
    }

    /// The peers that hold back the trust entry `key`.
    fn peers_holding_trust(&self, key: &TrustKey) -> Vec<String> {
        let entry = TrustEntry {
            trust_domain: key.trust_domain.to_string(),
            ca: key.ca.to_string(),
        };
        self.peers
            .iter()
            .filter(|peer| peer.holds_trust(key.bundle.as_str(), &entry))
            .map(PeerView::label)
            .collect()
    }

    /// Whether the gate orders anything.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// `rollout.ackTimeout`.
    pub fn ack_timeout(&self) -> Duration {
        self.ack_timeout
    }

    /// Starts a reconcile: forgets the previous waits.
    pub fn begin(&mut self) {
        self.waits.clear();
    }

    /// Records a timeout.
    pub fn timed_out(&mut self, mesh: &BundleKey, step: RolloutStep) {
        self.events.push((mesh.clone(), GateEvent::TimedOut(step)));
    }

    /// The waits of the last reconcile, with who trust and SAN waits still wait for counted now: a
    /// reconcile only asks whether anyone does, and ACKs are not recounted one batch at a time (see
    /// [`Gate::waits_over`]), so that a wait on 100,000 streams costs a count only when a status asks.
    pub fn waits_now(&self, streams: &StreamTable) -> Vec<Wait> {
        self.waits
            .iter()
            .map(|w| {
                let mut wait = w.wait.clone();
                if let Some((generation, selection)) = &w.recount {
                    let local =
                        streams.waiting_for(*generation, NAMED_WAITERS, |s| selection.selects(s));
                    (wait.waiting_count, wait.waiting_for) = waiting_list(&w.peers, local);
                }
                wait
            })
            .collect()
    }

    /// How many proxies (and peers) the wait of `step` for `ca` in `mesh` waits for now, as
    /// [`Gate::waits_now`] counts them; 0 for a wait it does not hold. A trust step that no stream
    /// has ACKed yet, as when it begins, is counted without a pass over the streams.
    pub fn waiting_count(
        &self,
        streams: &StreamTable,
        mesh: &str,
        step: RolloutStep,
        ca: &str,
    ) -> usize {
        let Some(w) = self
            .waits
            .iter()
            .find(|w| w.wait.step == step && w.wait.ca == ca && w.wait.mesh.as_str() == mesh)
        else {
            return 0;
        };
        let Some((generation, selection)) = &w.recount else {
            return w.wait.waiting_count;
        };
        let unacked = match selection {
            Selection::MeshTrust(bundle) => streams.carrying_unacked(*generation, bundle),
            Selection::Service(_) => None,
        };
        let local = unacked.unwrap_or_else(|| {
            streams
                .waiting_for(*generation, 0, |s| selection.selects(s))
                .count
        });
        w.peers.len() + local
    }

    /// Which trust or SAN waits are over (every stream it waits for has ACKed, or its timeout
    /// passed): then a reconcile must confirm them, and decide every proxy again if one of them held
    /// certificates back. Passes that stop at the first stream still waiting, so that a batch of ACKs
    /// while 100,000 streams wait costs little; [`Gate::confirm`] does the counting.
    pub fn waits_over(&self, streams: &StreamTable, now: SystemTime) -> WaitsOver {
        if !self.enabled {
            return WaitsOver::None;
        }
        // A wait is over when its timeout passes; this replica's part of it when its last stream
        // ACKs (what the peers are told changes; a wait they still hold ends with their views).
        let over = |p: &Published, selection: &Selection| {
            (!p.confirmed && now >= p.since + self.ack_timeout)
                || (!p.acked && !streams.any_waiting(p.since_generation, |s| selection.selects(s)))
        };
        // Without peers, nobody reads `acked` after a timeout confirmed an entry: a proxy that never
        // ACKs then costs no look at the streams per batch of ACKs.
        let alone = self.peers.is_empty();
        let trust_over = |holding: bool| {
            self.published
                .iter()
                .filter(|(key, p)| {
                    self.holds(key) == holding && (!p.state.confirmed || (!p.state.acked && !alone))
                })
                .any(|(key, p)| over(&p.state, &Selection::MeshTrust(key.bundle.clone())))
        };
        let sans_over = || {
            self.sans
                .iter()
                .filter(|(_, p)| !p.confirmed || (!p.acked && !alone))
                .any(|(key, p)| over(p, &Selection::Service(key.service.clone())))
        };
        if trust_over(true) || sans_over() {
            WaitsOver::Holding
        } else if trust_over(false) {
            WaitsOver::Foreign
        } else {
            WaitsOver::None
        }
    }

    /// The trust and SAN waits as of the last reconcile (their counts as they were then).
    pub fn current_waits(&self) -> impl Iterator<Item = &Wait> {
        self.waits.iter().map(|w| &w.wait)
    }

    /// Metric events since the last call.
    pub fn take_events(&mut self) -> Vec<(BundleKey, GateEvent)> {
        std::mem::take(&mut self.events)
    }

    /// Marks published CAs as confirmed once every stream that must carry them ACKed a snapshot that did,
    /// or once `ackTimeout` passed.
    ///
    /// Called more than once per reconcile (ACKs while it waits only ask [`Gate::waits_over`]):
    /// each call replaces the trust-before-identity and SANs-before-identity waits of the previous one,
    /// so a status lists every wait once. Returns whether it confirmed anything.
    pub fn confirm(&mut self, streams: &StreamTable, now: SystemTime) -> bool {
        self.waits.retain(|w| {
            w.wait.step != RolloutStep::TrustBeforeIdentity
                && w.wait.step != RolloutStep::SansBeforeIdentity
                && w.wait.step != RolloutStep::Federation
        });
        let mut confirmed = self.confirm_sans(streams, now);
        let timeout = self.ack_timeout;
        let reads = self.reads;
        let mut waits = Vec::new();
        let mut timeouts = Vec::new();
        let mut started = Vec::new();
        let mut trusted = Vec::new();
        let holding: HashMap<TrustKey, Vec<String>> = self
            .published
            .iter()
            .filter(|(_, p)| !p.state.confirmed)
            .map(|(key, _)| (key.clone(), self.peers_holding_trust(key)))
            .filter(|(_, peers)| !peers.is_empty())
            .collect();
        let exported = &self.exported;
        // A federated authority's confirmation moves no proxy off a removed CA.
        let moves_proxies = |key: &TrustKey| !self.foreign.contains(&key.bundle, &key.trust_domain);
        let mut federation_started = Vec::new();
        for (key, PublishedCa { ca, state: p }) in self
            .published
            .iter_mut()
            .filter(|(_, p)| !p.state.confirmed || !p.state.acked)
        {
            let mesh = &key.bundle;
            let selection = Selection::MeshTrust(mesh.clone());
            // Once all its streams ACKed, a stream that connects later is first served this trust.
            let local_waits =
                !p.acked && streams.any_waiting(p.since_generation, |s| selection.selects(s));
            p.acked |= !local_waits;
            if p.confirmed {
                // Confirmed by its timeout: counted on only for what the peers are told.
                continue;
            }
            let mut peers = holding.get(key).cloned().unwrap_or_default();
            let unknown = reads.unknown_since(p.peer_reads);
            let local_done = !local_waits && peers.is_empty() && !unknown;
            // Once this trust domain's own streams are done with it (or their timeout passed), the
            // peers of the trust domain, which no timeout speeds up.
            p.federation_until = None;
            if local_done || now >= p.since + timeout {
                let hold = exported.peers_hold(ca, now);
                if hold != PeersHold::Yes {
                    p.federation_until = Some(match hold {
                        PeersHold::Soon { ready_at, .. } => Some(ready_at),
                        PeersHold::Yes | PeersHold::NotServed => None,
                    });
                    if !p.federation_waited {
                        p.federation_waited = true;
                        federation_started.push(mesh.clone());
                    }
                    waits.push(federation_wait(mesh, ca, p, hold, exported.wait(), now));
                    continue;
                }
            }
            if local_done {
                if p.waited {
                    tracing::info!(
                        mesh = %mesh,
                        ca = %p.subject,
                        waited_ms = now.duration_since(p.since).unwrap_or_default().as_millis() as u64,
                        "every stream that must trust the new CA has ACKed its bundle; the mesh accepts what it signs (and issues from it when it is the mesh's own)"
                    );
                }
                p.confirmed = true;
                confirmed = true;
                if moves_proxies(key) {
                    trusted.push(mesh.clone());
                }
                continue;
            }
            // Waiting only to know the peers is no rollout wait to report (it ends with the next
            // reads of the database), but a wait all the same.
            if !p.waited && (local_waits || !peers.is_empty()) {
                p.waited = true;
                started.push(mesh.clone());
            }
            if unknown {
                peers.push(UNREAD_PEERS.to_owned());
            }
            if now >= p.since + timeout {
                let local = streams
                    .waiting_for(p.since_generation, NAMED_WAITERS, |s| selection.selects(s));
                let (waiting_count, waiting_first) = waiting_list(&peers, local);
                tracing::warn!(
                    mesh = %mesh,
                    ca = %p.subject,
                    proxies = ?waiting_first,
                    count = waiting_count,
                    timeout = ?timeout,
                    "rollout.ackTimeout passed: these proxies have not ACKed the new trust bundle; issuing from the new CA anyway"
                );
                p.confirmed = true;
                confirmed = true;
                if moves_proxies(key) {
                    trusted.push(mesh.clone());
                }
                timeouts.push(mesh.clone());
            } else {
                waits.push(Waiting {
                    wait: Wait {
                        mesh: mesh.clone(),
                        step: RolloutStep::TrustBeforeIdentity,
                        ca: p.subject.clone(),
                        since: rfc3339(p.since),
                        timeout_in_seconds: remaining(p.since + timeout, now),
                        // Counted when asked for ([`Gate::waits_now`]).
                        waiting_count: 0,
                        waiting_for: Vec::new(),
                    },
                    recount: Some((p.since_generation, selection)),
                    peers,
                });
            }
        }
        for mesh in started {
            let event = GateEvent::WaitStarted(RolloutStep::TrustBeforeIdentity);
            self.events.push((mesh, event));
        }
        for mesh in federation_started {
            let event = GateEvent::WaitStarted(RolloutStep::Federation);
            self.events.push((mesh, event));
        }
        for mesh in timeouts {
            self.timed_out(&mesh, RolloutStep::TrustBeforeIdentity);
        }
        // Only now can the proxies of these bundles be moved off a removed CA: its break-last timeout
        // starts again.
        for (key, since) in &mut self.retained_since {
            if trusted.contains(&key.bundle) && !self.given_up.contains(key) {
                *since = now;
            }
        }
        self.waits.extend(waits);
        confirmed
    }

    /// Confirms new SPIFFE IDs of `meshservice:` contexts: each once every stream subscribed to that
    /// context has ACKed a version carrying it, or once `ackTimeout` passed. Returns whether it confirmed
    /// any.
    fn confirm_sans(&mut self, streams: &StreamTable, now: SystemTime) -> bool {
        let timeout = self.ack_timeout;
        let mut confirmed = false;
        let mut waits = Vec::new();
        let mut events = Vec::new();
        let peers = &self.peers;
        let reads = self.reads;
        for (key, p) in self
            .sans
            .iter_mut()
            .filter(|(_, p)| !p.confirmed || !p.acked)
        {
            let (mesh, service, id) = (&key.service.bundle, &key.service.service, &key.spiffe_id);
            let selection = Selection::Service(key.service.clone());
            let local_waits =
                !p.acked && streams.any_waiting(p.since_generation, |s| selection.selects(s));
            p.acked |= !local_waits;
            if p.confirmed {
                continue;
            }
            let mut holding: Vec<String> = peers
                .iter()
                .filter(|peer| peer.holds_san(mesh.as_str(), service, id))
                .map(PeerView::label)
                .collect();
            let unknown = reads.unknown_since(p.peer_reads);
            if !local_waits && holding.is_empty() && !unknown {
                p.confirmed = true;
                confirmed = true;
                continue;
            }
            if !p.waited && (local_waits || !holding.is_empty()) {
                p.waited = true;
                events.push((
                    mesh.clone(),
                    GateEvent::WaitStarted(RolloutStep::SansBeforeIdentity),
                ));
            }
            if unknown {
                holding.push(UNREAD_PEERS.to_owned());
            }
            if now >= p.since + timeout {
                let local = streams
                    .waiting_for(p.since_generation, NAMED_WAITERS, |s| selection.selects(s));
                let (waiting_count, waiting_first) = waiting_list(&holding, local);
                tracing::warn!(
                    mesh = %mesh,
                    service = %service,
                    spiffe_id = %id,
                    proxies = ?waiting_first,
                    count = waiting_count,
                    "rollout.ackTimeout passed: these proxies have not ACKed the service's new SPIFFE ID; presenting it anyway"
                );
                p.confirmed = true;
                confirmed = true;
                events.push((
                    mesh.clone(),
                    GateEvent::TimedOut(RolloutStep::SansBeforeIdentity),
                ));
            } else {
                waits.push(Waiting {
                    wait: Wait {
                        mesh: mesh.clone(),
                        step: RolloutStep::SansBeforeIdentity,
                        ca: format!("{id} in meshservice:{service}"),
                        since: rfc3339(p.since),
                        timeout_in_seconds: remaining(p.since + timeout, now),
                        // Counted when asked for ([`Gate::waits_now`]).
                        waiting_count: 0,
                        waiting_for: Vec::new(),
                    },
                    recount: Some((p.since_generation, selection)),
                    peers: holding,
                });
            }
        }
        self.events.extend(events);
        self.waits.extend(waits);
        confirmed
    }

    /// Records what each `meshservice:` context of the snapshot about to be published (`generation`)
    /// carries: an ID new to a context starts unconfirmed; IDs that left are forgotten.
    pub fn plan_sans(&mut self, service_ids: &ServiceIds, generation: u64, now: SystemTime) {
        self.sans.retain(|key, _| {
            service_ids
                .get(&key.service)
                .is_some_and(|ids| ids.contains(&key.spiffe_id))
        });
        let (enabled, peer_reads) = (self.enabled, self.reads.done);
        for (service, ids) in service_ids {
            for id in ids {
                self.sans
                    .entry(SanKey {
                        service: service.clone(),
                        spiffe_id: id.clone(),
                    })
                    .or_insert_with(|| Published {
                        since_generation: generation,
                        since: now,
                        confirmed: !enabled,
                        acked: !enabled,
                        waited: false,
                        federation_waited: false,
                        federation_until: None,
                        subject: id.clone(),
                        peer_reads,
                    });
            }
        }
    }

    /// Whether a proxy of `service` may present `spiffe_id`: every stream subscribed to the service's
    /// `meshservice:` context has ACKed a version carrying it (or the timeout passed).
    pub fn may_present(&self, service: &ServiceKey, spiffe_id: &str) -> bool {
        !self.enabled
            || self
                .sans
                .get(&SanKey {
                    service: service.clone(),
                    spiffe_id: spiffe_id.to_owned(),
                })
                .is_none_or(|p| p.confirmed)
    }

    /// Decides what each mesh's bundles carry: every CA the configuration publishes, plus (break last) the
    /// published CAs it removed that a connected proxy's certificate still chains to, until the proxies stop
    /// presenting such certificates or `ackTimeout` passes. `generation` is the snapshot about to be
    /// published; CAs new to it start unconfirmed.
    ///
    /// A CA is told apart by mesh, trust domain and id: the same CA published for another trust domain is
    /// a new entry, ordered on its own, and its entry for the old trust domain leaves only by break last.
    pub fn plan_trust(
        &mut self,
        desired: Vec<CaTrust>,
        presented: &[(&CaTrust, Vec<&ProxyKey>)],
        generation: u64,
        now: SystemTime,
    ) -> BTreeMap<BundleKey, Vec<CaTrust>> {
        let retained = if self.enabled {
            self.note_removed(&desired, now);
            self.still_presented(&desired, presented, now)
        } else {
            BTreeMap::new()
        };
        let mut out: BTreeMap<BundleKey, Vec<CaTrust>> = BTreeMap::new();
        let mut keys: HashSet<TrustKey> = HashSet::new();
        for ca in desired {
            if keys.insert(ca.key()) {
                out.entry(ca.bundle.clone()).or_default().push(ca);
            }
        }
        for ca in self.retain(retained, now) {
            out.entry(ca.bundle.clone()).or_default().push(ca);
        }
        self.record_published(&out, generation, now);
        out
    }

    /// Whether planning `desired` would change only what federation brings: nothing is kept after its
    /// removal (break last), every CA `desired` adds or drops is of a trust domain only federation
    /// brings ([`Gate::set_foreign`]), and none it drops is one `issued_from` says a certificate this
    /// replica holds chains to. Then [`Gate::plan_trust`] needs no list of who presents what (nobody
    /// here presents those CAs) and no proxy's certificate depends on the change.
    pub fn foreign_change_only(
        &self,
        desired: &[CaTrust],
        issued_from: impl Fn(&TrustKey) -> bool,
    ) -> bool {
        if !self.removed_at.is_empty() || !self.retained_since.is_empty() {
            return false;
        }
        let desired_keys: HashSet<TrustKey> = desired.iter().map(CaTrust::key).collect();
        let added_foreign = desired_keys
            .iter()
            .filter(|key| !self.published.contains_key(*key))
            .all(|key| !self.holds(key));
        let dropped_foreign = self
            .published
            .keys()
            .filter(|key| !desired_keys.contains(*key))
            .all(|key| !self.holds(key) && !issued_from(key));
        added_foreign && dropped_foreign
    }

    /// Remembers when each published CA that `desired` no longer carries left the configuration.
    fn note_removed(&mut self, desired: &[CaTrust], now: SystemTime) {
        let desired_keys: HashSet<TrustKey> = desired.iter().map(CaTrust::key).collect();
        let published = &self.published;
        self.removed_at
            .retain(|key, _| published.contains_key(key) && !desired_keys.contains(key));
        let at = (now, self.reads.done);
        for key in published.keys().filter(|k| !desired_keys.contains(*k)) {
            self.removed_at.entry(key.clone()).or_insert(at);
        }
    }

    /// Break last: per published CA that `desired` no longer carries, who still presents it (this
    /// replica's proxies in `presented`, and the peers', including replicas not read since its
    /// removal, for at most `ackTimeout`).
    fn still_presented(
        &self,
        desired: &[CaTrust],
        presented: &[(&CaTrust, Vec<&ProxyKey>)],
        now: SystemTime,
    ) -> BTreeMap<TrustKey, Presenters> {
        // (bundle, trust domain, anchor PEM) the configuration publishes.
        let mut anchors: HashSet<(&BundleKey, &str, &str)> = HashSet::new();
        for ca in desired {
            anchors.extend(
                ca.pems
                    .iter()
                    .map(|p| (&ca.bundle, ca.trust_domain.as_str(), p.as_str())),
            );
        }
        let desired_keys: HashSet<TrustKey> = desired.iter().map(CaTrust::key).collect();
        let removed = |key: &TrustKey, p: &PublishedCa| {
            !desired_keys.contains(key)
                && !p.ca.pems.iter().all(|pem| {
                    anchors.contains(&(&key.bundle, key.trust_domain.as_str(), pem.as_str()))
                })
        };
        let mut retained: BTreeMap<TrustKey, Presenters> = BTreeMap::new();
        let mut retain = |key: &TrustKey,
                          p: &PublishedCa,
                          named: &mut dyn Iterator<Item = String>,
                          more: usize,
                          unread: bool| {
            let held = retained.entry(key.clone()).or_insert_with(|| Presenters {
                ca: p.ca.clone(),
                named: BTreeSet::new(),
                more: 0,
                unread: false,
            });
            held.named.extend(named);
            held.more += more;
            held.unread |= unread;
        };
        for (ca, proxies) in presented {
            for (key, p) in self.published_for(&ca.bundle, &ca.trust_domain) {
                if removed(key, p) && p.ca.covers(ca.ca_id.as_str(), &ca.pems) {
                    retain(
                        key,
                        p,
                        &mut proxies.iter().map(ToString::to_string),
                        0,
                        false,
                    );
                }
            }
        }
        for peer in &self.peers {
            let Some(view) = &peer.view else {
                // What it presents is unknown: every removed CA may be.
                for (key, p) in self.published.iter().filter(|(k, p)| removed(k, p)) {
                    retain(key, p, &mut std::iter::once(peer.label()), 0, false);
                }
                continue;
            };
            for ca in &view.presented {
                let bundle = BundleKey::from_name(&ca.mesh);
                // A trust domain that does not parse is none of the published ones.
                let Ok(trust_domain) = TrustDomain::parse(&ca.trust_domain) else {
                    continue;
                };
                for (key, p) in self.published_for(&bundle, &trust_domain) {
                    if removed(key, p) && p.ca.covers(&ca.ca, &ca.anchors) {
                        let mut named = ca
                            .named
                            .iter()
                            .map(|name| format!("{name} on replica {}", peer.replica));
                        let more = ca.proxies.saturating_sub(ca.named.len());
                        retain(key, p, &mut named, more, false);
                    }
                }
            }
        }
        for (key, p) in self.published.iter().filter(|(k, p)| removed(k, p)) {
            let unread = self.removed_at.get(key).is_some_and(|(since, reads)| {
                self.reads.unknown_since(*reads) && now < *since + self.ack_timeout
            });
            if unread {
                retain(key, p, &mut std::iter::empty(), 0, true);
            }
        }
        retained
    }

    /// Of the removed CAs still presented, those the bundles keep (break last) until `ackTimeout` after
    /// their removal, or after a new CA of their bundle was confirmed ([`Gate::confirm`]) when that is
    /// later; each is a wait, logged and counted when it starts and when it times out.
    fn retain(
        &mut self,
        retained: BTreeMap<TrustKey, Presenters>,
        now: SystemTime,
    ) -> Vec<CaTrust> {
        self.retained_since.retain(|k, _| retained.contains_key(k));
        self.given_up.retain(|k| retained.contains_key(k));
        let mut kept = Vec::new();
        for (key, presenters) in retained {
            let Presenters {
                ca,
                mut named,
                more,
                unread,
            } = presenters;
            // Kept only until the peers are known: no proxy is known to present it, so this is no
            // rollout wait to warn of (the next reads of the database end it), but a wait all the same.
            if unread && named.is_empty() && more == 0 && !self.retained_since.contains_key(&key) {
                let since = self.removed_at.get(&key).map_or(now, |(since, _)| *since);
                named.insert(UNREAD_PEERS.to_owned());
                let wait = self.break_last_wait(&ca, since, now, named, 0);
                self.waits.push(wait);
                kept.push(ca);
                continue;
            }
            let since = *self.retained_since.entry(key.clone()).or_insert_with(|| {
                tracing::warn!(
                    mesh = %ca.bundle,
                    trust_domain = %ca.trust_domain,
                    ca = %ca.subject,
                    proxies = named.len() + more,
                    "a CA was removed from the configuration while proxies still present certificates from it; it stays trusted until they have ACKed replacements (at most rollout.ackTimeout, counted again from when a new CA of the mesh is confirmed)"
                );
                self.events.push((ca.bundle.clone(), GateEvent::RemovedWhilePresented));
                self.events.push((ca.bundle.clone(), GateEvent::WaitStarted(RolloutStep::BreakLast)));
                now
            });
            if self.given_up.contains(&key) {
                continue;
            }
            if now >= since + self.ack_timeout {
                tracing::warn!(
                    mesh = %ca.bundle,
                    trust_domain = %ca.trust_domain,
                    ca = %ca.subject,
                    proxies = ?named.iter().take(NAMED_WAITERS).collect::<Vec<_>>(),
                    "rollout.ackTimeout passed: removing the CA although these proxies may still present its certificates"
                );
                self.events.push((
                    ca.bundle.clone(),
                    GateEvent::TimedOut(RolloutStep::BreakLast),
                ));
                self.given_up.insert(key);
                continue;
            }
            if unread {
                named.insert(UNREAD_PEERS.to_owned());
            }
            let wait = self.break_last_wait(&ca, since, now, named, more);
            self.waits.push(wait);
            kept.push(ca);
        }
        kept
    }

    /// The break-last wait of a removed CA kept since `since` for the proxies (and replicas) in
    /// `named` and `more` others.
    fn break_last_wait(
        &self,
        ca: &CaTrust,
        since: SystemTime,
        now: SystemTime,
        named: BTreeSet<String>,
        more: usize,
    ) -> Waiting {
        Waiting {
            wait: Wait {
                mesh: ca.bundle.clone(),
                step: RolloutStep::BreakLast,
                ca: ca.subject.clone(),
                since: rfc3339(since),
                timeout_in_seconds: remaining(since + self.ack_timeout, now),
                waiting_count: named.len() + more,
                waiting_for: named.into_iter().take(NAMED_WAITERS).collect(),
            },
            recount: None,
            peers: Vec::new(),
        }
    }

    /// Remembers what the bundles of snapshot `generation` carry: entries new to them start
    /// unconfirmed (unless nothing can hold a bundle without them), those that left are forgotten.
    fn record_published(
        &mut self,
        out: &BTreeMap<BundleKey, Vec<CaTrust>>,
        generation: u64,
        now: SystemTime,
    ) {
        let published_now: HashSet<TrustKey> = out.values().flatten().map(CaTrust::key).collect();
        self.published.retain(|k, _| published_now.contains(k));
        let enabled = self.enabled;
        let reads = self.reads;
        for ca in out.values().flatten() {
            // A CA of an exported trust domain waits for the trust domain's peers, even in a mesh
            // new to this replica (after a restart, a rotation's new CA may be minutes old only).
            let fresh_mesh = !self.known_meshes.contains(&ca.bundle)
                && self.exported.peers_hold(ca, now) == PeersHold::Yes;
            self.published
                .entry(ca.key())
                .or_insert_with(|| PublishedCa {
                    ca: ca.clone(),
                    state: Published {
                        since_generation: generation,
                        since: now,
                        // No stream of this replica holds a bundle of a mesh new to it; peers
                        // that publish the mesh's trust may, and so may replicas it has not read.
                        confirmed: !enabled
                            || (fresh_mesh && self.peers.is_empty() && !reads.expected),
                        acked: !enabled || fresh_mesh,
                        waited: false,
                        federation_waited: false,
                        federation_until: None,
                        subject: ca.subject.clone(),
                        peer_reads: reads.done,
                    },
                });
        }
        self.known_meshes = out.keys().cloned().collect();
    }

    /// The published CAs of one trust domain of a mesh.
    fn published_for<'a>(
        &'a self,
        mesh: &'a BundleKey,
        trust_domain: &'a TrustDomain,
    ) -> impl Iterator<Item = (&'a TrustKey, &'a PublishedCa)> + 'a {
        let from = TrustKey {
            bundle: mesh.clone(),
            trust_domain: trust_domain.clone(),
            ca: CaId::new(String::new()),
        };
        self.published
            .range(from..)
            .take_while(move |(key, _)| key.bundle == *mesh && key.trust_domain == *trust_domain)
    }

    /// Whether `ca` may issue certificates in `trust_domain` of `mesh`: a published CA that the bundles
    /// carry for that trust domain and that its certificates chain to (the CA itself, or an entry holding its
    /// trust anchor, such as a MeshTrust with its root) was ACKed by every stream that must carry it, or the
    /// timeout passed. A CA that no such entry carries is not gated (its trust is managed elsewhere).
    pub fn may_issue(
        &self,
        mesh: &BundleKey,
        trust_domain: &TrustDomain,
        ca: &CertificateAuthority,
    ) -> bool {
        if !self.enabled {
            return true;
        }
        let mut anchors: Option<std::sync::Arc<[String]>> = None;
        let mut carried = false;
        for (_, p) in self.published_for(mesh, trust_domain) {
            let chains = p.ca.ca_id == *ca.id() || {
                let anchors = anchors.get_or_insert_with(|| ca.bundle_pems());
                p.ca.covers(ca.id(), anchors)
            };
            if chains {
                if p.state.confirmed {
                    return true;
                }
                carried = true;
            }
        }
        !carried
    }

    /// The meshes in which a trust or SAN wait holds issuance back (the egress bundle's waits hold no
    /// mesh back). The reconcile at the end of such a
    /// wait (or its timeout) decides every proxy again.
    pub fn holding_meshes(&self) -> HashSet<&str, KeyHasher> {
        if !self.enabled {
            return HashSet::default();
        }
        let trust = self
            .published
            .iter()
            .filter(|(key, p)| !p.state.confirmed && self.holds(key))
            .filter_map(|(key, _)| key.bundle.mesh_name());
        let sans = self
            .sans
            .iter()
            .filter(|(_, p)| !p.confirmed)
            .filter_map(|(key, _)| key.service.bundle.mesh_name());
        trust.chain(sans).map(MeshName::as_str).collect()
    }

    /// Whether anything waits on ACKs (so ACK events must trigger a reconcile).
    pub fn pending(&self) -> bool {
        self.pending_where(|_| true)
    }

    /// Whether a wait may hold certificates back: anything [`Gate::pending`] says but the trust steps
    /// of federated authorities. While none does, a proxy that connects or renews is decided alone.
    pub fn holds_issuance(&self) -> bool {
        self.pending_where(|key| self.holds(key))
    }

    /// Whether anything waits on ACKs, of the published entries only those `counted` says.
    fn pending_where(&self, counted: impl Fn(&TrustKey) -> bool) -> bool {
        self.enabled
            && (self.published.iter().any(|(key, p)| {
                (!p.state.confirmed || (!p.state.acked && !self.peers.is_empty())) && counted(key)
            }) || self
                .sans
                .values()
                .any(|p| !p.confirmed || (!p.acked && !self.peers.is_empty()))
                || self
                    .retained_since
                    .keys()
                    .any(|k| !self.given_up.contains(k)))
    }

    /// The earliest time a timeout lets a waiting step proceed.
    pub fn next_deadline(&self) -> Option<SystemTime> {
        let timeout = self.ack_timeout;
        // A CA in the federation step proceeds when its trust domain's peers hold it (once its
        // endpoint reports it served, when that news comes); any other, at its timeout (or when its
        // streams ACKed, an event of its own).
        let trust = self
            .published
            .values()
            .filter(|p| !p.state.confirmed)
            .filter_map(|p| match p.state.federation_until {
                Some(until) => until,
                None => Some(p.state.since + timeout),
            });
        let sans = self
            .sans
            .values()
            .filter(|p| !p.confirmed)
            .map(|p| p.since + timeout);
        let retained = self
            .retained_since
            .iter()
            .filter(|(k, _)| !self.given_up.contains(*k))
            .map(|(_, t)| *t + timeout);
        trust.chain(sans).chain(retained).min()
    }
}

/// The federation step's wait for `ca`: peers polling its trust domain's endpoint as told.
fn federation_wait(
    mesh: &BundleKey,
    ca: &CaTrust,
    p: &Published,
    hold: PeersHold,
    wait: Duration,
    now: SystemTime,
) -> Waiting {
    let (since, left, waiting_for) = match hold {
        PeersHold::Soon { since, ready_at } => (
            since,
            remaining(ready_at, now),
            format!(
                "the peers of trust domain {} (its bundle endpoint has served this CA since {}; a peer polling as told holds it by {})",
                ca.trust_domain,
                rfc3339(since),
                rfc3339(ready_at)
            ),
        ),
        PeersHold::NotServed | PeersHold::Yes => (
            p.since,
            i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
            format!(
                "the bundle endpoint of trust domain {}, which has not served this CA yet",
                ca.trust_domain
            ),
        ),
    };
    Waiting {
        wait: Wait {
            mesh: mesh.clone(),
            step: RolloutStep::Federation,
            ca: p.subject.clone(),
            since: rfc3339(since),
            timeout_in_seconds: left,
            waiting_for: vec![waiting_for],
            waiting_count: 1,
        },
        recount: None,
        peers: Vec::new(),
    }
}

fn remaining(deadline: SystemTime, now: SystemTime) -> i64 {
    seconds_until(deadline, now).max(0)
}

#[cfg(test)]
mod tests;
