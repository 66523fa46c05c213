//! The same files mean the same identities in meshca and Kuma 2.14, read as `kumactl get ... -o yaml`
//! prints them: a MeshIdentity in a Mesh whose MeshServices are not `Exclusive` is not applied (status
//! `DependenciesReady=False/MeshServicesDisabled`, `Ready=False/Failure`, a warning from `meshca
//! validate`) and its dataplanes keep Kuma's legacy identity; once the Mesh says `Exclusive`, they move
//! to the MeshIdentity's; and a Dataplane file without `kuma.io/workload` that such a MeshIdentity
//! selects is refused with Kuma's message.

mod common;

use common::{pem_certs, uri_sans, wait_for, Env};
use serde_json::Value;

/// Mesh `default` as `kumactl get mesh default -o yaml` prints it, with a builtin backend and no
/// `meshServices` (Kuma's default mode, `Disabled`).
const MESH: &str = r#"type: Mesh
name: default
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
kri: kri_m____default_
mtls:
  enabledBackend: ca-1
  backends:
    - name: ca-1
      type: builtin
"#;

/// A MeshIdentity as Kuma prints it, selecting every dataplane, with Kuma's universal defaults.
const IDENTITY: &str = r#"type: MeshIdentity
name: identity
mesh: default
creationTime: "2026-12-01T10:00:00Z"
modificationTime: "2026-12-01T10:00:00Z"
kri: kri_mid_default___identity_
labels:
  kuma.io/mesh: default
  kuma.io/origin: zone
spec:
  selector:
    dataplane:
      matchLabels: {}
  spiffeID:
    trustDomain: "{{ .Mesh }}.{{ .Zone }}.mesh.local"
    path: "/workload/{{ .Workload }}"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Enabled
      autogenerate:
        enabled: true
"#;

/// `web-1`, labelled `kuma.io/workload: web` as `kumactl generate dataplane-token --workload web` needs,
/// and `old-1`, written before the label existed.
const DATAPLANES: &str = r#"type: Dataplane
mesh: default
name: web-1
kri: kri_dp_default___web-1_
labels:
  kuma.io/workload: web
networking:
  address: 10.0.0.1
  inbound:
    - port: 8080
      tags:
        kuma.io/service: web
---
type: Dataplane
mesh: default
name: old-1
kri: kri_dp_default___old-1_
networking:
  address: 10.0.0.2
  inbound:
    - port: 8080
      tags:
        kuma.io/service: old
"#;

const KUMA_REFUSAL: &str = "missing required label 'kuma.io/workload' - dataplane is selected by \
                            MeshIdentity 'identity' with path template '/workload/{{ .Workload }}'";

fn conditions(status: &Value) -> Vec<[String; 3]> {
    let identity = status["meshes"][0]["mesh_identities"]
        .as_array()
        .and_then(|ids| ids.iter().find(|i| i["name"] == "identity"))
        .unwrap_or_else(|| panic!("MeshIdentity identity is listed: {status}"));
    identity["conditions"]
        .as_array()
        .unwrap_or_else(|| panic!("conditions: {identity}"))
        .iter()
        .map(|c| {
            [
                c["type"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            ]
        })
        .collect()
}

fn spiffe_id(env: &Env, token: &common::Token) -> String {
    let chain = pem_certs(&env.fetch_identity(token));
    uri_sans(&chain[0]).remove(0)
}

#[test]
fn a_mesh_identity_waits_for_exclusive_mesh_services_and_a_file_without_the_workload_label_is_refused(
) {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH);
    env.write_resource("identity.yaml", IDENTITY);
    env.write_resource("dataplanes.yaml", DATAPLANES);

    let validated = env.cli(&["validate", "--config", env.cfg(), "--output", "json"]);
    assert_eq!(validated.code(), Some(0), "{validated}");
    let report = validated.json();
    let warning = report["warnings"]
        .as_array()
        .and_then(|w| {
            w.iter()
                .find(|w| w["resource"] == "MeshIdentity/default/identity")
        })
        .unwrap_or_else(|| panic!("the MeshIdentity is warned about: {report}"));
    let message = warning["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("MeshServicesDisabled")
            && message.contains("meshServices: {mode: Exclusive}"),
        "{warning}"
    );
    assert_eq!(
        warning["file"],
        env.root()
            .join("resources/identity.yaml")
            .display()
            .to_string()
    );
    let refused = report["warnings"]
        .as_array()
        .and_then(|w| {
            w.iter()
                .find(|w| w["resource"] == "Dataplane/default/old-1")
        })
        .unwrap_or_else(|| panic!("old-1's refusal is warned about before it connects: {report}"));
    assert_eq!(refused["field"], "labels", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .starts_with(KUMA_REFUSAL),
        "{refused}"
    );
    assert!(
        !report["warnings"]
            .to_string()
            .contains("Dataplane/default/web-1"),
        "web-1 is labelled: {report}"
    );

    let daemon = env.start();
    let status = daemon.admin_json("/api/status");
    assert_eq!(
        conditions(&status),
        [
            ["DependenciesReady", "False", "MeshServicesDisabled"],
            ["Ready", "False", "Failure"]
        ]
        .map(|c| c.map(str::to_owned)),
        "Kuma's conditions"
    );
    let human = env.cli(&["status", "--admin", &env.admin.to_string()]).ok();
    assert!(
        human.stdout.contains(
            "Ready=False/Failure; DependenciesReady=False/MeshServicesDisabled: MeshIdentity requires \
             MeshServices to be enabled on the mesh."
        ),
        "`meshca status` says why the MeshIdentity is not Ready: {human}"
    );
    let web = env.token("default", "web-1", &["--label", "kuma.io/workload=web"]);
    assert_eq!(
        spiffe_id(&env, &web),
        "spiffe://default/web",
        "Kuma's legacy identity while the MeshIdentity is not applied"
    );
    // Kuma refuses old-1 even now: its check reads the MeshIdentity whether or not it applies.
    let old = env.token("default", "old-1", &[]);
    let refused = env.fetch(&old, &["default"]);
    assert_ne!(refused.code(), Some(0), "{refused}");
    assert!(
        refused.stderr.contains("PermissionDenied") && refused.stderr.contains(KUMA_REFUSAL),
        "{refused}"
    );
    assert!(!refused.stdout.contains("BEGIN CERTIFICATE"), "{refused}");

    // The Mesh as Kuma needs it: the MeshIdentity applies and web-1 moves to its identity.
    env.write_resource(
        "mesh.yaml",
        &MESH.replace("mtls:\n", "meshServices:\n  mode: Exclusive\nmtls:\n"),
    );
    daemon.wait_json("/api/status", "the MeshIdentity to be Ready", |s| {
        conditions(s)
            .iter()
            .any(|c| c == &["Ready", "True", "Ready"].map(str::to_owned))
            .then_some(())
    });
    let moved = wait_for("web-1 to present the MeshIdentity's ID", || {
        let id = spiffe_id(&env, &web);
        (id != "spiffe://default/web").then_some(id)
    });
    assert_eq!(moved, "spiffe://default.default.mesh.local/workload/web");
    let refused = env.fetch(&old, &["default"]);
    assert!(refused.stderr.contains(KUMA_REFUSAL), "{refused}");
    let dataplanes = daemon.admin_json("/api/dataplanes/default/old-1");
    assert!(
        dataplanes
            .to_string()
            .contains("missing required label 'kuma.io/workload'"),
        "the status says why old-1 is refused: {dataplanes}"
    );
}
