//! What the mesh bundles trust and when: CAs ordered by trust domain, MeshTrust resources and the
//! MeshTrusts meshca creates, all through the rollout gate.

use super::*;
use meshca_keystore::Keystore;

use crate::test_certs::{self, TestCa};

/// The trust domains of mesh `default`'s bundle, each with the subjects of its certificates.
fn bundle(h: &Harness) -> BTreeMap<String, Vec<String>> {
    let snapshot = h.snapshots.borrow().clone();
    snapshot.meshes["default"]
        .trust
        .by_trust_domain()
        .iter()
        .map(|(td, pems)| {
            let mut subjects: Vec<String> = pems
                .iter()
                .map(|p| {
                    meshca_ca::inspect_pem(p.as_bytes()).expect("pem")[0]
                        .subject
                        .clone()
                })
                .collect();
            subjects.sort();
            (td.clone(), subjects)
        })
        .collect()
}

/// A bundle of the given trust domains, each holding the given subjects.
fn expect(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    entries
        .iter()
        .map(|(td, subjects)| {
            (
                td.to_string(),
                subjects.iter().map(ToString::to_string).collect(),
            )
        })
        .collect()
}

/// MeshIdentity `web` selecting every dataplane of mesh `default`, for `trust_domain`, with `ca` provided.
fn provided_identity(trust_domain: &str, ca: &TestCa, extra: &str) -> String {
    format!(
        "type: MeshIdentity\nname: web\nmesh: default\nspec:\n  selector: {{dataplane: {{matchLabels: {{}}}}}}\n  spiffeID: {{trustDomain: {trust_domain}, path: \"/workload/{{{{ .Workload }}}}\"}}\n  provider:\n    type: Bundled\n    bundled: {{{extra}{}}}\n",
        test_certs::provided(ca)
    )
}

fn waits(h: &Harness, step: RolloutStep) -> Vec<crate::Wait> {
    h.status()
        .rollout
        .iter()
        .filter(|w| w.step == step)
        .cloned()
        .collect()
}

#[test]
fn a_trust_domain_change_of_a_ca_without_uri_san_is_trusted_before_it_is_issued_and_kept_until_replaced(
) {
    let ca = test_certs::ca("Corp CA", t0());
    let resources = |td: &str| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
            provided_identity(
                td,
                &ca,
                "meshTrustCreation: Enabled, insecureAllowSelfSigned: true, "
            )
        )
    };
    let mut h = Harness::new(&resources("a.example"));
    h.connect("web-1", &[], &[]);
    h.connect("web-2", &[], &[]);
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    assert_eq!(bundle(&h), expect(&[("a.example", &["CN=Corp CA"])]));
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://a.example/workload/web-1"
    );

    // The same CA now signs for b.example: a new bundle entry, which must be ACKed before anyone is
    // issued a certificate in it.
    h.update(&resources("b.example")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g_trust = generation(&h);
    assert_eq!(
        bundle(&h),
        expect(&[
            ("a.example", &["CN=Corp CA"]),
            ("b.example", &["CN=Corp CA"])
        ])
    );
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://a.example/workload/web-1"
    );
    let wait = waits(&h, RolloutStep::TrustBeforeIdentity);
    assert_eq!(wait.len(), 1, "{:?}", h.status().rollout);
    assert_eq!(wait[0].waiting_for, ["default.web-1", "default.web-2"]);
    h.connect("new-1", &[], &[]);
    h.reconcile(t0() + Duration::from_secs(2));
    assert!(
        matches!(h.entry("new-1"), ProxyEntry::Pending),
        "a new proxy waits too"
    );

    h.ack(1, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://a.example/workload/web-1",
        "web-2 has not ACKed the b.example entry"
    );
    h.ack(2, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(4));
    for name in ["web-1", "web-2", "new-1"] {
        assert!(
            h.ready(name).spiffe_id.starts_with("spiffe://b.example/"),
            "{name}"
        );
    }
    // Break last: web-1 and web-2 may still present their a.example certificates.
    assert_eq!(
        bundle(&h),
        expect(&[
            ("a.example", &["CN=Corp CA"]),
            ("b.example", &["CN=Corp CA"])
        ])
    );
    let wait = waits(&h, RolloutStep::BreakLast);
    assert_eq!(wait.len(), 1, "{:?}", h.status().rollout);
    assert_eq!(wait[0].waiting_for, ["default.web-1", "default.web-2"]);

    let g_identity = generation(&h);
    h.ack(1, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(5));
    assert!(bundle(&h).contains_key("a.example"), "web-2 still may");
    h.ack(2, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(6));
    assert_eq!(bundle(&h), expect(&[("b.example", &["CN=Corp CA"])]));
    assert!(h.status().rollout.is_empty());
}

/// The served chain of `name`, as DER.
fn chain(h: &Harness, name: &str) -> Vec<Vec<u8>> {
    ::pem::parse_many(h.ready(name).chain_pem.as_bytes())
        .expect("pem")
        .iter()
        .map(|b| b.contents().to_vec())
        .collect()
}

/// The anchors of `trust_domain` in mesh `default`'s bundle, as DER.
fn anchors(h: &Harness, trust_domain: &str) -> Vec<Vec<u8>> {
    let snapshot = h.snapshots.borrow().clone();
    snapshot.meshes["default"].trust.by_trust_domain()[trust_domain]
        .iter()
        .map(|p| ::pem::parse(p).expect("pem").contents().to_vec())
        .collect()
}

#[test]
fn a_mesh_trust_resource_is_trusted_before_the_identity_it_makes_trusted_issues_and_leaves_break_last(
) {
    // Kuma's staged flow: the operator's CA (an intermediate under their root) issues for a MeshIdentity
    // that creates no MeshTrust; the operator publishes the root with a MeshTrust of their own.
    let (root, intermediate) = test_certs::intermediate("Corp Root", "Corp Issuing", t0());
    let partner = test_certs::ca("Partner Root", t0());
    let identity = format!(
        "---\n{}",
        provided_identity(
            "corp.example",
            &intermediate,
            "meshTrustCreation: Disabled, "
        )
        .replace("matchLabels: {}", "matchLabels: {app: web}")
    );
    let trusts = format!(
        "---\n{}---\n{}",
        test_certs::mesh_trust("corp", "corp.example", &[&root.cert_pem]),
        test_certs::mesh_trust("partner", "partner.example", &[&partner.cert_pem])
    );
    let mut h = Harness::new(LEGACY);
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.connect("client-1", &[], &[("kuma.io/service", "client")]);
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));

    h.update(&format!("{LEGACY}{identity}{trusts}"))
        .expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    let g_trust = generation(&h);
    let published = bundle(&h);
    assert_eq!(published["corp.example"], ["CN=Corp Root"]);
    assert_eq!(published["partner.example"], ["CN=Partner Root"]);
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default/web",
        "the MeshTrust must be ACKed before its CA's certificates are presented"
    );
    let wait = waits(&h, RolloutStep::TrustBeforeIdentity);
    assert!(
        wait.iter()
            .any(|w| w.ca == "CN=Corp Root"
                && w.waiting_for == ["default.client-1", "default.web-1"]),
        "{wait:?}"
    );

    h.ack(1, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default/web",
        "client-1 withholds its ACK"
    );
    h.ack(2, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(3));
    let expected = "spiffe://corp.example/workload/web-1";
    assert_eq!(h.ready("web-1").spiffe_id, expected);
    meshca_ca::verify_svid(
        &chain(&h, "web-1"),
        &anchors(&h, "corp.example"),
        &expected.parse().expect("valid id"),
        t0() + Duration::from_secs(3),
    )
    .expect("what web-1 presents verifies against the MeshTrust its peers hold");
    let g_identity = generation(&h);
    h.ack(1, Some(g_identity));
    h.ack(2, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(4));

    // Both MeshTrusts go: nobody presents a partner certificate, so it leaves at once; web-1 presents a
    // certificate under Corp Root, so that one stays (break last).
    h.update(&format!("{LEGACY}{identity}")).expect("valid");
    h.reconcile(t0() + Duration::from_secs(5));
    let published = bundle(&h);
    assert!(!published.contains_key("partner.example"), "{published:?}");
    assert_eq!(published["corp.example"], ["CN=Corp Root"]);
    let wait = waits(&h, RolloutStep::BreakLast);
    assert_eq!(wait.len(), 1, "{wait:?}");
    assert_eq!(
        (wait[0].ca.as_str(), wait[0].waiting_for.as_slice()),
        ("CN=Corp Root", ["default.web-1".to_owned()].as_slice())
    );
    assert!(h.disconnect(1));
    h.reconcile(t0() + Duration::from_secs(6));
    assert!(!bundle(&h).contains_key("corp.example"));
}

#[test]
fn replacing_a_provided_ca_appends_it_to_the_created_mesh_trust_and_both_stay_trusted() {
    let (x, y) = (test_certs::ca("CA X", t0()), test_certs::ca("CA Y", t0()));
    let resources = |ca: &TestCa| {
        format!(
            "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
            provided_identity(
                "corp.example",
                ca,
                "meshTrustCreation: Enabled, insecureAllowSelfSigned: true, "
            )
        )
    };
    let mut h = Harness::new(&resources(&x));
    h.connect("web-1", &[], &[]);
    h.connect("web-2", &[], &[]);
    h.reconcile(t0());
    let g = generation(&h);
    h.ack(1, Some(g));
    h.ack(2, Some(g));
    assert_eq!(bundle(&h), expect(&[("corp.example", &["CN=CA X"])]));

    h.update(&resources(&y)).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(
        bundle(&h),
        expect(&[("corp.example", &["CN=CA X", "CN=CA Y"])])
    );
    assert_eq!(
        issuer_of(&h.ready("web-1")),
        "CN=CA X",
        "Y is new to the bundles: trust before identity"
    );
    let g_trust = generation(&h);
    h.ack(1, Some(g_trust));
    h.ack(2, Some(g_trust));
    h.reconcile(t0() + Duration::from_secs(2));
    assert_eq!(issuer_of(&h.ready("web-1")), "CN=CA Y");
    let g_identity = generation(&h);
    h.ack(1, Some(g_identity));
    h.ack(2, Some(g_identity));
    h.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        bundle(&h),
        expect(&[("corp.example", &["CN=CA X", "CN=CA Y"])]),
        "X stays until the operator removes it from the record"
    );
    assert!(h.status().rollout.is_empty());

    let status = h.status();
    let listed = &status.meshes[0].mesh_trusts;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (
            listed[0].name.as_str(),
            listed[0].origin,
            listed[0].certificates,
            listed[0].keystore_path.as_deref()
        ),
        (
            "web",
            crate::TrustOrigin::Meshca,
            2,
            Some("meshtrust/default/web.yaml")
        )
    );
    let record = h
        .keystore
        .get_public("meshtrust/default/web.yaml")
        .expect("readable")
        .expect("written");
    let record = String::from_utf8(record).expect("UTF-8");
    assert_eq!(record.matches("BEGIN CERTIFICATE").count(), 2, "{record}");

    // The operator removes X from the record; the next load publishes Y alone.
    let x_pem = meshca_ca::TrustAnchor::parse_pem(x.cert_pem.as_bytes()).expect("a CA")[0]
        .pem
        .clone();
    let x_entry: String = x_pem.lines().map(|l| format!("          {l}\n")).collect();
    let without_x = record.replace(
        &format!("    # CN=CA X\n    - type: Pem\n      pem:\n        value: |\n{x_entry}"),
        "",
    );
    assert_ne!(without_x, record);
    h.keystore
        .put_public("meshtrust/default/web.yaml", without_x.as_bytes())
        .expect("written");
    h.update(&resources(&y)).expect("valid");
    h.reconcile(t0() + Duration::from_secs(4));
    assert_eq!(bundle(&h), expect(&[("corp.example", &["CN=CA Y"])]));
}

#[test]
fn a_corrupt_created_mesh_trust_rejects_the_update_and_the_previous_world_keeps_serving() {
    let yaml = format!(
        "type: Mesh\nname: default\nmeshServices:\n  mode: Exclusive\n---\n{}",
        workloads_identity("/workload/{{ .Workload }}", true)
    );
    let mut h = Harness::new(&yaml);
    h.connect("web-1", &[], &[]);
    h.reconcile(t0());
    let served = h.ready("web-1");
    let trusted = bundle(&h);
    h.keystore
        .put_public(
            "meshtrust/default/workloads.yaml",
            b"type: MeshTrust\nname: [",
        )
        .expect("written");
    let errors = h.update(&yaml).expect_err("the record is corrupt");
    assert!(
        errors.iter().any(
            |e| e.file == "keystore entry meshtrust/default/workloads.yaml"
                && e.resource == "MeshTrust/default/workloads"
        ),
        "{errors:?}"
    );
    h.owner.reject(errors, t0() + Duration::from_secs(1));
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.ready("web-1").chain_pem, served.chain_pem);
    assert_eq!(bundle(&h), trusted);
    let status = h.status();
    let rejected = status.last_rejected_update.as_ref().expect("shown");
    assert!(
        rejected.errors[0].to_string().starts_with(
            "keystore entry meshtrust/default/workloads.yaml: MeshTrust/default/workloads"
        ),
        "{}",
        rejected.errors[0]
    );
}
