//! Where Kuma 2.14 and meshca read the same files, they mean the same identities: a MeshIdentity applies
//! only in a Mesh whose MeshServices are `Exclusive`, and a Dataplane file that a MeshIdentity reading
//! `kuma.io/workload` selects must carry that label.

use super::*;

/// LEGACY without `meshServices`: Kuma's default mode, `Disabled`.
fn legacy_without_mesh_services() -> String {
    let yaml = LEGACY.replace("meshServices:\n  mode: Exclusive\n", "");
    assert_ne!(yaml, LEGACY, "LEGACY sets the mode");
    yaml
}

/// Kuma's conditions of a MeshIdentity in a Mesh whose MeshServices are not `Exclusive`.
const MESH_SERVICES_DISABLED: [[&str; 4]; 2] = [
    [
        "DependenciesReady",
        "False",
        "MeshServicesDisabled",
        "MeshIdentity requires MeshServices to be enabled on the mesh. To enable, set \
         `spec.meshServices.mode: Exclusive` on the mesh.",
    ],
    [
        "Ready",
        "False",
        "Failure",
        "One of initialization steps failed",
    ],
];

#[test]
fn a_mesh_identity_applies_only_once_the_mesh_services_are_exclusive() {
    let disabled = format!(
        "{}---\n{}---\n{WEB_SERVICE}",
        legacy_without_mesh_services(),
        workloads_identity("/workload/{{ .Workload }}", true)
    );
    let mut h = Harness::new(&disabled);
    let web = h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    let generation = h.snapshots.borrow().generation;
    h.ack(web.0, Some(generation));
    let legacy = h.ready("web-1");
    assert_eq!(
        legacy.spiffe_id, "spiffe://default/web",
        "Kuma's legacy identity"
    );
    assert_eq!(legacy.identity_name, None);
    assert_eq!(conditions(&h.status(), "workloads"), MESH_SERVICES_DISABLED);
    let identity = h.status().meshes[0]
        .mesh_identities
        .iter()
        .find(|i| i.name == "workloads")
        .cloned()
        .expect("listed");
    assert_eq!(identity.provider, "Bundled");
    assert!(
        identity.ca.is_none(),
        "no CA is loaded for it: {identity:?}"
    );
    assert_eq!(
        h.status().meshes[0].mesh_trusts.len(),
        0,
        "nor a MeshTrust created"
    );
    for mode in ["Disabled", "Everywhere", "ReachableBackends"] {
        let yaml = disabled.replace(
            "name: default\nmtls:",
            &format!("name: default\nmeshServices:\n  mode: {mode}\nmtls:"),
        );
        assert_ne!(yaml, disabled);
        h.update(&yaml).expect("valid");
        h.reconcile(t0());
        assert_eq!(h.ready("web-1").spiffe_id, "spiffe://default/web", "{mode}");
        assert_eq!(conditions(&h.status(), "workloads"), MESH_SERVICES_DISABLED);
    }

    // The same files with `Exclusive`: the MeshIdentity applies, its CA trusted before it issues.
    let exclusive = format!(
        "{LEGACY}---\n{}---\n{WEB_SERVICE}",
        workloads_identity("/workload/{{ .Workload }}", true)
    );
    h.update(&exclusive).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default/web",
        "held until web-1 trusts the new CA"
    );
    let generation = h.snapshots.borrow().generation;
    h.ack(web.0, Some(generation));
    h.reconcile(t0() + Duration::from_secs(2));
    let applied = h.ready("web-1");
    assert_eq!(applied.spiffe_id, "spiffe://default/workload/web-1");
    assert_eq!(applied.identity_name.as_deref(), Some("workloads"));
    let ready = conditions(&h.status(), "workloads");
    assert_eq!(
        ready
            .last()
            .map(|c| [c[0].as_str(), c[1].as_str(), c[2].as_str()]),
        Some(["Ready", "True", "Ready"])
    );
}

#[test]
fn a_dataplane_file_without_the_workload_label_is_refused_when_its_mesh_identity_reads_it() {
    let unlabelled = WEB_SERVICE.replace(
        "labels: {app: web, kuma.io/workload: web-1}",
        "labels: {app: web}",
    );
    assert_ne!(unlabelled, WEB_SERVICE);
    let kuma_message =
        "missing required label 'kuma.io/workload' - dataplane is selected by MeshIdentity \
                        'workloads' with path template '/workload/{{ .Workload }}'";
    let yaml = format!(
        "{LEGACY}---\n{}---\n{unlabelled}",
        workloads_identity("/workload/{{ .Workload }}", true)
    );
    let mut h = Harness::new(&yaml);
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    // A dataplane only a token describes carries the label its token was minted with (the name).
    h.connect("api-1", &[], &[("kuma.io/service", "api")]);
    h.reconcile(t0());
    match h.entry("web-1") {
        ProxyEntry::Refused { reason } => assert_eq!(reason, kuma_message),
        other => panic!("web-1 is not refused: {other:?}"),
    }
    assert_eq!(
        dataplane(&h.status(), "web-1").reason.as_deref(),
        Some(kuma_message)
    );
    assert_eq!(
        h.ready("api-1").spiffe_id,
        "spiffe://default/workload/api-1"
    );

    // Kuma checks the MeshIdentity that selects the dataplane best whether or not it applies.
    let disabled = yaml.replace("meshServices:\n  mode: Exclusive\n", "");
    h.update(&disabled).expect("valid");
    h.reconcile(t0() + Duration::from_secs(1));
    assert_eq!(h.reason("web-1"), kuma_message);

    // A path that does not read the label leaves the dataplane alone, and so does the label itself.
    let by_app = yaml.replace("/workload/{{ .Workload }}", "/app/{{ label `app` }}");
    assert_ne!(by_app, yaml);
    h.update(&by_app).expect("valid");
    h.reconcile(t0() + Duration::from_secs(2));
    assert!(matches!(
        h.entry("web-1"),
        ProxyEntry::Pending | ProxyEntry::Ready(_)
    ));
    let spelled = yaml.replace("{{ .Workload }}", "{{ label `kuma.io/workload` }}");
    h.update(&spelled).expect("valid");
    h.reconcile(t0() + Duration::from_secs(3));
    assert!(
        h.reason("web-1")
            .starts_with("missing required label 'kuma.io/workload'"),
        "{}",
        h.reason("web-1")
    );
    h.update(&format!(
        "{LEGACY}---\n{}---\n{WEB_SERVICE}",
        workloads_identity("/workload/{{ .Workload }}", true)
    ))
    .expect("valid");
    h.reconcile(t0() + Duration::from_secs(4));
    assert!(
        !matches!(h.entry("web-1"), ProxyEntry::Refused { .. }),
        "labelled, web-1 is served"
    );
}

#[test]
fn a_mesh_identitys_zone_is_the_one_kuma_labelled_it_with() {
    // What `kumactl get meshidentities -o yaml` prints of one created in zone-1: Kuma renders
    // `{{ .Zone }}` in its trust domain from that label, whatever zone reads it.
    let identity = r#"type: MeshIdentity
name: identity
mesh: default
labels: {kuma.io/origin: zone, kuma.io/zone: zone-1, kuma.io/env: universal, kuma.io/mesh: default}
spec:
  selector: {dataplane: {matchLabels: {}}}
  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}
"#;
    let mut h = Harness::new(&format!("{LEGACY}---\n{identity}---\n{WEB_SERVICE}"));
    assert_eq!(h.settings.zone, "default", "this daemon's zone differs");
    h.connect("web-1", &[("app", "web")], &[("kuma.io/service", "web")]);
    h.reconcile(t0());
    assert_eq!(
        h.ready("web-1").spiffe_id,
        "spiffe://default.zone-1.mesh.local/workload/web-1"
    );
    let status = h.status();
    assert_eq!(
        status.meshes[0].mesh_identities[0].trust_domain,
        "default.zone-1.mesh.local"
    );
    // Without the label, this zone's name.
    let unlabelled = identity.replace("kuma.io/zone: zone-1, ", "");
    h.update(&format!("{LEGACY}---\n{unlabelled}---\n{WEB_SERVICE}"))
        .expect("valid");
    assert_eq!(
        h.status().meshes[0].mesh_identities[0].trust_domain,
        "default.default.mesh.local"
    );
}
