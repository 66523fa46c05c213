//! The admin side of a running daemon: `meshca status`, `/healthz`, `/ready`, `/metrics` and the JSON API.

mod common;

use common::{Env, DATAPLANE_WEB_1, MESH_BUILTIN};
use serde_json::Value;

fn env_with_web_1() -> Env {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    env
}

fn dataplane<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["dataplanes"]
        .as_array()
        .and_then(|d| d.iter().find(|d| d["name"] == name))
        .unwrap_or_else(|| panic!("no dataplane {name} in {status}"))
}

#[test]
fn status_shows_the_mesh_and_the_connected_proxy() {
    let env = env_with_web_1();
    let daemon = env.start();
    let admin = env.admin.to_string();
    let token = env.token("default", "web-1", &[]);
    let (watch, serial) = env.hold_stream(&token);

    let human = env.cli(&["status", "--admin", &admin]).ok();
    let out = &human.stdout;
    assert!(out.contains("mesh default"), "{human}");
    assert!(
        out.contains("ca-1"),
        "the enabled backend is shown: {human}"
    );
    let row = out
        .lines()
        .find(|l| l.contains("web-1"))
        .unwrap_or_else(|| panic!("no row for web-1: {human}"));
    assert!(row.contains("yes"), "web-1 is connected: {row}");
    assert!(row.contains("spiffe://default/web"), "{row}");

    let json = env
        .cli(&["status", "--admin", &admin, "--output", "json"])
        .ok()
        .json();
    assert_eq!(json["meshes"][0]["name"], "default", "{json}");
    assert_eq!(json["meshes"][0]["connected_proxies"], 1, "{json}");
    let dp = dataplane(&json, "web-1");
    assert_eq!(dp["connected"], true, "{dp}");
    assert_eq!(dp["spiffe_id"], "spiffe://default/web", "{dp}");
    assert_eq!(dp["serial"].as_str(), Some(serial.as_str()), "{dp}");
    assert_eq!(dp["origin"], "file", "{dp}");

    // The document is valid for a strict reader: every key once (`meshca status` reads it so too).
    let body = daemon.admin_get("/api/status").body;
    let typed: meshca_control::Status =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(typed.dataplanes.len(), 1, "{body}");

    let api = daemon.admin_json("/api/dataplanes/default/web-1");
    assert_eq!(api["spiffe_id"], "spiffe://default/web");
    assert_eq!(
        api["sds_streams"].as_array().map(Vec::len),
        Some(1),
        "{api}"
    );
    assert_eq!(daemon.admin_get("/api/dataplanes/default/nope").status, 404);

    // When the workload goes away, the daemon says so.
    watch.stop();
    daemon.wait_json("/api/status", "web-1 to be shown disconnected", |s| {
        (dataplane(s, "web-1")["connected"] == false).then_some(())
    });
    let after = env.cli(&["status", "--admin", &admin]).ok();
    let row = after
        .stdout
        .lines()
        .find(|l| l.contains("web-1"))
        .unwrap_or_else(|| panic!("no row for web-1: {after}"));
    assert!(
        row.contains(" no "),
        "web-1 is not connected any more: {row}"
    );
}

#[test]
fn status_without_a_daemon_fails_with_a_clear_message() {
    let env = Env::new();
    let run = env.cli(&["status", "--admin", &env.admin.to_string()]);
    assert_eq!(run.code(), Some(1), "{run}");
    assert!(run.stderr.contains(&env.admin.to_string()), "{run}");
}

#[test]
fn a_finished_fetch_does_not_count_as_a_connected_proxy() {
    let env = env_with_web_1();
    let daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    env.fetch_identity(&token);
    daemon.wait_json(
        "/api/dataplanes/default/web-1",
        "web-1 to be disconnected after its one-shot fetch",
        |dp| (dp["connected"] == false && dp["streams"] == 0).then_some(()),
    );
    let status = daemon.admin_json("/api/status");
    assert_eq!(status["meshes"][0]["connected_proxies"], 0, "{status}");
}

/// The value of the Prometheus sample whose line starts with `prefix` (name and labels).
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn healthz_ready_and_metrics_count_issued_certificates() {
    let env = env_with_web_1();
    let daemon = env.start();

    let health = daemon.admin_get("/healthz");
    assert_eq!(health.status, 200, "{health:?}");
    assert_eq!(daemon.admin_get("/ready").status, 200);

    let issued = "meshca_certificates_issued_total{mesh=\"default\",issuer=\"backend ca-1\"}";
    let before = daemon.admin_get("/metrics");
    assert_eq!(before.status, 200);
    // The counter exists at 0 before anything is issued, so that Prometheus sees the first increase.
    assert_eq!(
        sample(&before.body, issued),
        Some(0.0),
        "nothing issued yet: {}",
        before.body
    );

    let token = env.token("default", "web-1", &[]);
    env.fetch_identity(&token);
    let after = daemon.admin_get("/metrics").body;
    assert!(
        after.contains("meshca_certificates_issued_total"),
        "{after}"
    );
    assert_eq!(sample(&after, issued), Some(1.0), "{after}");
    assert!(
        !after.contains("PRIVATE KEY"),
        "metrics must never hold key material"
    );
}

/// A SIGTERM that comes while the daemon starts (here once it has loaded its CA, before it is ready)
/// waits for the start to finish and stops it cleanly: the default action would kill it undrained.
#[test]
fn sigterm_during_the_start_stops_it_cleanly_once_started() {
    let env = env_with_web_1();
    let mut serve = env.spawn(&["serve", "--config", env.cfg()]);
    common::wait_for("the daemon to load its CA", || {
        if let Some(status) = serve.exited() {
            panic!("meshca serve ended ({status}): {}", serve.log());
        }
        serve.log().contains("CA loaded").then_some(())
    });
    let (status, log) = serve.stop_and_log();
    let status = status.expect("meshca serve exits after SIGTERM");
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("SIGTERM: draining"), "{log}");
}

#[test]
fn sigterm_with_an_open_stream_drains_and_exits_0() {
    let env = env_with_web_1();
    let daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    let (mut watch, _) = env.hold_stream(&token);
    let status = daemon.stop();
    assert_eq!(status.code(), Some(0), "SIGTERM with a stream open");
    // The workload sees its stream end rather than hanging on a dead daemon.
    let ended = common::wait_for("the workload's stream to end", || watch.exited());
    assert!(!ended.success(), "{}", watch.log());
}
