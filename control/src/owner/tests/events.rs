//! Per-event work: a proxy connecting, leaving or coming due for renewal reconciles that proxy alone;
//! a reload that changes nothing is no event; anything that reaches beyond the touched proxies (a new
//! configuration, a rollout, a new identity for a MeshService context) reconciles every proxy.

use std::sync::Mutex;

use super::*;
use crate::owner::Scope;

/// Telemetry that keeps the scope and size of every reconcile.
#[derive(Debug, Default)]
struct Scopes(Mutex<Vec<(Scope, usize)>>);

impl Telemetry for Scopes {
    fn reconciled(&self, scope: Scope, proxies: usize, _took: Duration) {
        self.0.lock().expect("not poisoned").push((scope, proxies));
    }
}

impl Scopes {
    /// The reconciles since the last call.
    fn take(&self) -> Vec<(Scope, usize)> {
        std::mem::take(&mut *self.0.lock().expect("not poisoned"))
    }
}

/// `count` proxies of service `web`, connected, served once by a full reconcile, and ACKed.
fn fleet(yaml: &str, count: u64) -> (Harness, Arc<Scopes>) {
    let scopes = Arc::new(Scopes::default());
    let mut h = Harness::with_telemetry(yaml, scopes.clone());
    for i in 0..count {
        h.connect(&format!("web-{i}"), &[], &[("kuma.io/service", "web")]);
    }
    h.reconcile(t0());
    let generation = h.snapshots.borrow().generation;
    for id in 1..=count {
        h.ack(id, Some(generation));
    }
    assert_eq!(scopes.take(), vec![(Scope::Full, count as usize)]);
    (h, scopes)
}

/// Every served identity, by proxy name.
fn identities(h: &Harness) -> BTreeMap<String, Arc<ProxyIdentity>> {
    let snapshot = h.snapshots.borrow().clone();
    snapshot
        .proxies
        .iter()
        .filter_map(|(key, entry)| match entry {
            ProxyEntry::Ready(identity) => Some((key.name.to_string(), identity.clone())),
            _ => None,
        })
        .collect()
}

/// Whether `b` serves the same identity objects as `a` for every proxy of `a` (nothing re-issued).
fn unchanged(
    a: &BTreeMap<String, Arc<ProxyIdentity>>,
    b: &BTreeMap<String, Arc<ProxyIdentity>>,
) -> bool {
    a.iter()
        .all(|(name, id)| b.get(name).is_some_and(|other| Arc::ptr_eq(id, other)))
}

#[test]
fn a_reload_that_changes_nothing_issues_nothing_and_publishes_nothing() {
    let (mut h, scopes) = fleet(LEGACY, 5);
    let before = h.snapshots.borrow().clone();
    h.update(LEGACY).expect("the same resources are valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let after = h.snapshots.borrow().clone();
    assert!(Arc::ptr_eq(&before, &after), "a snapshot was published");
    assert!(scopes.take().is_empty(), "something was reconciled");
    // A real change still is one. (ca-2 waits for its bundle's ACKs: the proxies keep their
    // certificates, and are decided when the wait ends.)
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Full, 0)]);
}

#[test]
fn a_connecting_proxy_is_reconciled_alone() {
    let (mut h, scopes) = fleet(LEGACY, 20);
    let before = identities(&h);
    let generation = h.snapshots.borrow().generation;
    h.connect("late", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    assert_eq!(h.ready("late").spiffe_id, "spiffe://default/web");
    let after = identities(&h);
    assert!(unchanged(&before, &after), "another proxy was re-issued");
    assert_eq!(after.len(), 21);
    let snapshot = h.snapshots.borrow().clone();
    // Two snapshots: late registered, waiting for its certificate; then late with its certificate.
    assert_eq!(snapshot.generation, generation + 2);
    // SDS is told that only late changed, so that it wakes late's streams alone.
    assert_eq!(snapshot.changed.since, generation + 1);
    assert_eq!(
        snapshot.changed.proxies.as_deref(),
        Some(&[ProxyKey::new("default", "late")][..])
    );
    // Its claim rule is served with it (a token registered it).
    assert!(h
        .snapshots
        .borrow()
        .claim_rules
        .contains_key(&ProxyKey::new("default", "late")));
    // An ACK while no rollout waits needs no reconcile at all.
    let generation = h.snapshots.borrow().generation;
    assert!(!h.stream(21, &["default"], Some(generation)));
}

#[test]
fn a_leaving_proxy_is_reconciled_alone_and_gets_its_certificate_back() {
    let (mut h, scopes) = fleet(LEGACY, 10);
    let web_3 = h.ready("web-3");
    // web-3 is stream 4.
    assert!(h.disconnect(4));
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    let snapshot = h.snapshots.borrow().clone();
    assert!(!snapshot
        .proxies
        .contains_key(&ProxyKey::new("default", "web-3")));
    assert!(
        !snapshot
            .claim_rules
            .contains_key(&ProxyKey::new("default", "web-3")),
        "a token-registered proxy's rule goes with its last stream"
    );
    assert_eq!(snapshot.proxies.len(), 9);
    // Reconnecting within the certificate's life serves the same certificate.
    h.connect("web-3", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    assert!(Arc::ptr_eq(&h.ready("web-3"), &web_3));
}

#[test]
fn a_due_renewal_reconciles_only_the_proxies_due() {
    let (mut h, scopes) = fleet(LEGACY, 20);
    let before = identities(&h);
    let due = h
        .reconcile(t0() + Duration::from_secs(1))
        .expect("connected proxies have renewal times");
    assert!(scopes.take().is_empty(), "nothing was due yet");
    h.reconcile(due);
    let reconciled = scopes.take();
    let after = identities(&h);
    let changed = h.snapshots.borrow().changed.proxies.clone();
    let renewed: Vec<&String> = before
        .iter()
        .filter(|(name, id)| !Arc::ptr_eq(id, &after[*name]))
        .map(|(name, _)| name)
        .collect();
    assert!(!renewed.is_empty(), "the proxy due was not renewed");
    assert!(renewed.len() < 20, "every proxy was renewed at once");
    assert_eq!(reconciled, vec![(Scope::Proxies, renewed.len())]);
    let changed: Vec<&str> = changed
        .as_deref()
        .expect("a renewal changes no bundle")
        .iter()
        .map(|k| &*k.name)
        .collect();
    assert_eq!(changed, renewed);
}

#[test]
fn a_proxy_that_brings_a_new_identity_to_a_service_context_reconciles_everyone() {
    let yaml = format!("{LEGACY}---\n{WEB_SERVICE}");
    let scopes = Arc::new(Scopes::default());
    let mut h = Harness::with_telemetry(&yaml, scopes.clone());
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let generation = h.snapshots.borrow().generation;
    h.ack(1, Some(generation));
    h.reconcile(t0());
    scopes.take();
    assert_eq!(service_context(&h, "web"), vec!["spiffe://default/web"]);
    // A second replica of web changes nothing shared: it is reconciled alone.
    h.connect("web-2", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    // A token whose inbound the MeshService also selects, with a ServiceTag of its own, adds an
    // identity to the `meshservice:web` context: that takes the full reconcile (SANs before identity).
    let yaml = yaml.replace(
        "selector: {dataplaneTags: {kuma.io/service: web}}",
        "selector: {dataplaneTags: {tier: front}}",
    );
    h.update(&yaml).expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    scopes.take();
    h.connect(
        "front-1",
        &[],
        &[("kuma.io/service", "front"), ("tier", "front")],
    );
    h.reconcile(t0() + Duration::from_secs(3));
    // It decides front-1 and web-1, whose stream asks for its identity; web-2, which subscribes to
    // nothing yet, is left to a deferred turn after it.
    assert_eq!(scopes.take().first(), Some(&(Scope::Full, 2)));
    assert!(
        service_context(&h, "web").contains(&"spiffe://default/front".to_owned()),
        "{:?}",
        service_context(&h, "web")
    );
}

#[test]
fn while_a_rollout_waits_every_event_reconciles_everyone() {
    let (mut h, scopes) = fleet(LEGACY, 3);
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    // The proxies keep their certificates while ca-2 waits: none is decided, or left for later turns.
    assert_eq!(scopes.take(), vec![(Scope::Full, 0)]);
    assert!(!h.owner.has_deferred());
    // ca-2 joined the bundle: every stream must look.
    assert!(h.snapshots.borrow().changed.proxies.is_none());
    // Nobody has ACKed ca-2's bundle: the gate waits, and a new proxy is part of the rollout (the
    // full reconcile, which decides the newcomer).
    h.connect("late", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Full, 1)]);
}

#[test]
fn acks_during_a_rollout_are_recounted_without_reconciling_everyone() {
    let (mut h, scopes) = fleet(LEGACY, 4);
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Full, 0)]);
    let bundle = h.snapshots.borrow().generation;
    let waiting = |h: &Harness| {
        h.status()
            .rollout
            .iter()
            .find(|w| w.step == RolloutStep::TrustBeforeIdentity)
            .map(|w| w.waiting_count)
    };
    assert_eq!(waiting(&h), Some(4));
    // Three of four ACK ca-2's bundle: the gate recounts, nobody is reconciled, the status follows.
    for id in 1..=3 {
        assert!(h.stream(id, &["default", "system_trust_bundle"], Some(bundle)));
        h.reconcile(t0() + Duration::from_secs(2));
    }
    assert_eq!(scopes.take(), vec![(Scope::Acks, 0); 3]);
    assert_eq!(waiting(&h), Some(1));
    let issuers = |h: &Harness| h.status().meshes[0].proxies_by_issuer.clone();
    assert_eq!(
        issuers(&h),
        BTreeMap::from([("backend ca-1".to_owned(), 4)]),
        "nothing is issued from ca-2 before every stream ACKed it"
    );
    // The last ACK ends the wait: everyone is reconciled and issued from ca-2.
    h.ack(4, Some(bundle));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(scopes.take(), vec![(Scope::Full, 4)]);
    let issued = h.snapshots.borrow().generation;
    assert_eq!(waiting(&h), None);
    assert_eq!(
        issuers(&h),
        BTreeMap::from([("backend ca-2".to_owned(), 4)])
    );
    // Their ACKs of the ca-2 certificates settle the replaced ones without a full reconcile: ca-1 stays
    // configured (secondary) and the SPIFFE IDs are the same, so nothing published changes.
    for id in 1..=4 {
        h.ack(id, Some(issued));
    }
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(scopes.take(), vec![(Scope::Acks, 0)]);
    assert!(h.status().rollout.is_empty(), "{:?}", h.status().rollout);
    // Nothing waits any more: an ACK needs no reconcile at all.
    assert!(!h.stream(1, &["default", "system_trust_bundle"], Some(issued)));
}

#[test]
fn dataplanes_are_described_again_only_when_their_files_change() {
    let yaml = format!("{LEGACY}---\n{WEB_SERVICE}");
    let mut h = Harness::new(&yaml);
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let web_1 = ProxyKey::new("default", "web-1");
    let rule = |h: &Harness| h.snapshots.borrow().claim_rules[&web_1].clone();
    let before = rule(&h);
    // An edit of the Mesh alone describes nobody again: the same rule is served.
    let switched = format!("{SWITCHED}---\n{WEB_SERVICE}");
    h.update(&switched).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert!(Arc::ptr_eq(&before, &rule(&h)));
    // An edit of the Dataplane file does.
    let relabelled = switched.replace("labels: {app: web,", "labels: {app: web, tier: front,");
    h.update(&relabelled).expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(
        rule(&h).labels.get("tier").map(String::as_str),
        Some("front")
    );
}

#[test]
fn a_renewal_the_gate_holds_back_does_not_make_the_loop_spin() {
    let scopes = Arc::new(Scopes::default());
    let mut h = Harness::with_telemetry(LEGACY, scopes.clone());
    // A rollout that waits longer than the certificates take to come due.
    let day = Duration::from_secs(24 * 3600);
    h.owner.config.ack_timeout = day;
    h.owner.gate = crate::gate::Gate::new(true, day);
    for name in ["web-1", "web-2"] {
        h.connect(name, &[], &[("kuma.io/service", "web")]);
    }
    h.reconcile(t0());
    let generation = h.snapshots.borrow().generation;
    h.ack(1, Some(generation));
    h.ack(2, Some(generation));
    scopes.take();
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    // Their renewals come before the wait times out: they are decided now (and held back), not left
    // to the end of the wait.
    assert_eq!(scopes.take(), vec![(Scope::Full, 2)]);
    // Both are due for renewal (10 h certificates, renewed at 80%), but only ca-2 may issue and nobody
    // has ACKed its bundle: the next wake-up is the gate's timeout, not a renewal time in the past.
    let later = t0() + Duration::from_secs(9 * 3600);
    let next = h.reconcile(later).expect("the gate's timeout is due");
    assert!(next > later, "the loop would wake at once: {next:?}");
    assert_eq!(scopes.take().last(), Some(&(Scope::Acks, 0)));
    assert_eq!(
        h.status().meshes[0].proxies_by_issuer,
        BTreeMap::from([("backend ca-1".to_owned(), 2)])
    );
}

#[test]
fn a_short_lived_certificate_is_renewed_before_it_expires() {
    // 10 s certificates (NotBefore 10 s back): renewed at 80% of 20 s, minus up to 5% jitter.
    let mut h = Harness::new(&LEGACY.replace("expiration: 10h", "expiration: 10s"));
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    let due = h
        .reconcile(t0())
        .expect("a served proxy has a renewal time");
    assert!(
        due <= t0() + Duration::from_secs(6),
        "renewal at {:?} after issuance, the certificate expires at 10 s",
        due.duration_since(t0())
    );
    let before = h.ready("web-1");
    h.reconcile(due);
    assert!(!Arc::ptr_eq(&before, &h.ready("web-1")), "renewed when due");
}

/// A full reconcile while the certificates of the proxies asking for them are being issued does not
/// decide those proxies again: each result, when it comes back, is checked and published.
#[test]
fn proxies_whose_certificates_are_being_issued_wait_for_the_result() {
    let (mut h, scopes) = fleet(LEGACY, 3);
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let bundle = h.snapshots.borrow().generation;
    for id in 1..=3 {
        h.ack(id, Some(bundle));
    }
    // The wait is over: the loop's reconcile submits their ca-2 certificates.
    h.owner.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Full, 0), (Scope::Full, 3)]);
    // They are being issued when something makes the loop reconcile the fleet.
    h.owner.agenda.full = true;
    h.owner.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        scopes.take(),
        vec![(Scope::Full, 0)],
        "nobody decided again"
    );
    let at = t0() + Duration::from_secs(3);
    assert_eq!(super::issue_held(&mut h, at), 3, "one job each, not two");
    assert_eq!(
        h.status().meshes[0].proxies_by_issuer,
        BTreeMap::from([("backend ca-2".to_owned(), 3)])
    );
}

/// A mesh without mTLS: its proxies hold no identity.
const NO_MTLS: &str = "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n";

/// web-0, asking for its identity, connected at t0 with its first certificate submitted and not yet
/// issued.
fn web_0_being_issued() -> Harness {
    let mut h = Harness::new(LEGACY);
    let stream = h.connect("web-0", &[], &[("kuma.io/service", "web")]);
    h.stream(stream.0, &["default"], None);
    h.owner.reconcile(t0());
    assert!(h
        .owner
        .issuing
        .is_issuing(&ProxyKey::new("default", "web-0")));
    h
}

/// Issues web-0's held certificate, hands it back and reconciles, all at `at`; web-0 must then hold no
/// identity, and the status must count no certificate for it.
fn drop_result_at(h: &mut Harness, at: SystemTime) {
    assert_eq!(super::issue_held(h, at), 1);
    h.reconcile(at);
    assert!(
        matches!(h.entry("web-0"), ProxyEntry::NoIdentity { .. }),
        "{:?}",
        h.entry("web-0")
    );
    assert!(h.status().meshes[0].proxies_by_issuer.is_empty());
}

/// A certificate decided before the configuration changed is decided again when it comes back, even
/// though no reconcile in between looked at its proxy (it was being issued): mTLS turned off, the
/// proxy keeps none.
#[test]
fn a_result_decided_before_a_reconciled_change_is_decided_again() {
    let mut h = web_0_being_issued();
    h.update(NO_MTLS).expect("valid");
    let at = t0() + Duration::from_secs(1);
    h.owner.reconcile(at);
    assert!(
        h.owner
            .issuing
            .is_issuing(&ProxyKey::new("default", "web-0")),
        "the reconcile left web-0 to its result"
    );
    drop_result_at(&mut h, at);
}

/// The same when the result comes back after the change and before the reconcile that follows it.
#[test]
fn a_result_arriving_between_a_change_and_its_reconcile_is_decided_again() {
    let mut h = web_0_being_issued();
    h.update(NO_MTLS).expect("valid");
    let at = t0() + Duration::from_secs(1);
    drop_result_at(&mut h, at);
}

/// The same when the change is the proxy's own, reconciled alone: web-0 comes back with a token whose
/// labels select a SPIRE identity, which meshca does not issue.
#[test]
fn a_result_decided_before_its_proxy_changed_is_decided_again() {
    let yaml = format!(
        "{LEGACY}---\ntype: MeshIdentity\nname: spire\nmesh: default\nspec:\n  selector: {{dataplane: {{matchLabels: {{team: spire}}}}}}\n  provider: {{type: Spire}}\n"
    );
    let (mut h, scopes) = {
        let scopes = Arc::new(Scopes::default());
        (Harness::with_telemetry(&yaml, scopes.clone()), scopes)
    };
    let web_0 = ProxyKey::new("default", "web-0");
    let stream = h.connect("web-0", &[], &[("kuma.io/service", "web")]);
    h.owner.reconcile(t0());
    assert!(h.owner.issuing.is_issuing(&web_0));
    assert!(h.disconnect(stream.0));
    let (stream, _) = h.try_connect("web-0", &[("team", "spire")], &[("kuma.io/service", "web")]);
    h.stream(stream.0, &["default"], None);
    h.owner.reconcile(t0());
    assert_eq!(
        scopes.take().last(),
        Some(&(Scope::Proxies, 1)),
        "web-0 was reconciled alone"
    );
    assert!(h.owner.issuing.is_issuing(&web_0), "its job is still out");
    assert_eq!(super::issue_held(&mut h, t0()), 1);
    h.reconcile(t0());
    assert!(
        h.reason("web-0").contains("SPIRE"),
        "{:?}",
        h.entry("web-0")
    );
}

/// A Dataplane file of proxy `name` with service `service`.
fn dataplane_file(name: &str, service: &str) -> String {
    format!(
        "---\ntype: Dataplane\nmesh: default\nname: {name}\nlabels: {{kuma.io/workload: {service}}}\nnetworking:\n  address: 10.0.0.9\n  inbound:\n    - port: 8080\n      tags: {{kuma.io/service: {service}}}\n"
    )
}

#[test]
fn a_changed_dataplane_file_reconciles_its_proxy_alone() {
    let (mut h, scopes) = fleet(LEGACY, 10);
    let before = identities(&h);
    let late_1 = ProxyKey::new("default", "late-1");
    // A new file: its claim rule is served before its proxy connects, and no other proxy is looked at.
    let generation = h.snapshots.borrow().generation;
    h.update(&format!("{LEGACY}{}", dataplane_file("late-1", "web")))
        .expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    let snapshot = h.snapshots.borrow().clone();
    assert_eq!(snapshot.generation, generation + 1);
    assert_eq!(
        snapshot.changed.proxies.as_deref(),
        Some(&[late_1.clone()][..])
    );
    let rule = snapshot.claim_rules.get(&late_1).expect("the file's rule");
    assert!(
        format!("{rule:?}").contains(r#"labels: {"kuma.io/workload": "web"}"#),
        "{rule:?}"
    );
    assert!(unchanged(&before, &identities(&h)), "a proxy was re-issued");
    // Its proxy is served as the file describes it.
    h.connect(
        "late-1",
        &[("kuma.io/workload", "web")],
        &[("kuma.io/service", "web")],
    );
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    let served = h.ready("late-1");
    assert_eq!(served.spiffe_id, "spiffe://default/web");
    // The file edited where the identity does not depend on it: the same certificate.
    let moved = dataplane_file("late-1", "web").replace("10.0.0.9", "10.0.0.10");
    h.update(&format!("{LEGACY}{moved}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    assert!(Arc::ptr_eq(&h.ready("late-1"), &served));
    // The file edited to another service, which the proxy's token contradicts: its streams are
    // refused, naming the contradiction.
    h.update(&format!("{LEGACY}{}", dataplane_file("late-1", "api")))
        .expect("valid");
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    let snapshot = h.snapshots.borrow().clone();
    match snapshot.proxies.get(&late_1) {
        Some(ProxyEntry::Refused { reason }) => assert!(reason.contains("web"), "{reason}"),
        other => panic!("expected late-1 refused, got {other:?}"),
    }
    assert!(unchanged(&before, &identities(&h)), "a proxy was re-issued");
}

#[test]
fn a_removed_dataplane_file_takes_its_claim_rule_with_it() {
    let (mut h, scopes) = fleet(&format!("{LEGACY}{}", dataplane_file("late-1", "web")), 3);
    let late_1 = ProxyKey::new("default", "late-1");
    assert!(h.snapshots.borrow().claim_rules.contains_key(&late_1));
    h.update(LEGACY).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    assert!(!h.snapshots.borrow().claim_rules.contains_key(&late_1));
}

#[test]
fn a_registration_change_reconciles_its_dataplane_alone_and_publishes_the_registrations() {
    let base = format!("{LEGACY}{}", dataplane_file("batch-1", "batch"));
    let (mut h, scopes) = fleet(&base, 10);
    let before = identities(&h);
    let old = h.snapshots.borrow().registrations.clone();
    let registration = "---\ntype: WorkloadRegistration\nmesh: default\nname: batch\nspec: {dataplane: batch-1, selectors: [unix:uid:1001]}\n";
    h.update(&format!("{base}{registration}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1)]);
    let snapshot = h.snapshots.borrow().clone();
    assert!(!Arc::ptr_eq(&old, &snapshot.registrations));
    assert_eq!(snapshot.registrations.iter().count(), 1);
    // Whom the new table concerns is for each Workload API stream to say: those streams all look, and
    // of the SDS streams only batch-1's (an agent may serve it now).
    assert!(snapshot.changed.registrations);
    assert_eq!(
        snapshot.changed.proxies.as_deref(),
        Some(&[ProxyKey::new("default", "batch-1")][..])
    );
    assert!(snapshot
        .changed
        .proxies_since(snapshot.changed.since)
        .is_none());
    assert!(unchanged(&before, &identities(&h)), "a proxy was re-issued");
    // The same again is no event.
    h.update(&format!("{base}{registration}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    assert!(scopes.take().is_empty());
}

#[test]
fn a_dataplane_change_a_meshservice_sees_reconciles_everyone() {
    let service = "---\ntype: MeshService\nmesh: default\nname: web\nspec:\n  selector: {dataplaneTags: {kuma.io/service: web}}\n  ports: [{port: 8080}]\n";
    let scopes = Arc::new(Scopes::default());
    let base = format!("{LEGACY}{service}{}", dataplane_file("late-1", "web"));
    let mut h = Harness::with_telemetry(&base, scopes.clone());
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    scopes.take();
    // late-1's file now says another service: what the MeshService selects changes.
    h.update(&format!(
        "{LEGACY}{service}{}",
        dataplane_file("late-1", "api")
    ))
    .expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let reconciled = scopes.take();
    assert_eq!(
        reconciled.first().map(|r| r.0),
        Some(Scope::Full),
        "{reconciled:?}"
    );
}

/// A relationship of mesh `default` with `partner.example`, whose initial bundle is `initial`.
fn with_partner(yaml: &str, initial: &std::path::Path) -> String {
    format!(
        "{yaml}\n---\ntype: FederationRelationship\nname: partner\nmesh: default\nspec:\n  trustDomain: partner.example\n  bundleEndpoint: {{url: \"https://bundles.partner.example/\", profile: https_spiffe, spiffeID: \"spiffe://partner.example/server\"}}\n  initialBundle: {{file: {}}}\n",
        initial.display()
    )
}

/// The CAs of `partner.example`: the one its initial bundle (written in `dir`) holds, and the next.
fn partner_cas(dir: &std::path::Path) -> (std::path::PathBuf, Vec<u8>, Vec<u8>) {
    let der =
        |ca: &crate::test_certs::TestCa| ::pem::parse(&ca.cert_pem).expect("PEM").into_contents();
    let initial = crate::test_certs::ca("Partner Initial", t0());
    let next = crate::test_certs::ca("Partner Next", t0());
    let path = dir.join("partner.pem");
    std::fs::write(&path, &initial.cert_pem).expect("written");
    (path, der(&initial), der(&next))
}

/// What the importer holds for `partner.example`: a bundle of the CAs `ders`.
fn partner_bundle(ders: &[&Vec<u8>]) -> meshca_federation::HeldBundles {
    let td: meshca_identity::TrustDomain = "partner.example".parse().expect("a trust domain");
    let authorities = ders
        .iter()
        .map(|der| meshca_federation::X509Authority::from_der((*der).clone(), &td).expect("a CA"))
        .collect();
    let bundle = meshca_federation::SpiffeBundle::new(td.clone(), authorities, Vec::new());
    BTreeMap::from([(td, Arc::new(bundle))])
}

/// The authorities (DER) mesh `default`'s bundle carries for `partner.example`, sorted.
fn partner_anchors(h: &Harness) -> Vec<Vec<u8>> {
    let snapshot = h.snapshots.borrow().clone();
    let trust = snapshot.meshes["default"].trust.by_trust_domain();
    let pems = trust.get("partner.example").into_iter().flatten();
    sorted(
        pems.map(|pem| ::pem::parse(pem).expect("PEM").into_contents())
            .collect(),
    )
}

fn sorted(mut ders: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    ders.sort();
    ders
}

#[test]
fn a_federated_bundle_change_publishes_the_bundles_and_decides_no_proxy() {
    let dir = tempfile::tempdir().expect("a directory");
    let (initial_file, initial, next) = partner_cas(dir.path());
    let (mut h, scopes) = fleet(&with_partner(LEGACY, &initial_file), 20);
    assert_eq!(partner_anchors(&h), std::slice::from_ref(&initial));
    let before = identities(&h);
    let generation = h.snapshots.borrow().generation;

    // The peer adds a CA to its bundle.
    assert!(h.owner.set_federated(&partner_bundle(&[&initial, &next])));
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Trust, 0)]);
    assert!(!h.owner.has_deferred(), "no proxy is left for later turns");
    let snapshot = h.snapshots.borrow().clone();
    assert_eq!(
        snapshot.generation,
        generation + 1,
        "one snapshot: the trust"
    );
    assert_eq!(
        snapshot.changed.proxies, None,
        "every stream carries the bundle"
    );
    assert_eq!(
        partner_anchors(&h),
        sorted(vec![initial.clone(), next.clone()])
    );
    assert!(unchanged(&before, &identities(&h)), "a proxy was re-issued");
    // Its trust step waits for the 20 streams, as the status says ...
    let waits = &h.status().rollout;
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits[0].ca, "CN=Partner Next");
    assert_eq!(waits[0].waiting_count, 20);

    // ... holding no certificate back: a proxy that connects meanwhile is decided alone.
    h.connect("late", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Proxies, 1), (Scope::Acks, 0)]);
    assert_eq!(h.ready("late").spiffe_id, "spiffe://default/web");

    // Once every stream ACKed, the wait ends without a pass over the fleet.
    let generation = h.snapshots.borrow().generation;
    for id in 1..=21 {
        h.ack(id, Some(generation));
    }
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(scopes.take(), vec![(Scope::Acks, 0)]);
    assert!(h.status().rollout.is_empty());
    assert!(unchanged(&before, &identities(&h)), "a proxy was re-issued");

    // The peer drops its old CA: nobody here presents it, so it leaves the bundle at once.
    assert!(h.owner.set_federated(&partner_bundle(&[&next])));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(scopes.take(), vec![(Scope::Trust, 0)]);
    assert_eq!(partner_anchors(&h), std::slice::from_ref(&next));
    assert!(h.status().rollout.is_empty());
    // The same bundle again is no event.
    assert!(!h.owner.set_federated(&partner_bundle(&[&next])));
}

#[test]
fn a_federated_bundle_change_during_a_rollout_reconciles_the_fleet() {
    let dir = tempfile::tempdir().expect("a directory");
    let (initial_file, _, next) = partner_cas(dir.path());
    let (mut h, scopes) = fleet(&with_partner(LEGACY, &initial_file), 5);
    // ca-2 becomes the issuer: its bundle waits for the streams' ACKs.
    h.update(&with_partner(SWITCHED, &initial_file))
        .expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(scopes.take(), vec![(Scope::Full, 0)]);
    assert!(h.owner.set_federated(&partner_bundle(&[&next])));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(scopes.take(), vec![(Scope::Full, 0)]);
    assert_eq!(partner_anchors(&h), [next]);
}
