//! Reconciling only what an event touched: the proxies that connected or left, and those due for
//! renewal. A full reconcile looks at every connected proxy; this one costs the event, not the fleet.
//!
//! It applies only while nothing global is in motion (no rollout step waits, no replaced certificate
//! awaits its ACK, the configuration is the one the last full reconcile saw) and only to changes that
//! stay within the proxy: its own entry, claim rule, reason and renewal. A touched proxy that would change
//! anything shared (the trust bundles, a `meshservice:` context, a MeshService's `status.tls`, the zone
//! egress bundle) sends the reconcile to the full path, which computes everything from scratch.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use super::{trusted, Dataplanes, Owner, Scope};
use crate::bundles;
use crate::error::ClaimMismatch;
use crate::plan::DataplaneInfo;
use crate::snapshot::{Changed, ProxyEntry, ProxyHashMap, ProxyKey};
use crate::trust::ServiceKey;

/// How many deferred proxies one turn of the loop serves: a few milliseconds of work, so that issued
/// certificates, ACKs and new streams are taken in between.
const DEFERRED_PER_TURN: usize = 1024;
/// Deferred proxies wait while more certificates than this are being issued: those issued for proxies
/// that wait for them go first, and deciding the quiet ones would only take CPU from them. Two turns'
/// worth keeps the issuance threads fed once the queue runs short.
pub(super) const DEFERRED_WHILE_ISSUING: usize = 2 * DEFERRED_PER_TURN;
/// Deferred proxies also wait while more proxies than this have not ACKed the certificate that replaced
/// their last one: the wave's certificates are still on their way to the proxies that wait for them,
/// and the streams delivering them need the CPU. A proxy that never ACKs stops counting at its
/// `ackTimeout`.
pub(super) const DEFERRED_WHILE_DELIVERING: usize = DEFERRED_PER_TURN;

/// When each served proxy's certificate is renewed, by time and by proxy.
#[derive(Debug, Default)]
pub(super) struct Renewals {
    by_time: BTreeSet<(SystemTime, ProxyKey)>,
    by_proxy: ProxyHashMap<SystemTime>,
}

impl Renewals {
    /// Sets (or, with `None`, clears) when `key` is renewed.
    pub fn set(&mut self, key: &ProxyKey, at: Option<SystemTime>) {
        if self.by_proxy.get(key) == at.as_ref() {
            return;
        }
        if let Some(old) = self.by_proxy.remove(key) {
            self.by_time.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.by_proxy.insert(key.clone(), at);
            self.by_time.insert((at, key.clone()));
        }
    }

    /// The proxies due for renewal at `now`.
    pub fn due(&self, now: SystemTime) -> impl Iterator<Item = ProxyKey> + '_ {
        self.by_time
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, key)| key.clone())
    }

    /// The earliest renewal.
    pub fn next(&self) -> Option<SystemTime> {
        self.by_time.first().map(|(at, _)| *at)
    }
}

impl Owner {
    /// Reconciles only `keys` at `now`, when what changed stays within them; returns false, having
    /// published nothing, when the full reconcile must run instead.
    pub(super) fn reconcile_proxies(&mut self, keys: &BTreeSet<ProxyKey>, now: SystemTime) -> bool {
        if self.egress.is_none() {
            return false;
        }
        let mut dataplanes = std::mem::take(&mut self.last.dataplanes);
        let done = self.try_reconcile_proxies(keys, &mut dataplanes, now);
        self.last.dataplanes = dataplanes;
        if done {
            // Every description the configuration may have changed since was among `keys` (see
            // `Owner::replace_world`): the dataplanes are now described from it.
            self.last.described_from = Some(self.world.resources.clone());
        }
        done
    }

    fn try_reconcile_proxies(
        &mut self,
        keys: &BTreeSet<ProxyKey>,
        dataplanes: &mut Dataplanes,
        now: SystemTime,
    ) -> bool {
        // The keys' descriptions may change.
        self.issuing.new_epoch();
        for key in keys {
            let described = self.proxies.describe(&self.world, key);
            if !self.stays_within(key, dataplanes.get(key), described.as_ref()) {
                return false;
            }
            match described {
                Some(described) => dataplanes.insert(key.clone(), described),
                None => dataplanes.remove(key),
            };
        }
        let generation = self.publisher.generation() + 1;
        let (connected, left): (Vec<ProxyKey>, Vec<ProxyKey>) = keys
            .iter()
            .cloned()
            .partition(|key| self.proxies.streams.is_connected(key));
        let entries = self.serve(connected, dataplanes, now);
        // A certificate that replaced one from another CA or with another SPIFFE ID starts a wait for
        // its ACK (break last): that is a rollout, which the full reconcile tracks.
        if keys
            .iter()
            .any(|key| self.issued.get(key).is_some_and(|i| !i.previous.is_empty()))
        {
            return false;
        }
        for key in &left {
            self.reasons.remove(key);
            self.agenda.renewals.set(key, None);
        }
        for key in keys {
            if !matches!(dataplanes.get(key), Some(Ok(_))) {
                if let Some(issued) = self.issued.remove(key) {
                    self.replacing.update(key, &issued.previous, &[]);
                }
                self.agent_keys.forget(key);
            }
        }
        self.publish_entries(generation, entries, &left, Some((keys, dataplanes)));
        self.last.at = now;
        true
    }

    /// A federated trust domain's bundle changed: plans and publishes the trust the bundles carry, when
    /// the change stays within what federation brings ([`Gate::foreign_change_only`]). No proxy's
    /// certificate, claim rule or `meshservice:` context depends on a foreign authority, so the last
    /// reconcile's stand; the new authorities' trust step waits for the ACKs like any other, holding no
    /// certificate back. Returns false, having published nothing, when the full reconcile must run
    /// instead.
    ///
    /// [`Gate::foreign_change_only`]: crate::gate::Gate::foreign_change_only
    pub(super) fn reconcile_trust(&mut self, now: SystemTime) -> bool {
        if self.egress.is_none() {
            return false;
        }
        let (desired, foreign) =
            trusted::configured_cas(&self.world, &self.federated, &self.egress);
        self.gate.set_foreign(foreign);
        let issued_cas = &self.issued_cas;
        if !self
            .gate
            .foreign_change_only(&desired, |key| issued_cas.contains(key))
        {
            return false;
        }
        self.agenda.trust = false;
        let generation = self.publisher.generation() + 1;
        self.gate.confirm(&self.proxies.streams, now);
        self.last.configured = desired.iter().collect();
        // Nobody here presents a CA the change drops: none is to be kept for a presenter.
        let trust = self.gate.plan_trust(desired, &[], generation, now);
        self.publisher.publish_trust_first(
            generation,
            &self.world,
            &trust,
            &self.last.service_ids,
            &self.federated,
        );
        self.gate.confirm(&self.proxies.streams, now);
        self.report_gate_events();
        self.agenda.next_global = self.next_global_event();
        true
    }

    /// Proxies left for later turns, plus certificates being issued: what the loop has yet to do
    /// beyond the events to come.
    pub fn backlog(&self) -> usize {
        self.agenda.deferred.len() + self.issuing.in_flight()
    }

    /// Whether quiet proxies wait for their turn ([`Owner::serve_deferred`]).
    pub fn has_deferred(&self) -> bool {
        !self.agenda.deferred.is_empty()
    }

    /// Whether the loop should serve deferred proxies now: some wait, the issuance threads have few
    /// certificates left to issue, and few proxies have yet to ACK the certificates just published.
    /// While a wave (the certificates of proxies that wait for them, submitted first) is being issued
    /// and delivered, the quiet proxies keep what they hold; their turn comes as the wave ends, and a
    /// queue that never runs short means the machine is issuing as fast as it can anyway.
    pub fn deferred_due(&self) -> bool {
        self.has_deferred()
            && self.issuing.in_flight() < DEFERRED_WHILE_ISSUING
            && self.replacing.len() < DEFERRED_WHILE_DELIVERING
    }

    /// Serves the next [`DEFERRED_PER_TURN`] proxies the last full reconcile left for later, as it
    /// would have (deciding, issuing where the gate allows, publishing what changed), except those
    /// held for a rollout step of their mesh, which its end decides. Their descriptions are unchanged
    /// since, and a reconcile of the fleet in between replaces this list.
    pub fn serve_deferred(&mut self, now: SystemTime) {
        let started = std::time::Instant::now();
        let take = self.agenda.deferred.len().min(DEFERRED_PER_TURN);
        let mut deferred = std::mem::take(&mut self.agenda.deferred);
        let held = self.held_for_rollout();
        let keys: Vec<ProxyKey> = deferred
            .drain(..take)
            .filter(|key| self.proxies.streams.is_connected(key) && !held(key))
            .collect();
        drop(held);
        self.agenda.deferred = deferred;
        let count = keys.len();
        let dataplanes = std::mem::take(&mut self.last.dataplanes);
        let entries = self.serve(keys, &dataplanes, now);
        self.last.dataplanes = dataplanes;
        let generation = self.publisher.generation() + 1;
        self.publish_entries(generation, entries, &[], None);
        // As after any pass: the gate's events reported, whether ACKs must wake the owner recounted.
        self.report_gate_events();
        self.telemetry
            .reconciled(Scope::Deferred, count, started.elapsed());
    }

    /// Publishes the last snapshot with `entries` replaced, the proxies that `left` removed, with
    /// `rules` the claim rules of its proxies as their descriptions say, and the registrations of the
    /// serving configuration; nothing when none of that changed. Only the changed proxies' streams are
    /// woken, unless the registrations changed.
    pub(super) fn publish_entries(
        &mut self,
        generation: u64,
        entries: Vec<(ProxyKey, ProxyEntry)>,
        left: &[ProxyKey],
        rules: Option<(&BTreeSet<ProxyKey>, &Dataplanes)>,
    ) {
        let mut snapshot = (*self.publisher.last()).clone();
        let mut changed = BTreeSet::new();
        for (key, entry) in entries {
            let differs = match snapshot.proxies.get_mut(&key) {
                Some(slot) => {
                    let old = std::mem::replace(slot, entry);
                    !bundles::same_entry(&old, slot)
                }
                None => {
                    snapshot.proxies.insert(key.clone(), entry);
                    true
                }
            };
            if differs {
                changed.insert(key);
            }
        }
        for key in left {
            if snapshot.proxies.remove(key).is_some() {
                changed.insert(key.clone());
            }
        }
        for key in rules.into_iter().flat_map(|(keys, _)| keys) {
            let Some((_, dataplanes)) = rules else { break };
            let rule = dataplanes
                .get(key)
                .and_then(|described| self.claim_rule_of(key, described));
            let old = match &rule {
                Some(rule) => snapshot.claim_rules.insert(key.clone(), rule.clone()),
                None => snapshot.claim_rules.remove(key),
            };
            if old != rule {
                changed.insert(key.clone());
            }
        }
        let registrations = self.publisher.registrations(&self.world);
        let same_registrations = Arc::ptr_eq(&registrations, &snapshot.registrations);
        if !same_registrations {
            // An SDS stream of a Dataplane an agent now serves must refuse itself: it looks too.
            changed.extend(snapshot.registrations.changed_proxies(&registrations));
        }
        snapshot.registrations = registrations;
        if !changed.is_empty() || !same_registrations {
            self.mark_served(generation, &snapshot.proxies, &changed);
            snapshot.changed = if same_registrations {
                Changed::after(&snapshot, Some(changed.into_iter().collect()))
            } else {
                Changed::with_registrations(&snapshot, changed.into_iter().collect())
            };
            snapshot.generation = generation;
            self.publisher.send(snapshot);
        }
    }

    /// Whether publishing `key`'s entry alone gives what a full reconcile would, its description
    /// unchanged (see [`Owner::stays_within`]).
    pub(super) fn stays_within_now(&self, key: &ProxyKey) -> bool {
        let described = self.last.dataplanes.get(key);
        self.egress.is_some() && self.stays_within(key, described, described)
    }

    /// Whether reconciling `key` alone gives what a full reconcile would: it is no zone egress (the
    /// egress bundle follows every egress), every CA it may present is configured (so the bundles do not
    /// depend on it), and every local MeshService that selects it, before or after, already lists what
    /// it gives and presents, and would list the same without it (so no `meshservice:` context and no
    /// `status.tls` changes).
    fn stays_within<'a>(
        &self,
        key: &ProxyKey,
        before: Option<&'a Result<DataplaneInfo, ClaimMismatch>>,
        after: Option<&'a Result<DataplaneInfo, ClaimMismatch>>,
    ) -> bool {
        if self.proxies.is_zone_egress(key) {
            return false;
        }
        // What it presents while connected, whether it just connected or just left.
        let mut presented: Vec<&str> = Vec::new();
        if let Some(issued) = self.issued.get(key) {
            let cas = std::iter::once(&issued.ca_trust)
                .chain(issued.previous.iter().map(|p| &p.ca_trust));
            if !cas.into_iter().all(|ca| self.last.configured.contains(ca)) {
                return false;
            }
            presented.push(&issued.published.spiffe_id);
            presented.extend(issued.previous.iter().map(|p| p.spiffe_id.as_str()));
        }
        let info = |described: Option<&'a Result<DataplaneInfo, ClaimMismatch>>| {
            described.and_then(|d| d.as_ref().ok())
        };
        let (before, after) = (info(before), info(after));
        let mesh = self.world.meshes.get(&*key.mesh);
        let mtls_on = mesh.is_some_and(|m| m.mtls_on());
        let local = self
            .world
            .resources
            .mesh_services
            .iter()
            .filter(|s| *s.mesh == *key.mesh && s.zone().is_none_or(|z| z == self.config.zone));
        for service in local {
            let Some(selector) = &service.dataplane_tags else {
                continue;
            };
            let selects =
                |info: Option<&DataplaneInfo>| info.is_some_and(|i| i.has_inbound_with(selector));
            if !selects(before) && !selects(after) {
                continue;
            }
            // A changed description (a returning proxy's token with other tags) may drop identities of
            // the service; a new one only adds, which the checks below see.
            if before.is_some() && before != after {
                return false;
            }
            let Some(dp) = after else { continue };
            let service_key = ServiceKey::new(service.mesh.as_str(), service.name.clone());
            if mtls_on && !self.publisher.tls_ready().contains(&service_key) {
                return false;
            }
            let Some(listed) = self.last.service_ids.get(&service_key) else {
                return false;
            };
            let given = self.identities().given_ids(mesh, dp, selector);
            // What it gives must be listed already; what it presents must be listed, and stay listed
            // without it (it gives that too), since it may be leaving.
            if !given.is_subset(listed) || !presented.iter().all(|id| given.contains(*id)) {
                return false;
            }
        }
        true
    }
}
