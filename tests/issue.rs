//! `meshca issue`: svid.pem, key.pem (0600) and bundle.pem for a workload that is not Envoy, straight from
//! the keystore (no daemon) and from a running daemon over SDS. Each result is checked by independent code:
//! x509-parser for the SAN, rustls-webpki for the chain, ring for the key pair.

mod common;

use std::path::Path;

use common::{mode, pem_certs, uri_sans, webpki_verify, Env, DATAPLANE_WEB_1, MESH_BUILTIN};

/// Checks the three files `meshca issue` wrote for `default/web-1`.
fn check_issued_files(out: &Path) {
    for f in ["svid.pem", "key.pem", "bundle.pem"] {
        assert!(out.join(f).is_file(), "{f} was not written");
    }
    assert_eq!(mode(&out.join("key.pem")), 0o600, "key.pem must be 0600");

    let svid = std::fs::read_to_string(out.join("svid.pem")).expect("svid.pem is text");
    let bundle = std::fs::read_to_string(out.join("bundle.pem")).expect("bundle.pem is text");
    let key = std::fs::read_to_string(out.join("key.pem")).expect("key.pem is text");
    let chain = pem_certs(&svid);
    let anchors = pem_certs(&bundle);
    assert!(!chain.is_empty(), "svid.pem holds no certificate");
    assert!(!anchors.is_empty(), "bundle.pem holds no certificate");
    assert!(
        !svid.contains("PRIVATE KEY") && !bundle.contains("PRIVATE KEY"),
        "a key leaked into a public file"
    );

    meshca_ca::check_svid_rules(&chain[0])
        .unwrap_or_else(|broken| panic!("the SVID breaks the SPIFFE rules: {broken:?}"));
    assert_eq!(uri_sans(&chain[0]), ["spiffe://default/web"]);
    webpki_verify(&chain, &anchors).expect("the SVID chains to bundle.pem");
    let expected: meshca_identity::SpiffeId =
        "spiffe://default/web".parse().expect("a valid SPIFFE ID");
    meshca_ca::verify_svid(&chain, &anchors, &expected, std::time::SystemTime::now())
        .expect("meshca's own verifier agrees");

    // The key belongs to the certificate: same public key (read with ring and x509-parser).
    let key_block = ::pem::parse(&key).expect("key.pem is PEM");
    assert_eq!(key_block.tag(), "PRIVATE KEY", "a PKCS#8 key");
    let rng = ring::rand::SystemRandom::new();
    let pair = ring::signature::EcdsaKeyPair::from_pkcs8(
        &ring::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
        key_block.contents(),
        &rng,
    )
    .expect("an ECDSA P-256 PKCS#8 key (the default keyAlgorithm)");
    use ring::signature::KeyPair;
    use x509_parser::prelude::*;
    let (_, cert) = X509Certificate::from_der(&chain[0]).expect("parsable SVID");
    assert_eq!(
        pair.public_key().as_ref(),
        cert.public_key().subject_public_key.data.as_ref(),
        "key.pem does not match svid.pem"
    );
}

fn env_with_web_1() -> Env {
    let env = Env::new();
    env.write_resource("mesh.yaml", MESH_BUILTIN);
    env.write_resource("dataplanes.yaml", DATAPLANE_WEB_1);
    env
}

/// `meshca issue --mesh default --name web-1 --out OUT` from the local keystore.
fn issue_into(env: &Env, out: &Path) -> common::Run {
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
}

#[test]
fn issue_from_the_local_keystore_without_a_daemon() {
    let env = env_with_web_1();
    let out = env.root().join("out");
    let run = issue_into(&env, &out).ok();
    assert!(run.stderr.contains("spiffe://default/web"), "{run}");
    check_issued_files(&out);

    // The bundle is the mesh's persisted CA, so a later daemon serves the same trust.
    let persisted =
        std::fs::read_to_string(env.keystore().join("ca/default/backend/ca-1/cert.pem"))
            .expect("issue persisted the backend CA");
    let bundle = std::fs::read_to_string(out.join("bundle.pem")).expect("bundle.pem");
    assert_eq!(pem_certs(&bundle), pem_certs(&persisted));
}

#[test]
fn issue_for_an_unknown_mesh_exits_2() {
    let env = env_with_web_1();
    let out = env.root().join("out");
    let run = env.cli(&[
        "issue",
        "--config",
        env.cfg(),
        "--out",
        out.to_str().expect("UTF-8"),
        "--mesh",
        "nope",
        "--name",
        "web-1",
    ]);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("nope"), "{run}");
    assert!(!out.join("key.pem").exists(), "no key for a failed issue");
}

#[test]
fn issue_from_a_running_daemon_over_sds() {
    let env = env_with_web_1();
    let _daemon = env.start();
    let token = env.token("default", "web-1", &[]);
    for (server, dir) in [
        (env.sds_unix(), "out-unix"),
        (env.sds_tcp.to_string(), "out-tls"),
    ] {
        let out = env.root().join(dir);
        env.cli(&[
            "issue",
            "--config",
            env.cfg(),
            "--out",
            out.to_str().expect("UTF-8"),
            "--server",
            &server,
            "--token-file",
            token.file.to_str().expect("UTF-8"),
        ])
        .ok();
        check_issued_files(&out);
    }
}

#[test]
fn issue_never_writes_the_key_through_a_planted_file() {
    use std::os::unix::fs::PermissionsExt;
    let env = env_with_web_1();
    let out = env.root().join("out");
    std::fs::create_dir(&out).expect("out");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // Someone plants the temporary names an earlier meshca used: a symlink to a file they can read,
    // and a world-readable file.
    let stolen = env.root().join("stolen.pem");
    std::fs::write(&stolen, "").expect("stolen");
    std::os::unix::fs::symlink(&stolen, out.join(".key.pem.tmp")).expect("symlink");
    std::fs::write(out.join(".svid.pem.tmp"), "").expect("planted");
    issue_into(&env, &out).ok();
    check_issued_files(&out);
    assert_eq!(
        std::fs::read_to_string(&stolen).expect("stolen"),
        "",
        "the key went through the planted symlink"
    );
    let mode = std::fs::metadata(out.join("key.pem"))
        .expect("key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let leftovers: Vec<String> = std::fs::read_dir(&out)
        .expect("out")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp") && n != ".key.pem.tmp" && n != ".svid.pem.tmp")
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn issue_refuses_an_output_directory_others_can_write() {
    use std::os::unix::fs::PermissionsExt;
    let env = env_with_web_1();
    let out = env.root().join("shared-out");
    std::fs::create_dir(&out).expect("out");
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let run = issue_into(&env, &out);
    assert_eq!(run.code(), Some(2), "{run}");
    assert!(run.stderr.contains("writable by other users"), "{run}");
    assert!(
        !out.join("key.pem").exists(),
        "no key in a shared directory"
    );
    // Sticky and owned by the caller (like a private /tmp subdirectory) is fine.
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    issue_into(&env, &out).ok();
    check_issued_files(&out);
}

#[test]
fn the_exec_command_gets_the_environment_without_meshcas_secrets() {
    let env = env_with_web_1();
    let out = env.root().join("out");
    let seen = env.root().join("seen-env");
    let exec = format!("env > {}", seen.display());
    let mut command = env.command(&[]);
    command
        .env("MESHCA_KEYSTORE_POSTGRES_PASSWORD", "not-for-children")
        .env("MESHCA_KEYSTORE_PKCS11_PIN", "pin-not-for-children")
        .env("MESHCA_TEST_PASSED_ON", "yes");
    let args = [
        "issue",
        "--config",
        env.cfg(),
        "--out",
        out.to_str().expect("UTF-8"),
        "--mesh",
        "default",
        "--name",
        "web-1",
        "--exec",
        &exec,
    ];
    command.args(args);
    env.cli_with(command, &args).ok();
    let seen = std::fs::read_to_string(&seen).expect("the command ran");
    assert!(seen.contains("MESHCA_TEST_PASSED_ON=yes"), "{seen}");
    assert!(
        !seen.contains("MESHCA_KEYSTORE_POSTGRES_PASSWORD") && !seen.contains("not-for-children"),
        "the database password reached the child: {seen}"
    );
    assert!(
        !seen.contains("MESHCA_KEYSTORE_PKCS11_PIN") && !seen.contains("pin-not-for-children"),
        "the token's PIN reached the child: {seen}"
    );
}
