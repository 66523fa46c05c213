//! The alerting rules and the Grafana dashboard in `monitoring/` name only metrics meshca really exports.
//! A daemon with every part that has metrics of its own (replicas on a real PostgreSQL database, CA keys
//! in a real SoftHSM2 token, a federation peer written from the standard, a proxy holding a stream) and a
//! `meshca agent` connected to it are scraped; every `meshca_*` name a rule or a panel queries must be a
//! sample name one of them exports (a counter's `_total`, a histogram's `_bucket`, `_sum` and `_count`),
//! read from the `# TYPE` lines too, so that a counter no event has touched yet still counts.

mod common;
#[path = "../federation/tests/peer/mod.rs"]
mod peer;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{http_get, wait_for, Env, DATAPLANE_WEB_1};
use meshca_testhsm::TestToken;
use meshca_testpg::TestPostgres;

const MESH: &str = "type: Mesh\nname: default\nmtls:\n  enabledBackend: ca-1\n  backends:\n    - name: ca-1\n      type: builtin\n";

/// The sample names an OpenMetrics or Prometheus text exposition holds: every sample, and what each
/// `# TYPE` line declares (so that a labelled counter with no sample yet is known too).
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            for suffix in suffixes {
                names.insert(format!("{name}{suffix}"));
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// Every `meshca_*` name in `text`.
fn queried(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("meshca_") {
        let start = i + at;
        let boundary =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if boundary {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// The queries of the rules file (each rule's `expr`) and of the dashboard (each target's `expr`).
fn queries(root: &Path) -> Vec<(String, String)> {
    let rules: serde_json::Value = read_yaml(&root.join("monitoring/meshca-alerts.yaml"));
    let mut out = Vec::new();
    for group in rules["groups"].as_array().expect("rule groups") {
        for rule in group["rules"].as_array().expect("rules") {
            out.push((
                format!("alert {}", rule["alert"].as_str().expect("an alert name")),
                rule["expr"].as_str().expect("an expr").to_owned(),
            ));
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("monitoring/meshca-dashboard.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                format!("panel {:?}", panel["title"].as_str().unwrap_or("")),
                target["expr"].as_str().expect("a target's expr").to_owned(),
            ));
        }
    }
    out
}

/// The rules file, read as YAML into JSON values.
fn read_yaml(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("the rules file");
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_metric_the_rules_and_the_dashboard_query_is_one_meshca_exports() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let queries = queries(root);
    assert!(
        queries.len() >= 20,
        "the rules and the panels: {}",
        queries.len()
    );

    // A federation peer, written from the standard.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let ca = peer::Ca::new("peer.example");
    let endpoint = runtime.block_on(peer::Endpoint::start(
        ca.svid(peer::ENDPOINT_ID),
        "200 OK",
        peer::bundle_json(&[ca.jwk()], 1),
    ));
    // The daemon: on PostgreSQL, its CA keys in a token, following the peer.
    let token = TestToken::new();
    let pg = TestPostgres::start();
    let shared = tempfile::tempdir().expect("a temp dir");
    let password = shared.path().join("db-password");
    std::fs::write(&password, pg.password()).expect("written");
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let env = Env::with_settings(&format!(
        "{}  postgres:\n    url: {}\n    passwordFile: {}\nreplica:\n  name: a\n",
        token.settings_yaml("postgres"),
        pg.url(),
        password.display()
    ))
    .with_vars(token.env());
    env.write_resource("mesh.yaml", MESH);
    env.write_resource("web-1.yaml", DATAPLANE_WEB_1);
    let initial = env.root().join("peer.json");
    std::fs::write(&initial, peer::bundle_json(&[ca.jwk()], 1)).expect("written");
    env.write_resource(
        "peer.yaml",
        &format!(
            "type: FederationRelationship\nname: peer\nmesh: default\nspec:\n  trustDomain: peer.example\n  bundleEndpoint: {{url: \"{}\", profile: https_spiffe, spiffeID: \"{}\"}}\n  initialBundle: {{file: {}}}\n",
            endpoint.url(),
            peer::ENDPOINT_ID,
            initial.display()
        ),
    );
    let daemon = env.start();
    // A proxy holding a stream, so that the per-proxy gauges have a sample.
    let web_1 = env.token("default", "web-1", &["--tag", "kuma.io/service=web"]);
    let (_stream, _) = env.hold_stream(&web_1);

    // An agent of the daemon's.
    let agent_token = env.agent_token("host-1");
    let token_file = env.root().join("agent.token");
    std::fs::write(&token_file, agent_token).expect("written");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let agent_admin = common::free_addr();
    let listen = format!("unix://{}", env.root().join("agent.sock").display());
    let mut agent = env.spawn(&[
        "agent",
        "--server",
        &env.sds_unix(),
        "--token-file",
        token_file.to_str().expect("UTF-8"),
        "--listen",
        &listen,
        "--admin",
        &agent_admin.to_string(),
    ]);
    wait_for("the agent to be served", || {
        if let Some(status) = agent.exited() {
            panic!("meshca agent exited ({status}):\n{}", agent.log());
        }
        http_get(agent_admin, "/ready")
            .ok()
            .filter(|r| r.status == 200)
    });

    let scraped = wait_for("the federation peer fetched and the proxy counted", || {
        let text = daemon.admin_get("/metrics").body;
        (text.contains("meshca_federation_fetches_total{")
            && text.contains("meshca_rotation_proxies{"))
        .then_some(text)
    });
    let mut names = exported(&scraped);
    names.extend(exported(
        &http_get(agent_admin, "/metrics")
            .expect("the agent's metrics")
            .body,
    ));
    for must in [
        "meshca_database_up",
        "meshca_keystore_token_up",
        "meshca_agent_server_connected",
    ] {
        assert!(names.contains(must), "the scrape lacks {must}: {names:?}");
    }
    let mut unknown = Vec::new();
    for (what, expr) in &queries {
        for name in queried(expr) {
            if !names.contains(&name) {
                unknown.push(format!("{what}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "queried but not exported: {unknown:#?}\nexported: {names:#?}"
    );
    assert!(agent.stop().expect("it exits").success());
}

#[test]
fn the_name_reader_finds_names_in_queries_and_expositions() {
    let q = queried(
        "rate(meshca_sds_nacks_total[5m]) and on (mesh) xmeshca_no meshca_ca_expiry_seconds < 7",
    );
    assert_eq!(
        q,
        BTreeSet::from([
            "meshca_sds_nacks_total".to_owned(),
            "meshca_ca_expiry_seconds".to_owned()
        ])
    );
    let e = exported("# TYPE meshca_sds_nacks counter\n# TYPE meshca_issuance_seconds histogram\nmeshca_up 1\n# EOF\n");
    assert!(e.contains("meshca_sds_nacks_total"));
    assert!(
        e.contains("meshca_issuance_seconds_bucket") && e.contains("meshca_issuance_seconds_count")
    );
    assert!(e.contains("meshca_up"));
    assert!(!e.contains("meshca_sds_nacks"));
}
