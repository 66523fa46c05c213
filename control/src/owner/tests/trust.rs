//! What the mesh bundles trust and when: CAs ordered by trust domain, MeshTrust resources and the
//! MeshTrusts meshca creates, all through the rollout gate.

use super::*;
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
    h.status
        .borrow()
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
            "type: Mesh\nname: default\n---\n{}",
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
    h.owner.reconcile(t0());
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
    h.owner.reconcile(t0() + Duration::from_secs(1));
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
    assert_eq!(wait.len(), 1, "{:?}", h.status.borrow().rollout);
    assert_eq!(wait[0].waiting_for, ["default.web-1", "default.web-2"]);
    h.connect("new-1", &[], &[]);
    h.owner.reconcile(t0() + Duration::from_secs(2));
    assert!(
        matches!(h.entry("new-1"), ProxyEntry::Pending),
        "a new proxy waits too"
    );

    h.ack(1, Some(g_trust));
    h.owner.reconcile(t0() + Duration::from_secs(3));
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://a.example/workload/web-1",
        "web-2 has not ACKed the b.example entry"
    );
    h.ack(2, Some(g_trust));
    h.owner.reconcile(t0() + Duration::from_secs(4));
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
    assert_eq!(wait.len(), 1, "{:?}", h.status.borrow().rollout);
    assert_eq!(wait[0].waiting_for, ["default.web-1", "default.web-2"]);

    let g_identity = generation(&h);
    h.ack(1, Some(g_identity));
    h.owner.reconcile(t0() + Duration::from_secs(5));
    assert!(bundle(&h).contains_key("a.example"), "web-2 still may");
    h.ack(2, Some(g_identity));
    h.owner.reconcile(t0() + Duration::from_secs(6));
    assert_eq!(bundle(&h), expect(&[("b.example", &["CN=Corp CA"])]));
    assert!(h.status.borrow().rollout.is_empty());
}
