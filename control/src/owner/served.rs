//! Issuance decisions: what each connected proxy is served this reconcile (the [`Served`]
//! decision: its identity, whether the gate holds its new certificate back, whether one is issued
//! now), which certificates go to the issuance threads and in what order, and which proxies a full
//! reconcile leaves for later turns.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use super::{Dataplanes, Owner, ISSUE_RETRY};
use crate::plan::{DataplaneInfo, Decision, Desired};
use crate::snapshot::{KeyHasher, LeafKey, ProxyEntry, ProxyKey};

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
    pub(super) fn split_quiet(
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

    /// One connected proxy: its decided identity, whether the gate holds it back, and whether it needs a
    /// certificate issued now.
    pub(super) fn plan_proxy(
        &self,
        key: &ProxyKey,
        info: &DataplaneInfo,
        now: SystemTime,
    ) -> Served {
        let identities = self.identities();
        let mut desired = match identities.decide(key, info) {
            Decision::NoIdentity(reason) => {
                return Served::Entry(ProxyEntry::NoIdentity { reason })
            }
            Decision::Refused(reason) => return Served::Entry(ProxyEntry::Refused { reason }),
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
            || !identities.may_present_id(key, info, &desired.spiffe_id.to_string());
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
}
