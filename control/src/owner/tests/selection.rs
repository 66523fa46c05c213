//! Which MeshIdentity a dataplane gets: selectors, and Spire identities that meshca must not shadow.

use super::*;

/// web-1 (`app: web`, service `web`) and s-1 (`app: web, team: spire`, service `s`).
fn connect_both(h: &mut Harness) {
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.connect(
        "s-1",
        &[("app", "web"), ("team", "spire")],
        &[("kuma.io/service", "s")],
    );
}

#[test]
fn a_dataplane_whose_best_identity_is_spire_gets_no_certificate_from_meshca() {
    let yaml = format!(
        "{LEGACY}---\n{}---\n{}",
        workloads_identity("/workload/{{ .Workload }}", true),
        r#"type: MeshIdentity
name: spire
mesh: default
spec:
  selector: {dataplane: {matchLabels: {team: spire}}}
  provider: {type: Spire}
"#
    );
    let mut h = Harness::new(&yaml);
    connect_both(&mut h);
    h.reconcile(t0());
    assert_eq!(
        h.ready("web-1").identity_name.as_deref(),
        Some("workloads"),
        "the broader Bundled identity issues where Spire does not select"
    );
    // Neither the less specific MeshIdentity nor the legacy backend issues for s-1.
    let reason = h.reason("s-1");
    assert!(
        reason.contains("MeshIdentity spire") && reason.contains("SPIRE"),
        "{reason}"
    );
    let status = h.status();
    let spire = status.meshes[0]
        .mesh_identities
        .iter()
        .find(|i| i.name == "spire")
        .expect("listed");
    assert_eq!(spire.provider, "Spire");
    assert!(
        spire
            .conditions
            .iter()
            .any(|c| c.kind == "Ready" && c.status == "True" && c.reason == "ManagedExternally"),
        "{:?}",
        spire.conditions
    );
    assert_eq!(
        status.meshes[0].proxies_by_issuer.values().sum::<usize>(),
        1,
        "s-1 holds no meshca certificate: {:?}",
        status.meshes[0].proxies_by_issuer
    );
}

#[test]
fn a_dataplane_whose_best_identity_cannot_render_its_id_gets_no_other_certificate() {
    // Kuma's Kubernetes path on a mesh that also runs universal dataplanes, which lack the namespace
    // and service-account labels; legacy mTLS and a broader MeshIdentity could both issue for them.
    let yaml = format!(
        "{LEGACY}---\n{}---\n{}",
        workloads_identity("/workload/{{ .Workload }}", true),
        r#"type: MeshIdentity
name: by-account
mesh: default
spec:
  selector: {dataplane: {matchLabels: {team: shop}}}
  spiffeID: {path: "/ns/{{ .Namespace }}/sa/{{ .ServiceAccount }}"}
  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}
"#
    );
    let mut h = Harness::new(&yaml);
    h.connect(
        "pod-1",
        &[
            ("team", "shop"),
            ("k8s.kuma.io/namespace", "shop"),
            ("k8s.kuma.io/service-account", "cart"),
        ],
        &[("kuma.io/service", "cart")],
    );
    h.connect("vm-1", &[("team", "shop")], &[("kuma.io/service", "cart")]);
    h.reconcile(t0());
    let pod = h.ready("pod-1");
    assert_eq!(
        pod.spiffe_id,
        "spiffe://default.default.mesh.local/ns/shop/sa/cart"
    );
    assert_eq!(pod.identity_name.as_deref(), Some("by-account"));

    // Neither the broader MeshIdentity nor the legacy backend issues for vm-1; its status says why.
    let reason = h.reason("vm-1");
    assert!(
        reason.contains("MeshIdentity by-account")
            && reason.contains("does not render")
            && reason.contains("k8s.kuma.io/namespace"),
        "{reason}"
    );
    let status = h.status();
    let vm = dataplane(&status, "vm-1");
    assert_eq!(vm.reason.as_deref(), Some(reason.as_str()));
    assert_eq!((&vm.issuer, &vm.spiffe_id), (&None, &None), "{vm:?}");
    assert_eq!(
        status.meshes[0].proxies_by_issuer,
        BTreeMap::from([("MeshIdentity by-account".to_owned(), 1)]),
        "only pod-1 holds a certificate"
    );
}

#[test]
fn empty_match_labels_select_every_dataplane_and_an_empty_selector_selects_none() {
    let bundled = "provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}";
    let none = format!(
        "type: MeshIdentity\nname: empty-selector\nmesh: default\nspec:\n  selector: {{}}\n  {bundled}\n---\ntype: MeshIdentity\nname: no-selector\nmesh: default\nspec:\n  {bundled}\n"
    );
    let mut h = Harness::new(&format!("{LEGACY}---\n{none}"));
    connect_both(&mut h);
    h.reconcile(t0());
    for name in ["web-1", "s-1"] {
        let id = h.ready(name);
        assert_eq!(
            id.identity_name, None,
            "{name}: no MeshIdentity selects it, the legacy backend issues"
        );
    }

    let all = format!(
        "type: MeshIdentity\nname: all\nmesh: default\nspec:\n  selector: {{dataplane: {{matchLabels: {{}}}}}}\n  {bundled}\n"
    );
    h.update(&format!("{LEGACY}---\n{none}---\n{all}"))
        .expect("valid");
    for step in 1..=2 {
        let now = t0() + Duration::from_secs(step);
        h.reconcile(now);
        let g = generation(&h);
        h.ack(1, Some(g));
        h.ack(2, Some(g));
    }
    h.reconcile(t0() + Duration::from_secs(3));
    for name in ["web-1", "s-1"] {
        assert_eq!(
            h.ready(name).identity_name.as_deref(),
            Some("all"),
            "{name}: matchLabels: {{}} selects it"
        );
    }
}

#[test]
fn a_dataplane_whose_best_identity_is_an_extension_gets_no_certificate_from_meshca() {
    let yaml = format!(
        "{LEGACY}---\n{}---\n{}",
        workloads_identity("/workload/{{ .Workload }}", true),
        r#"type: MeshIdentity
name: ext
mesh: default
spec:
  selector: {dataplane: {matchLabels: {team: spire}}}
  provider:
    type: Extension
    extension: {name: my-provider, config: {endpoint: "https://ca.example"}}
"#
    );
    let mut h = Harness::new(&yaml);
    connect_both(&mut h);
    h.reconcile(t0());
    assert_eq!(
        h.ready("web-1").identity_name.as_deref(),
        Some("workloads"),
        "the Bundled identity issues where the extension does not select"
    );
    // The most specific identity wins, as for any provider: neither the broader MeshIdentity nor
    // the legacy backend issues for s-1.
    let reason = h.reason("s-1");
    assert!(
        reason.contains("MeshIdentity ext") && reason.contains("managed by extension my-provider"),
        "{reason}"
    );
    let status = h.status();
    let ext = status.meshes[0]
        .mesh_identities
        .iter()
        .find(|i| i.name == "ext")
        .expect("listed");
    assert_eq!(ext.provider, "Extension");
    assert!(
        ext.conditions.iter().any(|c| c.kind == "Ready"
            && c.reason == "ManagedExternally"
            && c.message == "certificates are issued by extension my-provider"),
        "{:?}",
        ext.conditions
    );
    assert_eq!(
        dataplane(&status, "s-1").reason.as_deref(),
        Some(reason.as_str())
    );
    assert_eq!(
        status.meshes[0].proxies_by_issuer,
        BTreeMap::from([("MeshIdentity workloads".to_owned(), 1)]),
        "s-1 holds no meshca certificate"
    );
}
