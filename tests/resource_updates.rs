//! Resource updates while the daemon runs: an invalid update is rejected whole, the previous configuration
//! keeps serving, and fixing the file clears the rejection.

mod common;

use common::{wait_for, Env, DATAPLANE_WEB_1, MESH_BUILTIN};
use serde_json::Value;

/// The `default` mesh with an enabledBackend that names no backend.
const MESH_BROKEN: &str = "\
type: Mesh
name: default
meshServices:
  mode: Exclusive
mtls:
  enabledBackend: ca-missing
  backends:
    - name: ca-1
      type: builtin
      dpCert: {rotation: {expiration: 1d}}
      conf: {caCert: {expiration: 10y}}
";

/// A Dataplane `default/api-1`.
const DATAPLANE_API_1: &str = "\
type: Dataplane
mesh: default
name: api-1
labels: {app: api}
networking:
  address: 10.0.0.2
  inbound: [{port: 8080, tags: {kuma.io/service: api}}]
";

/// The value of `meshca_rejected_updates_total`.
fn rejected_updates(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with("meshca_rejected_updates_total"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn serial_of(env: &Env, chain_pem: &str) -> String {
    let certs = env.inspect(chain_pem);
    certs[0]["serial"]
        .as_str()
        .expect("inspect prints a serial")
        .to_owned()
}

#[test]
fn invalid_update_is_rejected_whole_and_fixing_it_clears_the_rejection() {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    let daemon = env.start();
    assert_eq!(daemon.admin_json("/api/rejected-update"), Value::Null);

    let token = env.token("default", "web-1", &[]);
    let chain = env.fetch_identity(&token);
    let serial = serial_of(&env, &chain);

    // Break the mesh: the whole update must be refused.
    env.write_resource("mesh.yaml", MESH_BROKEN);
    let rejected = daemon.wait_json("/api/rejected-update", "the update to be rejected", |v| {
        (!v.is_null()).then(|| v.clone())
    });
    let errors = rejected["errors"].as_array().expect("`errors` is a list");
    let error = errors
        .iter()
        .find(|e| e["field"] == "mtls.enabledBackend")
        .unwrap_or_else(|| panic!("no error on mtls.enabledBackend: {rejected}"));
    assert!(
        error["file"].as_str().unwrap_or("").ends_with("mesh.yaml"),
        "{rejected}"
    );
    assert_eq!(error["resource"], "Mesh/default", "{rejected}");
    assert!(
        error["message"]
            .as_str()
            .unwrap_or("")
            .contains("ca-missing"),
        "{rejected}"
    );
    let status = daemon.admin_json("/api/status");
    assert_eq!(
        status["last_rejected_update"], rejected,
        "status shows it too"
    );
    assert_eq!(
        status["meshes"][0]["mtls"]["enabled_backend"], "ca-1",
        "the previous configuration keeps serving"
    );
    let metrics = daemon.admin_get("/metrics").body;
    assert_eq!(rejected_updates(&metrics), Some(1.0), "{metrics}");
    let human = env.cli(&["status", "--admin", &env.admin.to_string()]).ok();
    assert!(human.stdout.contains("REJECTED"), "{human}");
    assert!(human.stdout.contains("mtls.enabledBackend"), "{human}");

    // Proxies keep the certificate they had.
    let again = env.fetch_identity(&token);
    assert_eq!(
        serial_of(&env, &again),
        serial,
        "the proxy's certificate changed"
    );
    assert_eq!(again, chain);
    let dp = daemon.admin_json("/api/dataplanes/default/web-1");
    assert_eq!(dp["serial"].as_str(), Some(serial.as_str()), "{dp}");

    // A valid file added while the mesh is broken is not half-applied: the whole update is refused again.
    env.write_resource("api.yaml", DATAPLANE_API_1);
    wait_for("a second rejected update", || {
        let metrics = daemon.admin_get("/metrics").body;
        rejected_updates(&metrics).filter(|n| *n >= 2.0)
    });
    let known = daemon.admin_json("/api/dataplanes");
    assert!(
        !known.to_string().contains("api-1"),
        "a rejected update was half-applied: {known}"
    );

    // Fix the file: the rejection clears, and the pending dataplane arrives with it.
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    daemon.wait_json("/api/rejected-update", "the rejection to clear", |v| {
        v.is_null().then_some(())
    });
    assert_eq!(
        daemon.admin_get("/api/dataplanes/default/api-1").status,
        200,
        "the accepted update holds api-1"
    );
    assert_eq!(
        daemon.admin_json("/api/status")["last_rejected_update"],
        Value::Null
    );
    let fixed = env.fetch_identity(&token);
    assert_eq!(
        common::uri_sans(&common::pem_certs(&fixed)[0]),
        ["spiffe://default/web"]
    );
    assert_eq!(daemon.stop().code(), Some(0));
}
