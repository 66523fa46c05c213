//! The keystore across restarts: every persisted CA is reused, keys are 0600 in 0700 directories, and a
//! damaged CA stops the daemon instead of being silently replaced.

mod common;

use common::{mode, walk, Env, DATAPLANE_WEB_1, MESH_BUILTIN};

/// A MeshIdentity with its own generated CA, published as a MeshTrust of the mesh (a second CA to reuse).
const API_IDENTITY: &str = r#"
type: MeshIdentity
name: api-id
mesh: default
spec:
  selector: {dataplane: {matchLabels: {app: api}}}
  spiffeID:
    trustDomain: "{{ .Mesh }}.{{ .Zone }}.mesh.local"
    path: "/workload/{{ .Workload }}"
  provider:
    type: Bundled
    bundled:
      meshTrustCreation: Enabled
      certificateParameters: {expiry: 24h}
      autogenerate: {enabled: true}
"#;

/// The persisted CA of backend `ca-1` of mesh `default`.
fn backend_ca_dir(env: &Env) -> std::path::PathBuf {
    env.keystore().join("ca/default/backend/ca-1")
}

fn env_with_two_cas() -> Env {
    let env = Env::with_settings("zone: zone-1\n");
    env.write_resource("mesh.yaml", &format!("{MESH_BUILTIN}---{API_IDENTITY}"));
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    env
}

#[test]
fn restart_reuses_every_ca_and_keystore_permissions_are_strict() {
    let env = env_with_two_cas();
    let daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    let names = ["system_trust_bundle", "mesh_ca:secret:default", "ALL"];
    let before = env.fetch_ok(&token, &names);
    let domains = before["system_trust_bundle"]["validation_context"]["spiffe_trust_domains"]
        .as_object()
        .expect("system_trust_bundle is a SPIFFE validator");
    assert!(
        domains.contains_key("default"),
        "the backend CA's trust domain: {before:?}"
    );
    assert!(
        domains.contains_key("default.zone-1.mesh.local"),
        "the MeshIdentity's CA (meshTrustCreation: Enabled) is trusted in the mesh: {before:?}"
    );
    // The MeshTrust meshca created for the MeshIdentity: in the keystore, and listed by the admin API.
    let record = env.keystore().join("meshtrust/default/api-id.yaml");
    let text = std::fs::read_to_string(&record).expect("the created MeshTrust is in the keystore");
    assert!(
        text.contains("type: MeshTrust") && text.contains("trustDomain: default.zone-1.mesh.local"),
        "{text}"
    );
    let meshes = daemon.admin_json("/api/meshes");
    let created = meshes[0]["mesh_trusts"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["origin"] == "meshca"))
        .unwrap_or_else(|| panic!("no created MeshTrust listed: {meshes}"));
    assert_eq!(created["name"], "api-id", "{created}");
    assert_eq!(created["certificates"], 1, "{created}");
    assert_eq!(
        created["keystore_path"], "meshtrust/default/api-id.yaml",
        "{created}"
    );
    let ca_files_before: Vec<(std::path::PathBuf, Vec<u8>)> = walk(&env.keystore())
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).expect("readable keystore file");
            (p, bytes)
        })
        .collect();
    let status = daemon.stop();
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean exit");

    let daemon = env.start();
    // The token signing key was reused too: the old token still authenticates.
    let after = env.fetch_ok(&token, &names);
    for name in names {
        assert_eq!(
            before[name], after[name],
            "trust bundle {name} changed across a restart: a CA was regenerated"
        );
    }
    for (path, bytes) in &ca_files_before {
        if path.file_name().is_some_and(|n| n == ".#lock") {
            continue;
        }
        assert_eq!(
            &std::fs::read(path).expect("the keystore file still exists"),
            bytes,
            "{} changed across a restart",
            path.display()
        );
    }
    let log = daemon.log();
    assert!(
        !log.contains("generated a new CA"),
        "the second start generated a CA: {log}"
    );
    assert_eq!(daemon.stop().code(), Some(0));

    // Permissions: every directory 0700, every key file 0600, nothing group/world writable.
    let mut keys = 0;
    assert_eq!(mode(&env.keystore()), 0o700, "the keystore directory");
    for path in walk(&env.keystore()) {
        let m = mode(&path);
        if path.is_dir() {
            assert_eq!(m, 0o700, "directory {}", path.display());
            continue;
        }
        assert_eq!(m & 0o022, 0, "{} is writable by others", path.display());
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.contains("key") || name.ends_with(".p8") {
            keys += 1;
            assert_eq!(m, 0o600, "key file {}", path.display());
        }
    }
    // The backend CA, the MeshIdentity CA, the SDS CA and the token signing key.
    assert!(keys >= 4, "expected at least 4 key files, found {keys}");
}

/// Starts the daemon once so the CA of backend `ca-1` is persisted, then stops it.
fn env_with_persisted_ca() -> Env {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    let daemon = env.start();
    assert_eq!(daemon.stop().code(), Some(0));
    assert!(backend_ca_dir(&env).join("key.pem").is_file());
    env
}

#[test]
fn corrupted_ca_key_stops_the_start_and_is_never_replaced() {
    let env = env_with_persisted_ca();
    let dir = backend_ca_dir(&env);
    let cert_before = std::fs::read(dir.join("cert.pem")).expect("the CA cert was persisted");
    let garbage = b"this is not a key\n";
    std::fs::write(dir.join("key.pem"), garbage).expect("the key file is writable by its owner");
    assert_eq!(
        mode(&dir.join("key.pem")),
        0o600,
        "overwriting kept the mode"
    );

    let run = env.cli(&["serve", "--config", env.cfg()]);
    assert_ne!(run.code(), Some(0), "{run}");
    assert!(
        run.code().is_some(),
        "exited by itself, not by a signal: {run}"
    );
    let err = &run.stderr;
    assert!(
        err.contains("ca/default/backend/ca-1"),
        "names the CA: {run}"
    );
    assert!(err.contains("key"), "says the key is the problem: {run}");
    assert!(
        err.contains("not replaced"),
        "says it will not replace it: {run}"
    );
    assert!(
        !err.contains("generated a new CA"),
        "a new CA was generated: {run}"
    );

    assert_eq!(
        std::fs::read(dir.join("cert.pem")).expect("the cert is still there"),
        cert_before,
        "the CA certificate was replaced"
    );
    assert_eq!(
        std::fs::read(dir.join("key.pem")).expect("the key file is still there"),
        garbage,
        "the damaged key was replaced"
    );
}

#[test]
fn missing_ca_key_stops_the_start_and_is_never_replaced() {
    let env = env_with_persisted_ca();
    let dir = backend_ca_dir(&env);
    let cert_before = std::fs::read(dir.join("cert.pem")).expect("the CA cert was persisted");
    std::fs::remove_file(dir.join("key.pem")).expect("the key file can be removed");

    let run = env.cli(&["serve", "--config", env.cfg()]);
    assert_ne!(run.code(), Some(0), "{run}");
    assert!(run.stderr.contains("ca/default/backend/ca-1"), "{run}");
    assert_eq!(
        std::fs::read(dir.join("cert.pem")).expect("the cert is still there"),
        cert_before
    );
    assert!(
        !dir.join("key.pem").exists(),
        "a new key was generated beside the old certificate"
    );
}
