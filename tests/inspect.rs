//! `meshca inspect`: what a certificate, chain or bundle holds; bad input exits 2.

mod common;

use common::{Env, DATAPLANE_WEB_1, MESH_BUILTIN};

/// Issues `svid.pem`, `key.pem` and `bundle.pem` for `default/web-1` from the keystore into `out/`.
fn issued(env: &Env) -> std::path::PathBuf {
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    let out = env.root().join("out");
    env.cli(&[
        "issue",
        "--config",
        env.cfg(),
        "--out",
        out.to_str().expect("UTF-8"),
        "--mesh",
        "default",
        "--name",
        "web-1",
    ])
    .ok();
    out
}

#[test]
fn inspect_json_shows_spiffe_id_ca_flag_and_key_type() {
    let env = Env::new();
    let out = issued(&env);

    let svid = env
        .cli(&[
            "inspect",
            out.join("svid.pem").to_str().expect("UTF-8"),
            "--output",
            "json",
        ])
        .ok();
    let certs = svid.json();
    let certs = certs.as_array().expect("a list of certificates");
    assert_eq!(certs.len(), 1, "{svid}");
    let leaf = &certs[0];
    assert_eq!(
        leaf["spiffe_ids"],
        serde_json::json!(["spiffe://default/web"])
    );
    assert_eq!(leaf["is_ca"], false);
    assert_eq!(leaf["key"], "ECDSA P-256");
    let serial = leaf["serial"].as_str().expect("a serial");
    assert!(serial.len() >= 16, "at least 64 bits of serial: {serial}");

    let bundle = env
        .cli(&[
            "inspect",
            out.join("bundle.pem").to_str().expect("UTF-8"),
            "--output",
            "json",
        ])
        .ok();
    let ca = &bundle.json()[0];
    assert_eq!(ca["spiffe_ids"], serde_json::json!(["spiffe://default"]));
    assert_eq!(ca["is_ca"], true);
    assert_eq!(ca["key"], "ECDSA P-256");
    assert_eq!(
        leaf["issuer"], ca["subject"],
        "the leaf names its CA as issuer"
    );

    // Human output carries the same facts.
    let human = env
        .cli(&["inspect", out.join("svid.pem").to_str().expect("UTF-8")])
        .ok();
    assert!(human.stdout.contains("spiffe://default/web"), "{human}");
    assert!(human.stdout.contains("ECDSA P-256"), "{human}");
}

#[test]
fn inspect_of_a_file_without_a_certificate_exits_2() {
    let env = Env::new();
    let out = issued(&env);
    let not_pem = env.root().join("notes.txt");
    std::fs::write(&not_pem, "hello, this is not PEM\n").expect("the temp dir is writable");

    for (file, shown) in [
        (not_pem.clone(), "notes.txt"),
        (out.join("key.pem"), "key.pem"),
    ] {
        let run = env.cli(&["inspect", file.to_str().expect("UTF-8"), "--output", "json"]);
        assert_eq!(run.code(), Some(2), "{run}");
        assert!(
            run.stderr.contains(shown),
            "the message names the file: {run}"
        );
        assert!(run.stdout.trim().is_empty(), "{run}");
        assert!(
            !run.stderr.contains("PRIVATE KEY-----") && !run.stdout.contains("PRIVATE KEY-----"),
            "inspect must never print a key: {run}"
        );
    }

    let missing = env.cli(&["inspect", "/nonexistent/meshca-test.pem"]);
    assert_ne!(missing.code(), Some(0), "{missing}");
    assert!(
        missing.stderr.contains("/nonexistent/meshca-test.pem"),
        "{missing}"
    );
}
