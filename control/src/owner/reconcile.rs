//! One reconcile: bring every connected proxy's certificate up to date, in the order the rollout gate
//! allows, and publish what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::{trusted, Dataplanes, Issued, Owner, Scope};
use crate::bundles;
use crate::egress::{self, MeshChoice};
use crate::error::ClaimMismatch;
use crate::gate::{GateEvent, RolloutStep, StepChange, StepPhase, Wait, WaitsOver};
use crate::plan::{DataplaneInfo, Origin};
use crate::resource_name::Target;
use crate::snapshot::{Changed, ClaimRule, ProxyEntry, ProxyKey, ProxyMap};
use crate::timefmt::{rfc3339, seconds_until};
use crate::trust::{BundleKey, CaTrust, ServiceIds};

/// How many proxies a wait names (the count says how many there are).
const NAMED_WAITERS: usize = 20;

/// What the next snapshot's bundles and `meshservice:` contexts carry, and its generation.
struct Carried {
    generation: u64,
    trust: BTreeMap<BundleKey, Vec<CaTrust>>,
    service_ids: ServiceIds,
}

impl Owner {
    /// Brings every connected proxy's certificate up to date at `now`, in the order the rollout gate
    /// allows, then publishes a snapshot if its content changed.
    ///
    /// The work is the event's, not the fleet's: while no rollout is under way and the configuration
    /// is unchanged, only the proxies that connected or left since the last reconcile, and those whose
    /// renewal is due, are looked at ([`Owner::reconcile_proxies`]); a federated bundle that changed
    /// costs its bundles ([`Owner::reconcile_trust`]); ACKs cost the waits they may end
    /// ([`Owner::reconcile_acks`]). Everything else (a new configuration, a rollout step, a timeout, a
    /// change that reaches beyond the proxy) reconciles every connected proxy.
    ///
    /// Returns the earliest time something is due: a renewal, a rollout timeout or a CA rotation step.
    pub fn reconcile(&mut self, now: SystemTime) -> Option<SystemTime> {
        let started = Instant::now();
        let global_due = self.agenda.global_due(now);
        let keys = self.agenda.take_keys(now);
        if !(self.agenda.full || global_due) && self.reconcile_events(&keys, now, started) {
            return self.next_due();
        }
        self.agenda.full = false;
        self.agenda.trust = false;
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

    /// The events since the last reconcile, each at its own cost: a federated bundle change, the
    /// proxies in `keys` (connected, left, due for renewal), ACKs while something waits on them.
    /// Returns false when the full reconcile must run instead (it handles them all).
    fn reconcile_events(
        &mut self,
        keys: &BTreeSet<ProxyKey>,
        now: SystemTime,
        started: Instant,
    ) -> bool {
        // A wait that begins in this turn has no ACKs yet.
        let acks = self.agenda.waiting_on_acks;
        if self.agenda.trust {
            if self.agenda.rollout || !self.reconcile_trust(now) {
                return false;
            }
            self.telemetry
                .reconciled(Scope::Trust, 0, started.elapsed());
        }
        if !keys.is_empty() {
            let started = Instant::now();
            if self.agenda.rollout || !self.reconcile_proxies(keys, now) {
                return false;
            }
            self.telemetry
                .reconciled(Scope::Proxies, keys.len(), started.elapsed());
        }
        if acks {
            let started = Instant::now();
            if !self.reconcile_acks(now) {
                return false;
            }
            self.telemetry.reconciled(Scope::Acks, 0, started.elapsed());
        }
        true
    }

    /// Reconciles every connected proxy (deciding now those [`Owner::split_quiet`] says); `touched`
    /// connected or left since the last reconcile. Returns when it is next due, and how many proxies it
    /// decided.
    ///
    /// Trust, then identities, then issuance, then one snapshot: what the bundles and contexts must
    /// carry goes out first, and every certificate decided after it is one the gate lets through.
    fn reconcile_all(
        &mut self,
        touched: &BTreeSet<ProxyKey>,
        now: SystemTime,
    ) -> (Option<SystemTime>, usize) {
        // Descriptions, the gate's plans and (before this call) the world may change from here on.
        self.issuing.new_epoch();
        // While the files that describe dataplanes are unchanged, only the touched proxies'
        // descriptions and claim rules can have changed.
        let only_touched = self
            .last
            .descriptions_current(&self.world)
            .then_some(touched);
        let dataplanes = self.refresh_dataplanes(touched);
        self.plan_egress();
        let Carried {
            generation,
            trust,
            service_ids,
        } = self.plan_carried(&dataplanes, now);
        let (entries, deferred, decided) =
            self.serve_connected(touched, only_touched, &dataplanes, now);
        self.forget_vanished(&dataplanes, only_touched);
        self.publisher
            .update_service_tls(&self.world, &dataplanes, &self.issued, &trust);
        self.publish_snapshot(
            generation,
            &trust,
            entries,
            &service_ids,
            &dataplanes,
            only_touched,
        );
        self.agenda.deferred = deferred;
        self.report_gate_events();
        self.last.at = now;
        self.last.dataplanes = dataplanes;
        self.last.service_ids = service_ids;
        self.agenda.next_global = self.next_global_event();
        (self.next_due(), decided)
    }

    /// Trust and identities: what each bundle and `meshservice:` context of the next snapshot
    /// carries, as the gate orders it, published ahead of any certificate when it changed, and the
    /// gate's waits confirmed against it.
    fn plan_carried(&mut self, dataplanes: &Dataplanes, now: SystemTime) -> Carried {
        let generation = self.publisher.generation() + 1;
        self.gate.begin();
        self.gate.confirm(&self.proxies.streams, now);
        self.settle_previous(now, true);
        let trust = self.plan_trust(generation, now);
        // SANs before identity: the contexts of this snapshot carry every ID decided now, and the gate
        // tracks when each entered them. (Issuing adds no ID: it presents decided ones.)
        let (service_ids, presented_ids) = self.identities().service_identities(dataplanes);
        self.last.presented_ids = presented_ids;
        self.gate.plan_sans(&service_ids, generation, now);
        // New trust goes out before the pass over every proxy, which only adds certificates the gate
        // lets through once that trust is ACKed.
        let generation = if self.publisher.publish_trust_first(
            generation,
            &self.world,
            &trust,
            &service_ids,
            &self.federated,
        ) {
            generation + 1
        } else {
            generation
        };
        // A CA or an ID that no connected stream must carry may be used at once. (No stream has ACKed
        // what was just published: its ACKs are read between turns.)
        self.gate.confirm(&self.proxies.streams, now);
        Carried {
            generation,
            trust,
            service_ids,
        }
    }

    /// Issuance: decides and serves the connected proxies [`Owner::split_quiet`] picks (`only_touched`:
    /// only `touched` can have changed descriptions), and forgets the renewals of those that left.
    /// Returns their entries, the proxies left for later turns, and how many were decided.
    fn serve_connected(
        &mut self,
        touched: &BTreeSet<ProxyKey>,
        only_touched: Option<&BTreeSet<ProxyKey>>,
        dataplanes: &Dataplanes,
        now: SystemTime,
    ) -> (Vec<(ProxyKey, ProxyEntry)>, Vec<ProxyKey>, usize) {
        self.reasons.clear();
        let connected: Vec<ProxyKey> = self.proxies.streams.proxies().cloned().collect();
        let (now_keys, deferred) = self.split_quiet(connected, only_touched);
        let decided = now_keys.len();
        let entries = self.serve(now_keys, dataplanes, now);
        // Every proxy that left since the last reconcile is touched.
        for key in touched
            .iter()
            .filter(|k| !self.proxies.streams.is_connected(k))
        {
            self.agenda.renewals.set(key, None);
        }
        (entries, deferred, decided)
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
        match self.gate.waits_over(&self.proxies.streams, now) {
            WaitsOver::Holding => return false,
            // A federated authority's trust step ended: confirming it changes what the status and
            // the peers are told, and no proxy's certificate.
            WaitsOver::Foreign => {
                self.gate.confirm(&self.proxies.streams, now);
                self.agenda.next_global = self.next_global_event();
            }
            WaitsOver::None => {}
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
        let presenting = trusted::Presenting {
            issued: &self.issued,
            streams: &self.proxies.streams,
        };
        let retained: Vec<CaTrust> = presenting
            .newcomers_meshes()
            .iter()
            .flat_map(|mesh| self.gate.retained_in(mesh).cloned().collect::<Vec<_>>())
            .collect();
        let presented = presenting.presented(&retained);
        let (desired, foreign) =
            trusted::configured_cas(&self.world, &self.federated, &self.egress);
        self.last.configured = desired.iter().collect();
        self.gate.set_foreign(foreign);
        self.gate.plan_trust(desired, &presented, generation, now)
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
            self.issued_cas = self
                .issued
                .values()
                .flat_map(|issued| issued.presentable_cas())
                .map(CaTrust::key)
                .collect();
            return;
        };
        for key in only.iter().filter(|k| !described(k)) {
            if let Some(issued) = self.issued.remove(key) {
                self.replacing.update(key, &issued.previous, &[]);
            }
            self.agent_keys.forget(key);
        }
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
        let mut snapshot = self.publisher.build(
            generation,
            &self.world,
            trust,
            proxies,
            service_ids,
            &self.federated,
        );
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
        self.agenda.rollout = self.gate.holds_issuance() || !self.replacing.is_empty();
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
        let mut changes = Vec::new();
        for ((mesh, step, ca), count) in began {
            let waiting = count.unwrap_or_else(|| {
                self.gate
                    .waiting_count(&self.proxies.streams, mesh, *step, ca)
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
    pub(super) fn next_global_event(&self) -> Option<SystemTime> {
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
