//! One reconcile: bring every connected proxy's certificate up to date, in the order the rollout gate
//! allows, and publish what changed.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use meshca_config::SERVICE_TAG;

use super::ISSUE_RETRY;
use super::{Dataplanes, Issued, Owner, Scope};
use crate::bundles;
use crate::egress::{self, MeshChoice};
use crate::error::ClaimMismatch;
use crate::gate::{GateEvent, RolloutStep, StepChange, StepPhase, Wait};
use crate::peers::PresentedIds;
use crate::plan::{self, DataplaneInfo, Decision, Desired, Origin};
use crate::resource_name::Target;
use crate::snapshot::{Changed, ClaimRule, KeyHasher, LeafKey, ProxyEntry, ProxyKey, ProxyMap};
use crate::timefmt::{rfc3339, seconds_until};
use crate::trust::{BundleKey, CaTrust, ServiceIds, ServiceKey, EGRESS_SERVICE};
use crate::world::MeshState;

/// How one connected proxy is served this reconcile.
pub(super) enum Served {
    /// Without a certificate decision: refused, or no identity.
    Entry(ProxyEntry),
    /// Pending: the agent that holds its keys (named) has offered none to certify yet.
    WaitsForKey(Arc<str>),
    /// With a decided identity.
    Decided {
        /// What it should hold.
        desired: Box<Desired>,
        /// The gate holds its new certificate back.
        gated: bool,
        /// A certificate is issued for it now.
        issue: bool,
    },
}

/// How many proxies a wait names (the count says how many there are).
const NAMED_WAITERS: usize = 20;

/// How many proxies a pass decides before it hands their certificates to the issuance threads: they
/// start issuing while the pass decides the rest.
const SUBMIT_EVERY: usize = 512;

/// `keys` in order, `size` at a time.
fn chunked(keys: Vec<ProxyKey>, size: usize) -> impl Iterator<Item = Vec<ProxyKey>> {
    let mut keys = keys.into_iter().peekable();
    std::iter::from_fn(move || {
        keys.peek()?;
        Some(keys.by_ref().take(size).collect())
    })
}

impl Owner {
    /// Brings every connected proxy's certificate up to date at `now`, in the order the rollout gate
    /// allows, then publishes a snapshot if its content changed.
    ///
    /// The work is the event's, not the fleet's: while no rollout is under way and the configuration
    /// is unchanged, only the proxies that connected or left since the last reconcile, and those whose
    /// renewal is due, are looked at ([`Owner::reconcile_proxies`]). Everything else (a new
    /// configuration, a rollout step, a timeout, a change that reaches beyond the proxy) reconciles
    /// every connected proxy.
    ///
    /// Returns the earliest time something is due: a renewal, a rollout timeout or a CA rotation step.
    pub fn reconcile(&mut self, now: SystemTime) -> Option<SystemTime> {
        let started = Instant::now();
        let global_due = self.agenda.global_due(now);
        let keys = self.agenda.take_keys(now);
        if !(self.agenda.full || global_due) && self.agenda.waiting_on_acks && keys.is_empty() {
            if self.reconcile_acks(now) {
                self.telemetry.reconciled(Scope::Acks, 0, started.elapsed());
                return self.next_due();
            }
        } else if !(self.agenda.full || global_due || self.agenda.waiting_on_acks) {
            if keys.is_empty() {
                return self.next_due();
            }
            if self.reconcile_proxies(&keys, now) {
                self.telemetry
                    .reconciled(Scope::Proxies, keys.len(), started.elapsed());
                return self.next_due();
            }
        }
        self.agenda.full = false;
        let (next, decided) = self.reconcile_all(&keys, now);
        let took = started.elapsed();
        tracing::debug!(
            connected = self.proxies.streams.proxies().count(),
            decided,
            deferred = self.agenda.deferred.len(),
            millis = took.as_millis() as u64,
            "reconciled the fleet"
        );
        self.telemetry.reconciled(Scope::Full, decided, took);
        next
    }

    /// Reconciles every connected proxy (deciding now those [`Owner::split_quiet`] says); `touched`
    /// connected or left since the last reconcile. Returns when it is next due, and how many proxies it
    /// decided.
    fn reconcile_all(
        &mut self,
        touched: &BTreeSet<ProxyKey>,
        now: SystemTime,
    ) -> (Option<SystemTime>, usize) {
        // Descriptions, the gate's plans and (before this call) the world may change from here on.
        self.issuing.new_epoch();
        // While the files that describe dataplanes are unchanged, only the touched proxies'
        // descriptions and claim rules can have changed.
        let unchanged_world = self.last.descriptions_current(&self.world);
        let dataplanes = self.refresh_dataplanes(touched);
        self.plan_egress();
        let generation = self.publisher.generation() + 1;
        self.gate.begin();
        self.gate.confirm(&self.proxies.streams, now);
        self.settle_previous(now, true);
        let trust = self.plan_trust(generation, now);
        // SANs before identity: the contexts of this snapshot carry every ID decided now, and the gate
        // tracks when each entered them. (Issuing below adds no ID: it presents decided ones.)
        let (service_ids, presented_ids) = self.service_identities(&dataplanes);
        self.last.presented_ids = presented_ids;
        self.gate.plan_sans(&service_ids, generation, now);
        // New trust goes out before the pass over every proxy, which only adds certificates the gate
        // lets through once that trust is ACKed.
        let generation =
            if self
                .publisher
                .publish_trust_first(generation, &self.world, &trust, &service_ids)
            {
                generation + 1
            } else {
                generation
            };
        // A CA or an ID that no connected stream must carry may be used at once. (No stream has ACKed
        // what was just published: its ACKs are read between turns.)
        self.gate.confirm(&self.proxies.streams, now);
        self.reasons.clear();
        let connected: Vec<ProxyKey> = self.proxies.streams.proxies().cloned().collect();
        let (now_keys, deferred) = self.split_quiet(connected, unchanged_world.then_some(touched));
        let decided = now_keys.len();
        let entries = self.serve(now_keys, &dataplanes, now);
        // Every proxy that left since the last reconcile is touched.
        for key in touched
            .iter()
            .filter(|k| !self.proxies.streams.is_connected(k))
        {
            self.agenda.renewals.set(key, None);
        }
        self.forget_vanished(&dataplanes, unchanged_world.then_some(touched));
        self.publisher
            .update_service_tls(&self.world, &dataplanes, &self.issued, &trust);
        let rules_changed = unchanged_world.then_some(touched);
        self.publish_snapshot(
            generation,
            &trust,
            entries,
            &service_ids,
            &dataplanes,
            rules_changed,
        );
        self.agenda.deferred = deferred;
        self.report_gate_events();
        self.last.at = now;
        self.last.dataplanes = dataplanes;
        self.last.service_ids = service_ids;
        self.agenda.next_global = self.next_global_event();
        (self.next_due(), decided)
    }

    /// Forgets the previous certificates of proxies that ACKed their replacement on each stream they
    /// receive their identity on, that disconnected, or whose `ackTimeout` passed: of every proxy that
    /// keeps some with `all`, else only of those with a stream event since they were last looked at.
    /// Returns whether a forgotten one may change what is published: its CA is not one the
    /// configuration publishes (break last kept it), or its SPIFFE ID is not the proxy's current one
    /// (a `meshservice:` context kept it).
    fn settle_previous(&mut self, now: SystemTime, all: bool) -> bool {
        let mut reaches_beyond = false;
        let timeout = self.gate.ack_timeout();
        let stirred = self.replacing.take_stirred();
        let keys = if all {
            self.replacing.proxies().cloned().collect()
        } else {
            stirred
        };
        let mut timed_out: BTreeMap<BundleKey, Vec<String>> = BTreeMap::new();
        for key in keys {
            let Some(issued) = self.issued.get(&key) else {
                continue;
            };
            let unacked = self.unacked(&key, issued);
            if unacked && now < issued.issued_at + timeout {
                continue;
            }
            reaches_beyond |= issued.previous.iter().any(|p| {
                !self.last.configured.contains(&p.ca_trust)
                    || p.spiffe_id != issued.published.spiffe_id
            });
            if unacked {
                timed_out
                    .entry(BundleKey::mesh(key.mesh.clone()))
                    .or_default()
                    .push(key.to_string());
            }
            if let Some(issued) = self.issued.get_mut(&key) {
                let previous = std::mem::take(&mut issued.previous);
                self.replacing.update(&key, &previous, &[]);
            }
        }
        // One line per mesh, however many proxies timed out together.
        for (mesh, mut proxies) in timed_out {
            proxies.sort();
            tracing::warn!(
                mesh = %mesh,
                count = proxies.len(),
                proxies = ?proxies.iter().take(NAMED_WAITERS).collect::<Vec<_>>(),
                "rollout.ackTimeout passed: these proxies have not ACKed their new certificates; no longer keeping their old CAs trusted for them"
            );
            for _ in &proxies {
                self.gate.timed_out(&mesh, RolloutStep::IdentityAck);
            }
        }
        reaches_beyond
    }

    /// Whether a stream on which `key` receives its identity has not ACKed `issued` yet.
    fn unacked(&self, key: &ProxyKey, issued: &Issued) -> bool {
        let identity = Some(&*issued.published);
        self.proxies.streams.of(key).any(|s| {
            issued
                .first_served_in
                .is_none_or(|generation| !s.has_acked(generation))
                && s.resources
                    .iter()
                    .any(|r| r.target(s.asker(), identity) == Target::Identity)
        })
    }

    /// The identity-ACK waits at `now`: per mesh and replaced CA, the proxies that have not ACKed the
    /// certificate that replaced one from it. Counted when asked for (the status), not per batch of
    /// ACKs.
    pub(super) fn identity_ack_waits(&self, now: SystemTime) -> Vec<Wait> {
        let timeout = self.gate.ack_timeout();
        let mut waiting: BTreeMap<(&str, &str), (SystemTime, BTreeSet<String>)> = BTreeMap::new();
        for key in self.replacing.proxies() {
            let Some(issued) = self.issued.get(key) else {
                continue;
            };
            if !self.unacked(key, issued) {
                continue;
            }
            for previous in &issued.previous {
                let (since, proxies) = waiting
                    .entry((&key.mesh, &previous.ca_trust.subject))
                    .or_insert((issued.issued_at, BTreeSet::new()));
                *since = (*since).min(issued.issued_at);
                proxies.insert(key.to_string());
            }
        }
        waiting
            .into_iter()
            .map(|((mesh, ca), (since, proxies))| Wait {
                mesh: BundleKey::mesh(mesh),
                step: RolloutStep::IdentityAck,
                ca: ca.to_owned(),
                since: rfc3339(since),
                timeout_in_seconds: seconds_until(since + timeout, now).max(0),
                waiting_count: proxies.len(),
                waiting_for: proxies.into_iter().take(NAMED_WAITERS).collect(),
            })
            .collect()
    }

    /// ACKs while a rollout waits: the gate checks whether a wait is over, and the replaced
    /// certificates of the proxies that ACKed are forgotten when all their ACKs are in. Returns false,
    /// when a wait is over or a forgotten certificate may change what is published: then every proxy
    /// is reconciled. Costs the batch's proxies, not a reconcile of the fleet for every batch of ACKs.
    fn reconcile_acks(&mut self, now: SystemTime) -> bool {
        if self.gate.any_wait_over(&self.proxies.streams, now) {
            return false;
        }
        if self.settle_previous(now, false) {
            return false;
        }
        self.report_gate_events();
        true
    }

    /// Chooses where the zone egress identity comes from, and says so when that changes.
    fn plan_egress(&mut self) {
        let plan = egress::choose(&self.world, self.config.default_mesh.as_deref());
        if self.egress.as_ref() == Some(&plan) {
            return;
        }
        let egress_known = self.proxies.egresses().next().is_some()
            || !self.world.resources.zone_egresses.is_empty();
        match &plan {
            Ok(p) if p.chosen_by == MeshChoice::FirstWithIdentity => tracing::warn!(
                mesh = %p.mesh,
                issuer = %p.issuer,
                "zone egress identity from {}: there is no defaults.mesh, no mesh named default, and more than one mesh",
                p.chosen_by
            ),
            Ok(p) => {
                tracing::info!(mesh = %p.mesh, issuer = %p.issuer, "zone egress identity from {}", p.chosen_by)
            }
            Err(reason) if egress_known => tracing::warn!("no zone egress identity: {reason}"),
            Err(reason) => tracing::info!("no zone egress identity: {reason}"),
        }
        self.egress = Some(plan);
    }

    /// What each mesh's bundles, and the zone egress bundle, carry: the configured CAs, plus (break
    /// last) removed CAs that connected proxies still present, as the gate decides.
    fn plan_trust(
        &mut self,
        generation: u64,
        now: SystemTime,
    ) -> BTreeMap<BundleKey, Vec<CaTrust>> {
        let mut grouped = super::presenters(&self.issued, &self.proxies.streams);
        // A connected proxy this replica has issued nothing to yet may present a certificate from
        // any CA its mesh still trusts (it moved here from another replica, or from before a
        // restart): those kept only because proxies may present them stay for it too.
        let retained: Vec<CaTrust> = self
            .proxies
            .streams
            .proxies()
            .filter(|key| !self.issued.contains_key(*key))
            .map(|key| BundleKey::mesh(key.mesh.clone()))
            .collect::<HashSet<BundleKey>>()
            .into_iter()
            .flat_map(|mesh| self.gate.retained_in(&mesh).cloned().collect::<Vec<_>>())
            .collect();
        for ca in &retained {
            let newcomers = self
                .proxies
                .streams
                .proxies()
                .filter(|key| ca.bundle.is_mesh(&key.mesh) && !self.issued.contains_key(*key));
            grouped
                .entry(ca.key())
                .or_insert((ca, Vec::new()))
                .1
                .extend(newcomers);
        }
        let presented: Vec<(&CaTrust, Vec<&ProxyKey>)> = grouped.into_values().collect();
        let mut desired: Vec<CaTrust> = self
            .world
            .meshes
            .values()
            .flat_map(bundles::mesh_cas)
            .collect();
        if let Some(Ok(plan)) = &self.egress {
            desired.extend(egress::egress_cas(&self.world, plan));
        }
        self.last.configured = desired.iter().collect();
        self.gate.plan_trust(desired, &presented, generation, now)
    }

    /// Splits the connected proxies of a full reconcile into those it serves now and the ones it leaves
    /// for later turns ([`Owner::serve_deferred`]), so that what proxies wait for (a certificate their
    /// streams ask for) is decided, issued and published without waiting for a pass over the whole
    /// fleet. Served now: every proxy when any description may have changed (`touched: None`), else the
    /// touched proxies and those with a stream that may ask for their identity, both found without
    /// looking at the others. The rest keep what they were published until their turn comes within the
    /// loop's next turns, as they would while a pass over the fleet ran.
    ///
    /// An asking proxy whose certificate is being issued is in neither list either: the result's arrival
    /// decides it.
    ///
    /// A proxy that asks for its identity but is served the certificate it holds, in a mesh where the
    /// gate holds issuance back (a new CA or SPIFFE ID waits for ACKs), is in neither list unless its
    /// renewal comes before the wait times out: it keeps its certificate until the wait ends, and the
    /// reconcile at the end decides it with the rest of the fleet. Deciding it during the wait would
    /// find its new certificate held back, at the cost of a pass that the streams delivering the new
    /// trust need the CPU for.
    fn split_quiet(
        &self,
        connected: Vec<ProxyKey>,
        touched: Option<&BTreeSet<ProxyKey>>,
    ) -> (Vec<ProxyKey>, Vec<ProxyKey>) {
        let Some(touched) = touched else {
            return (connected, Vec::new());
        };
        let held = self.held_for_rollout();
        let touched_now = touched
            .iter()
            .filter(|key| self.proxies.streams.is_connected(key))
            .map(|key| (key, true));
        let asking = self
            .proxies
            .streams
            .asking_identity()
            .map(|key| (key, false));
        let mut looked_at: HashSet<&ProxyKey, KeyHasher> = HashSet::default();
        let mut now = Vec::new();
        for (key, touched) in touched_now.chain(asking) {
            // An asking proxy whose certificate is being issued is decided again when it comes back
            // (`Owner::on_issued` asks whether it still wants it, and decides it anew if not).
            let waits_for_result = !touched && self.issuing.is_issuing(key);
            if looked_at.insert(key) && (touched || !held(key)) && !waits_for_result {
                now.push(key.clone());
            }
        }
        let deferred = connected
            .into_iter()
            .filter(|key| !looked_at.contains(key))
            .collect();
        (now, deferred)
    }

    /// Whether a proxy that was not touched waits for a rollout step of its mesh: the gate holds
    /// issuance back there, and the proxy is served the certificate it holds, which is not due for
    /// renewal before the wait times out (it keeps it until the wait ends, and the reconcile then decides
    /// it). A zone egress never waits here: its identity comes from a mesh of its own.
    pub(super) fn held_for_rollout(&self) -> impl Fn(&ProxyKey) -> bool + '_ {
        let holding = self.gate.holding_meshes();
        let deadline = self.gate.next_deadline();
        let published = self.publisher.last();
        move |key| {
            if !holding.contains(&*key.mesh) {
                return false;
            }
            let Some(ProxyEntry::Ready(served)) = published.proxies.get(key) else {
                return false;
            };
            self.issued.get(key).is_some_and(|issued| {
                Arc::ptr_eq(&issued.published, served)
                    && deadline.is_some_and(|deadline| issued.renew_at > deadline)
            }) && !self.proxies.is_zone_egress(key)
        }
    }

    /// Decides, issues (where the gate allows) and returns the snapshot entry of each of `keys`
    /// (connected proxies), keeping their reasons and renewal times up to date.
    pub(super) fn serve(
        &mut self,
        keys: Vec<ProxyKey>,
        dataplanes: &Dataplanes,
        now: SystemTime,
    ) -> Vec<(ProxyKey, ProxyEntry)> {
        // Decide every proxy first, then start issuing what the gate allows, then serve. A proxy
        // whose certificate is being issued keeps the one it has (or waits) until the result is in.
        let plans = self.decide_and_submit(keys, dataplanes, now);
        let mut entries = Vec::with_capacity(plans.len());
        for (key, served) in plans {
            let waits_for_key = match &served {
                Served::WaitsForKey(agent) => Some(agent.clone()),
                _ => None,
            };
            let (entry, renew_at) = self.entry_of(&key, served, now);
            self.agenda.renewals.set(&key, renew_at);
            match waits_for_key {
                Some(agent) => {
                    self.reasons.insert(
                        key.clone(),
                        format!("waiting for meshca agent {agent}'s key request: the agent makes and holds this dataplane's keys"),
                    );
                }
                None => self.note_reason(&key, &entry),
            }
            entries.push((key, entry));
        }
        entries
    }

    /// Decides each of `keys` and hands what must be issued to the issuance threads. Proxies waiting
    /// for their identity are decided and submitted first, a batch at a time: their certificates are
    /// issued while the others are decided (a trust wait that ends decides the whole fleet).
    fn decide_and_submit(
        &mut self,
        keys: Vec<ProxyKey>,
        dataplanes: &Dataplanes,
        now: SystemTime,
    ) -> Vec<(ProxyKey, Served)> {
        let (first, then): (Vec<ProxyKey>, Vec<ProxyKey>) = keys
            .into_iter()
            .partition(|key| self.waits_for_identity(key));
        let mut plans: Vec<(ProxyKey, Served)> = Vec::with_capacity(first.len() + then.len());
        let batches = [first, then]
            .into_iter()
            .flat_map(|keys| chunked(keys, SUBMIT_EVERY));
        for keys in batches {
            let planned = plans.len();
            for key in keys {
                let served = match dataplanes.get(&key) {
                    Some(Ok(info)) => self.plan_proxy(&key, info, now),
                    Some(Err(reason)) => Served::Entry(ProxyEntry::Refused {
                        reason: reason.to_string(),
                    }),
                    None => continue,
                };
                plans.push((key, served));
            }
            let jobs: Vec<(ProxyKey, &Desired)> = plans[planned..]
                .iter()
                .filter_map(|(key, served)| match served {
                    Served::Decided {
                        desired,
                        issue: true,
                        ..
                    } => Some((key.clone(), &**desired)),
                    _ => None,
                })
                .collect();
            self.submit(&jobs, now);
        }
        plans
    }

    /// What `key` is served as decided, and when it is looked at again for renewal (`None`: when
    /// something else wakes it).
    fn entry_of(
        &self,
        key: &ProxyKey,
        served: Served,
        now: SystemTime,
    ) -> (ProxyEntry, Option<SystemTime>) {
        let (gated, issue) = match served {
            Served::Entry(entry) => return (entry, None),
            // The agent's offer wakes it. A certificate over a key the agent holds is served until
            // it expires meanwhile (then the proxy is looked at again); one over a key meshca made
            // is of no use to the agent.
            Served::WaitsForKey(_) => {
                return match self.issued.get(key) {
                    Some(issued)
                        if matches!(issued.published.key, LeafKey::Agent(_))
                            && now < issued.leaf.not_after =>
                    {
                        (
                            ProxyEntry::Ready(issued.published.clone()),
                            Some(issued.leaf.not_after),
                        )
                    }
                    _ => (ProxyEntry::Pending, None),
                }
            }
            Served::Decided { gated, issue, .. } => (gated, issue),
        };
        // Being issued now: its result publishes it (or, on failure, sets its retry). Meanwhile the
        // proxy keeps the certificate it has, unless that has expired.
        let issuing = issue && self.issuing.is_issuing(key);
        let waits = gated || issuing;
        let held = self
            .issued
            .get(key)
            .filter(|i| !issuing || now < i.leaf.not_after);
        match held {
            // Held back by the gate: the wait's end (or its timeout) reconciles every proxy, this one
            // included; a renewal time in the past would only spin the loop.
            Some(issued) if waits => (ProxyEntry::Ready(issued.published.clone()), None),
            // A renewal that failed (its time has passed) is tried again after a pause.
            Some(issued) => {
                let retry = (issued.renew_at <= now).then_some(now + ISSUE_RETRY);
                (
                    ProxyEntry::Ready(issued.published.clone()),
                    Some(retry.unwrap_or(issued.renew_at)),
                )
            }
            None if waits => (ProxyEntry::Pending, None),
            None => (
                ProxyEntry::NoIdentity {
                    reason: "issuance failed; see the daemon log".into(),
                },
                Some(now + ISSUE_RETRY),
            ),
        }
    }

    /// Keeps why `key` has no certificate, as the status shows it.
    fn note_reason(&mut self, key: &ProxyKey, entry: &ProxyEntry) {
        match entry {
            ProxyEntry::Ready(_) => {
                self.reasons.remove(key);
            }
            ProxyEntry::Pending if self.issuing.is_issuing(key) => {
                self.reasons
                    .insert(key.clone(), "its certificate is being issued".into());
            }
            ProxyEntry::Pending => {
                self.reasons.insert(
                    key.clone(),
                    "waiting for connected proxies to ACK the new CA's trust bundle".into(),
                );
            }
            ProxyEntry::NoIdentity { reason } | ProxyEntry::Refused { reason } => {
                self.reasons.insert(key.clone(), reason.clone());
            }
        }
    }

    /// One INFO line per mesh and issuer when a wave of issuance is over (how many, and how long the
    /// wave took from its first job to its last result); the line per certificate is DEBUG.
    pub(super) fn log_wave(&mut self, took: std::time::Duration) {
        for ((mesh, issuer), count) in std::mem::take(&mut self.wave) {
            tracing::info!(
                mesh = %mesh,
                issuer = %issuer,
                certificates = count,
                millis = took.as_millis() as u64,
                "issued {count} certificate{}",
                if count == 1 { "" } else { "s" }
            );
        }
    }

    /// One connected proxy: its decided identity, whether the gate holds it back, and whether it needs a
    /// certificate issued now.
    pub(super) fn plan_proxy(
        &self,
        key: &ProxyKey,
        info: &DataplaneInfo,
        now: SystemTime,
    ) -> Served {
        let mut desired = match self.decide(key, info) {
            Decision::NoIdentity(reason) => {
                return Served::Entry(ProxyEntry::NoIdentity { reason })
            }
            Decision::Issue(desired) => desired,
        };
        // A proxy an agent serves is certified over a key the agent holds, never one of meshca's.
        if let Some(agent) = self.agent_served(key) {
            let current = self.issued.get(key).map(|i| &i.published.key);
            match self
                .agent_keys
                .next_key(key, current, desired.key_algorithm)
            {
                Some(next) => desired.agent_key = Some(next),
                None => return Served::WaitsForKey(Arc::from(agent)),
            }
        }
        // Trust before identity: a CA issues only once every stream that must trust it has ACKed it.
        // SANs before identity: a proxy changes its SPIFFE ID only once the `meshservice:` contexts of
        // its services, as their subscribers hold them, accept the new one.
        let trust_domain = desired.spiffe_id.trust_domain();
        let gated = !self
            .gate
            .may_issue(&desired.trusted_in, trust_domain, &desired.ca)
            || !self.may_present_id(key, info, &desired.spiffe_id.to_string());
        let issue = !gated && self.needs_issue(key, &desired, now);
        Served::Decided {
            desired,
            gated,
            issue,
        }
    }

    /// The agent that serves `key`, when one does (a zone egress is always meshca's).
    pub(super) fn agent_served(&self, key: &ProxyKey) -> Option<&str> {
        if self.proxies.is_zone_egress(key) {
            return None;
        }
        self.agent_keys.agent_of(key)
    }

    /// The certificate `key` should hold: the zone egress identity for an egress, else its dataplane
    /// identity.
    fn decide(&self, key: &ProxyKey, info: &DataplaneInfo) -> Decision {
        if !self.proxies.is_zone_egress(key) {
            let mesh = self.world.meshes.get(&*key.mesh);
            return plan::decide(mesh, info, &self.config.zone, self.config.key_algorithm);
        }
        match &self.egress {
            Some(Ok(plan)) => egress::decide(
                &self.world,
                plan,
                info,
                &self.config.zone,
                self.config.key_algorithm,
            ),
            Some(Err(reason)) => Decision::NoIdentity(format!("no zone egress identity: {reason}")),
            None => Decision::NoIdentity("the zone egress identity is not chosen yet".into()),
        }
    }

    /// Whether the proxy may present `spiffe_id`: it already does, or every local MeshService that
    /// selects it (for the zone egress: the egress bundle's SAN matchers) has had the ID confirmed in its
    /// context.
    fn may_present_id(&self, key: &ProxyKey, info: &DataplaneInfo, spiffe_id: &str) -> bool {
        let presents = self
            .issued
            .get(key)
            .is_none_or(|issued| issued.published.spiffe_id == spiffe_id);
        if self.proxies.is_zone_egress(key) {
            return presents || self.gate.may_present(&ServiceKey::egress(), spiffe_id);
        }
        presents
            || self
                .world
                .resources
                .mesh_services
                .iter()
                .filter(|s| s.mesh == info.mesh && s.zone().is_none_or(|z| z == self.config.zone))
                .filter(|s| {
                    s.dataplane_tags
                        .as_ref()
                        .is_some_and(|t| info.has_inbound_with(t))
                })
                .all(|s| {
                    let service = ServiceKey::new(s.mesh.as_str(), s.name.clone());
                    self.gate.may_present(&service, spiffe_id)
                })
    }

    /// Certificates of dataplanes that no longer exist are dropped; those of disconnected proxies are
    /// kept (a reconnect within their lifetime reuses them) but not served.
    /// With `only`, only those proxies' descriptions can have changed since the last reconcile, and
    /// only their certificates are looked at.
    fn forget_vanished(&mut self, dataplanes: &Dataplanes, only: Option<&BTreeSet<ProxyKey>>) {
        let described = |k: &ProxyKey| dataplanes.get(k).is_some_and(|d| d.is_ok());
        let Some(only) = only else {
            let replacing = &mut self.replacing;
            self.issued.retain(|k, issued| {
                let keep = described(k);
                if !keep {
                    replacing.update(k, &issued.previous, &[]);
                }
                keep
            });
            self.agent_keys.retain(described);
            return;
        };
        for key in only.iter().filter(|k| !described(k)) {
            if let Some(issued) = self.issued.remove(key) {
                self.replacing.update(key, &issued.previous, &[]);
            }
            self.agent_keys.forget(key);
        }
    }

    /// The SPIFFE IDs each MeshService's proxies present. For a service of another zone (or one without
    /// a dataplane selector), `spec.identities` as given. For a local service, computed whatever its file
    /// says: for every dataplane the service selects, the ServiceTag of its matching inbounds, the ID
    /// meshca decides for it, the IDs of every MeshIdentity selecting it (staged migrations), and (break
    /// last), while its proxy is connected, the ID of the certificate served now and of the one it
    /// replaced, until the proxy has ACKed its replacement; and what the peers' proxies present.
    ///
    /// Also returns what this replica's proxies present, per computed service, for the peers.
    fn service_identities(&self, dataplanes: &Dataplanes) -> (ServiceIds, PresentedIds) {
        let mut out = ServiceIds::new();
        let mut presented = PresentedIds::new();
        for service in &self.world.resources.mesh_services {
            let local = service.zone().is_none_or(|z| z == self.config.zone);
            let computed = local.then_some(service.dataplane_tags.as_ref()).flatten();
            let Some(selector) = computed else {
                // Another zone's service (or one that selects nothing): its identities as given.
                let ids = bundles::service_spiffe_ids(&service.mesh, service);
                out.insert(
                    ServiceKey::new(service.mesh.as_str(), service.name.clone()),
                    ids,
                );
                continue;
            };
            // A local service's identities are computed, whatever its file lists: the ServiceTag of
            // each selected inbound, the ID each selected dataplane is issued, the IDs of every
            // MeshIdentity that selects it, and what its connected proxies still present.
            let mut ids = BTreeSet::new();
            let mut theirs = BTreeSet::new();
            let mesh = self.world.meshes.get(&service.mesh);
            let selected = dataplanes.iter().filter_map(|(key, dp)| {
                let dp = dp.as_ref().ok()?;
                (dp.mesh == service.mesh && dp.has_inbound_with(selector)).then_some((key, dp))
            });
            for (key, dp) in selected {
                ids.extend(self.given_ids(mesh, dp, selector));
                theirs.extend(self.presented_ids(key));
            }
            ids.extend(theirs.iter().cloned());
            let key = ServiceKey::new(service.mesh.as_str(), service.name.clone());
            self.add_peers_ids(&key, &mut ids);
            out.insert(key, ids);
            presented
                .entry(service.mesh.clone())
                .or_default()
                .insert(service.name.clone(), theirs);
        }
        let (mut ids, theirs) = self.egress_identities(dataplanes);
        let egress = ServiceKey::egress();
        self.add_peers_ids(&egress, &mut ids);
        out.insert(egress, ids);
        presented
            .entry(BundleKey::Egress.to_string())
            .or_default()
            .insert(EGRESS_SERVICE.to_owned(), theirs);
        (out, presented)
    }

    /// Adds to a computed context's `ids` what the peers' proxies of `service` present (break last
    /// across replicas); while a peer's view cannot be read, every ID the context carried.
    fn add_peers_ids(&self, service: &ServiceKey, ids: &mut BTreeSet<String>) {
        for peer in self.gate.peers() {
            match &peer.view {
                Some(view) => {
                    let theirs = view
                        .presented_ids
                        .get(service.bundle.as_str())
                        .and_then(|s| s.get(&service.service));
                    ids.extend(theirs.into_iter().flatten().cloned());
                }
                None => {
                    let carried = self.last.service_ids.get(service);
                    ids.extend(carried.into_iter().flatten().cloned());
                }
            }
        }
    }

    /// What a dataplane gives a local MeshService that selects it (with `selector`), connected or not:
    /// the ServiceTag of each selected inbound, the ID meshca decides for it, and (staged migrations)
    /// the ID of every MeshIdentity selecting it, provider-less ones included.
    pub(super) fn given_ids(
        &self,
        mesh: Option<&MeshState>,
        dp: &DataplaneInfo,
        selector: &BTreeMap<String, String>,
    ) -> BTreeSet<String> {
        let mut ids: BTreeSet<String> = dp
            .inbounds_with(selector)
            .filter_map(|tags| tags.get(SERVICE_TAG))
            .map(|tag| format!("spiffe://{}/{tag}", dp.mesh))
            .collect();
        if let Decision::Issue(d) =
            plan::decide(mesh, dp, &self.config.zone, self.config.key_algorithm)
        {
            ids.insert(d.spiffe_id.to_string());
        }
        ids.extend(
            plan::selected_identity_ids(mesh, dp, &self.config.zone)
                .iter()
                .map(ToString::to_string),
        );
        ids
    }

    /// The SPIFFE IDs a proxy may present while it is connected (break last): its served certificate's,
    /// and those of the certificates it replaced and has not ACKed the replacement of.
    pub(super) fn presented_ids(&self, key: &ProxyKey) -> Vec<String> {
        match self.issued.get(key) {
            Some(issued) if self.proxies.streams.is_connected(key) => {
                std::iter::once(issued.published.spiffe_id.clone())
                    .chain(issued.previous.iter().map(|p| p.spiffe_id.clone()))
                    .collect()
            }
            _ => Vec::new(),
        }
    }

    /// The SPIFFE IDs the zone egress bundle accepts: the egress identity of every known egress (each
    /// ZoneEgress file, each egress token that connected) and, while an egress is connected, the IDs it
    /// may still present (break last).
    /// Also returns the IDs this replica's egresses present.
    fn egress_identities(&self, dataplanes: &Dataplanes) -> (BTreeSet<String>, BTreeSet<String>) {
        let plan = self.egress.as_ref().and_then(|p| p.as_ref().ok());
        let (zone, algorithm) = (&self.config.zone, self.config.key_algorithm);
        let decided = |info: &DataplaneInfo| match egress::decide(
            &self.world,
            plan?,
            info,
            zone,
            algorithm,
        ) {
            Decision::Issue(d) => Some(d.spiffe_id.to_string()),
            Decision::NoIdentity(_) => None,
        };
        let mesh = plan.map_or("", |p| p.mesh.as_str());
        let mut ids: BTreeSet<String> = self
            .world
            .resources
            .zone_egresses
            .iter()
            .filter_map(|egress| decided(&DataplaneInfo::from_zone_egress(mesh, egress)))
            .collect();
        let mut presented = BTreeSet::new();
        for key in self.proxies.egresses() {
            let Some(info) = dataplanes.get(key) else {
                continue;
            };
            ids.extend(info.as_ref().ok().and_then(decided));
            presented.extend(self.presented_ids(key));
        }
        ids.extend(presented.iter().cloned());
        (ids, presented)
    }

    /// Builds the snapshot and publishes it when its content differs from the last one, saying which
    /// proxies it changed (or that anything may have, when a bundle or context did). The per-proxy maps
    /// start from the last snapshot's and change only where an entry or rule differs, so an unchanged
    /// proxy costs a lookup. Claim rules are recomputed for `rules_changed` (every dataplane when `None`:
    /// a new configuration).
    #[allow(clippy::too_many_arguments)]
    fn publish_snapshot(
        &mut self,
        generation: u64,
        trust: &BTreeMap<BundleKey, Vec<CaTrust>>,
        entries: Vec<(ProxyKey, ProxyEntry)>,
        service_ids: &ServiceIds,
        dataplanes: &Dataplanes,
        rules_changed: Option<&BTreeSet<ProxyKey>>,
    ) {
        let previous = self.publisher.last();
        let mut changed: BTreeSet<ProxyKey> = BTreeSet::new();
        let mut proxies = previous.proxies.clone();
        // Every connected proxy with a description keeps an entry (deferred proxies and those held for
        // a rollout keep theirs until their turn). While the descriptions are the last reconcile's,
        // only a touched proxy can have lost its description, or its stream.
        let described = |key: &ProxyKey| match rules_changed {
            Some(touched) if !touched.contains(key) => true,
            _ => dataplanes.contains_key(key),
        };
        for (key, entry) in entries {
            if proxies
                .get(&key)
                .is_none_or(|old| !bundles::same_entry(old, &entry))
            {
                changed.insert(key.clone());
                proxies.insert(key, entry);
            }
        }
        // Every proxy that left since the last reconcile is touched too.
        let lost = |key: &ProxyKey| !self.proxies.streams.is_connected(key) || !described(key);
        let gone: Vec<ProxyKey> = match rules_changed {
            Some(touched) => touched
                .iter()
                .filter(|key| proxies.contains_key(*key) && lost(key))
                .cloned()
                .collect(),
            None => proxies.keys().filter(|key| lost(key)).cloned().collect(),
        };
        for key in gone {
            proxies.remove(&key);
            changed.insert(key);
        }
        let mut snapshot =
            self.publisher
                .build(generation, &self.world, trust, proxies, service_ids);
        snapshot.claim_rules = match rules_changed {
            Some(keys) => {
                let mut rules = previous.claim_rules.clone();
                for key in keys {
                    let rule = dataplanes
                        .get(key)
                        .and_then(|described| self.claim_rule_of(key, described));
                    let old = match &rule {
                        Some(rule) => rules.insert(key.clone(), rule.clone()),
                        None => rules.remove(key),
                    };
                    if old != rule {
                        changed.insert(key.clone());
                    }
                }
                rules
            }
            None => {
                let rules: ProxyMap<Arc<ClaimRule>> = dataplanes
                    .iter()
                    .filter_map(|(k, d)| Some((k.clone(), self.claim_rule_of(k, d)?)))
                    .collect();
                for (key, rule) in &rules {
                    if previous.claim_rules.get(key) != Some(rule) {
                        changed.insert(key.clone());
                    }
                }
                changed.extend(
                    previous
                        .claim_rules
                        .keys()
                        .filter(|k| !rules.contains_key(*k))
                        .cloned(),
                );
                rules
            }
        };
        let proxies_only = bundles::same_trust(&previous, &snapshot);
        if !proxies_only || !changed.is_empty() {
            self.mark_served(generation, &snapshot.proxies, &changed);
            snapshot.changed = Changed::after(
                &previous,
                proxies_only.then(|| changed.into_iter().collect()),
            );
            self.publisher.send(snapshot);
        }
    }

    /// The claim rule a snapshot carries for a dataplane: every filed dataplane has one (a contradicting
    /// token is refused at once, connected or not); a token-registered one only while the registering
    /// proxy is connected.
    pub(super) fn claim_rule_of(
        &self,
        key: &ProxyKey,
        described: &Result<DataplaneInfo, ClaimMismatch>,
    ) -> Option<Arc<ClaimRule>> {
        match described {
            Ok(info) if info.origin == Origin::File || self.proxies.streams.is_connected(key) => {
                Some(Arc::new(info.claim_rule()))
            }
            _ => None,
        }
    }

    /// Hands the gate's events to telemetry and notes whether ACKs must wake the owner.
    pub(super) fn report_gate_events(&mut self) {
        for mesh in self.replacing.take_started() {
            self.telemetry.gate_event(
                mesh.as_str(),
                GateEvent::WaitStarted(RolloutStep::IdentityAck),
            );
        }
        for (mesh, event) in self.gate.take_events() {
            self.telemetry.gate_event(mesh.as_str(), event);
        }
        self.report_step_changes();
        self.agenda.waiting_on_acks = self.gate.pending() || !self.replacing.is_empty();
    }

    /// Tells telemetry which rollout steps began and ended waiting since the last reconcile. Costs
    /// the waits (a few per rollout) per reconcile while a rollout is under way, nothing otherwise; and
    /// once per trust or SAN step that begins, a count of the streams it waits for.
    fn report_step_changes(&mut self) {
        if self.steps_waiting.is_empty()
            && self.replacing.is_empty()
            && self.gate.current_waits().next().is_none()
        {
            return;
        }
        let gate = self
            .gate
            .current_waits()
            .map(|w| ((w.mesh.to_string(), w.step, w.ca.clone()), None));
        let replacing = self.replacing.groups().map(|(mesh, ca, count)| {
            let key = (mesh.to_string(), RolloutStep::IdentityAck, ca.to_owned());
            (key, Some(count))
        });
        let now: BTreeMap<_, Option<usize>> = gate.chain(replacing).collect();
        let began: Vec<_> = now
            .iter()
            .filter(|(key, _)| !self.steps_waiting.contains(*key))
            .collect();
        // A trust or SAN wait counts whom it waits for when asked: once per step that begins.
        let counted = match began.iter().any(|(_, count)| count.is_none()) {
            true => self.gate.waits_now(&self.proxies.streams),
            false => Vec::new(),
        };
        let mut changes = Vec::new();
        for ((mesh, step, ca), count) in began {
            let waiting = count.unwrap_or_else(|| {
                counted
                    .iter()
                    .find(|w| w.step == *step && w.ca == *ca && w.mesh.to_string() == *mesh)
                    .map_or(0, |w| w.waiting_count)
            });
            changes.push((mesh, *step, ca, StepPhase::Began { waiting }));
        }
        for key in &self.steps_waiting {
            if !now.contains_key(key) {
                changes.push((&key.0, key.1, &key.2, StepPhase::Ended));
            }
        }
        for (mesh, step, ca, phase) in changes {
            self.telemetry.rollout_step(&StepChange {
                mesh: mesh.clone(),
                step,
                ca: ca.clone(),
                phase,
            });
        }
        self.steps_waiting = now.into_keys().collect();
    }

    /// The earliest of: a rollout timeout, the ACK timeout of a replaced certificate, and the next
    /// automatic CA rotation step. Any of them makes the next reconcile look at every proxy.
    fn next_global_event(&self) -> Option<SystemTime> {
        let previous_deadline = self
            .replacing
            .proxies()
            .filter_map(|key| self.issued.get(key))
            .map(|i| i.issued_at + self.gate.ack_timeout())
            .min();
        [
            self.gate.next_deadline(),
            previous_deadline,
            self.world.next_rotation_event(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// When the next reconcile is due: the next renewal or the next global event.
    pub fn next_due(&self) -> Option<SystemTime> {
        self.agenda.next_due()
    }
}
