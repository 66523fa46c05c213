//! The gate over several replicas: what this replica reports to its peers, and how their reports hold
//! its rollout steps back. Peers' views are injected as the daemon hands them in from the database.

use std::collections::BTreeSet;

use super::*;
use crate::peers::{GateView, PeerView, PresentedCa, TrustEntry};

fn trust_entry(h: &Harness, backend: &str) -> TrustEntry {
    // SWITCHED carries both backends; loading it from the same keystore gives the harness's CAs.
    let world = load(SWITCHED, &h.keystore, &h.settings, Some(h.owner.world())).expect("valid");
    let mesh = &world.meshes["default"];
    let ca = mesh
        .enabled_backend
        .iter()
        .chain(&mesh.secondary_backends)
        .find(|b| b.name == backend)
        .map(|b| b.ca.ca.id().to_owned())
        .expect("backend loaded");
    TrustEntry {
        trust_domain: "default".into(),
        ca,
    }
}

/// Peer `b`, whose streams have all ACKed `acked` of mesh `default`'s trust.
fn peer_acking(acked: &[TrustEntry]) -> PeerView {
    let mut view = GateView::default();
    view.trust_acked
        .insert("default".into(), acked.iter().cloned().collect());
    PeerView {
        replica: "b".into(),
        view: Some(view),
        gone: false,
    }
}

/// The harness of [`gated`], switched to ca-2 with every local stream ACKing the new trust.
fn switched_and_acked_here(h: &mut Harness) {
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g = generation(h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.reconcile(t0() + Duration::from_secs(2));
}

#[test]
fn a_peer_whose_streams_have_not_acked_the_new_trust_holds_issuing_from_it_back() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    let (e1, e2) = (trust_entry(&h, "ca-1"), trust_entry(&h, "ca-2"));
    assert!(h.owner.set_peers(&[peer_acking(std::slice::from_ref(&e1))]));
    h.reconcile(t0());
    switched_and_acked_here(&mut h);

    assert_eq!(issuer_of(&h.ready("web-1")), ca1, "b has not ACKed ca-2");
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits.len(), 1, "{:?}", status.rollout);
    assert_eq!(waits[0].waiting_for, ["replica b"]);
    assert_eq!(waits[0].waiting_count, 1);
    // What this replica tells b: its own streams have ACKed both.
    let view = h.owner.gate_view();
    assert_eq!(
        view.trust_acked["default"],
        BTreeSet::from([e1.clone(), e2.clone()])
    );

    // A view that says the same again changes nothing.
    assert!(!h.owner.set_peers(&[peer_acking(std::slice::from_ref(&e1))]));
    assert!(h.owner.set_peers(&[peer_acking(&[e1, e2])]));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-2"));
    assert!(waits_on(&h.status(), RolloutStep::TrustBeforeIdentity).is_empty());
}

#[test]
fn what_a_replica_reports_as_acked_waits_for_its_own_last_stream() {
    let mut h = gated(true);
    let e2 = trust_entry(&h, "ca-2");
    assert!(h.owner.set_peers(&[peer_acking(&[])]));
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g = generation(&h);
    h.ack(1, Some(g));
    h.reconcile(t0() + Duration::from_secs(2));
    assert!(
        !h.owner.gate_view().trust_acked["default"].contains(&e2),
        "web-2 has not ACKed"
    );
    h.ack(2, Some(g));
    h.reconcile(t0() + Duration::from_secs(3));
    assert!(h.owner.gate_view().trust_acked["default"].contains(&e2));
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        ca_subject(&h, "ca-1"),
        "b still holds ca-2 back"
    );
}

#[test]
fn a_peer_that_does_not_publish_the_mesh_holds_nothing_back() {
    let mut h = gated(true);
    let mut view = GateView::default();
    view.trust_acked.insert("other".into(), BTreeSet::new());
    h.owner.set_peers(&[PeerView {
        replica: "b".into(),
        view: Some(view),
        gone: false,
    }]);
    switched_and_acked_here(&mut h);
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-2"));
}

#[test]
fn a_peer_whose_view_cannot_be_read_holds_every_step_until_the_timeout() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    let unreadable = PeerView {
        replica: "b".into(),
        view: None,
        gone: false,
    };
    h.owner.set_peers(&[unreadable]);
    switched_and_acked_here(&mut h);
    assert_eq!(issuer_of(&h.ready("web-1")), ca1);
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::TrustBeforeIdentity);
    assert_eq!(
        waits[0].waiting_for,
        ["replica b (rollout state not readable)"]
    );
    // rollout.ackTimeout (30 s) bounds it, as it bounds a wait for a proxy.
    let ((), _) = crate::test_certs::warnings(|| {
        h.reconcile(t0() + Duration::from_secs(40));
    });
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-2"));
}

/// The harness of [`gated`], rotated to ca-2 with ca-1 removed, every local proxy holding and having
/// ACKed a ca-2 certificate; `peers` as given throughout.
fn rotated_with_peers(peers: Vec<PeerView>) -> Harness {
    let mut h = gated(true);
    h.owner.set_peers(&peers);
    switched_and_acked_here(&mut h);
    assert_eq!(issuer_of(&h.ready("web-1")), ca_subject(&h, "ca-2"));
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.update(ONLY_CA2).expect("valid");
    h.reconcile(t0() + Duration::from_secs(3));
    h
}

#[test]
fn a_removed_ca_stays_trusted_while_a_peers_proxy_presents_it() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    let (e1, e2) = (trust_entry(&h, "ca-1"), trust_entry(&h, "ca-2"));
    let world = h.owner.world().clone();
    let ca1_anchors = world.meshes["default"]
        .enabled_backend
        .as_ref()
        .expect("ca-1 enabled")
        .ca
        .ca
        .bundle_pems()
        .to_vec();
    // b has ACKed both CAs; three of its proxies present `presenting`.
    let peer = |presenting: &TrustEntry, anchors: Vec<String>| {
        let mut view = GateView::default();
        view.trust_acked
            .insert("default".into(), BTreeSet::from([e1.clone(), e2.clone()]));
        view.presented.push(PresentedCa {
            mesh: "default".into(),
            trust_domain: "default".into(),
            ca: presenting.ca.clone(),
            anchors,
            proxies: 3,
            named: vec!["default.api-1".into()],
        });
        PeerView {
            replica: "b".into(),
            view: Some(view),
            gone: false,
        }
    };
    h.owner.set_peers(&[peer(&e1, ca1_anchors)]);
    switched_and_acked_here(&mut h);
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.update(ONLY_CA2).expect("valid");
    let ((), _) = crate::test_certs::warnings(|| {
        h.reconcile(t0() + Duration::from_secs(3));
    });
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "api-1 on b still presents a ca-1 certificate"
    );
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::BreakLast);
    assert_eq!(waits.len(), 1, "{:?}", status.rollout);
    assert_eq!(waits[0].waiting_for, ["default.api-1 on replica b"]);
    assert_eq!(waits[0].waiting_count, 3, "three on b, one named");

    // b's proxies have ACKed their ca-2 certificates.
    assert!(h.owner.set_peers(&[peer(&e2, Vec::new())]));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(bundle_subjects(&h), [ca_subject(&h, "ca-2")]);
}

#[test]
fn without_peers_the_same_rotation_drops_the_ca_at_once() {
    let h = rotated_with_peers(Vec::new());
    assert_eq!(bundle_subjects(&h), [ca_subject(&h, "ca-2")]);
}

#[test]
fn a_replica_reports_the_cas_its_connected_proxies_present() {
    let mut h = gated(true);
    let e1 = trust_entry(&h, "ca-1");
    let view = h.owner.gate_view();
    assert_eq!(view.presented.len(), 1, "{:?}", view.presented);
    let presented = &view.presented[0];
    assert_eq!(
        (presented.mesh.as_str(), presented.ca.as_str()),
        ("default", e1.ca.as_str())
    );
    assert_eq!(presented.proxies, 2);
    assert_eq!(presented.named, ["default.web-1", "default.web-2"]);
    assert!(!presented.anchors.is_empty());
    h.disconnect(2);
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.owner.gate_view().presented[0].named, ["default.web-1"]);
}

#[test]
fn a_new_spiffe_id_waits_for_a_peer_whose_subscribers_have_not_acked_it() {
    let resources = |path: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}---\n{WEB_SERVICE}",
            workloads_identity(path, true)
        )
    };
    let peer = |ids: &[&str]| {
        let mut view = GateView::default();
        view.sans_acked.entry("default".into()).or_default().insert(
            "web".into(),
            ids.iter().map(|id| (*id).to_owned()).collect(),
        );
        PeerView {
            replica: "b".into(),
            view: Some(view),
            gone: false,
        }
    };
    let mut h = Harness::new(&resources("/a/{{ .Workload }}"));
    h.owner
        .set_peers(&[peer(&["spiffe://default/a/web-1", "spiffe://default/web"])]);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    h.ack(1, Some(generation(&h)));
    h.reconcile(t0());
    assert_eq!(h.ready("web-1").spiffe_id, "spiffe://default/a/web-1");

    h.update(&resources("/b/{{ .Workload }}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    h.ack(1, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default/a/web-1",
        "b's subscribers of meshservice:web have not ACKed the new ID"
    );
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::SansBeforeIdentity);
    assert_eq!(waits[0].waiting_for, ["replica b"]);
    let view = h.owner.gate_view();
    assert!(view.sans_acked["default"]["web"].contains("spiffe://default/b/web-1"));

    assert!(h.owner.set_peers(&[peer(&["spiffe://default/b/web-1"])]));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(h.ready("web-1").spiffe_id, "spiffe://default/b/web-1");
}

#[test]
fn an_id_a_peers_proxy_presents_stays_in_the_service_context() {
    let resources = format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}---\n{WEB_SERVICE}",
        workloads_identity("/a/{{ .Workload }}", true)
    );
    let mut h = Harness::new(&resources);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    assert!(!service_context(&h, "web").contains(&"spiffe://default/old/api-7".to_owned()));
    let mut view = GateView::default();
    view.presented_ids
        .entry("default".into())
        .or_default()
        .insert(
            "web".into(),
            BTreeSet::from(["spiffe://default/old/api-7".to_owned()]),
        );
    assert!(h.owner.set_peers(&[PeerView {
        replica: "b".into(),
        view: Some(view),
        gone: false,
    }]));
    h.reconcile(t0() + Duration::from_secs(1));
    assert!(service_context(&h, "web").contains(&"spiffe://default/old/api-7".to_owned()));
    // This replica reports only what its own proxies present.
    let mine = &h.owner.gate_view().presented_ids["default"]["web"];
    assert!(!mine.contains("spiffe://default/old/api-7"), "{mine:?}");
    assert!(mine.contains(&h.ready("web-1").spiffe_id));
}

/// Replica b dies while its proxies present ca-1, which this replica keeps only for them; one of them
/// reconnects here. It still presents its ca-1 certificate until it ACKs the one issued here, so ca-1
/// stays, though b is gone, until it does.
#[test]
fn a_proxy_that_moves_here_from_a_gone_replica_keeps_the_ca_it_may_present() {
    let mut h = gated(true);
    let ca1 = issuer_of(&h.ready("web-1"));
    let (e1, e2) = (trust_entry(&h, "ca-1"), trust_entry(&h, "ca-2"));
    let world = h.owner.world().clone();
    let anchors = world.meshes["default"]
        .enabled_backend
        .as_ref()
        .expect("ca-1 enabled")
        .ca
        .ca
        .bundle_pems()
        .to_vec();
    let mut view = GateView::default();
    view.trust_acked
        .insert("default".into(), BTreeSet::from([e1.clone(), e2]));
    view.presented.push(PresentedCa {
        mesh: "default".into(),
        trust_domain: "default".into(),
        ca: e1.ca,
        anchors,
        proxies: 1,
        named: vec!["default.web-9".into()],
    });
    h.owner.set_peers(&[PeerView {
        replica: "b".into(),
        view: Some(view),
        gone: false,
    }]);
    switched_and_acked_here(&mut h);
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    h.update(ONLY_CA2).expect("valid");
    let ((), _) = crate::test_certs::warnings(|| {
        h.reconcile(t0() + Duration::from_secs(3));
    });
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-9 on b presents ca-1"
    );

    // b is gone; web-9 reconnects here and is issued a ca-2 certificate.
    let web_9 = h.connect("web-9", &[], &[("kuma.io/service", "web")]);
    h.stream(web_9.0, &["default", "system_trust_bundle"], None);
    assert!(h.owner.set_peers(&[]));
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(issuer_of(&h.ready("web-9")), ca_subject(&h, "ca-2"));
    assert!(
        bundle_subjects(&h).contains(&ca1),
        "web-9 has not ACKed its ca-2 certificate: it still presents the one b gave it"
    );

    h.ack(web_9.0, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(5));
    assert_eq!(bundle_subjects(&h), [ca_subject(&h, "ca-2")]);
}

/// An owner that records what it issues and asks for recorded identities, with both ends of the link.
struct Recording {
    issued: tokio::sync::mpsc::UnboundedReceiver<Vec<crate::owner::IssuedIdentity>>,
    lookups: tokio::sync::mpsc::UnboundedReceiver<ProxyKey>,
}

fn recording(h: &mut Harness) -> Recording {
    let (issued_tx, issued) = tokio::sync::mpsc::unbounded_channel();
    let (lookups_tx, lookups) = tokio::sync::mpsc::unbounded_channel();
    h.owner.record_through(crate::owner::RecordLink {
        issued: issued_tx,
        lookups: lookups_tx,
    });
    Recording { issued, lookups }
}

#[test]
fn every_issued_certificate_is_recorded_and_a_newcomer_is_looked_up() {
    let mut h = Harness::new(LEGACY);
    let mut link = recording(&mut h);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    assert_eq!(
        link.lookups.try_recv().ok(),
        Some(ProxyKey::new("default", "web-1")),
        "a proxy this replica has issued nothing to is looked up"
    );
    h.reconcile(t0());
    let recorded = link.issued.try_recv().expect("a batch");
    assert_eq!(recorded.len(), 1);
    let served = h.ready("web-1");
    assert_eq!(recorded[0].key, ProxyKey::new("default", "web-1"));
    assert_eq!(recorded[0].issuer, "backend ca-1");
    assert_eq!(recorded[0].chain_pem, served.chain_pem);
    assert_eq!(
        recorded[0]
            .key_pem
            .as_ref()
            .expect("recorded with its key")
            .expose(),
        served.key.held().expect("held").expose()
    );
    // It reconnects: this replica holds its certificate, nothing to look up.
    h.disconnect(1);
    h.connect("web-1", &[], &[("kuma.io/service", "web")]);
    assert!(link.lookups.try_recv().is_err());
}

/// What replica b, serving the same configuration, issued to `name`.
fn issued_elsewhere(h: &Harness, name: &str) -> crate::owner::IssuedIdentity {
    let (snapshot_tx, snapshots) = watch::channel(Arc::new(Snapshot::empty()));
    let mut b = Harness {
        keystore: MemoryKeystore::new(),
        settings: h.settings.clone(),
        owner: Owner::new(
            OwnerConfig::from_settings(&h.settings),
            (**h.owner.world()).clone(),
            Arc::new(NoTelemetry),
            snapshot_tx,
        ),
        snapshots,
        next_stream: 0,
    };
    let mut link = recording(&mut b);
    b.connect(name, &[], &[("kuma.io/service", "web")]);
    b.reconcile(t0());
    link.issued.try_recv().expect("b issued")[0].clone()
}

#[test]
fn a_proxy_that_moves_here_mid_rotation_is_served_the_identity_it_holds_and_counted() {
    let mut h = gated(true);
    let mut link = recording(&mut h);
    let held = issued_elsewhere(&h, "web-9");
    h.update(SWITCHED).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g = generation(&h);
    h.ack(1, Some(g));

    // web-9 moves here while web-2 has not ACKed ca-2's trust: nothing may issue from ca-2, so it
    // would get nothing; it is served what b gave it, with the current trust.
    let web_9 = h.connect("web-9", &[], &[("kuma.io/service", "web")]);
    h.stream(web_9.0, &["default", "system_trust_bundle"], None);
    assert_eq!(
        link.lookups.try_recv().ok(),
        Some(ProxyKey::new("default", "web-9"))
    );
    h.reconcile(t0() + Duration::from_secs(2));
    assert!(matches!(h.entry("web-9"), ProxyEntry::Pending));
    assert!(h.owner.adopt(
        ProxyKey::new("default", "web-9"),
        Some(held.clone()),
        t0() + Duration::from_secs(2)
    ));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(h.ready("web-9").chain_pem, held.chain_pem);
    // The trust wait now waits for it too.
    h.ack(2, Some(g));
    h.reconcile(t0() + Duration::from_secs(3));
    let ca1 = ca_subject(&h, "ca-1");
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        ca1,
        "web-9 has not ACKed ca-2's trust"
    );
    let status = h.status();
    let waits = waits_on(&status, RolloutStep::TrustBeforeIdentity);
    assert_eq!(waits[0].waiting_for, ["default.web-9"]);

    h.ack(web_9.0, Some(generation(&h)));
    h.reconcile(t0() + Duration::from_secs(4));
    for name in ["web-1", "web-2", "web-9"] {
        assert_eq!(issuer_of(&h.ready(name)), ca_subject(&h, "ca-2"), "{name}");
    }
}

#[test]
fn an_identity_from_elsewhere_is_not_served_when_expiring_untrusted_or_superseded() {
    let mut h = gated(true);
    let _link = recording(&mut h);
    let held = issued_elsewhere(&h, "web-9");
    let key = ProxyKey::new("default", "web-9");
    // Not connected: nothing to serve.
    assert!(!h.owner.adopt(key.clone(), Some(held.clone()), t0()));
    let web_9 = h.connect("web-9", &[], &[("kuma.io/service", "web")]);
    h.stream(web_9.0, &["default", "system_trust_bundle"], None);
    // Expiring.
    let mut expiring = held.clone();
    expiring.not_after = t0() + Duration::from_secs(30);
    assert!(!h.owner.adopt(key.clone(), Some(expiring), t0()));
    // From a CA no bundle of the mesh carries.
    let mut foreign = held.clone();
    foreign.ca_id = "0".repeat(64);
    assert!(!h.owner.adopt(key.clone(), Some(foreign), t0()));
    // A chain that does not verify against the CA it names.
    let mut forged = held.clone();
    forged.chain_pem = h.ready("web-1").chain_pem.clone();
    assert!(
        !h.owner.adopt(key.clone(), Some(forged), t0()),
        "another proxy's chain"
    );
    // Issued here meanwhile: this replica's own wins.
    h.reconcile(t0());
    let own = h.ready("web-9");
    assert!(!h.owner.adopt(key, Some(held), t0()));
    h.reconcile(t0());
    assert!(Arc::ptr_eq(&h.ready("web-9"), &own));
}

/// Envoy may open its streams to several replicas; the one carrying its identity may move here after
/// another of its streams did. Each new stream of a proxy this replica holds nothing for asks again.
#[test]
fn a_proxy_holding_nothing_here_is_looked_up_on_each_new_stream() {
    let mut h = gated(true);
    let mut link = recording(&mut h);
    let key = ProxyKey::new("default", "web-9");
    h.connect("web-9", &[], &[("kuma.io/service", "web")]);
    assert_eq!(link.lookups.try_recv().ok(), Some(key.clone()));
    // Asked again while the answer is out: not twice.
    h.try_connect("web-9", &[], &[("kuma.io/service", "web")]);
    assert!(link.lookups.try_recv().is_err());
    assert!(!h.owner.adopt(key.clone(), None, t0()), "no record");
    h.try_connect("web-9", &[], &[("kuma.io/service", "web")]);
    assert_eq!(link.lookups.try_recv().ok(), Some(key));
}
