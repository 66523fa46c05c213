//! The zone egress end to end: a `zone-egress` token gets the default mesh's identity, sidecars get its
//! bundle, and the operator moves it to another mesh by editing `defaults.mesh` and sending SIGHUP.

mod common;

use std::process::Command;

use common::{wait_for, Env};
use serde_json::Value;

const MESHES: &str = r#"
type: Mesh
name: default
meshServices:
  mode: Exclusive
---
type: Mesh
name: other
meshServices:
  mode: Exclusive
---
type: MeshIdentity
name: default-all
mesh: default
spec:
  selector: {dataplane: {matchLabels: {}}}
  spiffeID: {trustDomain: default.mesh, path: "/workload/{{ .Workload }}"}
  provider: {type: Bundled, bundled: {meshTrustCreation: Enabled, autogenerate: {enabled: true}}}
---
type: MeshIdentity
name: other-all
mesh: other
spec:
  selector: {dataplane: {matchLabels: {}}}
  spiffeID: {trustDomain: other.mesh, path: "/workload/{{ .Workload }}"}
  provider: {type: Bundled, bundled: {meshTrustCreation: Enabled, autogenerate: {enabled: true}}}
"#;

fn sighup(pid: u32) {
    let status = Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
}

/// The SPIFFE ID of the first certificate of a PEM chain, through `meshca inspect`.
fn spiffe_id(env: &Env, chain: &str) -> String {
    env.inspect(chain)[0]["spiffe_ids"][0]
        .as_str()
        .expect("a SPIFFE ID")
        .to_owned()
}

/// Trust domains and SAN matchers of a fetched validation context.
fn context(secret: &Value) -> (Vec<String>, Vec<String>) {
    let view = &secret["validation_context"];
    let domains = view["spiffe_trust_domains"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    let sans = view["subject_alt_names"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    (domains, sans)
}

#[test]
fn the_egress_follows_defaults_mesh_changed_by_sighup() {
    let env = Env::new();
    env.write_resource("meshes.yaml", MESHES);
    let daemon = env.start_logging("info");
    let egress = env.token("default", "egress-1", &["--type", "zone-egress"]);
    let sidecar = env.token("other", "api-1", &["--tag", "kuma.io/service=api"]);

    // Without defaults.mesh, the mesh named default gives the egress its identity.
    let chain = env.fetch_identity(&egress);
    assert_eq!(
        spiffe_id(&env, &chain),
        "spiffe://default.mesh/workload/egress-1"
    );
    let status = daemon.admin_json("/api/status");
    assert_eq!(status["egress"]["mesh"], "default", "{status}");
    assert_eq!(status["egress"]["chosen_by"], "named-default", "{status}");
    // A sidecar of the other mesh validates the egress with the egress CA and the egress ID only.
    let secrets = env.fetch_ok(&sidecar, &["system_trust_bundle_egress"]);
    assert_eq!(
        context(&secrets["system_trust_bundle_egress"]),
        (
            vec!["default.mesh".to_owned()],
            vec!["spiffe://default.mesh/workload/egress-1".to_owned()]
        )
    );
    // The egress trusts the sidecars of every mesh.
    let all = env.fetch_ok(&egress, &["ALL"]);
    assert_eq!(
        context(&all["ALL"]).0,
        ["default.mesh".to_owned(), "other.mesh".to_owned()]
    );

    // The operator names `other` in the settings file and sends SIGHUP.
    let settings = std::fs::read_to_string(&env.config).expect("readable");
    std::fs::write(
        &env.config,
        format!("{settings}defaults: {{mesh: other}}\n"),
    )
    .expect("writable");
    sighup(daemon.pid());
    daemon.wait_json("/api/status", "the egress to move to mesh other", |s| {
        (s["egress"]["mesh"] == "other").then_some(())
    });
    // Its certificate from `other` is issued in the background; until it is, a fetch still gets the
    // one from `default`, which is valid and trusted.
    wait_for("the egress certificate from mesh other", || {
        let chain = env.fetch_identity(&egress);
        (spiffe_id(&env, &chain) == "spiffe://other.mesh/workload/egress-1").then_some(())
    });
    let status = daemon.admin_json("/api/status");
    assert_eq!(status["egress"]["chosen_by"], "setting", "{status}");

    // Other settings are not applied while serving; the log says so.
    let settings = std::fs::read_to_string(&env.config).expect("readable");
    std::fs::write(
        &env.config,
        format!("{settings}issuance: {{renewAt: 0.7}}\n"),
    )
    .expect("writable");
    sighup(daemon.pid());
    wait_for("the restart warning", || {
        daemon
            .log()
            .contains("take effect when meshca restarts")
            .then_some(())
    });
}

#[test]
fn without_an_eligible_identity_the_egress_is_told_why() {
    let env = Env::new();
    env.write_resource(
        "meshes.yaml",
        "type: Mesh\nname: alpha\nmeshServices:\n  mode: Exclusive\n---\ntype: Mesh\nname: beta\nmeshServices:\n  mode: Exclusive\n",
    );
    let daemon = env.start();
    let egress = env.token("alpha", "egress-1", &["--type", "zone-egress"]);
    let run = env.fetch(&egress, &["default"]);
    assert_ne!(run.code(), Some(0), "{run}");
    assert!(run.stderr.contains("set defaults.mesh"), "{run}");
    let status = daemon.admin_json("/api/status");
    let reason = status["egress"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("none is named default"), "{status}");
    let admin = env.admin.to_string();
    let status = env.cli(&["status", "--admin", &admin]);
    assert!(
        status.stdout.contains("zone egress identity: none:"),
        "{status}"
    );
}
