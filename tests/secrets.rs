//! Private keys never leave through logs, the admin API or `meshca sds fetch` output.

mod common;

use common::{Env, DATAPLANE_WEB_1, MESH_BUILTIN};

/// The base64 lines of a PEM key: what would show up if the key were logged in any PEM-ish form.
fn key_body_lines(key_pem: &str) -> Vec<String> {
    key_pem
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() >= 40)
        .map(str::to_owned)
        .collect()
}

#[test]
fn no_private_key_in_logs_admin_api_or_fetch_output() {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    // The most verbose logging there is, for every crate (tonic, h2, hyper included).
    let daemon = env.start_logging("trace");
    let token = env.token("default", "web-1", &[]);

    let json = env.fetch(&token, &["default", "system_trust_bundle"]).ok();
    assert!(json.stdout.contains("[redacted]"), "{json}");
    assert!(json.stdout.contains("BEGIN CERTIFICATE"), "{json}");
    assert!(!json.stdout.contains("PRIVATE KEY"), "{json}");
    let secrets = json.json();
    let identity = secrets
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "default"))
        .unwrap_or_else(|| panic!("no `default` secret: {json}"));
    assert_eq!(identity["tls_certificate"]["private_key"], "[redacted]");

    let file = token.file.to_str().expect("UTF-8");
    let human = env
        .cli(&[
            "sds",
            "fetch",
            "--config",
            env.cfg(),
            "--token-file",
            file,
            "default",
        ])
        .ok();
    assert!(human.stdout.contains("[redacted]"), "{human}");
    assert!(!human.stdout.contains("PRIVATE KEY"), "{human}");
    assert!(!human.stderr.contains("PRIVATE KEY"), "{human}");

    // The key the daemon handed out (over TLS this time), to look for its bytes elsewhere.
    let out = env.root().join("out");
    env.cli(&[
        "issue",
        "--config",
        env.cfg(),
        "--server",
        &env.sds_tcp.to_string(),
        "--token-file",
        file,
        "--out",
        out.to_str().expect("UTF-8"),
    ])
    .ok();
    let key = std::fs::read_to_string(out.join("key.pem")).expect("key.pem was written");
    let body = key_body_lines(&key);
    assert!(!body.is_empty(), "key.pem has a body: {key}");

    let mut exposed = vec![("the daemon log", daemon.log())];
    for path in [
        "/api/status",
        "/api/dataplanes",
        "/api/dataplanes/default/web-1",
        "/api/streams",
        "/api/meshes",
        "/metrics",
    ] {
        exposed.push((path, daemon.admin_get(path).body));
    }
    assert!(
        exposed[0].1.contains("issued certificate"),
        "the log is being captured: {}",
        exposed[0].1
    );
    assert!(
        exposed[0].1.contains("TRACE"),
        "RUST_LOG=trace is in effect: {}",
        exposed[0].1
    );
    for (what, text) in &exposed {
        assert!(!text.contains("PRIVATE KEY"), "{what} holds a PEM key");
        for line in &body {
            assert!(
                !text.contains(line.as_str()),
                "{what} holds key bytes {line}"
            );
        }
    }
    assert_eq!(daemon.stop().code(), Some(0));
}
