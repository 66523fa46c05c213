//! What `kumactl get ... -o yaml` and `kumactl export` print, read as Kuma wrote it: the output-only
//! fields (`kri`, a MeshService's `snis`, `creationTime`, `status`), lists wrapped in `items:`, and the
//! Insight resources, skipped with a note.

use super::*;

/// A Mesh as `kumactl get mesh default -o yaml` prints it (Kuma 2.14).
const MESH_PRINTED: &str = r#"type: Mesh
name: default
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
kri: kri_m____default_
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
"#;

const DATAPLANE_PRINTED: &str = r#"type: Dataplane
mesh: default
name: web-1
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
kri: kri_dp_default___web-1_
labels:
  kuma.io/workload: web
networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      tags:
        kuma.io/service: web
"#;

const MESH_SERVICE_PRINTED: &str = r#"type: MeshService
mesh: default
name: web
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
kri: kri_msvc_default___web_
snis:
  - sni.msvc.default...web.http
spec:
  selector:
    dataplaneTags:
      kuma.io/service: web
  ports:
    - port: 80
      targetPort: 8080
      appProtocol: http
status:
  addresses: []
"#;

#[test]
fn the_output_only_fields_kumactl_prints_are_read_and_ignored() {
    assert!(matches!(one(MESH_PRINTED), Resource::Mesh(m) if m.name == "default"));
    assert!(matches!(one(DATAPLANE_PRINTED), Resource::Dataplane(d) if d.name == "web-1"));
    assert!(matches!(one(MESH_SERVICE_PRINTED), Resource::MeshService(s) if s.name == "web"));
    let egress = "type: ZoneEgress\nname: egress\nkri: kri_zeg____egress_\nnetworking:\n  address: 10.0.0.9\n  port: 10002\n";
    assert!(matches!(one(egress), Resource::ZoneEgress(_)));
    let identity = "type: MeshIdentity\nmesh: default\nname: id\nkri: kri_mid_default___id_\nspec:\n  selector: {dataplane: {matchLabels: {}}}\n  spiffeID: {trustDomain: \"{{ .Mesh }}.mesh.local\", path: \"/{{ .Workload }}\"}\n  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}\n";
    assert!(matches!(one(identity), Resource::MeshIdentity(_)));
}

#[test]
fn snis_belong_to_a_meshservice_only() {
    let identity = "type: MeshIdentity\nmesh: default\nname: id\nsnis: [a]\nspec:\n  selector: {dataplane: {matchLabels: {}}}\n  spiffeID: {trustDomain: \"{{ .Mesh }}.mesh.local\", path: \"/{{ .Workload }}\"}\n  provider: {type: Bundled, bundled: {autogenerate: {enabled: true}}}\n";
    let error = one_error(identity);
    assert_error(&error, "snis", "a MeshIdentity has no snis");
    assert_eq!(error.resource.as_deref(), Some("MeshIdentity/default/id"));
}

#[test]
fn a_list_as_kumactl_prints_one_is_read_item_by_item() {
    let indent = |text: &str| {
        let mut lines = text.lines();
        let first = format!("  - {}\n", lines.next().unwrap_or_default());
        first + &lines.map(|l| format!("    {l}\n")).collect::<String>()
    };
    let list = format!(
        "items:\n{}{}next: null\ntotal: 2\n",
        indent(MESH_PRINTED),
        indent(DATAPLANE_PRINTED)
    );
    let resources = parse(&list).unwrap_or_else(|e| panic!("{e:#?}\n{list}"));
    assert_eq!(resources.len(), 2, "{resources:#?}");
    assert!(matches!(&resources[0], Resource::Mesh(m) if m.name == "default"));
    assert!(matches!(&resources[1], Resource::Dataplane(d) if d.name == "web-1"));

    // An error in an item names the item, the resource and the field.
    let bad = format!(
        "items:\n{}  - type: Dataplane\n    mesh: default\n    name: web-2\n    networking: {{address: 10.0.0.2, inbound: [{{port: 70000}}]}}\n",
        indent(MESH_PRINTED)
    );
    let errors = errors(&bad);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]
            .field
            .starts_with("items[1].networking.inbound[0]"),
        "{}",
        errors[0]
    );
    assert_eq!(
        errors[0].resource.as_deref(),
        Some("Dataplane/default/web-2")
    );
    assert_eq!(errors[0].document, 1);

    // A wrapper with anything else is refused, naming it.
    let error = one_error("items: []\nnext: null\ntotal: 0\nextra: 1\n");
    assert_error(&error, "items", "\"extra\" is not one of them");
    assert_error(
        &one_error("items: 3\n"),
        "items",
        "must be a list of resources",
    );
    assert_eq!(
        parse("items: []\ntotal: 0\n").expect("an empty list").len(),
        0
    );
}

#[test]
fn insights_are_skipped_with_one_note_per_file() {
    let dir = tempfile::tempdir().expect("a directory");
    let export = format!(
        "{MESH_PRINTED}---\ntype: MeshInsight\nname: default\ndataplanes: {{total: 1}}\n---\ntype: DataplaneInsight\nmesh: default\nname: web-1\nsubscriptions: []\n---\ntype: DataplaneInsight\nmesh: default\nname: web-2\nsubscriptions: []\n"
    );
    std::fs::write(dir.path().join("export.yaml"), export).expect("written");
    let resources = load_dir(dir.path(), &LoadLimits::default()).expect("valid");
    assert_eq!(resources.meshes.len(), 1);
    assert_eq!(resources.notes.len(), 1, "{:#?}", resources.notes);
    let note = &resources.notes[0];
    assert!(note.file.ends_with("export.yaml"));
    assert!(
        note.message.contains("DataplaneInsight, MeshInsight") && note.message.contains("skipped"),
        "{note}"
    );
}

/// A Mesh whose provided backend names Secrets, and those Secrets, as `kumactl export --include-admin`
/// writes them.
fn exported(cert_data: &str, key_secret: &str) -> String {
    format!(
        "type: Mesh\nname: default\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - name: ca-1\n      type: provided\n      conf:\n        cert: {{secret: default.ca-builtin-cert-ca-1}}\n        key: {{secret: {key_secret}}}\n        skipValidation: true\n---\ntype: Secret\nmesh: default\nname: default.ca-builtin-cert-ca-1\ndata: {cert_data}\n---\ntype: Secret\nmesh: default\nname: default.ca-builtin-key-ca-1\nkri: kri_sec_default___default.ca-builtin-key-ca-1_\ndata: a2V5LWJ5dGVz\n"
    )
}

#[test]
fn secret_data_sources_are_resolved_from_the_meshs_secrets() {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(
        dir.path().join("export.yaml"),
        exported("Y2VydC1ieXRlcw==", "default.ca-builtin-key-ca-1"),
    )
    .expect("written");
    let resources = load_dir(dir.path(), &LoadLimits::default()).expect("valid");
    assert_eq!(resources.secrets.len(), 2);
    let backend = &resources.meshes["default"]
        .mtls
        .as_ref()
        .expect("mtls")
        .backends[0];
    let BackendKind::Provided { cert, key } = &backend.kind else {
        panic!("provided: {backend:?}");
    };
    assert_eq!(cert.read(1 << 20).expect("resolved"), b"cert-bytes");
    assert_eq!(key.read(1 << 20).expect("resolved"), b"key-bytes");
    // Key material never shows in Debug.
    let debug = format!("{:?} {:?} {key:?}", resources.secrets, resources.meshes);
    assert!(
        !debug.contains("key-bytes") && !debug.contains("a2V5LWJ5dGVz"),
        "{debug}"
    );
}

#[test]
fn a_missing_or_unreadable_secret_is_refused_naming_the_field_and_never_quoting_it() {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("export.yaml");
    std::fs::write(
        &file,
        exported("Y2VydC1ieXRlcw==", "default.ca-builtin-key-ca-2"),
    )
    .expect("written");
    let errors = load_dir(dir.path(), &LoadLimits::default()).expect_err("refused");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert_error(
        &errors[0],
        "mtls.backends[0].conf.key.secret",
        "no Secret named \"default.ca-builtin-key-ca-2\" in mesh \"default\"",
    );
    assert_eq!(errors[0].resource.as_deref(), Some("Mesh/default"));

    std::fs::write(
        &file,
        exported("c2VjcmV0!!not-base64", "default.ca-builtin-key-ca-1"),
    )
    .expect("written");
    let errors = load_dir(dir.path(), &LoadLimits::default()).expect_err("refused");
    let error = errors
        .iter()
        .find(|e| e.field == "data")
        .expect("the data field");
    assert_eq!(
        error.resource.as_deref(),
        Some("Secret/default/default.ca-builtin-cert-ca-1")
    );
    assert!(
        error.message.contains("not base64") && !error.message.contains("c2VjcmV0"),
        "{error}"
    );

    // A Secret of another mesh is not the Mesh's.
    let other = exported("Y2VydC1ieXRlcw==", "default.ca-builtin-key-ca-1").replace(
        "mesh: default\nname: default.ca-builtin-key-ca-1",
        "mesh: other\nname: default.ca-builtin-key-ca-1",
    ) + "---\ntype: Mesh\nname: other\n";
    std::fs::write(&file, other).expect("written");
    let errors = load_dir(dir.path(), &LoadLimits::default()).expect_err("refused");
    assert!(
        errors
            .iter()
            .any(|e| e.field == "mtls.backends[0].conf.key.secret"),
        "{errors:#?}"
    );

    // Bounded: a Secret over MAX_SECRET_BYTES is refused.
    let big = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        vec![7u8; MAX_SECRET_BYTES + 1],
    );
    let error = one_error(&format!(
        "type: Secret\nmesh: default\nname: big\ndata: {big}\n"
    ));
    assert_error(&error, "data", "a Secret holds at most");
}
