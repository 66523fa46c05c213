//! Issuing a proxy's certificate: when one is needed, and how it is made, checked and kept.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use meshca_ca::{IssueError, SignedLeaf, Svid};
use tokio::sync::mpsc;

use super::served::Served;
use super::{Issued, IssuedIdentity, Leaf, Owner, Previous};
use crate::error::IssueFailure;
use crate::keys_ahead::KeysAhead;
use crate::plan::{self, Desired};
use crate::pool::{Background, Priority};
use crate::snapshot::{
    LeafKey, ProxyEntry, ProxyHashMap, ProxyIdentity, ProxyKey, ProxyMap, SecretPem,
};
use crate::standalone::{issue_verified, issue_verified_for_key};
use crate::trust::{BundleKey, CaId, CaTrust};

use super::ISSUE_RETRY;

/// One certificate to issue, for one proxy.
#[derive(Debug)]
pub struct Job {
    key: ProxyKey,
    ticket: u64,
    desired: Arc<Desired>,
    now: SystemTime,
}

/// A job's outcome, on its way back to the owner ([`Owner::on_issued`]).
#[derive(Debug)]
pub struct Completed {
    key: ProxyKey,
    ticket: u64,
    result: Result<Made, IssueFailure>,
    took: Duration,
}

/// A certificate a job made.
#[derive(Debug)]
enum Made {
    /// With a key meshca made and serves.
    Held(Svid),
    /// Over the key a `meshca agent` holds (the job's [`Desired::agent_key`]).
    ForAgent(SignedLeaf, Arc<meshca_ca::PublicKey>),
}

/// Issues a job's certificate and runs the check before publishing. A panic is an issuance failure
/// like any other: the proxy is tried again later instead of waiting forever.
pub fn run_job(job: &Job) -> Completed {
    run_job_with(job, None)
}

/// [`run_job`], with a key generated ahead when `keys` has one of the job's algorithm.
pub(super) fn run_job_with(job: &Job, keys: Option<&KeysAhead>) -> Completed {
    let started = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| match &job.desired.agent_key {
        Some(key) => issue_verified_for_key(&job.desired, key, job.now)
            .map(|leaf| Made::ForAgent(leaf, key.clone())),
        None => {
            let ahead = keys.and_then(|k| k.take(job.desired.key_algorithm));
            issue_verified(&job.desired, ahead, job.now).map(Made::Held)
        }
    }))
    .unwrap_or_else(|_| {
        Err(IssueFailure::Internal(
            "issuing the certificate panicked".into(),
        ))
    });
    Completed {
        key: job.key.clone(),
        ticket: job.ticket,
        result,
        took: started.elapsed(),
    }
}

/// Where the owner's certificates are issued.
#[derive(Debug)]
enum Runner {
    /// On the issuance threads, while the owner's loop goes on; results arrive on the channel
    /// [`Owner::issue_in_background`] returned.
    Background(Background<Job>),
    /// Kept until someone takes them ([`Owner::take_jobs`]) and hands back their results, in any order.
    Held(Vec<(Job, Priority)>),
}

/// A job whose result the owner waits for.
#[derive(Debug)]
struct InFlight {
    /// Only the newest job of a proxy counts: an older one's late result is dropped.
    ticket: u64,
    desired: Arc<Desired>,
    /// The [`Issuing::epoch`] it was decided in.
    epoch: u64,
}

/// The owner's side of issuance: what is being issued, and where.
#[derive(Debug)]
pub(super) struct Issuing {
    runner: Runner,
    next_ticket: u64,
    in_flight: ProxyHashMap<InFlight>,
    /// When the first job of the wave under way was submitted.
    wave_started: Option<Instant>,
    /// Counts the changes to what decisions read besides the proxy's own certificate (the world, the
    /// settings, the descriptions, the gate's plans): a result decided in the current epoch, for a
    /// proxy untouched since, is still wanted without deciding the proxy again.
    epoch: u64,
}

impl Default for Issuing {
    fn default() -> Issuing {
        Issuing {
            runner: Runner::Held(Vec::new()),
            next_ticket: 0,
            in_flight: ProxyHashMap::default(),
            wave_started: None,
            epoch: 0,
        }
    }
}

impl Issuing {
    /// Whether a certificate is being issued for `key`.
    pub fn is_issuing(&self, key: &ProxyKey) -> bool {
        self.in_flight.contains_key(key)
    }

    /// How many certificates are being issued (submitted, and not taken in yet).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Notes that what decisions read may change from now on: results of jobs decided before are
    /// checked against a new decision when they arrive.
    pub fn new_epoch(&mut self) {
        self.epoch += 1;
    }
}

/// Whether two decisions ask for the same certificate (over the same agent-held key, if any).
fn same_certificate(a: &Desired, b: &Desired) -> bool {
    a.ca.id() == b.ca.id()
        && a.spiffe_id == b.spiffe_id
        && a.identity_name == b.identity_name
        && a.key_algorithm == b.key_algorithm
        && a.agent_key == b.agent_key
}

impl Owner {
    /// From now on, certificates are issued on `issuance.workers` threads while the caller goes on;
    /// their results arrive, in chunks as they complete, on the returned channel, for
    /// [`Owner::on_issued`]. Until this is called, jobs are held for [`Owner::take_jobs`].
    pub fn issue_in_background(&mut self) -> mpsc::UnboundedReceiver<Vec<Completed>> {
        let (done, results) = mpsc::unbounded_channel();
        let keys = KeysAhead::new(self.config.key_algorithm, self.config.keys_ahead).map(Arc::new);
        let filled = keys.clone();
        let pool = Background::start(
            self.config.workers,
            move |job: Job| run_job_with(&job, keys.as_deref()),
            move || filled.as_ref().is_some_and(|k| k.fill_one()),
            done,
        );
        match std::mem::replace(&mut self.issuing.runner, Runner::Background(pool)) {
            Runner::Held(held) => {
                if let Runner::Background(pool) = &self.issuing.runner {
                    pool.submit(held);
                }
            }
            // The old threads' results are lost with their channel: decide every proxy anew.
            Runner::Background(_) => {
                self.issuing.in_flight.clear();
                self.agenda.full = true;
            }
        }
        results
    }

    /// The jobs held since the last call (none once issuance runs in the background), urgent ones
    /// first. Their results go to [`Owner::on_issued`], in any order.
    pub fn take_jobs(&mut self) -> Vec<Job> {
        match &mut self.issuing.runner {
            Runner::Held(held) => {
                let mut jobs = std::mem::take(held);
                jobs.sort_by_key(|(_, priority)| *priority != Priority::Urgent);
                jobs.into_iter().map(|(job, _)| job).collect()
            }
            Runner::Background(_) => Vec::new(),
        }
    }

    /// Whether `key` needs a new certificate to hold `desired`: it has none, its issuer, SPIFFE ID or
    /// MeshIdentity changed, it is due for renewal, or its key must change now (the key moved between
    /// meshca and an agent, or the agent holds no key for it any more).
    pub(super) fn needs_issue(&self, key: &ProxyKey, desired: &Desired, now: SystemTime) -> bool {
        match self.issued.get(key) {
            None => true,
            Some(issued) => {
                issued.ca_id != *desired.ca.id()
                    || issued.leaf.spiffe_id != desired.spiffe_id
                    || issued.identity_name != desired.identity_name
                    || now >= issued.renew_at
                    || now >= issued.leaf.not_after
                    || self.key_replaced_now(key, issued, desired)
            }
        }
    }

    /// Whether `issued`'s key must be replaced before its renewal to hold `desired`: meshca made it
    /// and an agent serves the proxy now (or the reverse), or the agent offered another key saying
    /// that it holds none for `issued`. A newer key offered for the next renewal waits for it.
    fn key_replaced_now(&self, key: &ProxyKey, issued: &Issued, desired: &Desired) -> bool {
        match (&issued.published.key, &desired.agent_key) {
            (LeafKey::Held(_), None) => false,
            (LeafKey::Agent(current), Some(_)) => self.agent_keys.replace_now(key, current),
            (LeafKey::Held(_), Some(_)) | (LeafKey::Agent(_), None) => true,
        }
    }

    /// Starts issuing a certificate for each of `jobs`, except where one for the same certificate is
    /// already being issued. A proxy that has no certificate yet, or whose stream asks for it now,
    /// goes before renewals and proxies that only watch trust bundles.
    pub(super) fn submit(&mut self, jobs: &[(ProxyKey, &Desired)], now: SystemTime) {
        let mut submitted = Vec::new();
        for (key, desired) in jobs {
            let issuing = &mut self.issuing;
            if issuing
                .in_flight
                .get(key)
                .is_some_and(|f| same_certificate(&f.desired, desired))
            {
                continue;
            }
            if let (Some(wanted), Some(issued)) = (&desired.agent_key, self.issued.get(key)) {
                if matches!(&issued.published.key, LeafKey::Agent(current) if current == wanted) {
                    tracing::debug!(proxy = %key, agent = self.agent_keys.agent_of(key).unwrap_or_default(), "issuing over the key of the current certificate: the agent offered no newer one");
                }
            }
            let issuing = &mut self.issuing;
            issuing.next_ticket += 1;
            let desired = Arc::new((*desired).clone());
            issuing.in_flight.insert(
                key.clone(),
                InFlight {
                    ticket: issuing.next_ticket,
                    desired: desired.clone(),
                    epoch: issuing.epoch,
                },
            );
            let priority = if self.waits_for_identity(key) {
                Priority::Urgent
            } else {
                Priority::Later
            };
            let job = Job {
                key: key.clone(),
                ticket: self.issuing.next_ticket,
                desired,
                now,
            };
            submitted.push((job, priority));
        }
        if submitted.is_empty() {
            return;
        }
        self.issuing.wave_started.get_or_insert_with(Instant::now);
        match &mut self.issuing.runner {
            Runner::Background(pool) => pool.submit(submitted),
            Runner::Held(held) => held.extend(submitted),
        }
    }

    /// Whether `key` has no certificate, or one of its streams asks for a name that may mean its
    /// identity (an alias counts, whether or not it names the current one: the answer orders work and
    /// decides nothing, and the stream table keeps it without reading names).
    pub(super) fn waits_for_identity(&self, key: &ProxyKey) -> bool {
        !self.issued.contains_key(key) || self.proxies.streams.may_ask_identity(key)
    }

    /// Takes in certificates issued (or failed) since the last call, in any order, and publishes
    /// them: a result is kept only if it is its proxy's newest job and the proxy still wants that very
    /// certificate and the rollout gate still allows it now (a proxy that disconnected meanwhile gets
    /// it when it returns). Anything else is dropped, and its proxy decided anew. Returns whether a reconcile must follow (a proxy to decide
    /// anew, or a change that reaches beyond the proxies, which the full reconcile publishes).
    pub fn on_issued(&mut self, done: Vec<Completed>, now: SystemTime) -> bool {
        if let Runner::Background(pool) = &self.issuing.runner {
            pool.taken(done.len());
        }
        let generation = self.publisher.generation() + 1;
        let mut kept = Vec::new();
        let mut failed = Vec::new();
        for completed in done {
            let Completed {
                key,
                ticket,
                result,
                took,
            } = completed;
            let in_flight = match self.issuing.in_flight.get(&key) {
                Some(f) if f.ticket == ticket => self.issuing.in_flight.remove(&key),
                // Superseded by a newer job for the proxy.
                _ => None,
            };
            let Some(InFlight { desired, epoch, .. }) = in_flight else {
                continue;
            };
            // Decided in this epoch, and nothing happened to the proxy since: the decision stands.
            // (Within an epoch the rollout gate only opens: its waits end or time out.)
            let decided_now = epoch == self.issuing.epoch
                && !self.agenda.full
                && !self.agenda.touched.contains(&key);
            match result {
                Ok(made) if decided_now || self.still_wanted(&key, &desired, now) => {
                    self.keep(&key, &desired, made, took, now);
                    kept.push(key);
                }
                Ok(_) => {
                    self.agenda.touched.insert(key);
                }
                Err(e) => {
                    self.telemetry.issue_failed(&key.mesh, &desired.issuer);
                    if let IssueFailure::Issue(IssueError::Token(_)) = &e {
                        // Said once, when the token stopped answering; retried until it answers.
                        tracing::debug!(proxy = %key, issuer = %desired.issuer, "certificate not issued: {e}");
                    } else {
                        tracing::error!(proxy = %key, issuer = %desired.issuer, "certificate not issued: {e}");
                    }
                    if let (IssueFailure::Issue(IssueError::KeyAlgorithm { .. }), Some(offered)) =
                        (&e, &desired.agent_key)
                    {
                        // The agent's next request is used instead.
                        self.agent_keys.drop_offer(&key, offered);
                    }
                    // A token that stopped answering is worth saying in the proxy's status; other
                    // failures are in the log line above.
                    let reason = match &e {
                        IssueFailure::Issue(IssueError::Token(token)) => token.to_string(),
                        _ => "issuance failed; see the daemon log".to_owned(),
                    };
                    failed.push((key, reason));
                }
            }
        }
        if self.issuing.in_flight.is_empty() {
            let took = self
                .issuing
                .wave_started
                .take()
                .map(|t| t.elapsed())
                .unwrap_or_default();
            self.log_wave(took);
        }
        self.links.flush();
        if self.agenda.full {
            return true;
        }
        // Only connected proxies are served; the others' certificates wait for their return.
        kept.retain(|key| self.proxies.streams.is_connected(key));
        if !kept.iter().all(|key| self.stays_within_now(key)) {
            self.agenda.full = true;
            return true;
        }
        let mut entries = Vec::with_capacity(kept.len() + failed.len());
        for key in kept {
            let issued = &self.issued[&key];
            if !issued.previous.is_empty() {
                // Break last: the replaced certificate's CA and ID stay until this one is ACKed, or
                // until the ACK timeout, which must wake the loop.
                let deadline = issued.issued_at + self.gate.ack_timeout();
                self.agenda.next_global = Some(
                    self.agenda
                        .next_global
                        .map_or(deadline, |t| t.min(deadline)),
                );
            }
            self.agenda.renewals.set(&key, Some(issued.renew_at));
            self.reasons.remove(&key);
            entries.push((key.clone(), ProxyEntry::Ready(issued.published.clone())));
        }
        for (key, reason) in failed
            .into_iter()
            .filter(|(k, _)| self.proxies.streams.is_connected(k))
        {
            let entry = match self.issued.get(&key) {
                Some(issued) => ProxyEntry::Ready(issued.published.clone()),
                None => {
                    self.reasons.insert(key.clone(), reason.clone());
                    ProxyEntry::NoIdentity { reason }
                }
            };
            self.agenda.renewals.set(&key, Some(now + ISSUE_RETRY));
            entries.push((key, entry));
        }
        self.publish_entries(generation, entries, &[], None);
        // A certificate that replaced one starts (or joins) an identity-ACK wait.
        self.report_gate_events();
        !self.agenda.touched.is_empty()
    }

    /// Whether `key` still wants the certificate of `desired`, and the gate allows it now. A proxy
    /// that disconnected meanwhile keeps it for when it comes back (a proxy that only fetches is
    /// gone again before its certificate is issued).
    fn still_wanted(&self, key: &ProxyKey, desired: &Desired, now: SystemTime) -> bool {
        let Some(Ok(info)) = self.last.dataplanes.get(key) else {
            return false;
        };
        match self.plan_proxy(key, info, now) {
            Served::Decided {
                desired: wanted,
                gated,
                ..
            } => !gated && same_certificate(&wanted, desired),
            Served::Entry(_) | Served::WaitsForKey(_) => false,
        }
    }

    /// Records, for the certificates `proxies` carries for the `changed` keys, that snapshot
    /// `generation` is the first to serve them: an ACK of that generation or a later one is an ACK of
    /// the certificate. Called as the snapshot is published.
    pub(super) fn mark_served<'k>(
        &mut self,
        generation: u64,
        proxies: &ProxyMap<ProxyEntry>,
        changed: impl IntoIterator<Item = &'k ProxyKey>,
    ) {
        for key in changed {
            let Some(ProxyEntry::Ready(served)) = proxies.get(key) else {
                continue;
            };
            if let Some(issued) = self.issued.get_mut(key) {
                if issued.first_served_in.is_none() && Arc::ptr_eq(&issued.published, served) {
                    issued.first_served_in = Some(generation);
                }
            }
        }
    }

    /// What a proxy may still present once `key` holds a new certificate from `ca_trust` for `spiffe_id`
    /// (break last): what its `old` one kept, and the old one itself if it was served and differs; for
    /// a proxy new to this replica, every CA its mesh keeps only for such proxies.
    fn replaced(
        &self,
        key: &ProxyKey,
        old: Option<&Issued>,
        ca_trust: &CaTrust,
        spiffe_id: &str,
    ) -> Vec<Previous> {
        let mut previous = old.map(|o| o.previous.clone()).unwrap_or_default();
        if old.is_none() && self.gate.enabled() {
            // A proxy new to this replica may come from another one (which died, or it was moved),
            // or from before a restart, presenting a certificate from any CA its mesh still trusts.
            // Those the configuration removed stay trusted until it ACKs this one.
            previous.extend(
                self.gate
                    .retained_in(&BundleKey::mesh(key.mesh.clone()))
                    .map(|ca| Previous {
                        ca_trust: ca.clone(),
                        spiffe_id: spiffe_id.to_owned(),
                    }),
            );
        }
        // One never served was never presented: nothing to keep trusted for it.
        if let Some(old) = old.filter(|o| self.gate.enabled() && o.first_served_in.is_some()) {
            let replaced = Previous {
                ca_trust: old.ca_trust.clone(),
                spiffe_id: old.published.spiffe_id.clone(),
            };
            let changes = old.ca_trust != *ca_trust || replaced.spiffe_id != spiffe_id;
            if changes && !previous.contains(&replaced) {
                previous.push(replaced);
            }
        }
        previous
    }

    /// Keeps a certificate issued and checked for `key`, remembering what it replaces (break last).
    fn keep(
        &mut self,
        key: &ProxyKey,
        desired: &Desired,
        made: Made,
        took: Duration,
        now: SystemTime,
    ) {
        let (leaf, leaf_key) = match made {
            Made::Held(svid) => {
                let key_pem = SecretPem::new(svid.key.to_pem().to_string());
                let leaf = SignedLeaf {
                    spiffe_id: svid.spiffe_id,
                    chain_pem: svid.chain_pem,
                    chain_der: svid.chain_der,
                    not_before: svid.not_before,
                    not_after: svid.not_after,
                    serial: svid.serial,
                    issuer_id: svid.issuer_id,
                };
                (leaf, LeafKey::Held(key_pem))
            }
            Made::ForAgent(leaf, certified) => {
                self.agent_keys.certified(key, &certified);
                (leaf, LeafKey::Agent(certified))
            }
        };
        self.telemetry.issued(&key.mesh, &desired.issuer, took);
        *self
            .wave
            .entry((key.mesh.to_string(), desired.issuer.to_string()))
            .or_default() += 1;
        let renew_at = plan::renewal_time(
            leaf.not_before,
            leaf.not_after,
            self.config.renew_at,
            jitter(),
        );
        let old = self.issued.get(key).map(Box::as_ref);
        let regenerations = old.map_or(0, |i| i.regenerations + 1);
        let ca_trust = CaTrust::of_ca(
            desired.trusted_in.clone(),
            leaf.spiffe_id.trust_domain(),
            &desired.ca,
        );
        // Break last: until the proxy ACKs this certificate, peers may still see the one it replaces,
        // from another CA or with another SPIFFE ID, or any it was issued before and has not ACKed.
        let spiffe_id = leaf.spiffe_id.to_string();
        // What the owner keeps is copied on its own thread: memory allocated on an issuance thread and
        // kept for the certificate's life would pin pages of that thread's allocator arena among the
        // wave's freed memory, which could then not be given back (measured with glibc's malloc: about
        // 2 KB more per idle stream at 10,000).
        let chain_pem = leaf.chain_pem.clone();
        let serial = leaf.serial.clone();
        let leaf_id = desired.spiffe_id.clone();
        let not_after = leaf.not_after;
        let previous = self.replaced(key, old, &ca_trust, &spiffe_id);
        self.replacing
            .update(key, old.map_or(&[][..], |o| &o.previous), &previous);
        let published = Arc::new(ProxyIdentity {
            spiffe_id,
            identity_name: desired.identity_name.clone(),
            chain_pem,
            key: leaf_key,
        });
        tracing::debug!(proxy = %key, spiffe_id = %leaf_id, issuer = %desired.issuer, serial = %serial, "issued certificate");
        self.signed.signed(desired.ca.id(), not_after);
        self.links.record(|| IssuedIdentity {
            key: key.clone(),
            issuer: desired.issuer.to_string(),
            ca_id: desired.ca.id().to_owned(),
            chain_pem: published.chain_pem.clone(),
            key_pem: published.key.held().cloned(),
            not_after,
        });
        self.issued_cas.insert(ca_trust.key());
        // A proxy new to this replica may present what its mesh keeps for such proxies.
        self.issued_cas
            .extend(previous.iter().map(|p| p.ca_trust.key()));
        self.issued.insert(
            key.clone(),
            Box::new(Issued {
                leaf: Leaf {
                    spiffe_id: leaf_id,
                    not_after,
                    serial,
                },
                issuer: desired.issuer.clone(),
                ca_id: CaId::new(desired.ca.id()),
                identity_name: desired.identity_name.clone(),
                renew_at,
                regenerations,
                published,
                ca_trust,
                previous,
                first_served_in: None,
                issued_at: now,
            }),
        );
    }
}

impl Owner {
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
}

/// A uniform number in `[0, 1)` from the system's secure random source (0.5 if it fails: the jitter
/// only spreads renewals).
fn jitter() -> f64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}
