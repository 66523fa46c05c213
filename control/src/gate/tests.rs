//! The gate on its own, driven step by step: what a new CA waits for before it issues, what a removed CA
//! waits for before it leaves the bundles, what a new SPIFFE ID waits for before a proxy presents it, and
//! how `rollout.ackTimeout` bounds each.

use std::time::{Duration, SystemTime};

use meshca_ca::{CaParams, CertificateAuthority};
use meshca_identity::{KeyAlgorithm, TrustDomain};

use super::*;
use crate::events::StreamId;
use crate::resource_name::ResourceName;

const TIMEOUT: Duration = Duration::from_secs(30);

fn td() -> TrustDomain {
    TrustDomain::parse("default").expect("a trust domain")
}

fn mesh() -> BundleKey {
    BundleKey::mesh("default")
}

fn ca(name: &str, now: SystemTime) -> CertificateAuthority {
    CertificateAuthority::generate(
        &CaParams {
            trust_domain: td(),
            key_algorithm: KeyAlgorithm::EcdsaP256,
            validity: Duration::from_secs(3600),
            name: name.into(),
        },
        now,
    )
    .expect("a CA")
}

fn trust(ca: &CertificateAuthority) -> CaTrust {
    CaTrust::of_ca(mesh(), &td(), ca)
}

fn proxy(name: &str) -> ProxyKey {
    ProxyKey::new("default", name)
}

/// A stream of proxy `name` of mesh `default`, subscribed to `resources`.
fn open(streams: &mut StreamTable, id: u64, name: &str, resources: &[&str]) {
    streams.connect(StreamId(id), proxy(name), false);
    streams.subscribe(
        StreamId(id),
        resources.iter().map(|r| ResourceName::parse(*r)).collect(),
    );
}

fn ack(streams: &mut StreamTable, id: u64, generation: u64) {
    streams.ack(StreamId(id), generation, format!("v{generation}"));
}

/// The CAs the plan's bundle of mesh `default` carries, by subject.
fn carried(plan: &BTreeMap<BundleKey, Vec<CaTrust>>) -> Vec<String> {
    let mut subjects: Vec<String> = plan
        .get(&mesh())
        .into_iter()
        .flatten()
        .map(|ca| ca.subject.clone())
        .collect();
    subjects.sort();
    subjects
}

/// A gate that published `old` at generation 1, every stream of `streams` having ACKed it.
fn with_first_ca(
    old: &CertificateAuthority,
    streams: &mut StreamTable,
    ids: &[u64],
    now: SystemTime,
) -> Gate {
    let mut gate = Gate::new(true, TIMEOUT);
    gate.begin();
    gate.plan_trust(vec![trust(old)], &[], 1, now);
    for id in ids {
        ack(streams, *id, 1);
    }
    assert!(
        !gate.confirm(streams, now),
        "a new mesh's first CA needs no ACK"
    );
    assert!(gate.may_issue(&mesh(), &td(), old));
    gate
}

#[test]
fn a_mesh_new_to_the_bundles_issues_from_its_first_ca_at_once() {
    let now = SystemTime::now();
    let first = ca("default/ca-1", now);
    let mut gate = Gate::new(true, TIMEOUT);
    let plan = gate.plan_trust(vec![trust(&first)], &[], 1, now);
    assert_eq!(carried(&plan), [first.subject().to_owned()]);
    assert!(gate.may_issue(&mesh(), &td(), &first));
    assert!(!gate.pending());
    assert!(gate.holding_meshes().is_empty());
}

#[test]
fn a_new_ca_issues_only_once_every_stream_carrying_the_trust_acked_it() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(
        &mut streams,
        1,
        "web-1",
        &["default", "system_trust_bundle"],
    );
    open(&mut streams, 2, "web-2", &["system_trust_bundle"]);
    // A stream that carries no trust of the mesh is not waited for.
    open(&mut streams, 3, "web-3", &["default"]);
    let mut gate = with_first_ca(&old, &mut streams, &[1, 2, 3], now);

    let plan = gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    assert_eq!(
        carried(&plan).len(),
        2,
        "trust first: both CAs in the bundle"
    );
    assert!(!gate.confirm(&streams, now));
    assert!(!gate.may_issue(&mesh(), &td(), &new), "not before the ACKs");
    assert!(
        gate.may_issue(&mesh(), &td(), &old),
        "the old CA keeps issuing"
    );
    assert!(gate.pending());
    assert_eq!(gate.next_deadline(), Some(now + TIMEOUT));
    assert!(gate.holding_meshes().contains("default"));
    let waits = gate.waits_now(&streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits[0].waiting_for, ["default.web-1", "default.web-2"]);
    assert_eq!(waits[0].timeout_in_seconds, 30);
    assert_eq!(
        gate.take_events(),
        [(
            mesh(),
            GateEvent::WaitStarted(RolloutStep::TrustBeforeIdentity)
        )]
    );

    // One of two ACKs: still waiting, for the other one only.
    ack(&mut streams, 1, 2);
    assert!(!gate.confirm(&streams, now + Duration::from_secs(1)));
    assert_eq!(gate.waits_now(&streams)[0].waiting_for, ["default.web-2"]);
    assert!(!gate.may_issue(&mesh(), &td(), &new));

    ack(&mut streams, 2, 2);
    assert!(gate.confirm(&streams, now + Duration::from_secs(2)));
    assert!(gate.may_issue(&mesh(), &td(), &new));
    assert!(gate.waits_now(&streams).is_empty());
    assert!(!gate.pending());
    assert!(gate.holding_meshes().is_empty());
    assert!(gate.take_events().is_empty(), "no timeout");
}

#[test]
fn a_proxy_that_never_acks_holds_a_new_ca_back_for_the_ack_timeout_only() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "stuck", &["system_trust_bundle"]);
    let mut gate = with_first_ca(&old, &mut streams, &[1], now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    assert!(!gate.confirm(&streams, now + TIMEOUT - Duration::from_secs(1)));
    assert!(!gate.may_issue(&mesh(), &td(), &new));
    assert_eq!(gate.waits_now(&streams)[0].timeout_in_seconds, 1);

    assert!(gate.confirm(&streams, now + TIMEOUT));
    assert!(gate.may_issue(&mesh(), &td(), &new));
    let events = gate.take_events();
    assert!(
        events.contains(&(
            mesh(),
            GateEvent::TimedOut(RolloutStep::TrustBeforeIdentity)
        )),
        "{events:?}"
    );
    assert!(gate.waits_now(&streams).is_empty());
}

#[test]
fn a_disconnected_proxy_holds_nothing_back() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "gone", &["system_trust_bundle"]);
    let mut gate = with_first_ca(&old, &mut streams, &[1], now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    assert!(!gate.confirm(&streams, now));
    assert_eq!(streams.disconnect(StreamId(1)), Some(proxy("gone")));
    assert!(gate.confirm(&streams, now));
    assert!(gate.may_issue(&mesh(), &td(), &new));
}

#[test]
fn a_removed_ca_stays_in_the_bundles_while_a_connected_proxy_presents_it() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(
        &mut streams,
        1,
        "web-1",
        &["default", "system_trust_bundle"],
    );
    let mut gate = with_first_ca(&old, &mut streams, &[1], now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    ack(&mut streams, 1, 2);
    assert!(gate.confirm(&streams, now));
    gate.take_events();

    // The configuration drops the old CA while web-1 still presents a certificate from it.
    let old_trust = trust(&old);
    let web_1 = proxy("web-1");
    let presented = [(&old_trust, vec![&web_1])];
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &presented, 3, now);
    assert_eq!(carried(&plan).len(), 2, "break last: the old CA is kept");
    let waits = gate.waits_now(&streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::BreakLast);
    assert_eq!(waits[0].ca, old.subject());
    assert_eq!(waits[0].waiting_for, ["default.web-1"]);
    let events = gate.take_events();
    assert!(
        events.contains(&(mesh(), GateEvent::RemovedWhilePresented))
            && events.contains(&(mesh(), GateEvent::WaitStarted(RolloutStep::BreakLast))),
        "{events:?}"
    );
    assert!(gate.pending());
    assert_eq!(gate.next_deadline(), Some(now + TIMEOUT));

    // Once nobody presents it, it leaves.
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &[], 4, now + Duration::from_secs(1));
    assert_eq!(carried(&plan), [new.subject().to_owned()]);
    assert!(gate.waits_now(&streams).is_empty());
    assert!(!gate.pending());
}

#[test]
fn a_removed_ca_leaves_after_the_ack_timeout_even_if_still_presented() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "stuck", &["system_trust_bundle"]);
    let mut gate = with_first_ca(&old, &mut streams, &[1], now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    ack(&mut streams, 1, 2);
    assert!(gate.confirm(&streams, now));
    let old_trust = trust(&old);
    let stuck = proxy("stuck");
    let presented = [(&old_trust, vec![&stuck])];
    gate.begin();
    gate.plan_trust(vec![trust(&new)], &presented, 3, now);
    gate.take_events();

    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &presented, 4, now + TIMEOUT);
    assert_eq!(carried(&plan), [new.subject().to_owned()], "given up");
    assert!(gate
        .take_events()
        .contains(&(mesh(), GateEvent::TimedOut(RolloutStep::BreakLast))));
    assert!(!gate.pending(), "a CA given up is not waited on again");
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &presented, 5, now + TIMEOUT * 2);
    assert_eq!(carried(&plan), [new.subject().to_owned()]);
    assert!(gate.take_events().is_empty(), "and not reported again");
}

#[test]
fn a_new_ca_confirmed_restarts_the_break_last_clock_of_its_mesh() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "web-1", &["system_trust_bundle"]);
    let mut gate = with_first_ca(&old, &mut streams, &[1], now);
    // One edit: the new CA in, the old one out while web-1 presents it.
    let old_trust = trust(&old);
    let web_1 = proxy("web-1");
    let presented = [(&old_trust, vec![&web_1])];
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &presented, 2, now);
    assert_eq!(carried(&plan).len(), 2);
    // The new CA is confirmed late (20 s): the old one's proxies only then can move to it, so its
    // break-last timeout counts from there.
    ack(&mut streams, 1, 2);
    let confirmed_at = now + Duration::from_secs(20);
    assert!(gate.confirm(&streams, confirmed_at));
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &presented, 3, now + TIMEOUT);
    assert_eq!(carried(&plan).len(), 2, "kept past the first timeout");
    assert_eq!(gate.next_deadline(), Some(confirmed_at + TIMEOUT));
}

#[test]
fn a_disabled_gate_issues_and_removes_at_once() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "web-1", &["system_trust_bundle"]);
    let mut gate = Gate::new(false, TIMEOUT);
    gate.plan_trust(vec![trust(&old)], &[], 1, now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    assert!(gate.may_issue(&mesh(), &td(), &new), "no ACK waited for");
    let old_trust = trust(&old);
    let web_1 = proxy("web-1");
    let plan = gate.plan_trust(vec![trust(&new)], &[(&old_trust, vec![&web_1])], 3, now);
    assert_eq!(carried(&plan), [new.subject().to_owned()], "no break last");
    assert!(!gate.pending());
    assert!(gate.waits_now(&streams).is_empty());
}

#[test]
fn a_new_spiffe_id_is_presented_once_its_service_context_acked_it() {
    let now = SystemTime::now();
    let mut streams = StreamTable::default();
    // A client validating the server with the service's context, and another stream that does not.
    open(&mut streams, 1, "client", &["meshservice:api"]);
    open(&mut streams, 2, "other", &["system_trust_bundle"]);
    let mut gate = Gate::new(true, TIMEOUT);
    let api = ServiceKey::new("default", "api");
    let old_id = "spiffe://default/api";
    let new_id = "spiffe://default.zone/workload/api";
    let mut ids = ServiceIds::default();
    ids.insert(api.clone(), [old_id.to_owned()].into_iter().collect());
    gate.plan_sans(&ids, 1, now);
    ack(&mut streams, 1, 1);
    ack(&mut streams, 2, 1);
    gate.confirm(&streams, now);
    assert!(gate.may_present(&api, old_id));

    ids.insert(
        api.clone(),
        [old_id.to_owned(), new_id.to_owned()].into_iter().collect(),
    );
    gate.plan_sans(&ids, 2, now);
    assert!(!gate.confirm(&streams, now));
    assert!(!gate.may_present(&api, new_id), "SANs before identity");
    assert!(gate.may_present(&api, old_id));
    assert!(gate.holding_meshes().contains("default"));
    let waits = gate.waits_now(&streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::SansBeforeIdentity);
    assert_eq!(waits[0].waiting_for, ["default.client"]);

    ack(&mut streams, 1, 2);
    assert!(gate.confirm(&streams, now + Duration::from_secs(1)));
    assert!(gate.may_present(&api, new_id));
    assert!(!gate.pending());

    // An ID that leaves the context is forgotten; one never planned is not held back.
    ids.insert(api.clone(), [new_id.to_owned()].into_iter().collect());
    gate.plan_sans(&ids, 3, now);
    assert!(gate.may_present(&api, "spiffe://default/never-planned"));
}

#[test]
fn a_new_spiffe_id_waits_for_the_ack_timeout_at_most() {
    let now = SystemTime::now();
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "stuck", &["meshservice:api"]);
    let mut gate = Gate::new(true, TIMEOUT);
    let api = ServiceKey::new("default", "api");
    let mut ids = ServiceIds::default();
    ids.insert(
        api.clone(),
        ["spiffe://default/api".to_owned()].into_iter().collect(),
    );
    gate.plan_sans(&ids, 1, now);
    assert!(!gate.confirm(&streams, now + TIMEOUT - Duration::from_secs(1)));
    assert!(!gate.may_present(&api, "spiffe://default/api"));
    assert!(gate.confirm(&streams, now + TIMEOUT));
    assert!(gate.may_present(&api, "spiffe://default/api"));
    assert!(gate
        .take_events()
        .contains(&(mesh(), GateEvent::TimedOut(RolloutStep::SansBeforeIdentity))));
}

/// A replica that has not read the replicas table since a CA was published may not know a replica
/// that joined meanwhile, whose proxies hold bundles without it: the CA issues only once the
/// second read after publishing (the first began after it) found nobody holding it back.
#[test]
fn on_replicas_a_new_ca_issues_only_after_the_peers_were_read_since_it_was_published() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut streams = StreamTable::default();
    let mut gate = Gate::new(true, TIMEOUT);
    gate.expect_peers();
    gate.plan_trust(vec![trust(&old)], &[], 1, now);
    // Even a mesh new to this replica waits: a replica it has not read may serve its proxies.
    assert!(!gate.confirm(&streams, now));
    assert!(!gate.may_issue(&mesh(), &td(), &old));
    assert!(
        !gate.set_peers(&[]),
        "the first read may have begun before the CA was published: it ends no wait"
    );
    assert!(!gate.confirm(&streams, now));
    assert!(gate.set_peers(&[]), "the second read ends the wait");
    assert!(gate.confirm(&streams, now));
    assert!(gate.may_issue(&mesh(), &td(), &old));
    assert!(
        gate.take_events().is_empty(),
        "knowing the peers is no rollout wait: {:?}",
        gate.events
    );
    assert!(!gate.set_peers(&[]), "nothing waits for a read");

    // A new CA: no stream of this replica carries the mesh's trust and no peer is known, yet it
    // waits for two reads of the database, and says so.
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    assert!(!gate.confirm(&streams, now));
    assert!(!gate.may_issue(&mesh(), &td(), &new));
    let waits = gate.waits_now(&streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits[0].waiting_for, [UNREAD_PEERS]);
    assert!(!gate.set_peers(&[]));
    assert!(!gate.confirm(&streams, now));
    // The second read found a replica that joined: its proxies have not ACKed the new CA.
    let joined = |acked: &[&CertificateAuthority]| {
        let mut view = crate::peers::GateView::default();
        let entries = acked.iter().map(|ca| TrustEntry {
            trust_domain: "default".into(),
            ca: ca.id().to_string(),
        });
        view.trust_acked.insert("default".into(), entries.collect());
        PeerView {
            replica: "joined".into(),
            view: Some(view),
            gone: false,
        }
    };
    assert!(gate.set_peers(&[joined(&[&old])]));
    assert!(!gate.confirm(&streams, now), "the joined replica holds it");
    assert!(!gate.may_issue(&mesh(), &td(), &new));
    let waits = gate.waits_now(&streams);
    assert_eq!(waits[0].waiting_for, [joined(&[]).label()]);

    // A local stream that connects now is served the new trust first: it holds nothing back.
    open(&mut streams, 1, "web-1", &["system_trust_bundle"]);
    assert!(gate.set_peers(&[joined(&[&old, &new])]));
    assert!(gate.confirm(&streams, now));
    assert!(gate.may_issue(&mesh(), &td(), &new));
}

#[test]
fn a_new_spiffe_id_on_replicas_waits_for_the_peers_to_be_read_too() {
    let now = SystemTime::now();
    let streams = StreamTable::default();
    let mut gate = Gate::new(true, TIMEOUT);
    gate.expect_peers();
    let api = ServiceKey::new("default", "api");
    let id = "spiffe://default/api";
    let mut ids = ServiceIds::default();
    ids.insert(api.clone(), [id.to_owned()].into_iter().collect());
    gate.plan_sans(&ids, 1, now);
    assert!(!gate.confirm(&streams, now));
    assert!(!gate.may_present(&api, id));
    assert_eq!(gate.waits_now(&streams)[0].waiting_for, [UNREAD_PEERS]);
    gate.set_peers(&[]);
    gate.set_peers(&[]);
    assert!(gate.confirm(&streams, now));
    assert!(gate.may_present(&api, id));
}

/// Alone (no database), nothing waits for reads of peers that cannot exist.
#[test]
fn alone_nothing_waits_for_peers_to_be_read() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let streams = StreamTable::default();
    let mut gate = Gate::new(true, TIMEOUT);
    gate.plan_trust(vec![trust(&old)], &[], 1, now);
    assert!(gate.may_issue(&mesh(), &td(), &old));
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    assert!(gate.confirm(&streams, now));
    assert!(gate.may_issue(&mesh(), &td(), &new));
}

/// A replica's gate that published `cas` at generation 1, confirmed after two reads of its (no)
/// peers.
fn replica_publishing(cas: &[&CertificateAuthority], now: SystemTime) -> Gate {
    let mut gate = Gate::new(true, TIMEOUT);
    gate.expect_peers();
    gate.plan_trust(cas.iter().map(|ca| trust(ca)).collect(), &[], 1, now);
    gate.set_peers(&[]);
    gate.set_peers(&[]);
    assert!(gate.confirm(&StreamTable::default(), now));
    gate.take_events();
    gate
}

/// Break last on replicas: a removed CA that no known proxy presents stays in the bundles until the
/// peers were read since its removal (a replica that joined may serve proxies presenting it), with
/// no warning of proxies presenting it; then it leaves, unless the read found one.
#[test]
fn on_replicas_a_removed_ca_leaves_only_after_the_peers_were_read_since() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut gate = replica_publishing(&[&old, &new], now);

    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &[], 2, now);
    assert_eq!(
        carried(&plan),
        [old.subject().to_owned(), new.subject().to_owned()]
    );
    assert!(
        gate.take_events().is_empty(),
        "nobody is known to present it"
    );
    let waits: Vec<_> = gate.current_waits().cloned().collect();
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::BreakLast);
    assert_eq!(waits[0].waiting_for, [UNREAD_PEERS]);
    assert!(!gate.set_peers(&[]));
    assert!(gate.set_peers(&[]), "the removal waited for this read");
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &[], 3, now);
    assert_eq!(carried(&plan), [new.subject().to_owned()]);
    assert!(gate.current_waits().next().is_none());
    assert!(!gate.set_peers(&[]), "nothing waits for a read");
}

/// The reads that end the wait may find a replica whose proxies present the removed CA: it stays.
#[test]
fn a_removed_ca_a_replica_read_since_finds_presented_stays() {
    let now = SystemTime::now();
    let (old, new) = (ca("default/ca-1", now), ca("default/ca-2", now));
    let mut gate = replica_publishing(&[&old, &new], now);
    gate.plan_trust(vec![trust(&new)], &[], 2, now);
    let mut view = crate::peers::GateView::default();
    view.presented.push(crate::peers::PresentedCa {
        mesh: "default".into(),
        trust_domain: "default".into(),
        ca: old.id().to_string(),
        anchors: Vec::new(),
        proxies: 1,
        named: vec!["web-9".into()],
    });
    let joined = PeerView {
        replica: "joined".into(),
        view: Some(view),
        gone: false,
    };
    gate.set_peers(std::slice::from_ref(&joined));
    gate.set_peers(std::slice::from_ref(&joined));
    gate.begin();
    let plan = gate.plan_trust(vec![trust(&new)], &[], 3, now);
    assert_eq!(
        carried(&plan),
        [old.subject().to_owned(), new.subject().to_owned()]
    );
    assert!(gate
        .take_events()
        .contains(&(mesh(), GateEvent::RemovedWhilePresented)));
    let waits: Vec<_> = gate.current_waits().cloned().collect();
    assert_eq!(waits[0].waiting_for, ["web-9 on replica joined"]);
}

/// One refresh hint plus the fetch margin, as in the defaults.
const FEDERATION_WAIT: Duration = Duration::from_secs(330);

fn exported_gate() -> Gate {
    let mut gate = Gate::new(true, TIMEOUT);
    gate.export([td()].into_iter().collect(), FEDERATION_WAIT);
    gate
}

/// What the endpoint of `default` served, each CA since the time given.
fn served(cas: &[(&CertificateAuthority, SystemTime)]) -> std::sync::Arc<ServedSince> {
    let ids = cas
        .iter()
        .flat_map(|(ca, since)| {
            ca.bundle_der().into_iter().map(move |der| {
                let d = ring::digest::digest(&ring::digest::SHA256, &der);
                let id: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
                (id, *since)
            })
        })
        .collect();
    std::sync::Arc::new([(td(), ids)].into_iter().collect())
}

fn federation_waits(gate: &Gate, streams: &StreamTable) -> Vec<Wait> {
    gate.waits_now(streams)
        .into_iter()
        .filter(|w| w.step == RolloutStep::Federation)
        .collect()
}

#[test]
fn a_new_ca_of_an_exported_trust_domain_issues_once_peers_polling_as_told_hold_it() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let (old, new) = (ca("default/ca-1", t0), ca("default/ca-2", t0));
    let mut streams = StreamTable::default();
    open(
        &mut streams,
        1,
        "web-1",
        &["default", "system_trust_bundle"],
    );
    let mut gate = exported_gate();
    gate.begin();
    gate.plan_trust(vec![trust(&old)], &[], 1, t0);
    ack(&mut streams, 1, 1);
    // Until the endpoint says it served the first CA, nothing issues from it.
    gate.confirm(&streams, t0);
    assert!(!gate.may_issue(&mesh(), &td(), &old));
    let waits = federation_waits(&gate, &streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert!(
        waits[0].waiting_for[0].contains("has not served this CA yet"),
        "{waits:?}"
    );
    // The first bundle ever served is held by no peer before: it issues at once.
    assert!(gate.set_served(served(&[(&old, SystemTime::UNIX_EPOCH)])));
    assert!(gate.confirm(&streams, t0));
    assert!(gate.may_issue(&mesh(), &td(), &old));

    // The next CA: the trust domain's own streams ACK it at once...
    let t1 = t0 + Duration::from_secs(60);
    gate.begin();
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, t1);
    ack(&mut streams, 1, 2);
    assert!(gate.set_served(served(&[(&old, SystemTime::UNIX_EPOCH), (&new, t1)])));
    assert!(!gate.confirm(&streams, t1));
    // ...but the peers are waited for, one refresh hint plus the margin, which no ackTimeout shortens.
    let later = t1 + TIMEOUT + Duration::from_secs(60);
    gate.begin();
    assert!(!gate.confirm(&streams, later));
    // Looked at again (a batch of ACKs), it is still one wait.
    assert!(!gate.confirm(&streams, later));
    assert!(!gate.may_issue(&mesh(), &td(), &new));
    assert!(
        gate.may_issue(&mesh(), &td(), &old),
        "the old CA keeps issuing"
    );
    let waits = federation_waits(&gate, &streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].ca, new.subject());
    assert!(
        waits[0].waiting_for[0].contains("the peers of trust domain default"),
        "{waits:?}"
    );
    assert_eq!(
        waits[0].timeout_in_seconds,
        (FEDERATION_WAIT - TIMEOUT - Duration::from_secs(60)).as_secs() as i64
    );
    assert_eq!(gate.next_deadline(), Some(t1 + FEDERATION_WAIT));
    assert!(gate.holding_meshes().contains("default"));
    assert!(gate
        .take_events()
        .contains(&(mesh(), GateEvent::WaitStarted(RolloutStep::Federation))));

    gate.begin();
    assert!(gate.confirm(&streams, t1 + FEDERATION_WAIT));
    assert!(gate.may_issue(&mesh(), &td(), &new));
    assert!(federation_waits(&gate, &streams).is_empty());
}

#[test]
fn after_a_restart_a_new_ca_still_waits_out_what_is_left_of_its_peers_wait() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let (old, new) = (ca("default/ca-1", t0), ca("default/ca-2", t0));
    let streams = StreamTable::default();
    let mut gate = exported_gate();
    gate.begin();
    // A restart: both CAs are published to a mesh new to this gate, the new one served 100 s ago.
    let now = t0 + Duration::from_secs(100);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 1, now);
    assert!(!gate.may_issue(&mesh(), &td(), &old), "not served yet");
    gate.set_served(served(&[(&old, SystemTime::UNIX_EPOCH), (&new, t0)]));
    gate.confirm(&streams, now);
    assert!(gate.may_issue(&mesh(), &td(), &old));
    assert!(!gate.may_issue(&mesh(), &td(), &new));
    assert_eq!(gate.next_deadline(), Some(t0 + FEDERATION_WAIT));
    gate.begin();
    gate.confirm(&streams, t0 + FEDERATION_WAIT);
    assert!(gate.may_issue(&mesh(), &td(), &new));
}

#[test]
fn a_trust_domain_not_exported_or_a_gate_off_never_waits_for_peers() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let first = ca("default/ca-1", t0);
    let mut gate = Gate::new(true, TIMEOUT);
    gate.export(
        [TrustDomain::parse("other.example").expect("a trust domain")]
            .into_iter()
            .collect(),
        FEDERATION_WAIT,
    );
    gate.plan_trust(vec![trust(&first)], &[], 1, t0);
    assert!(gate.may_issue(&mesh(), &td(), &first));
    let mut off = Gate::new(false, TIMEOUT);
    off.export([td()].into_iter().collect(), FEDERATION_WAIT);
    off.plan_trust(vec![trust(&first)], &[], 1, t0);
    assert!(off.may_issue(&mesh(), &td(), &first));
}

#[test]
fn a_federation_wait_shorter_than_the_ack_timeout_ends_on_time() {
    // The streams ACK at once; the peers' wait (4 s) ends long before the 30 s ackTimeout would.
    let wait = Duration::from_secs(4);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let (old, new) = (ca("default/ca-1", t0), ca("default/ca-2", t0));
    let mut streams = StreamTable::default();
    open(&mut streams, 1, "web-1", &["system_trust_bundle"]);
    let mut gate = Gate::new(true, TIMEOUT);
    gate.export([td()].into_iter().collect(), wait);
    gate.plan_trust(vec![trust(&old)], &[], 1, t0);
    gate.set_served(served(&[(&old, SystemTime::UNIX_EPOCH)]));
    ack(&mut streams, 1, 1);
    gate.confirm(&streams, t0);
    let t1 = t0 + Duration::from_secs(10);
    gate.begin();
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, t1);
    gate.set_served(served(&[(&old, SystemTime::UNIX_EPOCH), (&new, t1)]));
    ack(&mut streams, 1, 2);
    assert!(!gate.confirm(&streams, t1));
    assert_eq!(
        gate.next_deadline(),
        Some(t1 + wait),
        "woken when peers hold it"
    );
    gate.begin();
    assert!(gate.confirm(&streams, t1 + wait));
    assert!(gate.may_issue(&mesh(), &td(), &new));
    assert_eq!(gate.next_deadline(), None);
}

/// A CA of another trust domain, as a federated peer's bundle brings it to mesh `default`.
fn partner_trust(name: &str, now: SystemTime) -> CaTrust {
    let partner = TrustDomain::parse("partner.example").expect("a trust domain");
    let ca = CertificateAuthority::generate(
        &CaParams {
            trust_domain: partner.clone(),
            key_algorithm: KeyAlgorithm::EcdsaP256,
            validity: Duration::from_secs(3600),
            name: name.into(),
        },
        now,
    )
    .expect("a CA");
    CaTrust::of_ca(mesh(), &partner, &ca)
}

#[test]
fn a_trust_domain_only_federation_brings_is_foreign_and_one_the_mesh_has_is_not() {
    let now = SystemTime::now();
    let own = trust(&ca("default/ca-1", now));
    let partner = partner_trust("partner", now);
    // A peer that (against the rules) serves the mesh's own trust domain brings nothing foreign.
    let mut same_domain = partner.clone();
    same_domain.trust_domain = td();
    let foreign = ForeignDomains::of([&own], [&partner, &same_domain]);
    assert!(foreign.contains(&mesh(), &partner.trust_domain));
    assert!(!foreign.contains(&mesh(), &td()));
    assert!(
        !foreign.contains(&BundleKey::mesh("other"), &partner.trust_domain),
        "only in the bundle it was brought to"
    );
}

/// A gate that published `default/ca-1`, ACKed by `count` streams (web-1 ...), and that knows
/// `partner.example` as a trust domain only federation brings; with the partner's CA.
fn with_partner_domain(
    count: u64,
    now: SystemTime,
) -> (Gate, StreamTable, CertificateAuthority, CaTrust) {
    let old = ca("default/ca-1", now);
    let partner = partner_trust("partner", now);
    let mut streams = StreamTable::default();
    let ids: Vec<u64> = (1..=count).collect();
    for id in &ids {
        let name = format!("web-{id}");
        open(
            &mut streams,
            *id,
            &name,
            &["default", "system_trust_bundle"],
        );
    }
    let mut gate = with_first_ca(&old, &mut streams, &ids, now);
    gate.set_foreign(ForeignDomains::of([&trust(&old)], [&partner]));
    (gate, streams, old, partner)
}

#[test]
fn a_federated_authority_waits_for_its_acks_but_holds_no_certificate_back() {
    let now = SystemTime::now();
    let (mut gate, mut streams, old, partner) = with_partner_domain(2, now);

    let desired = vec![trust(&old), partner.clone()];
    assert!(gate.foreign_change_only(&desired, |_| false));
    gate.plan_trust(desired, &[], 2, now);
    assert!(!gate.confirm(&streams, now));
    // Its trust step waits, as the status shows, and ACKs must wake the owner to end it ...
    assert!(gate.pending());
    let waits = gate.waits_now(&streams);
    assert_eq!(waits.len(), 1, "{waits:?}");
    assert_eq!(waits[0].step, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits[0].ca, partner.subject);
    assert_eq!(waits[0].waiting_count, 2);
    let counted = |gate: &Gate, streams: &StreamTable| {
        gate.waiting_count(
            streams,
            "default",
            RolloutStep::TrustBeforeIdentity,
            &partner.subject,
        )
    };
    assert_eq!(
        counted(&gate, &streams),
        2,
        "before any ACK, from the index"
    );
    // ... but no mesh is held, and the mesh's own CA keeps issuing.
    assert!(!gate.holds_issuance());
    assert!(gate.holding_meshes().is_empty());
    assert!(gate.may_issue(&mesh(), &td(), &old));
    assert_eq!(gate.waits_over(&streams, now), WaitsOver::None);
    ack(&mut streams, 1, 2);
    assert_eq!(counted(&gate, &streams), 1, "after one, by a pass");
    assert_eq!(
        gate.waits_over(&streams, now),
        WaitsOver::None,
        "web-2 waits"
    );
    ack(&mut streams, 2, 2);
    assert_eq!(gate.waits_over(&streams, now), WaitsOver::Foreign);
    assert!(gate.confirm(&streams, now));
    assert!(!gate.pending());
    assert!(gate.waits_now(&streams).is_empty());

    // A new CA of the mesh's own trust domain still holds its mesh, and its end is a holding one.
    let new = ca("default/ca-2", now);
    let desired = vec![trust(&old), trust(&new), partner.clone()];
    assert!(
        !gate.foreign_change_only(&desired, |_| false),
        "the mesh's own trust domain changes"
    );
    gate.plan_trust(desired, &[], 3, now);
    gate.confirm(&streams, now);
    assert!(gate.holds_issuance());
    assert!(gate.holding_meshes().contains("default"));
    ack(&mut streams, 1, 3);
    ack(&mut streams, 2, 3);
    assert_eq!(gate.waits_over(&streams, now), WaitsOver::Holding);
}

#[test]
fn dropping_a_federated_authority_is_foreign_only_while_nobody_here_presents_it() {
    let now = SystemTime::now();
    let (mut gate, mut streams, old, partner) = with_partner_domain(1, now);
    gate.plan_trust(vec![trust(&old), partner.clone()], &[], 2, now);
    ack(&mut streams, 1, 2);
    assert!(gate.confirm(&streams, now));

    let without = vec![trust(&old)];
    assert!(gate.foreign_change_only(&without, |_| false));
    assert!(
        !gate.foreign_change_only(&without, |key| *key == partner.key()),
        "a certificate this replica holds chains to it"
    );
    // Dropping the mesh's own CA is no foreign change either.
    assert!(!gate.foreign_change_only(std::slice::from_ref(&partner), |_| false));
    let plan = gate.plan_trust(without.clone(), &[], 3, now);
    assert_eq!(carried(&plan), [old.subject().to_owned()], "gone at once");
    assert!(!gate.pending());

    // While a removed CA is kept for its presenters (break last), every trust change is the full
    // reconcile's: it must count them again.
    let new = ca("default/ca-2", now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 4, now);
    ack(&mut streams, 1, 4);
    gate.confirm(&streams, now);
    let old_trust = trust(&old);
    let web_1 = proxy("web-1");
    gate.plan_trust(vec![trust(&new)], &[(&old_trust, vec![&web_1])], 5, now);
    assert!(!gate.foreign_change_only(&[trust(&new), partner], |_| false));
}

#[test]
fn a_federated_authority_confirmed_leaves_the_break_last_clock_alone() {
    let now = SystemTime::now();
    let (mut gate, mut streams, old, partner) = with_partner_domain(1, now);
    let new = ca("default/ca-2", now);
    gate.plan_trust(vec![trust(&old), trust(&new)], &[], 2, now);
    ack(&mut streams, 1, 2);
    assert!(gate.confirm(&streams, now));
    // ca-1 is removed while web-1 still presents it: kept for at most the timeout from now.
    let old_trust = trust(&old);
    let web_1 = proxy("web-1");
    gate.plan_trust(vec![trust(&new)], &[(&old_trust, vec![&web_1])], 3, now);
    assert_eq!(gate.next_deadline(), Some(now + TIMEOUT));
    // The partner's new CA is confirmed later: that moves no proxy off ca-1, so its clock goes on.
    let later = now + Duration::from_secs(10);
    let desired = vec![trust(&new), partner];
    gate.plan_trust(desired, &[(&old_trust, vec![&web_1])], 4, later);
    ack(&mut streams, 1, 4);
    assert!(gate.confirm(&streams, later));
    assert_eq!(gate.next_deadline(), Some(now + TIMEOUT));
}
